"""Claim checks for a model's large proposals: over ``INLINE_LIMIT``, the proposal's bytes go to the
artifact store (under the run's tenant) and its fact holds only their hash and size; before a
decision, the worker puts the proposal back in place, so run kinds read proposals of any size the
same way. A tool's receipt takes the same path (``tool_answers.receipt_of``), but its fact keeps the
reference: run kinds read ``{"artifact", "size", "external_id"}`` for a large receipt.

Content-addressed and written before the transaction that refers to them, checked-in bytes never
change, so resolving them again on every decision (or on a replay) gives the same proposal.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from longrun.artifacts import INLINE_LIMIT, ArtifactStore
from longrun.domain import Fact, JsonValue, RunSnapshot, freeze
from longrun.ports.runs import Artifact

PROPOSAL_FACT_PREFIX = "proposal:"
CLAIM_CHECK = frozenset({"artifact", "size"})
"""The keys of a checked-in proposal's fact value, exactly."""


def is_claim_check(fact: Fact) -> bool:
    value = fact.value
    return (fact.key.startswith(PROPOSAL_FACT_PREFIX) and isinstance(value, Mapping)
            and set(value) == CLAIM_CHECK)


async def check_in(artifacts: ArtifactStore, tenant_id: str,
                   proposal: Mapping[str, Any]) -> tuple[JsonValue, Artifact | None]:
    """The fact value a proposal is recorded as: itself, or a claim check for it once uploaded (the
    upload to register with the fact)."""
    body = json.dumps(proposal, sort_keys=True).encode()
    if len(body) <= INLINE_LIMIT:
        return freeze(proposal), None
    # Upload first; the reference commits with the fact.
    ref = await artifacts.put(tenant_id, body)
    return freeze({"artifact": ref, "size": len(body)}), Artifact(ref, len(body), tenant_id)


async def resolved(artifacts: ArtifactStore, run: RunSnapshot) -> RunSnapshot:
    """``run`` with each checked-in proposal in place of its claim check (``run`` itself when none)."""
    if not any(is_claim_check(f) for f in run.facts):
        return run
    facts = []
    for fact in run.facts:
        if is_claim_check(fact):
            assert isinstance(fact.value, Mapping)
            body = await artifacts.get(run.tenant_id, str(fact.value["artifact"]))
            fact = Fact(fact.key, freeze(json.loads(body)), fact.source, fact.recorded_at)
        facts.append(fact)
    return run.replace(facts=tuple(facts))
