"""The dependency-upgrade agent written code-first (version 2) under the testing kit: it completes with
one merge request, survives a worker killed at every ledger point, and a run version 1 started before
version 2 was shipped finishes on version 1 while new runs take version 2."""

from __future__ import annotations

from longrun.authoring import RunKind
from longrun.domain import ActionStatus, RunSnapshot, RunStatus
from longrun.model import ScriptedModel
from longrun.testing.kit import Kit
from longrun_dependency_upgrade import CODE_FIRST_VERSIONS
from longrun_dependency_upgrade import workflow as dependency_upgrade
from longrun_dependency_upgrade import workflow_code_first
from longrun_dependency_upgrade.forge_client import ForgeClient
from longrun_dependency_upgrade.tools import forge_tools
from tests.unit.workflows.test_dependency_upgrade import (
    GOAL,
    MR,
    ci_reports,
    crashed_everywhere,
    forge,
    upgrade,
    upgrade_kind,
)


def code_first_kind() -> RunKind:
    return RunKind(dependency_upgrade.KIND, CODE_FIRST_VERSIONS, workflow_code_first.upgrade,
                   forge_tools(ForgeClient("http://forge.invalid")), dependency_upgrade.allowed_actions,
                   input_schema=workflow_code_first.UpgradeInput)


def kit(kind: RunKind | None = None) -> Kit:
    return Kit(kind or code_first_kind(), answers=forge(), model=ScriptedModel(dependency_upgrade.model_script()))


def test_the_code_first_upgrade_completes_with_one_merge_request_and_version_1s_action_names() -> None:
    with kit() as k:
        upgrade(k)
        (run_id,) = k.run_ids()
        run = k.snapshot(run_id)
        assert run.status is RunStatus.COMPLETED, run.terminal_reason
        assert run.versions.workflow == "2"
        assert [a.logical_action for a in run.actions] == ["branch", "commit:1", "ci:1", "merge_request"]
        assert all(a.status is ActionStatus.CONFIRMED for a in run.actions)
        assert k.executions(MR) == 1 and k.check() == []


def test_a_failed_ci_round_asks_the_model_for_a_fix_and_commits_again() -> None:
    with kit() as k:
        run_id = k.start(GOAL)
        reports = ["failed"]  # the first CI run fails, every later one passes

        def people(kit_: Kit, run: RunSnapshot) -> bool:
            status = reports.pop() if reports and run.status is RunStatus.WAITING_EVENT else "passed"
            return bool(ci_reports(status)(kit_, run))

        k.settle(people=people)
        run = k.snapshot(run_id)
        assert run.status is RunStatus.COMPLETED, run.terminal_reason
        assert [a.logical_action for a in run.actions] == ["branch", "commit:1", "ci:1", "commit:2", "ci:2",
                                                           "merge_request"]


def test_a_worker_killed_at_every_ledger_point_still_makes_one_merge_request() -> None:
    runs, elapsed = crashed_everywhere(code_first_kind())
    assert elapsed < 2.0, f"{runs} crashed runs took {elapsed:.2f}s of CPU"


def test_a_run_started_on_version_1_finishes_on_it_once_version_2_ships_and_new_runs_take_2() -> None:
    with kit(upgrade_kind()) as k:
        old = k.start(GOAL)
        k.settle(people=lambda kit_, run: run.status is RunStatus.WAITING_EVENT and ci_reports()(kit_, run),
                 timers=False)
        assert k.status(old) is RunStatus.WAITING_USER
        k.deploy(code_first_kind())
        new = k.start({**GOAL, "branch": "upgrade-payment-sdk-2"})
        k.settle(people=ci_reports())
        assert k.status(old) is RunStatus.COMPLETED and k.snapshot(old).versions.workflow == "1"
        assert not any(p.startswith("longrun.await:") for p in k.snapshot(old).patches)
        assert k.status(new) is RunStatus.COMPLETED and k.snapshot(new).versions.workflow == "2"
        assert k.executions(MR) == 2 and k.check() == []
