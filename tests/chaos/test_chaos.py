"""Randomized chaos: hundreds of runs while random services are killed, paused and restarted.

The short form (``make test``) runs 200+ runs through 60 s of faults; ``make chaos`` runs
the long form (``CHAOS_MINUTES``, default 30). Both print the seed first (replay a failure
with ``CHAOS_SEED=<seed>``), then let the system settle with every service up again, and end
with the one checker every fault scenario ends with (no external effect twice, legal and
complete histories, a complete ledger, explainable end states) plus the figures: runs,
kills per service, duplicates absorbed, effects per kind.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from longrun.testing.invariants import check
from tests.chaos.chaos import Chaos, Plan, patiently
from tests.integration.ensemble import ROOT, Ensemble

PLAN = Plan.from_env()
MIDWAY_CHECK_EVERY = float(os.environ.get("CHAOS_CHECK_EVERY", "300"))
"""Long form: seconds between checker runs on the moving system."""

pytestmark = [pytest.mark.integration, pytest.mark.fault]


def _say(line: str) -> None:
    print(f"[chaos] {line}", flush=True)


@pytest.mark.timeout(PLAN.budget_seconds)
async def test_random_kills_leave_every_run_consistent(clean, engine, bus, services, tmp_path: Path) -> None:
    plan = PLAN
    _say(f"CHAOS_SEED={plan.seed} ({'long' if plan.long else 'short'} form: {plan.chaos_seconds:.0f}s of faults, "
         f">= {plan.min_runs} runs)")
    chaos = Chaos(Ensemble(services, tmp_path), engine, bus, plan, tmp_path)
    began = time.monotonic()
    await chaos.up()

    # While runs keep coming, the monkey kills, stops and restarts services; people answer runs.
    until = time.monotonic() + plan.chaos_seconds
    people_until = until + plan.settle_seconds
    people = asyncio.create_task(chaos.people(people_until))
    producer = asyncio.create_task(chaos.producer(time.monotonic() + plan.chaos_seconds * plan.create_share))
    progress = asyncio.create_task(_progress(chaos, engine, until)) if plan.long else None
    await chaos.monkey(until, alongside=(producer, people))
    await producer
    chaos.figures.chaos_seconds = time.monotonic() - began

    # Then everything comes back and every run must reach an end a user can explain.
    settle_began = time.monotonic()
    await chaos.heal()
    stuck = await _settle(chaos, time.monotonic() + plan.settle_seconds)
    chaos.figures.settle_seconds = time.monotonic() - settle_began
    people.cancel()
    if progress is not None:
        progress.cancel()
    await asyncio.gather(people, *([progress] if progress else []), return_exceptions=True)

    effects = await chaos.ensemble.forge_effects()
    report = await patiently(lambda: check(engine, effects=effects, settled=True))
    figures = await patiently(lambda: _figures(chaos, report, effects, time.monotonic() - began))
    for line in json.dumps(figures, indent=2, sort_keys=True).splitlines():
        _say(line)
    _keep(figures)
    replay = f"replay with CHAOS_SEED={plan.seed}"
    assert not stuck, f"{len(stuck)} run(s) did not settle ({replay}): {stuck[:20]}"
    midway = [v for _, found in chaos.midway for v in found]
    assert not midway, f"{len(midway)} violation(s) while the system was moving ({replay}):\n  " + "\n  ".join(
        midway[:50])
    assert report.runs == len(chaos.keys), f"asked for {len(chaos.keys)} runs, {report.runs} exist ({replay})"
    assert not report.violations, f"{len(report.violations)} violation(s) ({replay}):\n  " + "\n  ".join(
        report.violations[:50])
    await patiently(lambda: _every_run_ended_as_its_story_says(engine, chaos, replay))
    # The forge's outage (one in every run) opened its breaker: runs waited for it to close.
    assert figures["waits_for_tool_health"] > 0, f"no run ever waited on an open breaker ({replay})"


async def _settle(chaos: Chaos, deadline: float) -> list[tuple[str, str, str]]:
    while True:
        stuck = await patiently(chaos.unsettled)
        if not stuck or time.monotonic() > deadline:
            return stuck
        await asyncio.sleep(0.5)


async def _progress(chaos: Chaos, engine, until: float) -> None:  # type: ignore[no-untyped-def]
    """The long form says how it is going every minute, and runs the checker on the moving system
    every ``MIDWAY_CHECK_EVERY`` seconds (one consistent database snapshot; nothing is settled)."""
    consistent = engine.execution_options(isolation_level="REPEATABLE READ")
    next_check = time.monotonic() + MIDWAY_CHECK_EVERY
    while time.monotonic() < until:
        await asyncio.sleep(60)
        f = chaos.figures
        try:
            _say(f"{f.creates} runs asked, {await chaos.open_runs()} open, kills {dict(f.kills)}, "
                 f"pauses {dict(f.pauses)}, terms {dict(f.terms)}, forge faults {sum(f.forge_faults.values())}")
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + MIDWAY_CHECK_EVERY
                report = await check(consistent, effects=await chaos.ensemble.forge_effects(), settled=False)
                chaos.midway.append((report.runs, report.violations))
                _say(f"midway check: {report.runs} runs, {report.actions} actions, "
                     f"{len(report.violations)} violation(s) {list(report.violations[:5])}")
        except Exception as e:  # noqa: BLE001 - a report line is not worth failing the run for
            _say(f"progress report skipped: {e.__class__.__name__}: {e}")


async def _every_run_ended_as_its_story_says(engine, chaos: Chaos, replay: str) -> None:  # type: ignore[no-untyped-def]
    """``steps`` runs complete, or end TIMED_OUT by their business deadline or their schedule-to-start
    if they had one; an upgrade completes unless its approver denied the merge (version 2, code-first, says
    so through its exception: ``UpgradeFailed: merge denied by ...``); a ``long_call`` run
    completes, or fails once its call's retries are spent (heartbeat or start-to-close timeouts, or
    the forge down for a write)."""
    async with engine.connect() as conn:
        rows = (await conn.execute(text(
            "SELECT run_id, workflow, status, snapshot->>'terminal_reason' AS reason, idempotency_key FROM runs "
            "WHERE NOT (status = 'COMPLETED' OR (workflow = 'dependency_upgrade' AND status = 'FAILED' "
            "AND snapshot->>'terminal_reason' LIKE '%merge denied by %'))"))).all()

    def told(row) -> bool:  # type: ignore[no-untyped-def]
        reason = row.reason or ""
        if row.status == "TIMED_OUT":
            return ((row.idempotency_key in chaos.deadlines and reason.startswith("business_deadline"))
                    or (row.idempotency_key in chaos.queue_timeouts and reason.startswith("schedule_to_start")))
        return row.workflow == "long_call" and row.status == "FAILED" and reason.startswith("work failed: ")

    others = [tuple(r)[:4] for r in rows if not told(r)]
    assert not others, f"runs that ended otherwise ({replay}): {others[:20]}"


async def _figures(chaos: Chaos, report, effects, total: float) -> dict:  # type: ignore[no-untyped-def]
    f = chaos.figures
    per_kind: dict[str, dict[str, int]] = {}
    for effect in effects:
        kind = per_kind.setdefault(effect["kind"], {"objects": 0, "max_per_key": 0})
        kind["objects"] += effect["count"]
        kind["max_per_key"] = max(kind["max_per_key"], effect["count"])
    return {
        "seed": f.seed,
        "form": "long" if chaos.plan.long else "short",
        "seconds": {"chaos": round(f.chaos_seconds, 1), "settle": round(f.settle_seconds, 1),
                    "total": round(total, 1)},
        "runs_asked": f.creates, "upgrade_runs_asked": f.upgrades,
        "run_create_sent_twice_same_message": f.same_message_twice,
        "run_create_same_key_new_message": f.same_key_again,
        "kills_sigkill": dict(f.kills), "kills_sigterm": dict(f.terms), "pauses_sigstop": dict(f.pauses),
        "duplicates_absorbed_by_inbox": dict(chaos.count_logs(r"duplicate \S+ dropped")),
        "stale_workers_fenced_out": sum(chaos.count_logs(r"lease \d+ lost").values()),
        "expired_leases_rewoken": sum(chaos.count_logs(r"lease \d+ of \S+ expired").values()),
        "forge_faults": dict(f.forge_faults),
        "approvals": dict(f.approvals),
        "webhooks_redelivered": f.webhooks_redelivered,
        "runs_with_a_deadline": len(chaos.deadlines),
        "runs_with_a_schedule_to_start": len(chaos.queue_timeouts), "long_call_runs_asked": f.long_calls,
        **await chaos.tally(),
        "effects": per_kind,
        "checker": {"runs": report.runs, "actions": report.actions, "effect_keys": report.effects,
                    "violations": len(report.violations),
                    "midway_checks": [{"runs": runs, "violations": len(found)} for runs, found in chaos.midway]},
    }


def _keep(figures: dict) -> None:  # type: ignore[type-arg]
    out = ROOT / "var" / "chaos"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{figures['form']}-{figures['seed']}.json").write_text(json.dumps(figures, indent=2, sort_keys=True))
