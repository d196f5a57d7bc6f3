"""The ratios, the targets, the printed table and the JSON file.

Every ratio is taken between figures from the same run. A figure that could not be
measured stays ``None`` and its target is reported as "not measured", never as met.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def dig(data: Any, *path: str | int) -> Any:
    for key in path:
        if data is None:
            return None
        if isinstance(key, int):
            data = data[key] if isinstance(data, list) and len(data) > key else None
        else:
            data = data.get(key) if isinstance(data, dict) else None
    return data


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def bare_reference(r: dict[str, Any]) -> float | None:
    """The ensemble's reference: the mean of the one-process bare loop before and after it (the machine drifts)."""
    around = [b for b in (dig(r, "limits", "bare_loop", 0, "steps_per_s"), dig(r, "bare_after", "steps_per_s")) if b]
    return round(sum(around) / len(around), 1) if around else None


def dbos_best(r: dict[str, Any]) -> float | None:
    """DBOS's steps/s in its faster mode (started directly or through its queue); None unless both ran."""
    modes = [dig(r, "dbos", mode, "steps_per_s") for mode in ("direct", "queue")]
    return None if None in modes else max(modes)


def ratios(r: dict[str, Any]) -> dict[str, Any]:
    ens = dig(r, "ensemble", "saturate", "steps_per_s")
    bare1 = dig(r, "limits", "bare_loop", 0, "steps_per_s")
    bare2 = dig(r, "limits", "bare_loop", 1, "steps_per_s")
    after = dig(r, "bare_after", "steps_per_s")
    bare = bare_reference(r)
    scale = {p["workers"]: p.get("steps_per_s") for p in (r.get("scale") or []) if isinstance(p, dict) and "workers" in p}
    best = max((v or 0 for v in scale.values()), default=None) or None
    return {
        "ensemble_steps_per_s": ens,
        "ensemble_over_dbos_queue": _ratio(ens, dig(r, "dbos", "queue", "steps_per_s")),
        "ensemble_over_dbos_direct": _ratio(ens, dig(r, "dbos", "direct", "steps_per_s")),
        "ensemble_over_dbos_best": _ratio(ens, dbos_best(r)),
        "ensemble_over_temporal": _ratio(ens, dig(r, "temporal", "throughput", "steps_per_s")),
        "ensemble_over_restate": _ratio(ens, dig(r, "restate", "throughput", "steps_per_s")),
        "ensemble_over_bare_loop": _ratio(ens, bare),
        "best_scale_over_bare_loop": _ratio(best, bare),
        "bare_loop_after_over_before": _ratio(after, bare1),
        # The replica count that does best on this machine (the targets use the ensemble's).
        "best_scale_over_dbos_queue": _ratio(best, dig(r, "dbos", "queue", "steps_per_s")),
        "bare_loop_2_over_1_processes": _ratio(bare2, bare1),
        "bare_loop_over_pg_txn_limit": _ratio(bare1, dig(r, "limits", "postgres", "best_txn_per_s")),
        "scale_2_over_1": _ratio(scale.get(2), scale.get(1)),
        "scale_4_over_1": _ratio(scale.get(4), scale.get(1)),
        "worker_cpu_ms_per_step_over_bare_loop": _ratio(dig(r, "ensemble", "saturate", "cpu_ms_per_step", "workers"),
                                                        dig(r, "limits", "bare_loop", 0, "cpu_ms_per_step")),
        "lone_ms_longrun_over_dbos": _ratio(dig(r, "ensemble", "lone", "completed_ms", "p50"),
                                            dig(r, "dbos", "lone_ms", "p50")),
        "lone_ms_longrun_over_temporal": _ratio(dig(r, "ensemble", "lone", "completed_ms", "p50"),
                                                dig(r, "temporal", "lone_ms", "p50")),
        "lone_ms_longrun_over_restate": _ratio(dig(r, "ensemble", "lone", "completed_ms", "p50"),
                                               dig(r, "restate", "lone_ms", "p50")),
        "recovery_max_over_lease_ttl": _ratio(max((v for v in (_recovery_s(r, row) for row in RECOVERY_ROWS)
                                                   if v is not None), default=None),
                                              dig(r, "recovery", "run_lease_ttl_s")),
        "retention_short_horizon_over_default": _ratio(dig(r, "retention", "short_horizon", "steps_per_s"),
                                                       dig(r, "retention", "default", "steps_per_s")),
    }


