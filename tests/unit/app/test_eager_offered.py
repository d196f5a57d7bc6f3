"""Which of a worker's transition rows it may publish itself (``eager_publish.offered``): only rows
about the run it moves, in that run's partition; the rest is the relay's."""

from __future__ import annotations

from longrun.app import effects
from longrun.bus import topology
from longrun.eager_publish import offered
from longrun.envelope import make
from longrun.envelope.payloads import RejectionCode
from longrun.ports.runs import Message

RUN = "run-1"
PARTITION = 3


def _message(run_id: str, partition: int, type_: str = "run.wakeup") -> Message:
    envelope = make(type_, {"wakeup_id": "w", "reason": "test"}, producer="worker", tenant_id="acme", run_id=run_id)
    return Message(envelope, topology.work_exchange("worker"), topology.partition_key(partition), partition)


def test_the_rows_about_the_moved_run_in_its_partition_are_offered() -> None:
    assert offered([_message(RUN, PARTITION), _message(RUN, PARTITION)], RUN, PARTITION) == [True, True]


def test_a_row_about_another_run_is_left_to_the_relay_even_in_the_same_partition() -> None:
    # e.g. the next queued run woken by the slot this one hands on, or a parent told its child ended
    assert offered([_message("run-2", PARTITION), _message(RUN, PARTITION)], RUN, PARTITION) == [False, True]


def test_a_row_routed_to_another_partition_is_left_to_the_relay() -> None:
    assert offered([_message(RUN, PARTITION + 1)], RUN, PARTITION) == [False]


def test_a_row_naming_no_run_is_left_to_the_relay() -> None:
    rejected = effects.rejected_message(tenant_id="acme", correlation_id=None, refused_event_id="e-1",
                                        idempotency_key="k", code=RejectionCode.INVALID_PAYLOAD, reason="unreadable",
                                        partitions=8, producer="scheduler")
    assert offered([rejected], RUN, rejected.partition) == [False]


def test_a_transition_with_no_rows_offers_nothing() -> None:
    assert offered([], RUN, PARTITION) == []
