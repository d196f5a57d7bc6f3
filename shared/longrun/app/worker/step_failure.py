"""A step whose run kind's own code raised (``decide``, or ``accept`` on a completion): recorded on the
run (``run.step_failed``: the error's type and message, how many steps in a row failed), tried again on
a durable timer after the retry policy's delay (not when the lease expires), and past the policy's
attempts left NEEDS_ATTENTION for a person, who retries it once a fixed kind is deployed. A code-first
kind whose code cannot replay its history (``ReplayError``: it diverged) goes there at once: the same
code would diverge again."""

from __future__ import annotations

import logging

from longrun.app.worker.commit import Step
from longrun.app.worker.far_side import FarSide
from longrun.authoring import RunKind
from longrun.codefirst.journal import ReplayError
from longrun.domain import ScheduleRetry, next_delay, wait_for
from longrun.domain import events as ev
from longrun.ports.runs import StoredRun

logger = logging.getLogger("longrun.app.worker")
MESSAGE_LIMIT = 2000
"""Characters of the error's message kept in the run's history: enough to read it, not a whole dump."""


async def step_failed(far: FarSide, step: Step, stored: StoredRun, kind: RunKind, phase: str,
                      error: Exception) -> None:
    """Record that ``phase`` of ``kind`` raised ``error`` on ``stored`` (as it was before the step decided
    anything) and park the run: until its retry, or for a person once its attempts are used up."""
    run = stored.snapshot
    attempt = (run.failure.attempt if run.failure is not None else 0) + 1
    logger.warning("run %s: %s of %s@%s raised (%d in a row)", run.run_id, phase, run.kind, run.versions.workflow,
                 attempt, exc_info=error)
    delay = None if isinstance(error, ReplayError) else next_delay(kind.step_retry or far.retry, attempt, rng=far.rng)
    retry = None
    if delay is not None:
        _, retry = wait_for(ScheduleRetry(logical_action=phase, delay=delay), far.context())
    await step.finish(stored, ev.StepFailed, phase=phase, error_type=_type_name(error),
                      message=str(error)[:MESSAGE_LIMIT], attempt=attempt, retry=retry)


def _type_name(error: Exception) -> str:
    cls = type(error)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
