"""The dependency-upgrade agent under the testing kit: the real engine in memory, a scripted forge
and model, CI by webhook, the owner's approval, simulated time, and a crash at every ledger point."""

from __future__ import annotations

import gc
import time
from collections.abc import Mapping
from typing import Any

import pytest

from longrun.app.worker import tool_call
from longrun.authoring import RunKind, ToolResult
from longrun_dependency_upgrade.forge_client import ForgeClient
from longrun.domain import ActionStatus, RecoveryPolicy, RunSnapshot, RunStatus
from longrun.model import ScriptedModel
from longrun.testing.kit import Kit, every_crash
from longrun_dependency_upgrade import VERSIONS as DEPENDENCY_UPGRADE_VERSIONS
from longrun_dependency_upgrade import workflow as dependency_upgrade
from longrun_dependency_upgrade.tools import forge_tools

GOAL = {"repo": "acme/payments", "branch": "upgrade-payment-sdk", "package": "payment-sdk", "to": "5.0.0",
        "owner": "alice"}
MR = dependency_upgrade.MR_TOOL


def upgrade_kind() -> RunKind:
    # The tools' declarations (schemas, effect kinds, lookups): the kit routes their calls to its far side.
    tools = forge_tools(ForgeClient("http://forge.invalid"))
    return RunKind(dependency_upgrade.KIND, DEPENDENCY_UPGRADE_VERSIONS, dependency_upgrade.DependencyUpgrade(),
                   tools, dependency_upgrade.allowed_actions)


def forge() -> dict[str, Any]:
    """A forge that makes what it is asked for, one object per idempotency key."""
    def branch(args: Mapping[str, Any], key: str) -> ToolResult:
        return ToolResult(args["name"], {"name": args["name"], "head_sha": "0" * 40})

    def commit(args: Mapping[str, Any], key: str) -> ToolResult:
        sha = f"{abs(hash(key)):040x}"[:40]
        return ToolResult(sha, {"sha": sha, "branch": args["branch"]})

    def ci(args: Mapping[str, Any], key: str) -> ToolResult:
        return ToolResult(f"ci-{key[:8]}", {"id": f"ci-{key[:8]}", "sha": args["sha"]})

    def merge_request(args: Mapping[str, Any], key: str) -> ToolResult:
        return ToolResult("mr-1", {"id": "mr-1", "number": 7, "url": "https://forge.invalid/mr/7"})

    return {"forge.create_branch": branch, "forge.create_commit": commit, "forge.start_ci_run": ci,
            MR: merge_request}


def ci_reports(status: str = "passed"):  # type: ignore[no-untyped-def]
    """People: CI reports on the run it waits for, the owner approves what it asks."""
    def answer(kit: Kit, run: RunSnapshot) -> bool:
        wait = run.wait
        if run.status is RunStatus.WAITING_EVENT and wait is not None and wait.correlation_key:
            ci_id = wait.correlation_key.rsplit("/", 1)[1]
            sha = next(f.value["sha"] for f in run.facts if f.key.startswith("receipt:ci")
                       and f.value["id"] == ci_id)
            kit.event(wait.correlation_key, f"ci_result:{ci_id}", {"status": status, "sha": sha})
            return True
        if run.status is RunStatus.WAITING_USER:
            kit.decide(run.run_id)
            return True
        return False
    return answer


def kit(**options: Any) -> Kit:
    return Kit(upgrade_kind(), answers=forge(), model=ScriptedModel(dependency_upgrade.model_script()), **options)


def upgrade(k: Kit) -> None:
    k.start(GOAL)
    k.settle(people=ci_reports())


def test_an_upgrade_completes_with_one_merge_request_and_a_clean_ledger() -> None:
    with kit(duplicate_deliveries=True) as k:
        upgrade(k)
        (run_id,) = k.run_ids()
        run = k.snapshot(run_id)
        assert run.status is RunStatus.COMPLETED, run.terminal_reason
        assert [a.logical_action for a in run.actions] == ["branch", "commit:1", "ci:1", "merge_request"]
        assert all(a.status is ActionStatus.CONFIRMED for a in run.actions)
        assert k.executions(MR) == 1
        assert k.check() == []


