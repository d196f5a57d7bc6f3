"""Tool health: a circuit breaker per far side, as data plus pure transitions.

Responsibility: decide from recent outcomes whether a far side (a tool, or the service several
tools call) is worth calling now. Storage keeps one ``Breaker`` per far side, shared by every
worker, and applies these functions under the row's lock, with the database's clock.

Invariants:
- CLOSED admits every call. ``threshold`` unavailable outcomes within ``window`` seconds open it.
- OPEN admits no call until ``reopen_at`` (one cool-down after it opened); then one caller claims
  the probe, which makes it HALF_OPEN until ``probe_until``. While a probe is claimed (or reserved
  for a run, ``reserve``) every other caller waits: probes are at least one cool-down apart.
- A probe's success closes it; any unavailable outcome while HALF_OPEN opens it again for a
  cool-down. A claimed probe that never reports expires after a cool-down and may be claimed again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from longrun.domain.snapshot import Wait

TOOL_HEALTHY_PREFIX = "tool-healthy:"
"""A run waiting for a far side to recover waits on the correlation key ``tool-healthy:<far side>``."""
TOOL_HEALTHY_WAIT = "tool_healthy"
"""The wait kind (reason) of a run waiting for a far side to recover."""


class BreakerState(str, Enum):
    CLOSED = "CLOSED"
    OPEN = "OPEN"
    HALF_OPEN = "HALF_OPEN"


class Admission(str, Enum):
    CALL = "call"
    """Healthy: call it."""
    PROBE = "probe"
    """Call it as the one probe of a cool-down; its outcome closes or re-opens the breaker."""
    WAIT = "wait"
    """Do not call it: wait until it is healthy again."""


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    threshold: int
    """Unavailable outcomes within ``window`` that open the breaker."""
    window: float
    """Seconds over which unavailable outcomes are counted."""
    cool_down: float
    """Seconds an open breaker admits nothing; also how long a claimed probe is waited for."""

    def __post_init__(self) -> None:
        if self.threshold < 1 or self.window <= 0 or self.cool_down <= 0:
            raise ValueError(f"invalid BreakerSettings: threshold {self.threshold} must be >= 1, window "
                             f"{self.window} and cool_down {self.cool_down} must be > 0")


@dataclass(frozen=True, slots=True)
class Breaker:
    far_side: str
    state: BreakerState = BreakerState.CLOSED
    failures: int = 0
    """Unavailable outcomes counted in the current window (CLOSED), or that opened it."""
    window_start: float | None = None
    reopen_at: float | None = None
    """OPEN: when a probe may be claimed."""
    probe_by: str | None = None
    """The run that holds the probe (HALF_OPEN) or for which it is reserved (OPEN)."""
    probe_until: float | None = None

    @property
    def clean(self) -> bool:
        """Closed with nothing counted: a success changes nothing, so it is not written."""
        return self.state is BreakerState.CLOSED and self.failures == 0


def admit(b: Breaker, *, caller: str, now: float, settings: BreakerSettings) -> tuple[Admission, Breaker]:
    """Whether ``caller`` (a run) may call the far side now, and the breaker after it asked."""
    if b.state is BreakerState.CLOSED:
        return Admission.CALL, b
    if probe_due(b, now=now) or (b.state is BreakerState.OPEN and b.probe_by == caller
                                 and b.reopen_at is not None and now >= b.reopen_at):
        claimed = replace(b, state=BreakerState.HALF_OPEN, probe_by=caller, probe_until=now + settings.cool_down)
        return Admission.PROBE, claimed
    return Admission.WAIT, b


def probe_due(b: Breaker, *, now: float) -> bool:
    """An open breaker past its cool-down with no live claim or reservation, or a claim that expired."""
    if b.state is BreakerState.OPEN:
        cooled = b.reopen_at is not None and now >= b.reopen_at
        return cooled and (b.probe_by is None or b.probe_until is None or now >= b.probe_until)
    return b.state is BreakerState.HALF_OPEN and b.probe_until is not None and now >= b.probe_until


def reserve(b: Breaker, *, run_id: str, now: float, settings: BreakerSettings) -> Breaker:
    """The probe kept for ``run_id`` (a waiting run about to be woken) for one cool-down; others wait."""
    if not probe_due(b, now=now):
        raise ValueError(f"breaker {b.far_side} is {b.state.value} with no probe due at {now}")
    return replace(b, state=BreakerState.OPEN, reopen_at=b.reopen_at if b.state is BreakerState.OPEN else now,
                   probe_by=run_id, probe_until=now + settings.cool_down)


def failed(b: Breaker, *, now: float, settings: BreakerSettings) -> Breaker:
    """The breaker after an unavailable outcome."""
    if b.state is BreakerState.OPEN:
        return b  # a call that started before the opening reached its caller: nothing new
    if b.state is BreakerState.HALF_OPEN:
        return _opened(b, now, settings)
    in_window = b.window_start is not None and now - b.window_start <= settings.window
    counted = replace(b, failures=b.failures + 1 if in_window else 1,
                      window_start=b.window_start if in_window else now)
    return _opened(counted, now, settings) if counted.failures >= settings.threshold else counted


def succeeded(b: Breaker) -> Breaker:
    """The breaker after a call answered: closed, nothing counted."""
    return Breaker(b.far_side)


def _opened(b: Breaker, now: float, settings: BreakerSettings) -> Breaker:
    return replace(b, state=BreakerState.OPEN, reopen_at=now + settings.cool_down, probe_by=None, probe_until=None)


def holds_back(b: Breaker, *, caller: str, now: float) -> bool:
    """Whether ``b`` would make ``caller`` wait (``admit``) without a probe to offer it: not closed,
    no probe due, none reserved for it. Read from a copy of the breaker, so a run can be parked
    before it decides anything, and a run that may probe goes on to its call, where ``admit`` claims it."""
    return b.state is not BreakerState.CLOSED and not probe_due(b, now=now) and b.probe_by != caller


def health_wait(*, wait_id: str, far_side: str, logical_action: str | None, now: float, max_wait: float) -> Wait:
    """The wait of a run whose call waits for ``far_side`` to recover: woken by the key when the
    breaker closes (or to probe it), and by its own timer after ``max_wait`` seconds at the latest.
    ``logical_action``: the call that waits (None: the run parked before deciding its next one)."""
    return Wait(wait_id=wait_id, kind=TOOL_HEALTHY_WAIT, deadline=now + max_wait, wake_at=now + max_wait,
                correlation_key=f"{TOOL_HEALTHY_PREFIX}{far_side}", subject=logical_action)
