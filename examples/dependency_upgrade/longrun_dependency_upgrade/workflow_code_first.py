"""The dependency-upgrade agent written code-first (workflow version 2): the same story as ``workflow``'s
``decide`` (plan, branch, commit, CI by webhook, a fix per failed round, an approval bound to the exact
merge request, the merge request), as one async function whose awaits the engine journals.

Its calls keep the names of version 1's logical actions (``branch``, ``commit:<round>``, ``ci:<round>``,
``ci:head:<sha>``, ``merge_request``), so their idempotency keys, and what operators look for in the
ledger, are the same. A push to the branch while the approval is asked voids it (``ApprovalVoided``):
the new head gets its own green CI and its own approval.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from longrun.author import ApprovalVoided, Context, RunSnapshot, WaitTimedOut, freeze, request_hash, workflow
from longrun_dependency_upgrade.workflow import (
    APPROVAL_TIMEOUT,
    CI_TIMEOUT,
    FORGE,
    KIND,
    MAX_ROUNDS,
    MR_TOOL,
    MR_TOOL_VERSION,
    DependencyUpgrade,
    ci_key,
)


class UpgradeInput(BaseModel):
    repo: str
    branch: str
    package: str
    to: str
    owner: str


class UpgradeOutput(BaseModel):
    """The evidence the run completes with, judged as version 1 judges its evidence."""

    sha: str
    approval_id: str
    approved_hash: str
    merge_request: dict[str, Any]
    ci: list[dict[str, Any]]


class UpgradeFailed(Exception):
    """The upgrade cannot go on: the run fails with this reason."""


def merge_request_args(goal: UpgradeInput, sha: str) -> dict[str, Any]:
    return {"repo": goal.repo, "source_branch": goal.branch, "sha": sha,
            "title": f"Upgrade {goal.package} to {goal.to}",
            "description": f"Automated upgrade of {goal.package} to {goal.to}; CI passed on {sha}."}


async def _ci(ctx: Context, goal: UpgradeInput, sha: str, name: str) -> dict[str, Any]:
    """CI for one commit: started, then its result by webhook."""
    run = await ctx.call_tool("forge.start_ci_run", {"repo": goal.repo, "sha": sha}, name=name)
    try:
        return await ctx.wait_event("ci", ci_key(goal.repo, run["id"]), fact=f"ci_result:{run['id']}",
                                    timeout=CI_TIMEOUT, provider=FORGE)
    except WaitTimedOut:
        raise UpgradeFailed(f"CI run {run['id']} did not report within {CI_TIMEOUT:.0f}s") from None


async def _green_commit(ctx: Context, goal: UpgradeInput, ci: list[dict[str, Any]]) -> str:
    """Commit the plan, then a fix per failed CI round, until CI passes; the passing commit's sha."""
    files = (await ctx.ask_model("plan"))["args"]
    await ctx.call_tool("forge.create_branch", {"repo": goal.repo, "name": goal.branch, "from_ref": "main"},
                        name="branch")
    for round_ in range(1, MAX_ROUNDS + 1):
        commit = await ctx.call_tool("forge.create_commit", {"repo": goal.repo, "branch": goal.branch, **files},
                                     name=f"commit:{round_}")
        result = await _ci(ctx, goal, commit["sha"], f"ci:{round_}")
        ci.append(result)
        if result["status"] == "passed":
            return str(commit["sha"])
        if round_ < MAX_ROUNDS:
            files = (await ctx.ask_model("fix"))["args"]
    raise UpgradeFailed(f"CI still failing after {MAX_ROUNDS} rounds")


async def upgrade_dependency(goal: UpgradeInput, ctx: Context) -> UpgradeOutput:
    ci: list[dict[str, Any]] = []
    sha = await _green_commit(ctx, goal, ci)
    while True:
        args = merge_request_args(goal, sha)
        approved_hash = request_hash(MR_TOOL, MR_TOOL_VERSION, args=args)
        approval_id = f"merge:{sha[:12]}"
        try:
            decided = await ctx.approval(
                approval_id, owner=goal.owner, approved_hash=approved_hash, timeout=APPROVAL_TIMEOUT,
                summary=f"merge {goal.branch} at {sha} into main: {args['title']}",
                invalidated_by=f"branch/{goal.repo}/{goal.branch}", invalidated_fact=f"head:{goal.branch}",
                provider=FORGE)
        except WaitTimedOut:
            raise UpgradeFailed(f"approval {approval_id} was not given before its deadline") from None
        except ApprovalVoided as voided:
            # The branch moved under us (someone pushed): what gets merged is the new head, so it needs its
            # own green CI and its own approval.
            head = (voided.fact or {}).get("sha", sha)
            if head != sha:
                sha = head
                result = await _ci(ctx, goal, sha, f"ci:head:{sha[:12]}")
                ci.append(result)
                if result["status"] != "passed":
                    raise UpgradeFailed(f"CI failed on {sha}, which was pushed to the branch by someone else") from None
            continue
        if not decided["approved"]:
            raise UpgradeFailed(f"merge denied by {decided['decided_by']}")
        merge_request = await ctx.call_tool(MR_TOOL, args, name="merge_request", approval_id=approval_id)
        return UpgradeOutput(sha=sha, approval_id=approval_id, approved_hash=approved_hash,
                             merge_request=merge_request, ci=ci)


def accept(state: RunSnapshot, output: UpgradeOutput) -> tuple[str, ...]:
    """Version 1's acceptance, on the same evidence: CI passed on the merged commit, an approval of exactly
    this merge request, the approved merge request exists, no action in doubt."""
    return DependencyUpgrade().accept(state, freeze(output.model_dump(mode="json")))


upgrade = workflow(KIND, input=UpgradeInput, output=UpgradeOutput, accept=accept)(upgrade_dependency)
