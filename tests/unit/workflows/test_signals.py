"""A run kind that waits for a signal, through the kit, in memory: the signal wakes it once however
often it is sent, one sent before the wait is read by ``decide``, one its kind does not declare or
whose payload breaks the schema is refused, and one sent after the run ended is kept, not applied."""

from __future__ import annotations

import pytest

from longrun.app.signals import SignalRefused
from longrun.domain import RunStatus, event_to_dict
from longrun.testing.kit import Kit
from tests.integration.signal_kinds import SIGNALLED


def types(kit: Kit, run_id: str) -> list[str]:
    return [str(event_to_dict(e)["type"]) for e in kit.world.store.history(run_id)]


def test_a_signal_sent_twice_wakes_the_waiting_run_once() -> None:
    with Kit(SIGNALLED) as kit:
        run_id = kit.start({})
        kit.settle(timers=False)
        assert kit.status(run_id) is RunStatus.WAITING_EVENT
        first = kit.signal(run_id, "ship", {"by": "ana"}, signal_id="ship-1")
        again = kit.signal(run_id, "ship", {"by": "ana"}, signal_id="ship-1")
        assert (first["outcome"], again["outcome"]) == ("woke", "duplicate")
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED
        acceptance = kit.snapshot(run_id).acceptance
        assert acceptance is not None and acceptance.evidence["woken_by"] == "ship-1"
        assert types(kit, run_id).count("signal.received") == 1
        assert [a["action"] for a in kit.world.audit_log] == ["signal"]
        assert kit.check() == []


def test_a_signal_sent_before_the_wait_is_read_by_decide() -> None:
    with Kit(SIGNALLED) as kit:
        run_id = kit.start({})
        assert kit.signal(run_id, "note", "first this")["outcome"] == "recorded"
        assert kit.signal(run_id, "ship", {"by": "bo"})["outcome"] == "recorded"
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED
        evidence = kit.snapshot(run_id).acceptance.evidence  # type: ignore[union-attr]
        assert evidence["woken_by"] is None
        assert [name for name, _, _ in evidence["signals"]] == ["note", "ship"]
        assert [s.name for s in kit.signals(run_id)] == ["note", "ship"]
        assert kit.check() == []


@pytest.mark.parametrize(("name", "payload", "why"), [
    ("deploy", {}, "accepts no signal named 'deploy' (it accepts: note, ship)"),
    ("ship", {"by": ""}, "payload.by: '' should be non-empty"),
    ("ship", {"by": "ana", "when": "now"}, "Additional properties are not allowed ('when' was unexpected)"),
    ("note", 7, "payload: 7 is not of type 'string'"),
])
def test_a_signal_its_kind_does_not_accept_is_refused_and_changes_nothing(name: str, payload: object,
                                                                         why: str) -> None:
    with Kit(SIGNALLED) as kit:
        run_id = kit.start({})
        kit.settle(timers=False)
        before = kit.world.store.tables()
        with pytest.raises(SignalRefused, match="refused") as refused:
            kit.signal(run_id, name, payload)  # type: ignore[arg-type]
        assert any(why in problem for problem in refused.value.problems), refused.value.problems
        assert kit.world.store.tables() == before


def test_a_signal_after_the_run_ended_is_kept_and_not_applied() -> None:
    with Kit(SIGNALLED) as kit:
        run_id = kit.start({})
        kit.signal(run_id, "ship", {"by": "ana"})
        kit.settle()
        done = kit.snapshot(run_id)
        assert done.status is RunStatus.COMPLETED
        late = kit.signal(run_id, "note", "too late", signal_id="late-1")
        assert (late["outcome"], late["status"], late["revision"]) == ("late", "COMPLETED", done.revision)
        assert kit.signal(run_id, "note", "too late", signal_id="late-1")["outcome"] == "duplicate"
        assert kit.snapshot(run_id) == done
        assert types(kit, run_id).count("signal.received") == 2
        assert not kit.world.pending
        assert kit.check() == []


def test_a_run_nobody_signals_fails_at_its_deadline() -> None:
    with Kit(SIGNALLED) as kit:
        run_id = kit.start({"wait_for": 30})
        kit.settle()
        assert kit.status(run_id) is RunStatus.FAILED
        assert kit.snapshot(run_id).terminal_reason == "nobody said ship before the deadline"
