"""Claim checks for a model's large proposals: the real worker over the memory store (the kit). A
proposal over the inline limit is uploaded under the run's tenant and recorded as its hash; the run
kind still reads the whole proposal, on every decision, after a crash too."""

from __future__ import annotations

import hashlib
import json

from longrun.artifacts import INLINE_LIMIT, object_key
from longrun.authoring import RunKind
from longrun.domain import (
    AskModel,
    Complete,
    Decision,
    DecisionContext,
    FrozenMap,
    PinnedVersions,
    RunSnapshot,
    RunStatus,
    freeze,
    thaw,
)
from longrun.model import ScriptedModel
from longrun.testing.kit import Kit, every_crash

RATIONALE = "the failing test pins the old client; " * 500
PROPOSAL = {"action": "retry", "args": {}, "rationale": RATIONALE}


class Asks:
    """Asks the model once, then completes with what it read of the proposal."""

    kind = "asks"

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        proposal = state.fact("proposal:triage:1")
        if proposal is None:
            return AskModel(purpose="triage")
        read = thaw(proposal.value)
        return Complete(evidence=freeze({"action": read["action"], "rationale_chars": len(read["rationale"])}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return () if evidence["rationale_chars"] == len(RATIONALE) else ("the proposal was not read whole",)


def asks_kind() -> RunKind:
    versions = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="none")
    return RunKind(Asks.kind, versions, Asks(), {}, allowed_actions=lambda state, purpose: ("retry",))


def model() -> ScriptedModel:
    return ScriptedModel({"triage": [{"action": "retry", "rationale": RATIONALE}]})


def test_a_large_proposal_is_kept_in_the_store_and_read_whole_by_the_run_kind() -> None:
    body = json.dumps(PROPOSAL, sort_keys=True).encode()
    assert len(body) > INLINE_LIMIT
    content_hash = hashlib.sha256(body).hexdigest()
    with Kit(asks_kind(), model=model()) as kit:
        run_id = kit.start({}, tenant="acme")
        kit.settle()
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.COMPLETED, kit.failures
        assert kit.check() == []
        # The run kind read the whole proposal; the run keeps its hash, the store its bytes
        assert run.acceptance is not None
        assert thaw(run.acceptance.evidence) == {"action": "retry", "rationale_chars": len(RATIONALE)}
        recorded = run.fact("proposal:triage:1")
        assert recorded is not None and thaw(recorded.value) == {"artifact": content_hash, "size": len(body)}
        assert kit.world.stored_objects[object_key("acme", content_hash)] == body
        assert kit.world.artifacts == {content_hash: len(body)}


def test_a_small_proposal_stays_inline() -> None:
    small = ScriptedModel({"triage": [{"action": "retry", "rationale": "short"}]})

    class ReadsShort(Asks):
        def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
            return ()

    kind = RunKind(Asks.kind, asks_kind().versions, ReadsShort(), {}, allowed_actions=lambda state, purpose: ("retry",))
    with Kit(kind, model=small) as kit:
        run_id = kit.start({}, tenant="acme")
        kit.settle()
        recorded = kit.snapshot(run_id).fact("proposal:triage:1")
        assert recorded is not None and thaw(recorded.value)["rationale"] == "short"
        assert kit.world.stored_objects == {}


def test_a_crash_at_any_point_leaves_a_proposal_the_next_worker_reads_whole() -> None:
    def scenario(kit: Kit) -> None:
        run_id = kit.start({}, tenant="acme")
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED, kit.failures

    outcomes = every_crash(asks_kind(), scenario, model=model())
    assert outcomes
    assert {o.point: o.kit.check() for o in outcomes} == {o.point: [] for o in outcomes}
