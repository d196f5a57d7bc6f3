"""Where a lone run's way from its create to its worker's take goes, mark by mark, across processes.

The ensemble's hops (``Ensemble.lone``) come from PostgreSQL's timestamps, which are the start of
the transaction that wrote each row: they cannot split the scheduler's transaction, the relay's
publish or the worker's take. Here each service runs under ``python -m bench.timeline MODULE``,
which wraps the functions a create passes through (the service code is the real one) and writes a
line per mark with the wall clock, the clock the bench's publish time is taken from:

- scheduler: the create decoded, its inbox row claimed, the tenant locked with its policy read, the
  creating statement sent and returned, the outcome recorded, the transaction committed;
- relay: the wakeup read, its publish confirmed;
- worker: the wakeup decoded, the take sent and returned.

``BENCH_PHASES=timeline`` (on demand) runs 200 lone runs on a one-worker ensemble under it and reports each mark's
p50 in ms after run.create was published and the p50 of each gap to the mark before. A mark costs
its service one line written (a few microseconds); the lone runs of this phase are not the ones
the targets judge. Only lone runs: with creates batched, the scheduler's marks would name the
batch's last create.
"""

from __future__ import annotations

import functools
import os
import runpy
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from bench.common import Knobs
    from bench.infra import Infra

MARKS = ("create decoded", "inbox row claimed", "tenant locked", "create statement sent",
         "create statement returned", "outcome recorded", "committed", "relay read the wakeup",
         "relay publish confirmed", "worker decoded the wakeup", "take sent", "taken")
"""In the order a run passes them."""

_KEY: ContextVar[str | None] = ContextVar("bench_timeline_key", default=None)
"""The scheduler's create in hand: its idempotency key."""
_out: Any = None


def _mark(name: str, key: str | None) -> None:
    if key is not None:
        _out.write(f"{time.time():.6f}\t{name}\t{key}\n")


def _after(owner: Any, attribute: str, mark: Callable[[tuple[Any, ...], dict[str, Any], Any], None],
           before: Callable[[tuple[Any, ...], dict[str, Any]], None] | None = None) -> None:
    """Wrap the coroutine function ``owner.attribute``: ``before`` on entry, ``mark`` with its result."""
    real = getattr(owner, attribute)

    @functools.wraps(real)
    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        if before is not None:
            before(args, kwargs)
        result = await real(*args, **kwargs)
        mark(args, kwargs, result)
        return result
    setattr(owner, attribute, wrapped)


def _decoded(scheduler: bool) -> None:
    from longrun.bus import consumer

    real = consumer.decode

    def decode(body: bytes) -> Any:
        envelope = real(body)
        if scheduler and envelope.type == "run.create":
            _KEY.set(envelope.payload.idempotency_key)
            _mark("create decoded", envelope.payload.idempotency_key)
        elif not scheduler and envelope.type == "run.wakeup":
            _mark("worker decoded the wakeup", envelope.run_id)
        return envelope
    consumer.decode = decode


