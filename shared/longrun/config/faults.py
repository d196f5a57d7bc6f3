"""Fault tests only: crash points, a skewed clock and protections switched off; left empty and 0 in production."""

from __future__ import annotations

from dataclasses import dataclass

from longrun.config import parse
from longrun.config.declaration import Concern, setting


@dataclass(frozen=True)
class FaultSettings(Concern):
    """Fault tests"""

    crash_points: tuple[str, ...] = setting("LONGRUN_CRASH_POINTS", parse.name_list,
                                            "comma-separated crash point names", "")
    """Fault tests only: named crash points to arm (see longrun.faults); empty in production."""
    clock_skew: float = setting("LONGRUN_CLOCK_SKEW", parse.finite_float,
                                "seconds, a finite number (may be negative)", "0")
    """Fault tests only: seconds added to this process's wall clock (may be negative); 0 in production."""
    protections_off: tuple[str, ...] = setting("LONGRUN_PROTECTIONS_OFF", parse.protections,
                                               "comma-separated protections: publisher-confirms", "")
    """Fault tests only: protections switched off, to show a fault row fails without them; empty in production."""
