"""Concurrency keys: the policy a create applies (``domain.concurrency``), the declaration's checks
(``authoring.ConcurrencyKey``), and the rules through the memory world (the kit), which mirrors
admission's: a run waiting for its key is not admitted, and the run that ends hands its key on."""

from __future__ import annotations

import pytest

from longrun.authoring import ConcurrencyKey, RunKind
from longrun.domain import RunStatus
from longrun.domain.concurrency import KeyClaim, KeyedRun, KeyPolicy, Queue, Refuse, key_problem, on_create
from longrun.envelope.payloads import RejectionCode
from longrun.services.gateway.run_create import STATUS
from longrun.testing.kit import Kit
from tests.integration.keyed_kinds import VERSIONS, Holds, repository

CLAIM = KeyClaim("repo:acme/api", 1)
HOLDER = KeyedRun("run-1", holding=True, cancel_requested=False)
WAITER = KeyedRun("run-2", holding=False, cancel_requested=False)


def test_queue_creates_the_run_whatever_holds_the_key() -> None:
    assert on_create(KeyPolicy.QUEUE, CLAIM, None, [HOLDER, WAITER]) == Queue()


def test_queue_with_max_waiting_refuses_past_the_runs_allowed_to_wait() -> None:
    assert on_create(KeyPolicy.QUEUE, CLAIM, 1, [HOLDER]) == Queue()
    refused = on_create(KeyPolicy.QUEUE, CLAIM, 1, [HOLDER, WAITER])
    assert isinstance(refused, Refuse) and "held by run-1" in refused.reason and "1 waiting" in refused.reason


def test_refuse_refuses_while_the_limit_is_taken_even_by_a_run_not_admitted_yet() -> None:
    assert on_create(KeyPolicy.REFUSE, CLAIM, None, []) == Queue()
    assert isinstance(on_create(KeyPolicy.REFUSE, CLAIM, None, [WAITER]), Refuse)
    assert on_create(KeyPolicy.REFUSE, KeyClaim(CLAIM.key, 2), None, [HOLDER]) == Queue()


def test_cancel_in_progress_cancels_every_earlier_run_but_the_newest_limit_minus_one() -> None:
    asked = KeyedRun("run-0", holding=True, cancel_requested=True)
    assert on_create(KeyPolicy.CANCEL_IN_PROGRESS, CLAIM, None, [asked, HOLDER, WAITER]) == Queue(("run-1", "run-2"))
    assert on_create(KeyPolicy.CANCEL_IN_PROGRESS, KeyClaim(CLAIM.key, 2), None, [HOLDER, WAITER]) == \
        Queue(("run-1",))
    assert on_create(KeyPolicy.CANCEL_IN_PROGRESS, KeyClaim(CLAIM.key, 3), None, [HOLDER]) == Queue()


@pytest.mark.parametrize("key, problem", [(7, "a string"), ("", "1 to 200"), ("x" * 201, "1 to 200"),
                                          ("repo:\n", "control characters")])
def test_a_key_that_is_not_one_is_named(key: object, problem: str) -> None:
    assert problem in (key_problem(key) or "")


def test_a_declaration_out_of_bounds_is_refused_naming_why() -> None:
    with pytest.raises(ValueError, match="limit must be 1 to 32767"):
        ConcurrencyKey(repository, limit=0)
    with pytest.raises(ValueError, match="for the policy queue only"):
        ConcurrencyKey(repository, policy=KeyPolicy.REFUSE, max_waiting=1)
    with pytest.raises(ValueError, match="cannot be derived"):
        ConcurrencyKey(lambda value: value["missing"]).claim({})
    assert ConcurrencyKey(repository).claim({}) is None


def _kit(policy: KeyPolicy, **options: int) -> Kit:
    return Kit(RunKind("upgrade", VERSIONS, Holds(), {},
                       concurrency=ConcurrencyKey(repository, limit=1, policy=policy, **options)))


def _first_running(kit: Kit, run_id: str) -> float:
    return next(row.event.at for row in kit.world.store.events[run_id]
                if getattr(row.event, "to", None) is RunStatus.RUNNING)


def _ended(kit: Kit, run_id: str) -> float:
    return next(row.event.at for row in kit.world.store.events[run_id]
                if row.event.type in ("run.completed", "run.status_changed")
                and getattr(row.event, "to", RunStatus.COMPLETED) in (RunStatus.COMPLETED, RunStatus.CANCELLED))


def test_the_second_run_of_a_key_waits_unadmitted_and_takes_the_key_when_the_first_ends() -> None:
    with _kit(KeyPolicy.QUEUE) as kit:
        first = kit.start({"repo": "acme/api", "hold": 5})
        second = kit.start({"repo": "acme/api", "hold": 5})
        other = kit.start({"hold": 5})
        rows = kit.world.store.runs
        assert (rows[first].admitted, rows[second].admitted, rows[other].admitted) == (True, False, True)
        kit.settle()
        assert kit.status(first) is kit.status(second) is kit.status(other) is RunStatus.COMPLETED
        assert _first_running(kit, second) >= _ended(kit, first)


def test_buffer_one_refuses_a_third_run_while_one_runs_and_one_waits() -> None:
    with _kit(KeyPolicy.QUEUE, max_waiting=1) as kit:
        kit.start({"repo": "acme/api", "hold": 5})
        kit.start({"repo": "acme/api", "hold": 5})
        with pytest.raises(ValueError, match="concurrency_key_held"):
            kit.start({"repo": "acme/api", "hold": 5})


def test_cancel_in_progress_cancels_the_holder_then_runs_the_new_one() -> None:
    with _kit(KeyPolicy.CANCEL_IN_PROGRESS) as kit:
        first = kit.start({"repo": "acme/api", "hold": 3600})
        kit.settle(timers=False)
        second = kit.start({"repo": "acme/api", "hold": 5})
        assert kit.snapshot(first).cancel_requested
        kit.settle()
        assert (kit.status(first), kit.status(second)) == (RunStatus.CANCELLED, RunStatus.COMPLETED)
        assert _first_running(kit, second) >= _ended(kit, first)


def test_a_refusal_for_a_held_key_answers_409_on_post_runs() -> None:
    assert STATUS[RejectionCode.CONCURRENCY_KEY_HELD] == 409


def test_a_holder_an_operator_terminates_gives_its_key_to_the_run_waiting_for_it() -> None:
    with _kit(KeyPolicy.QUEUE) as kit:
        first = kit.start({"repo": "acme/api", "hold": 3600})
        second = kit.start({"repo": "acme/api", "hold": 5})
        kit.settle(timers=False)
        kit.world.operate(first, "terminate")
        assert kit.world.store.runs[second].admitted
        kit.settle()
        assert (kit.status(first), kit.status(second)) == (RunStatus.TERMINATED, RunStatus.COMPLETED)


def test_an_input_the_key_cannot_be_derived_from_is_refused_as_input_invalid() -> None:
    kind = RunKind("upgrade", VERSIONS, Holds(), {}, concurrency=ConcurrencyKey(lambda value: value["repo"]))
    with Kit(kind) as kit, pytest.raises(ValueError, match="input_invalid.*no concurrency key"):
        kit.start({"hold": 5})
