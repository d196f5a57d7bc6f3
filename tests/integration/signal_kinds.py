"""A run kind that waits for a signal, loaded by the real services (``LONGRUN_RUN_KINDS=
tests.integration.signal_kinds:SIGNALLED``) and by the kit.

``signalled`` declares two signals: ``ship`` (``{"by": <name>}``, nothing else) and ``note`` (any
string). Each step it takes appends the run's id to the file ``SIGNAL_STEPS`` names, when set, so a
test counts how often the run was woken. It waits for ``ship`` (until ``goal.wait_for`` seconds
from now, default an hour) unless one arrived already, and completes with every signal it received
as evidence; past the deadline without one, it fails saying so.
"""

from __future__ import annotations

import os

from longrun.authoring import RunKind
from longrun.domain import (
    Complete,
    Decision,
    DecisionContext,
    Fail,
    FrozenMap,
    PinnedVersions,
    RunSnapshot,
    WaitForSignal,
    WakeReason,
    freeze,
    received_signals,
    thaw,
    woken_by_signal,
)

SHIP_SCHEMA = {"type": "object", "required": ["by"], "additionalProperties": False,
               "properties": {"by": {"type": "string", "minLength": 1}}}
STEPS_FILE = "SIGNAL_STEPS"
"""The environment variable naming the file each step appends its run's id to."""


class Signalled:
    kind = "signalled"

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        steps = os.environ.get(STEPS_FILE)
        if steps:
            with open(steps, "a", encoding="utf-8") as f:
                f.write(state.run_id + "\n")
        shipped = received_signals(state, "ship")
        if shipped:
            woke = woken_by_signal(state)
            return Complete(evidence=freeze({
                "shipped_by": thaw(shipped[0].payload), "woken_by": None if woke is None else woke.signal_id,
                "signals": [[s.name, s.signal_id, thaw(s.payload)] for s in received_signals(state)]}))
        if state.last_wake is not None and state.last_wake.reason is WakeReason.DEADLINE:
            return Fail(reason="nobody said ship before the deadline")
        goal = thaw(state.goal)
        assert isinstance(goal, dict)
        return WaitForSignal(name="ship", deadline=ctx.now + float(goal.get("wait_for", 3600)))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return () if received_signals(state, "ship") else ("no ship signal",)


SIGNALLED = RunKind("signalled", PinnedVersions(workflow="1", prompt="none", model_policy="none",
                                                tool_schemas="none"), Signalled(), {},
                    signals={"ship": SHIP_SCHEMA, "note": {"type": "string"}})
