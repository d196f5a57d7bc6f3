"""Where a service's CPU goes, sampled from outside with py-spy (the ``bench`` extra) while a phase runs.

py-spy samples only threads that are running, so an event loop waiting in ``epoll`` counts for
nothing: the shares are shares of CPU, not of wall time. Each sample is put down to the innermost
frame that belongs to a known area (a stdlib helper such as ``json`` or ``dataclasses`` counts for
whoever called it), and the innermost frame alone names the function for the top list.
"""

from __future__ import annotations

import collections
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

AREAS = (
    ("SQLAlchemy", "/sqlalchemy/"),
    ("psycopg", "/psycopg"),
    ("AMQP client (aio-pika, aiormq, pamqp)", ("/aio_pika/", "/aiormq/", "/pamqp/")),
    ("pydantic", "/pydantic"),
    ("OpenTelemetry", "/opentelemetry/"),
    ("longrun domain", "/longrun/domain/"),
    ("longrun db layer", "/longrun/db/"),
    ("longrun app + bus", ("/longrun/app/", "/longrun/bus/", "/longrun/workflows/", "/longrun/envelope/")),
    ("asyncio (event loop, selectors)", ("/asyncio/", "/selectors.py")),
)


_HEADER = re.compile(r'^(process \d+:|thread \(0x)')
"""The process and thread lines py-spy puts above the frames with --subprocesses or --threads."""


def _py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


class Sampler:
    """``py-spy record`` on one PID until ``stop``; without py-spy, a result that says so."""

    def __init__(self, pid: int, out: Path, rate: int = 200) -> None:
        self.pid = pid
        self.out = out
        self.rate = rate
        self._proc: subprocess.Popen[bytes] | None = None
        self._missing = _py_spy() is None

    def start(self) -> None:
        if self._missing:
            return
        self._proc = subprocess.Popen(
            [str(_py_spy()), "record", "--format", "raw", "--full-filenames", "--nonblocking",
             "--rate", str(self.rate), "--pid", str(self.pid), "--output", str(self.out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def stop(self) -> dict[str, Any]:
        if self._proc is None:
            return {"measured": False, "reason": "py-spy not installed (pip install -e '.[bench]')"
                    if self._missing else "not started"}
        self._proc.send_signal(signal.SIGINT)
        try:
            _, err = self._proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            _, err = self._proc.communicate()
        if not self.out.exists():
            return {"measured": False, "reason": err.decode(errors="replace").strip()[-300:]}
        return summarize(self.out.read_text())


def summarize(collapsed: str, top: int = 12) -> dict[str, Any]:
    """Shares of samples by area and by innermost function, from py-spy's collapsed stacks."""
    by_area: collections.Counter[str] = collections.Counter()
    by_function: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if not _HEADER.match(f)]
        if not frames:
            continue
        total += n
        by_function[_short(frames[-1])] += n
        by_area[_area(frames)] += n
    if total == 0:
        return {"measured": False, "reason": "no samples"}
    pct = lambda n: round(100 * n / total, 1)  # noqa: E731
    return {"measured": True, "samples": total,
            "by_area_pct": {a: pct(n) for a, n in by_area.most_common()},
            "top_functions_pct": [[f, pct(n)] for f, n in by_function.most_common(top)]}


def _area(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, marks in AREAS:
            if any(m in frame for m in ((marks,) if isinstance(marks, str) else marks)):
                return name
    return "other"


def _short(frame: str) -> str:
    """``func (/long/path/site-packages/pkg/mod.py:12)`` -> ``func (pkg/mod.py:12)``."""
    name, _, where = frame.partition(" (")
    parts = where.rstrip(")").split("/")
    return f"{name} ({'/'.join(parts[-2:])})" if where else name