def test_no_approval_before_the_deadline_fails_the_run_when_its_timer_fires() -> None:
    with kit() as k:
        run_id = k.start(GOAL)
        k.settle(people=lambda kit_, run: run.status is RunStatus.WAITING_EVENT and ci_reports()(kit_, run),
                 timers=False)
        assert k.status(run_id) is RunStatus.WAITING_USER
        k.advance(dependency_upgrade.APPROVAL_TIMEOUT - 60)  # the CI wait's deadline fires, for nothing
        k.settle(timers=False)
        assert k.status(run_id) is RunStatus.WAITING_USER
        k.advance(120)
        k.settle()
        assert k.status(run_id) is RunStatus.FAILED
        assert "approval" in (k.snapshot(run_id).terminal_reason or "")
        assert k.executions(MR) == 0 and k.check() == []


@pytest.mark.parametrize("fault", ["unavailable", "timeout_after_acting"])
def test_a_merge_request_that_failed_or_timed_out_after_acting_is_made_exactly_once(fault: str) -> None:
    with kit() as k:
        run_id = k.start(GOAL)

        def people(kit_: Kit, run: RunSnapshot) -> bool:
            if run.status is RunStatus.WAITING_USER:
                kit_.far_side.arm(fault)  # the merge request's call, right after the approval
            return bool(ci_reports()(kit_, run))

        k.settle(people=people)
        assert k.status(run_id) is RunStatus.COMPLETED
        assert k.executions(MR) == 1
        assert k.check() == []


def crashed_everywhere(kind: RunKind) -> tuple[int, float]:
    """An upgrade on ``kind`` with its worker killed at every ledger point: each run completed with one
    merge request and a clean ledger. How many runs, and the CPU seconds they took (what the kit costs,
    whatever else the machine runs). What earlier tests left on the heap is frozen first, so the
    collector does not walk it on the kit's time: inside the whole suite the same runs once took
    1.05 s, against 0.22-0.33 s alone, on a machine half as fast as the one the bound was set on."""
    gc.collect()
    gc.freeze()
    try:
        started = time.process_time()
        outcomes = every_crash(kind, upgrade, answers=forge(), model=ScriptedModel(dependency_upgrade.model_script()))
        elapsed = time.process_time() - started
    finally:
        gc.unfreeze()
    assert {o.point for o in outcomes} == {"worker.before_tool_request", "worker.after_tool_response_before_record",
                                           "worker.after_commit", "worker.before_completion"}
    for o in outcomes:
        (run_id,) = o.kit.run_ids()
        assert o.kit.status(run_id) is RunStatus.COMPLETED, (o.point, o.nth, o.kit.snapshot(run_id).terminal_reason)
        assert o.kit.executions(MR) == 1, (o.point, o.nth)
        assert o.kit.check() == [], (o.point, o.nth)
    return len(outcomes), elapsed


def test_a_worker_killed_at_every_ledger_point_still_makes_one_merge_request() -> None:
    runs, elapsed = crashed_everywhere(upgrade_kind())
    assert elapsed < 2.0, f"{runs} crashed runs took {elapsed:.2f}s of CPU"


def test_the_crash_test_catches_an_engine_that_blindly_retries_a_merge_request(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A mutant worker that re-sends a SUBMITTED non-idempotent write after a crash instead of
    reconciling it: the worker killed between the forge's answer and its record makes two."""
    monkeypatch.setattr(tool_call, "recovery_policy", lambda effect: RecoveryPolicy.RERUN)
    outcomes = every_crash(upgrade_kind(), upgrade, answers=forge(),
                           model=ScriptedModel(dependency_upgrade.model_script()))
    caught = [(o.point, o.kit.executions(MR)) for o in outcomes if o.kit.check()]
    assert ("worker.after_tool_response_before_record", 2) in caught
