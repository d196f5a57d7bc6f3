"""A call against the run's scope: refused before anything is prepared, or let through under an
approval that still holds."""

from __future__ import annotations

from collections.abc import Mapping

from longrun.app.worker.commit import Step
from longrun.app.worker.far_side import FarSide
from longrun.authoring import RunKind, Tool
from longrun.domain import (
    APPROVAL_FACT_PREFIX,
    DENIED_FACT_PREFIX,
    RunSnapshot,
    RunStatus,
    WaitForUser,
    refusal,
    revalidated,
    wait_for,
)
from longrun.domain import events as ev
from longrun.ports.runs import StoredRun

SCOPE_APPROVAL_PREFIX = "scope:"
"""The approval a call outside the run's scope waits for is ``scope:<logical_action>``."""


def approves(run: RunSnapshot, approval_id: str, requested: str) -> bool:
    """Whether the run holds a person's approval ``approval_id`` of exactly the request ``requested``."""
    fact = run.fact(APPROVAL_FACT_PREFIX + approval_id)
    decision = fact.value if fact is not None else None
    return (isinstance(decision, Mapping) and decision.get("approved") is True
            and decision.get("approved_hash") == requested)


async def scope_check(step: Step, run: RunSnapshot, kind: RunKind, tool: Tool, name: str, resource: str | None,
                      requested: str, approval_id: str | None) -> tuple[str | None, str | None]:
    """(Why the call is refused, or None; the approval it is prepared under). Pure unless the call
    is approved: an approval was given under the tenant policy of its time, so an approved call
    reads the tenant's current policy and, if it changed since the run's scope was set, is
    checked against the scope narrowed by it too; a person's exception to the scope does not
    survive any policy change."""
    scope = run.permissions
    assert scope is not None
    why = refusal(scope, tool.name, resource)
    exception = SCOPE_APPROVAL_PREFIX + name
    excepted = why is not None and kind.scope_approval is not None and approves(run, exception, requested)
    if why is not None and not excepted:
        return why, None
    if approval_id is None and not excepted:
        return None, None
    # The ledger binds the call to decide's own approval; a scope exception is checked here.
    approval_id = approval_id if approval_id is not None else exception
    policy = await step.store.tenant_policy(run.tenant_id)
    current = revalidated(scope, policy)
    if current is scope:
        return None, approval_id
    assert policy is not None
    again = why if excepted else refusal(current, tool.name, resource)
    if again is None:
        return None, approval_id
    voided = exception if excepted else approval_id
    return (f"approval {voided!r} no longer holds: the tenant policy changed from v{scope.policy_version} "
            f"to v{policy.version}; {again}"), None


async def refuse(far: FarSide, step: Step, stored: StoredRun, kind: RunKind, tool: Tool, name: str,
                 resource: str | None, requested: str, why: str) -> None:
    """The refusal on record (``run.permission_denied``), then NEEDS_ATTENTION; or, where the run
    kind lets a person approve a call outside the scope, a wait for that approval, asked once."""
    run = stored.snapshot
    asked = run.fact(DENIED_FACT_PREFIX + name) is not None
    denied = step.event(stored, ev.PermissionDenied, logical_action=name, tool=tool.name, resource=resource,
                        request_hash=requested, reason=why)
    ask = kind.scope_approval
    if ask is None or asked:
        then = step.event(stored, ev.RunStatusChanged, offset=2, to=RunStatus.NEEDS_ATTENTION,
                          reason=f"permission denied: {why}")
    else:
        ctx = far.context()
        status, wait = wait_for(WaitForUser(approval_id=SCOPE_APPROVAL_PREFIX + name, owner=ask.owner,
                                            deadline=ctx.now + ask.timeout, approved_hash=requested,
                                            summary=f"allow {name} outside the run's scope: {why}"), ctx)
        then = step.event(stored, ev.WaitStarted, offset=2, status=status, wait=wait)
    await step.commit(stored, [denied, then], release=True)
