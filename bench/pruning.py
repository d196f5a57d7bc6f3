"""Retention at its default and with a short horizon: what pruning while the runs step costs, and that
it loses nothing.

Two fresh ensembles in turn (``workers`` replicas and the reconciler, which prunes), each saturated
with M runs as the ensemble phase's saturation is: one with the retention variables at their
defaults (a pass every ``LONGRUN_RETENTION_INTERVAL``, horizons of days: nothing is old enough to go
during a measurement), one with ``bench.infra.pruning_env(SHORT_HORIZON_S)``: a pass every second,
every table's horizon a second, so published outbox rows, inbox rows and finished timers go while
the runs step (finished runs are archived only after the measurement read their events). Either
side ignores ``BENCH_RETENTION``.

No loss, on each side: every run completed, every one of its K steps on record, and, once the relay
has caught up, no outbox row left unsent.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import fields
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from bench.common import Knobs
from bench.ensemble import Ensemble
from bench.infra import Infra, pruned_so_far, pruning_env
from longrun.config.declaration import variable
from longrun.config.retention import RetentionSettings

SHORT_HORIZON_S = 1.0
DRAIN_S = 15.0
"""How long the relay gets, after the last run completed, to publish what is still unsent."""


def default_retention() -> dict[str, str]:
    """Every variable the short side sets, at its declared default."""
    short = pruning_env(f"{SHORT_HORIZON_S:g}")
    defaults = {v.env: v.default for f in fields(RetentionSettings) if (v := variable(f)) is not None}
    return {name: default for name in short if (default := defaults[name]) is not None}


def losses(side: dict[str, Any], runs: int, steps: int) -> dict[str, int]:
    """What one side lost: runs not completed, steps not on record, outbox rows never sent."""
    return {"runs_not_completed": runs - (side["completed_ms"].get("n") or 0),
            "steps_not_recorded": runs * steps - side["steps"],
            "outbox_rows_unsent": side["outbox_rows_unsent"]}


async def default_and_short_horizon(infra: Infra, engine: AsyncEngine, knobs: Knobs, workers: int) -> dict[str, Any]:
    sides = {"default": default_retention(), "short_horizon": pruning_env(f"{SHORT_HORIZON_S:g}")}
    out: dict[str, Any] = {"short_horizon_s": SHORT_HORIZON_S, "runs": knobs.runs, "steps_per_run": knobs.steps}
    for name, env in sides.items():
        side = await _saturated(infra, engine, knobs, workers, env)
        side["lost"] = losses(side, knobs.runs, knobs.steps)
        out[name] = side
    out["no_loss"] = not any(v for name in sides for v in out[name]["lost"].values())
    return out


async def _saturated(infra: Infra, engine: AsyncEngine, knobs: Knobs, workers: int,
                     env: dict[str, str]) -> dict[str, Any]:
    ensemble = Ensemble(infra, engine, knobs, workers, env=env)
    try:
        await ensemble.start(reconciler=True)
        before = await pruned_so_far(engine)
        saturate = await ensemble.saturate(knobs.runs)
        unsent = await _unsent_after_drain(engine)
        after = await pruned_so_far(engine)
        errors = ensemble.services.errors() if ensemble.services else {}
    finally:
        ensemble.stop()
    keep = ("steps_per_s", "steps_per_s_overall", "runs_per_s", "makespan_s", "steps", "completed_ms",
            "cpu_ms_per_step")
    return {**{k: saturate[k] for k in keep}, "outbox_rows_unsent": unsent, "env": env,
            "pruned": {table: n - before.get(table, 0) for table, n in after.items() if n - before.get(table, 0)},
            "service_errors": errors}


async def _unsent_after_drain(engine: AsyncEngine) -> int:
    deadline = time.monotonic() + DRAIN_S
    while True:
        async with engine.connect() as conn:
            unsent = int((await conn.execute(text(
                "SELECT count(*) FROM outbox WHERE published_at IS NULL"))).scalar_one())
        if unsent == 0 or time.monotonic() > deadline:
            return unsent
        await asyncio.sleep(0.2)
