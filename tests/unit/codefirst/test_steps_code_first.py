"""The benchmark's code-first twin of ``steps``: the same K calls through the ledger, in as many events
as the decide-style kind writes, so the bench compares the cost of replay and nothing else."""

from __future__ import annotations

from longrun.authoring import RunKind
from longrun.domain import RunStatus
from longrun.testing.kit import Kit
from longrun.workflows import STEPS_VERSIONS, steps
from longrun.workflows.steps_code_first import STEPS_CODE_FIRST


def events_of_a_run(kind: RunKind, k: int) -> list[str]:
    with Kit(kind) as kit:
        run_id = kit.start({"steps": k})
        kit.settle()
        assert kit.status(run_id) is RunStatus.COMPLETED
        assert kit.executions(steps.ECHO.name) == k and kit.check() == []
        return [e["type"] for e in kit.history(run_id)]


def test_the_code_first_twin_writes_the_events_the_decide_style_kind_writes() -> None:
    decide_style = RunKind(steps.KIND, STEPS_VERSIONS, steps.Steps(), {steps.ECHO.name: steps.ECHO},
                           input_schema=steps.StepsInput)
    assert events_of_a_run(STEPS_CODE_FIRST, 5) == events_of_a_run(decide_style, 5)
