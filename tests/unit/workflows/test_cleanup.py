"""Cleanup at closure under the testing kit: a finished run's cleanup steps run through the ledger in
the memory world, failures are retried under the kit's clock and alerted once, and how the run ended
never changes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from longrun.authoring import CleanupStep, RunKind, Tool, ToolResult
from longrun.domain import EffectKind, RetryPolicy, RunSnapshot, RunStatus, cleanup
from longrun.domain import events as ev
from longrun.testing.kit import Kit
from longrun.workflows import STEPS_VERSIONS, steps

RELEASE = "workspace.release"
REVOKE = "credential.revoke"


class WorkspaceArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    workspace: str


async def _unused(args: Mapping[str, Any], key: str, token: int) -> ToolResult:
    raise AssertionError("the kit calls its far side")


async def _no_lookup(key: str) -> ToolResult | None:
    raise AssertionError("the kit looks up on its far side")


def _workspace(run: RunSnapshot) -> dict[str, Any]:
    return {"workspace": f"ws-{run.run_id}"}


KIND = RunKind(
    steps.KIND, STEPS_VERSIONS, steps.Steps(),
    {steps.ECHO.name: steps.ECHO,
     RELEASE: Tool(RELEASE, "1", EffectKind.IDEMPOTENT_WRITE, WorkspaceArgs, _unused),
     REVOKE: Tool(REVOKE, "1", EffectKind.NON_IDEMPOTENT_WRITE, WorkspaceArgs, _unused, lookup=_no_lookup)},
    cleanup=(CleanupStep("release_workspace", RELEASE, _workspace),
             CleanupStep("revoke_credential", REVOKE, _workspace)),
    cleanup_retry=RetryPolicy(initial_interval=2.0, maximum_interval=8.0, jitter=0.0),
)


def _cleanup_events(kit: Kit, run_id: str) -> list[tuple[str, str, int]]:
    return [(e.step, e.outcome, e.attempt) for e in kit.world.store.history(run_id) if isinstance(e, ev.CleanupRecorded)]


def _alerts(kit: Kit, run_id: str) -> list[str]:
    return [row["action"] for row in kit.world.audit_log if row["target"] == run_id and row["action"].startswith("alert.")]


def test_a_cleanup_failing_twice_is_retried_alerted_once_and_resolved_and_the_run_stays_completed() -> None:
    with Kit(KIND) as kit:
        kit.far_side.arm("unavailable")
        kit.far_side.arm("unavailable")
        run_id = kit.start({"steps": 0})
        started = kit.world.clock()
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED
        assert _cleanup_events(kit, run_id) == [("release_workspace", "failed", 1), ("release_workspace", "failed", 2),
                                                ("release_workspace", "done", 3), ("revoke_credential", "done", 3)]
        # retried after 2 s, then 4 s, of the kit's clock
        assert 6.0 <= kit.world.clock() - started < 7.0
        assert _alerts(kit, run_id) == ["alert.cleanup_failed", "alert.resolved"]
        assert kit.executions(RELEASE) == 1 and kit.executions(REVOKE) == 1
        assert {r.logical_action: r.status for r in kit.world.store.for_run(run_id)} == {
            "cleanup:release_workspace": "CONFIRMED", "cleanup:revoke_credential": "CONFIRMED"}
        assert kit.check() == []


def test_a_non_idempotent_step_cut_short_after_acting_is_found_by_key_not_sent_again() -> None:
    with Kit(KIND) as kit:
        kit.far_side.arm("ok")  # the workspace is released
        kit.far_side.arm("timeout_after_acting")  # the credential is revoked, the answer lost
        run_id = kit.start({"steps": 0})
        kit.settle()
        assert _cleanup_events(kit, run_id)[1:] == [("revoke_credential", "failed", 1),
                                                    ("revoke_credential", "done", 2)]
        assert kit.executions(REVOKE) == 1 and kit.check() == []


def test_a_terminated_run_runs_no_cleanup_and_a_cancelled_one_does() -> None:
    with Kit(KIND) as kit:
        terminated, cancelled = kit.start({"steps": 2}), kit.start({"steps": 2})
        kit.world.operate(terminated, "terminate")
        kit.world.operate(cancelled, "cancel")
        kit.settle()
        assert kit.status(terminated) is RunStatus.TERMINATED and kit.status(cancelled) is RunStatus.CANCELLED
        assert _cleanup_events(kit, terminated) == [] and terminated not in kit.world.store.cleanups
        assert [outcome for _, outcome, _ in _cleanup_events(kit, cancelled)] == ["done", "done"]
        assert kit.executions(RELEASE) == 1 and kit.check() == []


def test_a_step_with_nothing_to_release_is_skipped() -> None:
    kind = RunKind(KIND.name, KIND.versions, KIND.workflow, KIND.tools,
                   cleanup=(CleanupStep("release_workspace", RELEASE, lambda run: None),))
    with Kit(kind) as kit:
        run_id = kit.start({"steps": 1})
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED and _cleanup_events(kit, run_id) == []
        assert kit.world.store.cleanups[run_id].done_at is not None and kit.executions(RELEASE) == 0


def test_a_kind_refuses_a_cleanup_step_calling_a_tool_it_does_not_have() -> None:
    with pytest.raises(ValueError, match=f"cleanup step 'release_workspace' calls '{RELEASE}', which is not one"):
        RunKind(KIND.name, KIND.versions, KIND.workflow, {steps.ECHO.name: steps.ECHO},
                cleanup=(CleanupStep("release_workspace", RELEASE, _workspace),))


def test_cleanup_keys_are_one_per_step_of_a_run() -> None:
    assert cleanup.key("r1", "a") == cleanup.key("r1", "a") != cleanup.key("r1", "b") != cleanup.key("r2", "a")


def test_a_kind_refuses_a_non_idempotent_cleanup_tool_it_could_not_look_up() -> None:
    blind = Tool(REVOKE, "1", EffectKind.NON_IDEMPOTENT_WRITE, WorkspaceArgs, _unused)
    with pytest.raises(ValueError, match="a non-idempotent write without a lookup"):
        RunKind(KIND.name, KIND.versions, KIND.workflow, {REVOKE: blind},
                cleanup=(CleanupStep("revoke_credential", REVOKE, _workspace),))


def test_the_cleanup_rows_of_a_kind_with_no_cleanup_steps_are_dropped() -> None:
    plain = RunKind(KIND.name, KIND.versions, KIND.workflow, KIND.tools)
    with Kit(plain) as kit:
        run_id = kit.start({"steps": 1})
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED and kit.world.store.cleanups == {}
        assert _cleanup_events(kit, run_id) == [] and kit.check() == []


def test_a_step_whose_arguments_cannot_be_read_fails_alerted_and_is_retried() -> None:
    reads = []

    def once_broken(run: RunSnapshot) -> dict[str, Any]:
        reads.append(run.run_id)
        if len(reads) == 1:
            raise KeyError("workspace")
        return _workspace(run)

    kind = RunKind(KIND.name, KIND.versions, KIND.workflow, KIND.tools,
                   cleanup=(CleanupStep("release_workspace", RELEASE, once_broken),), cleanup_retry=KIND.cleanup_retry)
    with Kit(kind) as kit:
        run_id = kit.start({"steps": 0})
        kit.settle()
        assert _cleanup_events(kit, run_id) == [("release_workspace", "failed", 1), ("release_workspace", "done", 2)]
        assert _alerts(kit, run_id) == ["alert.cleanup_failed", "alert.resolved"] and kit.check() == []
