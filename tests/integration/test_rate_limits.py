"""Rate limits per far side, with real processes: 60 runs of two tenants call one tool limited to 20
calls per 10 s (the per-minute limit, scaled), on two workers.

The tool's far side (``limited_kinds``) writes down the time of every call it gets; the test checks
that no 10 s window holds more than the limit plus its burst, that each limited call cost its run at
most one extra wake, and that workers holding runs in line spend no more CPU than idle ones.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from sqlalchemy import text
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from longrun.app.worker.rate_limit import PARKED_CONTEXT_TOKENS
from longrun.bus import topology
from longrun.bus.codec import broker_user, to_message
from longrun.config.rate_limits import RateLimitSettings
from longrun.domain.rate_limit import Per
from longrun.envelope import make
from longrun.model import ALLOWED_ACTIONS_MARKER, MESSAGE_OVERHEAD_TOKENS, input_tokens_bound
from longrun.monitoring import alerts
from longrun.services.worker.main import RATE_LIMIT_LEAD
from tests.fixtures import eventually
from tests.integration.ensemble import Ensemble, new_key
from tests.integration.identities import bearer
from tests.integration.prometheus_server import PrometheusServer
from tests.model_servers import model_env
from tests.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

KINDS = "tests.integration.limited_kinds:kinds"
PER_10S, BURST, RUNS, WORKERS = 20, 2, 60, 2
# Runs neither waiting nor done once all are in line: one step on each worker, and those woken ahead of
# their place (RATE_LIMIT_LEAD seconds of the limit's rate) that are queued or running again.
IN_FLIGHT = WORKERS + math.ceil(RATE_LIMIT_LEAD * PER_10S / 10)
MODULES = {"scheduler": "longrun.services.scheduler", "relay": "longrun.services.outbox_relay",
           "timer": "longrun.services.timer", "worker": "longrun.services.worker",
           "gateway": "longrun.services.gateway"}


def _start(services: Any, tmp_path: Path, **env: str) -> tuple[Path, list[int], Ensemble]:
    calls = tmp_path / "far-side.jsonl"
    calls.touch()
    ensemble = Ensemble(services, tmp_path)
    options = {"LONGRUN_RUN_KINDS": KINDS, "LIMITED_CALLS": str(calls), "LIMITED_PER_10S": str(PER_10S),
               "LIMITED_BURST": str(BURST), **env}
    for name in ("scheduler", "relay", "timer", "gateway"):
        ensemble.start(name, MODULES[name], **options)
    workers = [ensemble.start(f"worker-{i}", MODULES["worker"], **options).pid for i in range(WORKERS)]
    return calls, workers, ensemble


async def _create(bus: Any, tenant: str, goal: dict[str, Any]) -> str:
    key = new_key()
    envelope = make("run.create", {"workflow": "limited", "idempotency_key": key, "input": goal},
                    producer="tests", tenant_id=tenant)
    await bus.publish(topology.INGRESS_EXCHANGE, "run.create", to_message(envelope, user_id=broker_user(bus.url)))
    return key


def _cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU the processes used so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / ticks


async def _cpu_share(pids: list[int], seconds: float) -> float:
    """The share of one core each of ``pids`` used over the next ``seconds``, on average."""
    before = _cpu_seconds(pids)
    await asyncio.sleep(seconds)
    return (_cpu_seconds(pids) - before) / seconds / len(pids)


async def _rows(engine: Any, sql: str, **params: Any) -> list[Any]:
    async with engine.connect() as conn:
        return list(await conn.execute(text(sql), params))


@pytest.mark.long
async def test_sixty_runs_of_two_tenants_keep_to_one_tool_s_limit_on_two_workers(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given the ensemble with two workers, slots for every run, and a tool limited to 20 calls per 10 s
    calls, workers, ensemble = _start(services, tmp_path, LONGRUN_TENANT_SLOTS=str(RUNS))
    operator = await bearer(engine, "ana", "admin")
    # When 60 runs of two tenants each call it once, all at once
    started = time.monotonic()
    for i in range(RUNS):
        await _create(bus, ("acme", "globex")[i % 2], {})

    async def parked() -> bool:
        (row,) = await _rows(engine, "SELECT count(*) FILTER (WHERE wait_kind = 'rate_limit' "
                                     "AND wait_correlation_key = 'rate_limit:forge-api') AS waiting, "
                                     "count(*) FILTER (WHERE status = 'COMPLETED') AS done FROM runs")
        return row.waiting >= RUNS // 2 and row.waiting + row.done >= RUNS - IN_FLIGHT

    # Then most wait in line for the limit, showing it
    await eventually(parked, timeout=20, what="runs waiting for rate_limit:forge-api")
    waiting = await _cpu_share(workers, 6)
    # and an operator lists them by what holds them, and sees it on each
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, headers=operator, timeout=10) as gateway:
        # (those whose place is more than 3 s away are still held when the answer comes)
        later = {r.run_id for r in await _rows(engine, "SELECT run_id FROM runs WHERE wait_kind = 'rate_limit' "
                                                         "AND wait_deadline > now() + interval '3 s'")}
        listed = (await gateway.get("/runs", params={"waiting_for": "rate_limit:forge-api", "limit": 500})).json()
        held = {r["run_id"]: r for r in listed["runs"]}
        assert len(later) >= 10 and later <= set(held), listed
        assert {r["wait_kind"] for r in held.values()} == {"rate_limit"}
        view = (await gateway.get(f"/runs/{sorted(later)[0]}")).json()
        assert view["waiting_for"] == "rate_limit:forge-api", view
        other = (await gateway.get("/runs", params={"waiting_for": "rate_limit:another"})).json()
        assert other["runs"] == []
        assert (await gateway.get("/runs", params={"waiting_for": "no kind"})).status_code == 400

    async def all_done() -> bool:
        (row,) = await _rows(engine, "SELECT count(*) FILTER (WHERE status = 'COMPLETED') AS done, count(*) AS n "
                                     "FROM runs WHERE workflow = 'limited'")
        return row.n == RUNS and row.done == RUNS

    # And every run completes
    await eventually(all_done, timeout=90, what=f"{RUNS} runs COMPLETED")
    elapsed = time.monotonic() - started
    seen = sorted(json.loads(line)["at"] for line in calls.read_text().splitlines())
    assert len(seen) == RUNS
    # In every sliding 10 s window the tool saw at most 20 plus the burst
    worst = max(sum(1 for t in seen if start <= t < start + 10) for start in seen)
    print(f"{RUNS} calls in {elapsed:.1f}s; the busiest 10 s window held {worst}", [round(t - seen[0], 2) for t in seen])
    assert worst <= PER_10S + BURST, [round(t - seen[0], 2) for t in seen]
    # Each limited call cost its run at most one extra wake, and was charged once
    wakes = await _rows(engine, "SELECT r.run_id, count(e.seq) FILTER (WHERE e.type = 'run.woken') AS woken, "
                                "(r.snapshot #>> '{budget,used,tool_calls}')::int AS charged FROM runs r "
                                "JOIN run_events e USING (run_id) WHERE r.workflow = 'limited' GROUP BY r.run_id")
    assert len(wakes) == RUNS and all(w.woken <= 1 and w.charged == 1 for w in wakes), \
        [w for w in wakes if w.woken > 1 or w.charged != 1]
    assert sum(w.woken for w in wakes) >= RUNS - BURST - PER_10S  # the limit did hold most of them
    # And holding runs in line cost the workers no more CPU than idle, once they are all done, besides
    # the calls that went out meanwhile at their place (two a second, each a take, a call and a
    # commit: 2.4 % of a core a worker on a machine half as fast as the one the bound was set on)
    idle = await _cpu_share(workers, 6)
    print(f"workers' CPU: holding runs in line {waiting:.2%} of a core, idle {idle:.2%}")
    assert waiting <= idle + 0.04


@pytest.mark.long
async def test_prometheus_scrapes_what_a_rate_limit_holds_and_the_alert_on_a_long_hold_fires(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given the limited tool's ensemble with a reconciler, each process with /metrics on a port of its own,
    # and a Prometheus scraping them whose alert on a long hold is rendered at 3 s
    calls = tmp_path / "far-side.jsonl"
    calls.touch()
    ensemble = Ensemble(services, tmp_path)
    ports: dict[str, list[int]] = {}
    for name in ("scheduler", "relay", "timer", "worker", "reconciler"):
        port = free_port()
        ports.setdefault(name, []).append(port)
        ensemble.start(name, {**MODULES, "reconciler": "longrun.services.reconciler"}[name],
                       LONGRUN_RUN_KINDS=KINDS, LIMITED_CALLS=str(calls), LIMITED_PER_10S="10", LIMITED_BURST="1",
                       LONGRUN_HEALTH_PORT=str(port), LONGRUN_HEALTH_BIND="127.0.0.1", LONGRUN_METRICS_INTERVAL="1",
                       LONGRUN_TENANT_SLOTS="20")
    prometheus = PrometheusServer(tmp_path / "prometheus", ports,
                                  alerts.rules(alerts.Thresholds(rate_limit_held_seconds=3), hold="0s"))
    try:
        await prometheus.ready()
        await eventually(prometheus.targets_up, timeout=30, what="every target scraped")
        # When 20 runs call a tool limited to 10 calls per 10 s at once
        for i in range(20):
            await _create(bus, "acme", {})

        # Then Prometheus sees the runs it holds, how long the oldest has waited, and the bucket's level
        async def holding() -> bool:
            held = await prometheus.query('longrun_rate_limit_held_runs{limit="forge-api"}')
            level = await prometheus.query('longrun_rate_limit_bucket_level{bucket="forge-api"}')
            return bool(held) and value(held) >= 5 and bool(level) and value(level) < 0

        await eventually(holding, timeout=30, what="the held runs and the bucket's level scraped")

        # ...and the alert on a run held past its threshold fires, naming the limit
        async def firing() -> bool:
            return any(a["labels"]["alertname"] == "LongrunRateLimitHoldingRuns" and a["state"] == "firing"
                       and a["labels"]["limit"] == "forge-api" for a in await prometheus.alerts())

        await eventually(firing, timeout=30, what="LongrunRateLimitHoldingRuns firing")
        # ...and the worker counted the calls it put in line and how long they waited
        limited = await prometheus.query('sum(longrun_rate_limited_calls_total{limit="forge-api"})')
        waited = await prometheus.query('sum(longrun_rate_limit_wait_seconds_count{limit="forge-api"})')
        assert value(limited) >= 15 and value(waited) == value(limited)
    finally:
        prometheus.stop()


def value(result: list[dict[str, Any]]) -> float:
    (sample,) = result
    return float(sample["value"][1])


class ModelServer:
    """An OpenAI-compatible model in the test process: notes every request's time, run, the tokens it
    can use at most (its messages' bytes, as ``longrun.model.input_tokens_bound`` counts them, plus its
    ``max_tokens``) and its body, answers "finish" reporting all it could use as used, and answers 429
    with ``Retry-After`` to the requests numbered in ``refuse``."""

    def __init__(self, refuse: set[int], retry_after: float, *, outage: float = 0.0) -> None:
        """``outage``: for this many seconds from the first request, every request is answered 503."""
        self.refuse, self.retry_after, self.outage = refuse, retry_after, outage
        self.down_until: float | None = None
        self.requests: list[tuple[float, str, int, int | None]] = []
        """(arrival, run, the most tokens it can use, tokens the answer reports used; None: refused)."""
        self.bodies: list[dict[str, Any]] = []
        """Per request: what it sent."""
        self.port = free_port()
        app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))

    async def chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        arrived, run_id = time.time(), json.loads(body["messages"][1]["content"])["run_id"]
        most = sum(len(m["content"].encode()) + MESSAGE_OVERHEAD_TOKENS for m in body["messages"])
        most += MESSAGE_OVERHEAD_TOKENS + body.get("max_tokens", 100)
        self.bodies.append(body)
        if self.down_until is None:
            self.down_until = arrived + self.outage
        if arrived < self.down_until:
            self.requests.append((arrived, run_id, most, None))
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
        if len(self.requests) in self.refuse:
            self.requests.append((arrived, run_id, most, None))
            return JSONResponse({"error": {"message": "rate limited"}}, status_code=429,
                                headers={"Retry-After": f"{self.retry_after:g}"})
        completion = body.get("max_tokens", 100)
        prompt = most - completion
        self.requests.append((arrived, run_id, most, prompt + completion))
        answer = {"action": "finish", "args": {}, "rationale": "nothing to do"}
        return JSONResponse({"choices": [{"message": {"role": "assistant", "content": json.dumps(answer)}}],
                             "usage": {"prompt_tokens": prompt, "completion_tokens": completion}})


def reservation(body: dict[str, Any]) -> int:
    """What the worker reserves for a call that goes with the context this request was sent with
    (``longrun.app.worker.rate_limit.ask_model``): its input's bound, its ``max_tokens`` and the room
    parking would add."""
    system, user = (m["content"] for m in body["messages"])
    allowed = json.loads(system.split(ALLOWED_ACTIONS_MARKER, 1)[1])
    return input_tokens_bound(json.loads(user), allowed) + body["max_tokens"] + PARKED_CONTEXT_TOKENS


@pytest.mark.long
async def test_a_model_limited_in_tokens_per_minute_keeps_to_it_and_honours_a_429_s_retry_after(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given a model limited to 12,000 tokens per minute (scaled to 6 s), answers of at most 100 tokens,
    # and a model server that answers the third request 429 "retry after 3 s" and reports every token
    # a request could use as used (so what is given back is only what a reservation held beyond that)
    per_minute, minute, retry_after, runs = 12_000, 6.0, 3.0, 10
    model = ModelServer(refuse={2}, retry_after=retry_after)
    serving = asyncio.create_task(model.server.serve())
    try:
        calls = tmp_path / "far-side.jsonl"
        calls.touch()
        ensemble = Ensemble(services, tmp_path)
        for name in ("scheduler", "relay", "timer", "worker"):
            ensemble.start(name, MODULES[name], LONGRUN_RUN_KINDS=KINDS, LIMITED_CALLS=str(calls),
                           LONGRUN_TENANT_SLOTS=str(runs), **model_env(f"http://127.0.0.1:{model.port}/v1"),
                           LONGRUN_MODEL_TOKENS_PER_PERIOD=str(per_minute), LONGRUN_MODEL_RATE_PERIOD=str(minute),
                           LONGRUN_MODEL_MAX_TOKENS="100", LONGRUN_RETRY_INITIAL_INTERVAL="0.5")
        # When ten runs each ask the model once, at once
        for i in range(runs):
            await _create(bus, ("acme", "globex")[i % 2], {"ask": True})

        async def all_done() -> bool:
            (row,) = await _rows(engine, "SELECT count(*) FILTER (WHERE status = 'COMPLETED') AS done, count(*) AS n "
                                         "FROM runs WHERE workflow = 'limited'")
            return row.n == runs and row.done == runs

        # Then every run completes, some after waiting for their place in the model's line
        await eventually(all_done, timeout=90, what=f"{runs} runs COMPLETED")
        waited = await _rows(engine, "SELECT data FROM run_events WHERE type = 'run.wait_started' "
                                     "AND data #>> '{wait,kind}' = 'rate_limit'")
        assert len(waited) >= 3 and {w.data["wait"]["correlation_key"] for w in waited} == {"rate_limit:model-tokens"}
        # ...each request's reservation is on record: a call parked for its place reserved what its
        # run's fact ``rate_limit:model:plan`` holds for its attempt (its n-th request is attempt n), for
        # the fact's first go_at; any other call reserved for the context it was sent with, and went at
        # its place (the request's arrival)
        facts = await _rows(engine, "SELECT run_id, data -> 'value' AS value FROM run_events "
                                    "WHERE type = 'fact.recorded' AND data ->> 'key' = 'rate_limit:model:plan' "
                                    "ORDER BY seq")
        places: dict[tuple[str, int], tuple[float, int]] = {}
        for fact in facts:
            places.setdefault((fact.run_id, fact.value["attempt"]), (fact.value["go_at"], fact.value["tokens"]))
        asked, attempts = [], {}
        for (arrived, run_id, most, used), body in zip(model.requests, model.bodies):
            attempt = attempts[run_id] = attempts.get(run_id, -1) + 1
            place, reserved = places.get((run_id, attempt), (arrived, reservation(body)))
            asked.append((place, reserved, most, used))
        # ...no request could use more tokens than its call reserved, and every answer used no more
        assert all(most <= reserved for _, reserved, most, _ in asked), asked
        assert all(used <= most for _, _, most, used in asked if used is not None), asked
        assert sum(1 for *_, used in asked if used is not None) == runs
        # ...and in every minute (6 s here) the tokens reserved for it kept to the token bucket's bound:
        # its refill per minute plus its size (amount + burst: the setting's 12,000, split between
        # them), plus what answers gave back before the minute ended (a refund refills the bucket)
        (limit,) = RateLimitSettings(model_requests_per_period=0, model_tokens_per_period=per_minute,
                                     model_rate_period=minute, model_rate_per=Per.KEY,
                                     model_max_tokens=100).model_rate_limits()
        assert limit.amount + limit.burst == per_minute
        given_back = [(arrived, reserved - used) for (arrived, *_), (_, reserved, _, used)
                      in zip(model.requests, asked) if used is not None]
        for start, *_ in asked:
            reserved_in_minute = sum(reserved for place, reserved, *_ in asked if start <= place < start + minute)
            bound = limit.amount + limit.burst + sum(back for t, back in given_back if t < start + minute)
            assert reserved_in_minute <= bound, (start, reserved_in_minute, bound, asked)
        # ...and after the 429 nothing reached the model before its Retry-After had passed
        (refused,) = [t for t, _, _, used in model.requests if used is None]
        after = [t for t, _, _, used in model.requests if used is not None and t > refused]
        assert after and min(after) >= refused + retry_after, (refused, after)
        assert len(model.requests) == runs + 1
    finally:
        model.server.should_exit = True
        await serving


@pytest.mark.long
async def test_a_model_endpoint_that_is_down_opens_its_breaker_and_runs_wait_for_it_uncharged(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given a model server down for 8 s from the first call it gets, a breaker opened by 2 unavailable answers with a
    # cool-down of 2 s, and a reconciler that wakes the runs waiting for it once it is healthy
    runs, outage, threshold, cool_down = 8, 8.0, 2, 2.0
    model = ModelServer(refuse=set(), retry_after=0, outage=outage)
    serving = asyncio.create_task(model.server.serve())
    try:
        calls = tmp_path / "far-side.jsonl"
        calls.touch()
        ensemble = Ensemble(services, tmp_path)
        for name, module in (*MODULES.items(), ("reconciler", "longrun.services.reconciler")):
            if name != "gateway":
                ensemble.start(name, module, LONGRUN_RUN_KINDS=KINDS, LIMITED_CALLS=str(calls),
                               LONGRUN_TENANT_SLOTS=str(runs), LONGRUN_MODEL_MAX_TOKENS="100",
                               **model_env(f"http://127.0.0.1:{model.port}/v1"),
                               LONGRUN_BREAKER_THRESHOLD=str(threshold), LONGRUN_BREAKER_COOL_DOWN=f"{cool_down:g}",
                               LONGRUN_BREAKER_CACHE="1", LONGRUN_RETRY_INITIAL_INTERVAL="0.5",
                               LONGRUN_RETRY_MAXIMUM_ATTEMPTS="50", LONGRUN_RECONCILE_INTERVAL="1")
        # When eight runs each ask it once
        for i in range(runs):
            await _create(bus, "acme", {"ask": True})

        # Then its breaker opens and runs wait for it to be healthy, showing it
        async def opened() -> bool:
            rows = await _rows(engine, "SELECT count(*) AS n FROM runs WHERE wait_correlation_key = 'tool-healthy:model'")
            return rows[0].n >= 1

        await eventually(opened, timeout=20, what="runs waiting for the model's breaker")
        assert [r.state for r in await _rows(engine, "SELECT state FROM tool_health WHERE far_side = 'model'")] \
            != ["CLOSED"]

        # ...and once it is back, every run completes
        async def all_done() -> bool:
            (row,) = await _rows(engine, "SELECT count(*) FILTER (WHERE status = 'COMPLETED') AS done, count(*) AS n "
                                         "FROM runs WHERE workflow = 'limited'")
            return row.n == runs and row.done == runs

        await eventually(all_done, timeout=90, what=f"{runs} runs COMPLETED")
        refused = [t for t, _, _, used in model.requests if used is None]
        # the breaker bounds what the outage cost: the answers that opened it, the calls already under
        # way, and one probe per cool-down
        bound = threshold + runs + math.ceil(outage / cool_down) + 1
        assert len(refused) <= bound, (len(refused), bound)
        assert len(model.requests) - len(refused) == runs
        assert [r.state for r in await _rows(engine, "SELECT state FROM tool_health WHERE far_side = 'model'")] \
            == ["CLOSED"]
    finally:
        model.server.should_exit = True
        await serving


async def test_runs_parked_on_a_rate_limit_leave_their_tenant_s_slots_to_its_unlimited_runs(
        clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given two slots per tenant and a tool limited to 2 calls per 10 s: six runs of acme wait in its line
    calls, _, _ = _start(services, tmp_path, LONGRUN_TENANT_SLOTS="2", LIMITED_PER_10S="2", LIMITED_BURST="1")
    for _ in range(6):
        await _create(bus, "acme", {})
    parked = lambda: _rows(engine, "SELECT run_id FROM runs WHERE wait_kind = 'rate_limit'")  # noqa: E731
    await eventually(lambda: _at_least(parked, 2), timeout=20, what="acme's limited runs parked in the line")
    # When acme creates three runs that call nothing limited
    unlimited = [await _create(bus, "acme", {"unlimited": True}) for _ in range(3)]
    # Then they are admitted and complete while acme's limited runs still wait for their places
    done = lambda: _rows(engine, "SELECT run_id FROM runs WHERE idempotency_key = ANY(:keys) "  # noqa: E731
                                 "AND status = 'COMPLETED'", keys=unlimited)
    await eventually(lambda: _at_least(done, 3), timeout=10, what="acme's unlimited runs COMPLETED")
    assert await parked(), "the limited runs were all done: nothing showed the unlimited ones got past them"
    assert sum(1 for line in calls.read_text().splitlines() if '"tool": "call"' in line) < 6


async def _at_least(rows, n: int) -> bool:  # type: ignore[no-untyped-def]
    return len(await rows()) >= n
