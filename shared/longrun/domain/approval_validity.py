"""Approval validity: a decision is good for as long as its approval declared (seed 001: on resume,
re-check the approval's validity among the rest). Pure.

Responsibility:
- A decision on a wait that declares ``valid_for`` records when it expires with the decision, in its
  fact ``approval.<approval_id>`` (``APPROVAL_VALID_UNTIL``: ``lifecycle``).
- ``expired``: where the run resumes, before ``decide`` reads the decisions: the decisions whose time
  passed and that no call has used yet, each as a ``run.approval_expired``.
- folding ``run.approval_expired`` withdraws the decision's fact, so ``decide`` finds none and asks
  again (a new approval request); the decision itself stays in the history, the expiry beside it.

Invariants: a decision a call was prepared under (``ActionRecord.approval_id``) never expires: that
call was approved while the decision was valid, and a submitted write cannot be taken back.
"""

from __future__ import annotations

from collections.abc import Mapping

from longrun.domain import events as ev
from longrun.domain.lifecycle import Handler, reject
from longrun.domain.run import RunStatus
from longrun.domain.snapshot import APPROVAL_FACT_PREFIX, APPROVAL_VALID_UNTIL, RunSnapshot


def expired(run: RunSnapshot, *, now: float, seq: int, at: float) -> list[ev.ApprovalExpired]:
    """The decisions of ``run`` whose validity ended by ``now`` and that no call was prepared under,
    as ``run.approval_expired`` events numbered from ``seq``."""
    used = {a.approval_id for a in run.actions if a.approval_id is not None}
    found: list[ev.ApprovalExpired] = []
    for fact in run.facts:
        if not fact.key.startswith(APPROVAL_FACT_PREFIX) or not isinstance(fact.value, Mapping):
            continue
        until = fact.value.get(APPROVAL_VALID_UNTIL)
        approval_id = fact.key.removeprefix(APPROVAL_FACT_PREFIX)
        if isinstance(until, int | float) and until <= now and approval_id not in used:
            found.append(ev.ApprovalExpired(seq=seq + len(found), at=at, approval_id=approval_id,
                                            decided_at=fact.recorded_at, valid_until=float(until)))
    return found


def _expired(s: RunSnapshot, e: ev.ApprovalExpired) -> RunSnapshot:
    key = APPROVAL_FACT_PREFIX + e.approval_id
    if s.status is not RunStatus.RUNNING:
        reject(s, e, f"a decision expires where a worker resumes the run; the run is {s.status.value}")
    if s.fact(key) is None:
        reject(s, e, f"no decision on approval {e.approval_id!r} is on record")
    if any(a.approval_id == e.approval_id for a in s.actions):
        reject(s, e, f"a call was prepared under approval {e.approval_id!r}: it cannot expire")
    return s.replace(facts=tuple(f for f in s.facts if f.key != key))


HANDLERS: Mapping[type[ev.RunEvent], Handler] = {ev.ApprovalExpired: _expired}