def _target(name: str, value: float | None, limit: float | None, ok: Callable[[float, float], bool],
            unit: str) -> dict[str, Any]:
    """A target's verdict: None ("not measured") when its figure or its limit was not measured."""
    return {"target": name, "measured": value, "limit": limit, "unit": unit,
            "met": None if value is None or limit is None else bool(ok(value, limit))}


TIMERS_AT_ONCE = 10_000
RECOVERY_ROWS = {"between_steps": "between steps", "mid_call": "mid-call"}
"""The recovery phase's rows (``recovery.<row>``) and how the targets name them."""


def _recovery_s(r: dict[str, Any], row: str) -> float | None:
    """The slowest of a recovery row's runs to step again after the kill; a run that never did is slower
    than any limit."""
    if dig(r, "recovery", row, "not_recovered"):
        return float("inf")
    return dig(r, "recovery", row, "next_step_after_kill_s", "max")


def targets(r: dict[str, Any], rat: dict[str, Any]) -> list[dict[str, Any]]:
    ge: Callable[[float, float], bool] = lambda v, lim: v >= lim  # noqa: E731
    le: Callable[[float, float], bool] = lambda v, lim: v <= lim  # noqa: E731
    steps = dig(r, "knobs", "steps")
    timers = dig(r, "timers", "timers") or 0
    # Fewer timers at once (a quick run) is not the target's load: its lateness does not count.
    p99 = dig(r, "timers", "lateness_s", "p99") if timers >= TIMERS_AT_ONCE else None
    ttl = dig(r, "recovery", "partition_lease_ttl_s")
    recovery_limit = None if ttl is None else ttl + 2
    return [
        _target("ensemble steps/s >= 2 x DBOS's best mode (the faster of started directly and its queue)",
                rat["ensemble_over_dbos_best"], 2.0, ge, "x"),
        _target(f"lone {steps}-step run p50 <= 0.8 x DBOS's", rat["lone_ms_longrun_over_dbos"], 0.8, le, "x"),
        _target("publish -> terminal event received by a consumer on the bus, p50 <= 20 ms (lone runs)",
                dig(r, "ensemble", "bus", "terminal_event_ms", "p50"), 20.0, le, "ms"),
        _target("ensemble steps/s >= 0.6 x bare loop (mean of the loops before and after it)",
                rat["ensemble_over_bare_loop"], 0.6, ge, "x"),
        _target(f"timer p99 lateness <= 250 ms with {TIMERS_AT_ONCE:,} due at once (here {timers:,})",
                None if p99 is None else round(p99 * 1000, 1), 250.0, le, "ms"),
        *(_target(f"recovery after a worker SIGKILL {name} <= LONGRUN_PARTITION_LEASE_TTL + 2 s "
                  f"({_n(recovery_limit, 1)} s), max over its runs", _recovery_s(r, row), recovery_limit, le, "s")
          for row, name in RECOVERY_ROWS.items()),
    ]


# -- the printed table ---------------------------------------------------------------------------------

def _n(v: Any, digits: int = 0, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, (int, float)):
        if v == float("inf"):
            return "inf"
        return f"{v:,.{digits}f}{unit}"
    return str(v)


def _pct(stats: dict[str, Any] | None, digits: int = 0, unit: str = " ms") -> str:
    if not stats:
        return "-"
    return (f"p50 {_n(stats.get('p50'), digits)} / p95 {_n(stats.get('p95'), digits)} / "
            f"p99 {_n(stats.get('p99'), digits)}{unit}")


