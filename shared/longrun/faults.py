"""Named crash points, armed from outside the process for fault tests; inert otherwise.

``LONGRUN_CRASH_POINTS=name[,name...]`` arms points; a point may carry a count as
``name:N`` (crash on the N-th pass). A process with nothing armed pays one dict lookup.
``LONGRUN_PROTECTIONS_OFF`` switches protections off (``protected``), so a fault row can show it
fails without them.
"""

from __future__ import annotations

import logging
import os
import signal

logger = logging.getLogger(__name__)

_armed: dict[str, int] = {}
_passes: dict[str, int] = {}
_off: set[str] = set()


def arm(points: tuple[str, ...], protections_off: tuple[str, ...] = ()) -> None:
    _armed.clear()
    _passes.clear()
    for point in points:
        name, _, nth = point.partition(":")
        _armed[name] = int(nth) if nth else 1
    _off.clear()
    _off.update(protections_off)


def protected(protection: str) -> bool:
    """Whether ``protection`` (one of ``config.parse.PROTECTIONS``) is on: always, but in a fault test."""
    return protection not in _off


def crash_point(name: str) -> None:
    nth = _armed.get(name)
    if nth is None:
        return
    _passes[name] = _passes.get(name, 0) + 1
    if _passes[name] == nth:
        logger.critical("crash point %s reached: SIGKILL", name)
        os.kill(os.getpid(), signal.SIGKILL)
