"""The dependency-upgrade agent: change files, CI, read the failure, fix, CI again, approval, merge request.

``decide`` is a pure function of the run's structured state: the goal, the model's
recorded proposals (facts ``proposal:<purpose>:<n>``), tool receipts (facts
``receipt:<action>``), CI results delivered by webhook (facts ``ci_result:<id>``) and
approval decisions. Re-running it after any crash gives the same next step, so the
model is asked only for what is still open, and no effect is requested twice.

Logical actions: ``branch``, ``commit:<round>``, ``ci:<round>`` (idempotent writes: the
forge honours idempotency keys) and ``merge_request`` (a non-idempotent write gated by
an approval bound to the hash of the exact request, reconciled by idempotency key).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from longrun.domain import (
    AskModel,
    CallTool,
    Complete,
    Decision,
    DecisionContext,
    Fail,
    FrozenMap,
    RunSnapshot,
    WaitForEvent,
    WaitForUser,
    WakeReason,
    freeze,
    request_hash,
    thaw,
)
from longrun.domain.action import ActionStatus, UNRECONCILED
from longrun_dependency_upgrade.sample_project import FIX_FILES, PLAN_FILES

KIND = "dependency_upgrade"
MR_TOOL = "forge.create_merge_request"
MR_TOOL_VERSION = "1"
CI_TIMEOUT = 3600.0
APPROVAL_TIMEOUT = 3 * 24 * 3600.0
MAX_ROUNDS = 3
FORGE = "forge"
"""The webhook provider whose events end this kind's waits (``longrun_dependency_upgrade.webhooks``)."""
WAIT_PROVIDER_PATCH = "wait-names-its-provider"
"""Waits decided since this patch name the forge as their provider; a history recorded before it
replays through waits that name none (its runs' waits got the forge from the database migration)."""


def _fact(state: RunSnapshot, key: str) -> Any:
    fact = state.fact(key)
    return None if fact is None else thaw(fact.value)


def _confirmed(state: RunSnapshot, logical_action: str) -> bool:
    record = state.action(logical_action)
    return record is not None and record.status is ActionStatus.CONFIRMED


def _files_for_round(state: RunSnapshot, round_: int) -> dict[str, Any] | None:
    proposal = _fact(state, "proposal:plan:1" if round_ == 1 else f"proposal:fix:{round_ - 1}")
    return None if proposal is None else proposal["args"]


def merge_request_args(state: RunSnapshot, sha: str) -> dict[str, Any]:
    goal = thaw(state.goal)
    return {"repo": goal["repo"], "source_branch": goal["branch"], "sha": sha,
            "title": f"Upgrade {goal['package']} to {goal['to']}",
            "description": f"Automated upgrade of {goal['package']} to {goal['to']}; CI passed on {sha}."}