def table(r: dict[str, Any]) -> str:
    lines: list[str] = []
    add = lines.append
    k = r["knobs"]
    m = r.get("machine", {})
    add(f"longrun bench  {r['started_at']}  commit {r.get('commit', '?')}  {'QUICK' if k['quick'] else 'FULL'}  "
        f"K={k['steps']} steps/run, N={k['inflight']} in flight, M={k['runs']} runs")
    add(f"machine: {m.get('cores')} cores, {m.get('memory_gib')} GiB; PostgreSQL {m.get('postgres')} "
        f"(synchronous_commit={m.get('synchronous_commit')}, fsync={m.get('fsync')}); RabbitMQ {m.get('rabbitmq')}; "
        f"before start: machine {m.get('cpu_busy_before_start_pct')}% busy, load avg {m.get('loadavg_start')}")
    for name, phase in r.get("phase_errors", {}).items():
        add(f"!! phase {name} failed: {phase}")
    for note in r.get("interference") or []:
        add(f"!! {note}")

    lim = r.get("limits") or {}
    if lim:
        add("")
        add("LIMITS (this machine, now)")
        for p in dig(lim, "postgres", "pgbench") or []:
            add(f"  PostgreSQL step txn, pgbench {p['clients']:>3} clients   {_n(p['txn_per_s'])} txn/s "
                f"(avg {p.get('latency_ms')} ms)")
        py = dig(lim, "postgres", "python_psycopg")
        if py:
            add(f"  PostgreSQL step txn, asyncio+psycopg {py['clients']} conns {_n(py['txn_per_s'])} txn/s")
        mq = lim.get("rabbitmq") or {}
        if mq:
            add(f"  RabbitMQ confirmed publish ({mq.get('message_bytes')} B, quorum): awaiting each "
                f"{_n(mq.get('publish_confirm_each_per_s'))}/s, 100 in flight {_n(mq.get('publish_confirm_100_inflight_per_s'))}/s")
            add(f"  RabbitMQ consume+ack: prefetch 1 {_n(mq.get('consume_ack_prefetch_1_per_s'))}/s, "
                f"prefetch 100 {_n(mq.get('consume_ack_prefetch_100_per_s'))}/s")
        limited = lim.get("rate_limited_call")
        if limited:
            for name in ("sequential", "concurrent"):
                calls = limited[name]
                add(f"  rate-limited call ({' + '.join(limited['limits'])}: reserve, then refund), "
                    f"{calls['at_once']:>2} at once {_pct(calls['call_ms'], 2)}, {_n(calls['calls_per_s'])} calls/s "
                    f"(reserve p50 {_n(calls['reserve_ms']['p50'], 2)}, refund p50 {_n(calls['refund_ms']['p50'], 2)} ms)")
        for b in lim.get("bare_loop") or []:
            per = ", ".join(f"{p['steps_per_s']:.0f} @ {p['process_cpu_pct']:.0f}% CPU" for p in b["per_process"])
            add(f"  bare loop, {b['processes']} process(es)          {_n(b['steps_per_s'])} steps/s ({per}; "
                f"{b.get('cpu_ms_per_step')} CPU ms/step in Python)")
        after = r.get("bare_after")
        if after:
            add(f"  bare loop, 1 process, again after the ensemble {_n(after['steps_per_s'])} steps/s "
                f"({after.get('cpu_ms_per_step')} CPU ms/step in Python); the ensemble's reference: the mean, "
                f"{_n(bare_reference(r))} steps/s")
        for name, err in (lim.get("errors") or {}).items():
            add(f"  !! {name}: {err}")

    add("")
    add(f"PEERS: workflows of K={k['steps']} trivial steps, N={k['inflight']} in flight")
    add(f"  {'system':<34}{'steps/s':>9}{'runs/s':>9}   lone run (K steps)")
    ens = r.get("ensemble") or {}
    rows = []
    d = r.get("dbos") or {}
    if d.get("measured"):
        rows.append((f"DBOS {d.get('version')} queue (poll {d.get('queue_polling_interval_s')}s)",
                     dig(d, "queue", "steps_per_s"), dig(d, "queue", "workflows_per_s"), d.get("lone_ms")))
        rows.append((f"DBOS {d.get('version')} started directly", dig(d, "direct", "steps_per_s"),
                     dig(d, "direct", "workflows_per_s"), None))
    else:
        add(f"  DBOS: not measured: {d.get('reason', 'phase not run')}")
    t = r.get("temporal") or {}
    if t.get("measured"):
        rows.append(("Temporal dev server (SQLite)", dig(t, "throughput", "steps_per_s"),
                     dig(t, "throughput", "workflows_per_s"), t.get("lone_ms")))
    else:
        add(f"  Temporal: not measured: {t.get('reason', 'phase not run')}")
    rs = r.get("restate") or {}
    if rs.get("measured"):
        rows.append((f"Restate {_restate_log(rs.get('durability') or {})}", dig(rs, "throughput", "steps_per_s"),
                     dig(rs, "throughput", "workflows_per_s"), rs.get("lone_ms")))
    else:
        add(f"  Restate: not measured: {rs.get('reason', 'phase not run')}")
    if ens.get("saturate"):
        rows.append((f"longrun ensemble ({ens.get('workers')} workers)", dig(ens, "saturate", "steps_per_s"),
                     dig(ens, "saturate", "runs_per_s"), dig(ens, "lone", "completed_ms")))
    for name, steps, runs, lone in rows:
        add(f"  {name:<34}{_n(steps):>9}{_n(runs, 1):>9}   {_pct(lone) if lone else '-'}")

    if ens:
        s = ens.get("saturate") or {}
        add("")
        add(f"ENSEMBLE ({ens.get('workers')} workers; real services; run.create published -> run_events)")
        add(f"  lone run, completed          {_pct(dig(ens, 'lone', 'completed_ms'))}")
        add(f"  lone run, first step         {_pct(dig(ens, 'lone', 'first_step_ms'))}")
        bus = ens.get("bus") or {}
        if bus:
            add(f"  lone run, publish -> terminal event received on the bus {_pct(bus.get('terminal_event_ms'))} "
                f"({bus['runs']} runs; " + ", ".join(f"{n} {c}" for n, c in bus["terminal_statuses"].items()) + ")")
        hops = dig(ens, "lone", "hops_p50_ms") or {}
        if hops:
            add("    where it goes (p50 ms): " + ", ".join(f"{n} {v}" for n, v in hops.items()))
        if s:
            add(f"  saturation: {s['runs']} runs    {_n(s['steps_per_s'])} steps/s sustained "
                f"({_n(s['steps_per_s_overall'])} overall), {_n(s['runs_per_s'], 1)} runs/s, makespan {s['makespan_s']} s")
            add(f"    first step                 {_pct(s.get('first_step_ms'))}")
            add(f"    completed                  {_pct(s.get('completed_ms'))}")
            ps = s.get("per_step") or {}
            add(f"    per step: {ps.get('service_commits')} write txns + {ps.get('service_read_only_txns')} read-only txns "
                f"+ {ps.get('service_statements_alone')} statements alone (no BEGIN/COMMIT), "
                f"{ps.get('service_statements')} statements, {ps.get('service_round_trips')} DB round trips, "
                f"{ps.get('messages_published')} msgs published, {ps.get('messages_consumed')} consumed "
                f"(pg_stat: {ps.get('pg_xact_commit')} commits, {ps.get('pg_xact_rollback')} rollbacks)")
            by = s.get("sql_by_service") or {}
            add("    commits/step by service: " + ", ".join(
                f"{n} {v['commits']}" for n, v in by.items() if n != "all services"))
            add("    CPU %: " + ", ".join(f"{n} {v:.0f}" for n, v in (s.get("cpu_pct") or {}).items()))
            add("    CPU ms per step: " + ", ".join(f"{n} {v:.2f}" for n, v in (s.get("cpu_ms_per_step") or {}).items()))
            add(f"    bottleneck: {s.get('bottleneck')}")
        _profiles(add, ens.get("profile"))
        h = ens.get("half_load") or {}
        if h:
            add(f"  half load ({h['rate_runs_per_s']} runs/s = {h['rate_steps_per_s']} steps/s, {h['runs']} runs)")
            add(f"    first step                 {_pct(h.get('first_step_ms'))}")
            add(f"    completed                  {_pct(h.get('completed_ms'))}")

    _retention(add, r.get("retention") or {}, r.get("ratios") or {})
    _timeline(add, r.get("timeline") or {})

    scale = r.get("scale") or []
    if scale:
        add("")
        add(f"SCALE (worker replicas; N={k['inflight']}, K={k['steps']})")
        add(f"  {'workers':>7}{'runs':>6}{'steps/s':>9}{'runs/s':>8}  {'CPU% workers/pg/mq/machine':<28} bottleneck")
        for p in scale:
            if "error" in p:
                add(f"  {p.get('workers'):>7}  !! {p['error']}")
                continue
            c = p.get("cpu_pct") or {}
            cpu = f"{c.get('workers', 0):.0f}/{c.get('postgres', 0):.0f}/{c.get('rabbitmq', 0):.0f}/{c.get('machine', 0):.0f}"
            add(f"  {p['workers']:>7}{p.get('runs', 0):>6}{_n(p['steps_per_s']):>9}{_n(p['runs_per_s'], 1):>8}  "
                f"{cpu:<28} {p.get('bottleneck')}")

    tm = r.get("timers") or {}
    if tm:
        add("")
        add("TIME")
        add(f"  {tm['timers']:,} timers due at once (1 timer service): lateness "
            f"{_pct(tm.get('lateness_s'), 2, ' s')}, max {_n(dig(tm, 'lateness_s', 'max'), 2)} s; "
            f"all fired after {tm.get('all_fired_after_s')} s ({_n(tm.get('fired_per_s'))}/s)")
        add(f"  CPU per wake: timer process {_n(tm.get('timer_cpu_ms_per_timer'), 3)} ms, PostgreSQL "
            f"{_n(tm.get('postgres_cpu_ms_per_timer'), 3)} ms; committed p99 after {tm.get('p99_until_committed_s')} s")
        _profiles(add, tm.get("profile"))
    rec = r.get("recovery") or {}
    if rec:
        if not tm:
            add("")
            add("TIME")
        if rec.get("measured"):
            for row, label in RECOVERY_ROWS.items():
                one = rec.get(row) or {}
                add(f"  recovery after SIGKILL {label}: 1 of 2 workers holding {one.get('runs_held_by_killed_worker')} "
                    f"runs: next step after {_pct(one.get('next_step_after_kill_s'), 2, ' s')}, max "
                    f"{_n(dig(one, 'next_step_after_kill_s', 'max'), 2)} s (membership TTL "
                    f"{rec['partition_lease_ttl_s']:g} s, run lease TTL {rec['run_lease_ttl_s']:g} s; "
                    f"{one.get('not_recovered')} not recovered, {one.get('rewoken_after_lease_expiry')} by lease expiry)")
        else:
            add(f"  recovery: {rec.get('reason')}")
    w = r.get("waiting") or {}
    if w:
        add("")
        add(f"WAITING IS FREE ({w['parked']:,} runs parked in WAITING_EVENT, watched {w['window_s']:g} s each)")
        add(f"  worker RSS growth {w['worker_rss_growth_kib']:+,} KiB; worker CPU {w['worker_cpu_pct_no_runs']}% with no runs, "
            f"{w['worker_cpu_pct_parked']}% with them parked; all services {w['services_cpu_pct_no_runs']}% -> "
            f"{w['services_cpu_pct_parked']}%; PostgreSQL {dig(w, 'no_runs', 'cpu_pct', 'postgres')}% -> "
            f"{dig(w, 'with_parked', 'cpu_pct', 'postgres')}%")
    million = r.get("million") or {}
    if million:
        add("")
        add(f"PARKED AT VOLUME (half on events, half on timers; {million['woken_at_once']:,} woken at once)")
        for p in million["points"]:
            wake = p["wake"]
            add(f"  {p['parked']:>9,} parked: {p['storage']['bytes_per_parked_run']:,} B each "
                f"({p['storage']['total_mib']:,} MiB), loaded in {p['load_s']:g} s; idle: services "
                f"{p['idle_services_cpu_pct']}%, PostgreSQL {p['idle_cpu_pct'].get('postgres')}% "
                f"({p['idle_cpu_pct_before_services'].get('postgres')}% before the services started); "
                f"steady: services {p['steady_services_cpu_pct']}%, PostgreSQL {p['steady_cpu_pct'].get('postgres')}%")
            add("    sweeps (ms): " + ", ".join(f"{k} {v:g}" for k, v in p["sweeps_ms"].items()))
            add("    GET /metrics (ms): " + ", ".join(f"{k} {v:g}" for k, v in p["scrape_ms"].items()))
            add(f"    woken at once: lateness {_pct(wake['lateness_s'], 2, ' s')}; all fired after "
                f"{wake['all_fired_after_s']} s, all taken up after {wake['all_taken_up_after_s']} s, all completed after "
                f"{wake['all_completed_after_s']} s")

    cf = r.get("code_first") or {}
    if cf:
        add("")
        add(f"CODE-FIRST: the steps workload saturated on one ensemble, K={k['steps']}, M={k['runs']}")
        for name in ("decide", "code_first"):
            side = cf[name]
            add(f"  {name:<12} {_n(side['steps_per_s'])} steps/s, {_n(side['runs_per_s'])} runs/s, "
                f"workers {side['cpu_ms_per_step']['workers']} CPU ms/step")
        add(f"  code-first / decide-style steps/s: {_n(cf['code_first_vs_decide'], 2)}")

    add("")
    add("RATIOS (same run)")
    for name, v in (r.get("ratios") or {}).items():
        add(f"  {name:<36} {_n(v, 2)}")
    add("")
    add("TARGETS")
    for tgt in r.get("targets") or []:
        verdict = {True: "MET", False: "MISSED", None: "not measured"}[tgt["met"]]
        add(f"  [{verdict:^12}] {tgt['target']}: {_n(tgt['measured'], 2)} {tgt['unit']}")
    return "\n".join(lines)


