"""The model endpoint's circuit breaker, as a tool's (``domain.breaker``): while the model answers
unavailable past the breaker's threshold, runs stop asking it and wait, uncharged, until the
reconciler sees it healthy again (or their own probe is due). A 429 is the model's rate limit
speaking (``rate_limit``), not its health: it is not counted."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from longrun.app.worker.commit import Step
from longrun.app.worker.far_side import FarSide
from longrun.domain import RunStatus
from longrun.domain import events as ev
from longrun.domain.breaker import Admission, health_wait
from longrun.errors import ToolUnavailable
from longrun.model import ModelRateLimited, Proposal
from longrun.ports.runs import StoredRun

MODEL_FAR_SIDE = "model"
"""The model endpoint's breaker (``tool_health``), and what a run waiting for it shows: ``tool_healthy:model``."""


async def ask(far: FarSide, step: Step, stored: StoredRun, purpose: str,
              propose: Callable[[], Awaitable[Proposal]]) -> Proposal | None:
    """The model's answer if its breaker lets the call through; None when the run was parked for its health."""
    if far.breakers is None:
        return await propose()
    admission = await far.breakers.admit(MODEL_FAR_SIDE, stored.snapshot.run_id)
    if admission is Admission.WAIT:
        ctx = far.context()
        wait = health_wait(wait_id=ctx.new_id(), far_side=MODEL_FAR_SIDE, logical_action=f"model:{purpose}",
                           now=ctx.now, max_wait=far.health_max_wait)
        await step.finish(stored, ev.WaitStarted, status=RunStatus.RETRY_SCHEDULED, wait=wait)
        return None
    probe = admission is Admission.PROBE
    try:
        answer = await propose()
    except ModelRateLimited:
        raise
    except ToolUnavailable:
        await far.breakers.failed(MODEL_FAR_SIDE)
        raise
    except Exception:
        await far.breakers.succeeded(MODEL_FAR_SIDE, probe=probe)  # it answered, if not usefully
        raise
    await far.breakers.succeeded(MODEL_FAR_SIDE, probe=probe)
    return answer