class DependencyUpgrade:
    kind = KIND

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        goal = thaw(state.goal)
        repo, branch = goal["repo"], goal["branch"]
        if _fact(state, "proposal:plan:1") is None:
            return AskModel(purpose="plan")
        if not _confirmed(state, "branch"):
            return CallTool(tool="forge.create_branch", logical_action="branch",
                            args=freeze({"repo": repo, "name": branch, "from_ref": "main"}))
        round_ = 1
        while True:
            files = _files_for_round(state, round_)
            if files is None:
                return AskModel(purpose="fix")
            if not _confirmed(state, f"commit:{round_}"):
                return CallTool(tool="forge.create_commit", logical_action=f"commit:{round_}",
                                args=freeze({"repo": repo, "branch": branch, **files}))
            sha = _fact(state, f"receipt:commit:{round_}")["sha"]
            if not _confirmed(state, f"ci:{round_}"):
                return CallTool(tool="forge.start_ci_run", logical_action=f"ci:{round_}",
                                args=freeze({"repo": repo, "sha": sha}))
            ci_id = _fact(state, f"receipt:ci:{round_}")["id"]
            result = _fact(state, f"ci_result:{ci_id}")
            if result is None:
                if state.last_wake is not None and state.last_wake.reason is WakeReason.DEADLINE:
                    return Fail(reason=f"CI run {ci_id} did not report within {CI_TIMEOUT:.0f}s")
                return WaitForEvent(kind="ci", correlation_key=ci_key(repo, ci_id), deadline=ctx.now + CI_TIMEOUT,
                                    provider=_provider(ctx))
            if result["status"] == "passed":
                break
            if round_ >= MAX_ROUNDS:
                return Fail(reason=f"CI still failing after {MAX_ROUNDS} rounds")
            round_ += 1
        head = _fact(state, f"head:{branch}")
        if head is not None and head["sha"] != sha:
            # The branch moved under us (someone pushed): what gets merged is the new head,
            # so it needs its own green CI and its own approval.
            sha = head["sha"]
            checked = self._ci(state, ctx, repo, sha, f"ci:head:{sha[:12]}")
            if checked is not None:
                return checked
        return self._merge(state, ctx, sha)

    def _ci(self, state: RunSnapshot, ctx: DecisionContext, repo: str, sha: str, action: str) -> Decision | None:
        """CI for one commit: start it, wait for its result; None once it passed."""
        if not _confirmed(state, action):
            return CallTool(tool="forge.start_ci_run", logical_action=action, args=freeze({"repo": repo, "sha": sha}))
        ci_id = _fact(state, f"receipt:{action}")["id"]
        result = _fact(state, f"ci_result:{ci_id}")
        if result is None:
            if state.last_wake is not None and state.last_wake.reason is WakeReason.DEADLINE:
                return Fail(reason=f"CI run {ci_id} did not report within {CI_TIMEOUT:.0f}s")
            return WaitForEvent(kind="ci", correlation_key=ci_key(repo, ci_id), deadline=ctx.now + CI_TIMEOUT,
                                provider=_provider(ctx))
        if result["status"] != "passed":
            return Fail(reason=f"CI failed on {sha}, which was pushed to the branch by someone else")
        return None

    def _merge(self, state: RunSnapshot, ctx: DecisionContext, sha: str) -> Decision:
        args = merge_request_args(state, sha)
        approved_hash = request_hash(MR_TOOL, MR_TOOL_VERSION, args=args)
        approval_id = f"merge:{sha[:12]}"
        decision = _fact(state, f"approval.{approval_id}")
        if decision is None or decision["approved_hash"] != approved_hash:
            if state.last_wake is not None and state.last_wake.reason is WakeReason.DEADLINE and decision is None:
                return Fail(reason=f"approval {approval_id} was not given before its deadline")
            goal = thaw(state.goal)
            return WaitForUser(approval_id=approval_id, owner=goal["owner"],
                               deadline=ctx.now + APPROVAL_TIMEOUT, approved_hash=approved_hash,
                               summary=f"merge {args['source_branch']} at {sha} into main: {args['title']}",
                               invalidated_by=f"branch/{goal['repo']}/{goal['branch']}",
                               provider=_provider(ctx))
        if not decision["approved"]:
            return Fail(reason=f"merge denied by {decision['decided_by']}")
        if not _confirmed(state, "merge_request"):
            return CallTool(tool=MR_TOOL, logical_action="merge_request", args=freeze(args),
                            approval_id=approval_id)
        return Complete(evidence=freeze({
            "sha": sha, "approval_id": approval_id, "approved_hash": approved_hash,
            "merge_request": _fact(state, "receipt:merge_request"),
            "ci": [_fact(state, f.key) for f in state.facts if f.key.startswith("ci_result:")],
        }))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        """Completion is judged on recorded evidence, never on the model's say-so."""
        unmet = []
        facts = thaw(evidence)
        ci = facts.get("ci") or []
        if not ci or ci[-1].get("status") != "passed" or ci[-1].get("sha") != facts.get("sha"):
            unmet.append("the last CI run on the merged commit passed")
        approval = _fact(state, f"approval.{facts.get('approval_id')}")
        if not approval or not approval["approved"] or approval["approved_hash"] != facts.get("approved_hash"):
            unmet.append("an approval of exactly this merge request")
        mr = state.action("merge_request")
        if mr is None or mr.status is not ActionStatus.CONFIRMED or mr.request_hash != facts.get("approved_hash"):
            unmet.append("the approved merge request exists")
        if any(a.status in UNRECONCILED for a in state.actions):
            unmet.append("no action with an unknown outcome")
        return tuple(unmet)


def ci_key(repo: str, ci_run_id: Any) -> str:
    return f"ci/{repo}/{ci_run_id}"


def allowed_actions(state: RunSnapshot, purpose: str) -> Sequence[str]:
    return ("edit_files",) if purpose in ("plan", "fix") else ()


def model_script(goal: Mapping[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    """What the scripted model answers, as edits of the forge's sample application: the plan bumps the
    pin and the checkout but misses the refund, whose test then fails; the fix repairs it."""
    return {
        "plan": [{"action": "edit_files", "rationale": "bump payment-sdk and follow the 5.x API (create_charge)",
                  "args": {"message": "Upgrade payment-sdk to 5.0.0", "files": dict(PLAN_FILES)}}],
        "fix": [{"action": "edit_files",
                 "rationale": "test_refund_gives_the_amount_back fails: payments/refunds.py still calls the "
                              "removed Client.charge; 5.x refunds with Client.create_refund",
                 "args": {"message": "Refund through Client.create_refund (payment-sdk 5.x)",
                          "files": dict(FIX_FILES)}}],
    }


def _provider(ctx: DecisionContext) -> str | None:
    return FORGE if ctx.patched(WAIT_PROVIDER_PATCH) else None
