"""A call outside a run's scope, in the author's kit (the runtime's own worker over the memory store):
refused before it is prepared; where the kind asks a person, asked once, and a denial or a deadline
leaves the run in NEEDS_ATTENTION with the tool never called."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from longrun.authoring import RunKind, ScopeApproval
from longrun.config import Settings
from longrun.domain import DENIED_FACT_PREFIX, RunStatus
from longrun.testing.kit import Kit
from tests.integration.notes_kinds import kinds

TIMEOUT = 600.0


@pytest.fixture
def asking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunKind:
    """``notes`` (at most read and write) asking user_42 before a call outside a run's scope."""
    monkeypatch.setenv("NOTES_CALLS", str(tmp_path / "unused"))
    notes = next(k for k in kinds(Settings.from_env({})) if k.name == "notes")
    return replace(notes, scope_approval=ScopeApproval(owner="user_42", timeout=TIMEOUT))


def _approvals_asked(kit: Kit, run_id: str) -> int:
    return sum(1 for e in kit.world.store.history(run_id) if e.type == "run.wait_started")


@pytest.mark.parametrize("answer", ["denied", "unanswered"])
def test_a_refused_call_asks_once_and_without_an_approval_the_run_needs_attention(asking: RunKind,
                                                                                    answer: str) -> None:
    with Kit(asking) as kit:
        run_id = kit.start({"doc": "public/a", "calls": ["write", "delete"]})
        kit.settle(timers=False)
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.WAITING_USER and run.wait is not None
        assert (run.wait.approval_id, run.wait.owner) == ("scope:delete:1", "user_42")
        assert run.fact(DENIED_FACT_PREFIX + "delete:1") is not None
        if answer == "denied":
            kit.decide(run_id, approved=False)
            kit.settle(timers=False)
        else:
            kit.advance(TIMEOUT + 1)
            kit.settle(timers=False)
        assert kit.status(run_id) is RunStatus.NEEDS_ATTENTION
        assert (kit.executions("notes.write"), kit.executions("notes.delete")) == (1, 0)
        assert _approvals_asked(kit, run_id) == 1
        assert kit.snapshot(run_id).action("delete:1") is None
        assert kit.check(settled=False) == []