def _scheduler() -> None:
    from longrun.bus.consumer import QueueConsumer
    from longrun.db import inbox, policies, runs

    _decoded(scheduler=True)
    _after(inbox, "claim", lambda a, k, r: _mark("inbox row claimed", _KEY.get()))
    _after(policies, "lock_and_load", lambda a, k, r: _mark("tenant locked", _KEY.get()))

    def sent(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # The run id names the run from here on: the relay and the worker know only it.
        _out.write(f"{time.time():.6f}\trun\t{kwargs['idempotency_key']}\t{args[1].run_id}\n")
        _mark("create statement sent", kwargs["idempotency_key"])
    _after(runs, "create", lambda a, k, r: _mark("create statement returned", k["idempotency_key"]), before=sent)
    _after(inbox, "record_outcome", lambda a, k, r: _mark("outcome recorded", _KEY.get()))
    _after(QueueConsumer, "_handle_once", lambda a, k, r: _mark("committed", _KEY.get()))


def _relay() -> None:
    from longrun.bus.connection import Bus
    from longrun.db import outbox

    def read(args: tuple[Any, ...], kwargs: dict[str, Any], rows: Any) -> None:
        for row in rows:
            if row.type == "run.wakeup":
                _mark("relay read the wakeup", row.payload.get("run_id"))

    def confirmed(args: tuple[Any, ...], kwargs: dict[str, Any], results: Any) -> None:
        for (_, _, message), error in zip(args[1], results, strict=True):
            if error is None and message.type == "run.wakeup":
                _mark("relay publish confirmed", message.headers.get("cloudEvents:subject"))
    _after(outbox, "unpublished", read)
    _after(Bus, "publish_many", confirmed)


def _worker() -> None:
    from longrun.db import leases

    _decoded(scheduler=False)
    _after(leases, "take_on_wakeup", lambda a, k, r: _mark("taken", a[1].run_id),
           before=lambda a, k: _mark("take sent", a[1].run_id))


HOOKS = {"longrun.services.scheduler": _scheduler, "longrun.services.outbox_relay": _relay,
         "longrun.services.worker": _worker}


def main() -> None:
    global _out
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    _out = open(os.environ["BENCH_TIMELINE_FILE"], "a", buffering=1)  # noqa: SIM115 - open while it runs
    install = HOOKS.get(module)
    if install is not None:
        install()
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def read_marks(directory: Path) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """Every mark's first time per key, and each create's run id by its idempotency key."""
    marks: dict[str, dict[str, float]] = {}
    run_of: dict[str, str] = {}
    for path in directory.glob("*.marks"):
        for line in path.read_text().splitlines():
            fields = line.split("\t")
            if fields[1] == "run":
                run_of[fields[2]] = fields[3]
                continue
            marks.setdefault(fields[2], {}).setdefault(fields[1], float(fields[0]))
    return marks, run_of


def summarize(published: dict[str, float], marks: dict[str, dict[str, float]],
              run_of: dict[str, str]) -> dict[str, Any]:
    """p50 of each mark after the publish, and of each gap to the mark before, over the runs that
    passed every mark (the first run, which warms every pool, left out)."""
    rows = []
    for key in sorted(published)[1:]:
        seen = {**marks.get(key, {}), **marks.get(run_of.get(key, ""), {})}
        if all(name in seen for name in MARKS):
            rows.append([(seen[name] - published[key]) * 1000 for name in MARKS])
    if not rows:
        return {"runs": 0}
    at = {name: round(statistics.median(r[i] for r in rows), 2) for i, name in enumerate(MARKS)}
    gaps = {name: round(statistics.median(r[i] - (r[i - 1] if i else 0.0) for r in rows), 2)
            for i, name in enumerate(MARKS)}
    return {"runs": len(rows), "after_publish_p50_ms": at, "gap_p50_ms": gaps}


RUNS = 200
"""Lone runs of the phase (a quick bench's: 40): the medians of gaps under a millisecond need them."""


async def phase(infra: Infra, engine: AsyncEngine, knobs: Knobs) -> dict[str, Any]:
    """Lone runs on a one-worker ensemble whose services mark their way."""
    from bench.ensemble import Ensemble  # here: this module also runs inside every service of the phase

    marks_dir = infra.logs / f"timeline-{uuid.uuid4().hex[:6]}"
    marks_dir.mkdir(parents=True)
    ensemble = Ensemble(infra, engine, knobs, 1, timeline_dir=marks_dir)
    published: dict[str, float] = {}
    try:
        await ensemble.start(count=False)
        lone = await ensemble.lone(RUNS // 5 if knobs.quick else RUNS, published)
    finally:
        ensemble.stop()
    return {"lone_completed_ms": lone["completed_ms"], **summarize(published, *read_marks(marks_dir))}


if __name__ == "__main__":
    main()