def _retention(add: Any, rt: dict[str, Any], rat: dict[str, Any]) -> None:
    """The ensemble saturated with retention at its default, then pruning with a short horizon."""
    if not rt:
        return
    add("")
    add(f"RETENTION (a fresh ensemble per side, {rt['runs']} runs of {rt['steps_per_run']} steps each)")
    for name, label in (("default", "default horizons"), ("short_horizon", f"{rt['short_horizon_s']:g} s horizons")):
        side = rt[name]
        lost = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in side["lost"].items())
        pruned = ", ".join(f"{t} {n:,}" for t, n in side["pruned"].items()) or "nothing"
        add(f"  {label:<18} {_n(side['steps_per_s']):>6} steps/s; lost: {lost}; pruned during it: {pruned}")
    add(f"  short / default steps/s: {_n(rat.get('retention_short_horizon_over_default'), 2)}; "
        f"{'no loss' if rt['no_loss'] else '!! LOSS (above)'}")


def _timeline(add: Any, marks: dict[str, Any]) -> None:
    if not marks.get("runs"):
        return
    add("")
    add(f"TIMELINE (1 worker, {marks['runs']} lone runs, each service marking its way; completed "
        f"{_pct(marks['lone_completed_ms'])})")
    for name, at in marks["after_publish_p50_ms"].items():
        add(f"  {name:<28}{at:>8.2f} ms after the publish (p50), {marks['gap_p50_ms'][name]:>6.2f} after the mark before")


def _restate_log(durability: dict[str, Any]) -> str:
    """How the Restate server kept its log in this run, as it reported it (the JSON has the rest)."""
    if durability.get("log-server.rocksdb-disable-wal"):
        return "(1 node, log without WAL)"
    if durability.get("log-server.rocksdb-disable-wal-fsync"):
        return "(1 node, log WAL, no fsync)"
    return "(1 node, log WAL fsynced)"


def write(r: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(r, indent=1, default=str) + "\n")


def _profiles(add: Any, profiles: dict[str, Any] | None) -> None:
    """py-spy's shares (bench/profile.py), one service per line."""
    for name, prof in (profiles or {}).items():
        if not isinstance(prof, dict):
            continue
        if prof.get("measured"):
            add(f"  {name} CPU by area (py-spy, {prof['samples']} samples): " + ", ".join(
                f"{a} {v}%" for a, v in prof["by_area_pct"].items()))
            add("    hottest: " + ", ".join(f"{f} {v}%" for f, v in prof["top_functions_pct"][:6]))
        else:
            add(f"  {name} profile: not measured: {prof.get('reason')}")
