"""The reconciler's sweeps: their pace and when a silent run is alerted on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from longrun.config import parse
from longrun.config.declaration import Concern, setting
from longrun.domain.run import TERMINAL, RunStatus


def _silence_limits(raw: str) -> Mapping[RunStatus, float]:
    """``STATUS=seconds`` pairs, comma separated; only open statuses can fall silent."""
    limits: dict[RunStatus, float] = {}
    for pair in (p.strip() for p in raw.split(",") if p.strip()):
        name, sep, seconds = pair.partition("=")
        status = RunStatus(name.strip())
        if not sep or status in TERMINAL:
            raise ValueError
        limits[status] = parse.positive_float(seconds)
    return MappingProxyType(limits)


@dataclass(frozen=True)
class ReconcilerSettings(Concern):
    """Reconciler: sweeps and silence alerts"""

    reconcile_interval: float = setting("LONGRUN_RECONCILE_INTERVAL", parse.positive_float, "seconds, a number > 0",
                                        "1")
    """Seconds between the reconciler's sweeps (unknown actions, expired leases, silent runs)."""
    drift_interval: float = setting("LONGRUN_DRIFT_INTERVAL", parse.positive_float, "seconds, a number > 0", "60")
    """Seconds between the reconciler's drift checks of confirmed actions against the far side."""
    silence_limits: Mapping[RunStatus, float] = setting("LONGRUN_SILENCE_LIMITS", _silence_limits,
                                                        "comma-separated STATUS=seconds for open run statuses",
                                                        "RUNNING=300,READY=600,ACTION_UNKNOWN=3600")
    """How long a run may stay in a status (without a live lease) before the reconciler alerts."""
