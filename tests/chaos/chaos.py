"""The chaos driver: a steady stream of runs, a monkey that kills services, and the people who answer runs.

Everything random comes from the seed, one stream per role so that timing cannot reorder
the draws: which service dies, how (SIGKILL, SIGTERM, or SIGSTOP for a while, the "stuck
process" whose lease runs out), how long it stays down, when the forge misbehaves once (times
out or fails after acting, or refuses before acting) or is down for a few seconds (every call
answered 503; one such outage, a third of the way in, in every run, so that the forge's circuit
breaker opens, probes and closes), which runs are upgrades, which run.create messages are sent
twice, which runs have a business deadline (due within seconds), which approvals are denied or
first tried with a wrong hash (a function of the seed and the run's key). The processes' own
timing is not replayable, but the script of faults is: ``CHAOS_SEED=<seed>`` replays it.

Roles next to the monkey, as they exist in production:
- a producer publishing ``run.create`` on the ingress exchange, sometimes the very same
  message twice (the scheduler inbox must absorb it) and sometimes the same key again in a
  new message (idempotent creation must answer with the same run);
- an approver answering every WAITING_USER through the gateway's operator API with the
  approval id and hash the run published (mostly approve; some deny; some first send a
  wrong hash, which must be refused);
- the forge's webhook retry: the forge sends each CI result (twice) once, and a gateway that
  is down at that moment loses it; like a real provider's redelivery, a CI result still
  unmatched after a while is sent again, signed, under a stable event id.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.bus import topology
from longrun.bus.codec import broker_user, to_message
from longrun.bus.connection import CONNECTION_ERRORS, Bus
from longrun.db.errors import is_transient
from longrun_dependency_upgrade.forge import sign_payload
from longrun.domain import TERMINAL, RunStatus
from longrun.domain.breaker import TOOL_HEALTHY_WAIT
from longrun.domain.rate_limit import RATE_LIMIT_WAIT
from longrun.envelope import make
from longrun.errors import BusUnavailable
from tests.harness import Process
from tests.integration.ensemble import ROOT, WEBHOOK_SECRET, Ensemble, goal
from tests.integration.identities import bearer

T = TypeVar("T")
TERMINAL_SQL = ", ".join(f"'{s.value}'" for s in TERMINAL)
SETTLED_SQL = ", ".join(f"'{s.value}'" for s in (*TERMINAL, RunStatus.NEEDS_ATTENTION))
LEASE_TTL = 5.0
TENANTS = 8
FORGE_ENDPOINTS = ("branches", "commits", "ci_runs", "merge_requests")
FORGE_FAULTS = ("timeout_after_commit", "error_500_after_commit", "fail_before_commit")
FORGE_OUTAGE_SHARE = 0.25
"""Of the forge's misbehaviours, the share that is an outage (every call answered 503 for a few
seconds: the circuit breakers' case) rather than one faulty answer."""
FORGE_OUTAGE_SECONDS = (2.0, 8.0)
SURE_OUTAGE_SECONDS = 8.0
"""One outage every run has, a third of the way into the faults, met by ``OUTAGE_CALLERS`` runs created
as it begins: the forge's breaker opens, so its waits and probes are in every mix."""
OUTAGE_CALLERS = 8
"""``long_call`` writes that call the forge within a second: with their retries, more unavailable
answers than the breaker's threshold (5), whatever share of the mix calls the forge then."""
BREAKER_COOL_DOWN = 3.0
DEADLINE_SHARE = 0.06
"""Of the ``steps`` runs, the share created with a business deadline, due ``DEADLINE_IN`` seconds after
they are asked for: some finish first, the others end TIMED_OUT by it."""
DEADLINE_IN = (0.5, 4.0)
LONG_CALL_SHARE = 0.08
"""Of the runs, the share of ``long_call`` runs (``tests.kinds``): one call that heartbeats for a
second or two (a read, or a write of a branch on the forge), so a worker stopped or killed mid-call
leaves a call its heartbeat timer gives up on."""
LONG_CALL_BEATS = (2, 5)
LONG_CALL_EVERY = 0.4
QUEUE_TIMEOUT_SHARE = 0.05
"""Of the ``steps`` runs, the share created with a short schedule-to-start: started in time they
complete; if no worker starts them in time (workers down, the scheduler down), they end TIMED_OUT."""
SCHEDULE_TO_START = (1.0, 3.0)
MODEL_CALLS_PER_PERIOD = 4
MODEL_RATE_PERIOD = 2.0
"""The model's rate limit in the mix: about two calls a second for every run together."""


@dataclass(frozen=True)
class Plan:
    seed: int
    chaos_seconds: float
    """How long the monkey kills; run.create keeps coming during the first ``create_share`` of it."""
    min_runs: int
    rate: float
    """run.create per second while creating."""
    settle_seconds: float
    """After the monkey stops: how long every run gets to reach a terminal (or person-waiting) state."""
    long: bool
    kill_every: tuple[float, float] = (1.0, 3.0)
    down_for: tuple[float, float] = (0.3, 2.5)
    pause_for: tuple[float, float] = (1.0, LEASE_TTL + 3.0)
    upgrade_share: float = 0.08
    create_share: float = 0.75
    max_open: int = 150
    """No new run.create while this many runs are open: the backlog stays bounded in the long form."""

    @classmethod
    def from_env(cls) -> Plan:
        raw_seed = os.environ.get("CHAOS_SEED", "").strip()
        seed = int(raw_seed) if raw_seed else random.SystemRandom().randrange(1, 2**31)
        minutes = os.environ.get("CHAOS_MINUTES", "").strip()
        if minutes:
            seconds = float(minutes) * 60
            return cls(seed=seed, chaos_seconds=seconds, min_runs=200, rate=3.0, settle_seconds=240.0, long=True,
                       create_share=0.95)
        return cls(seed=seed, chaos_seconds=60.0, min_runs=200, rate=205 / (60.0 * 0.8), settle_seconds=75.0,
                   long=False, create_share=0.85)

    @property
    def budget_seconds(self) -> float:
        """Wall time the whole test may take (startup, chaos, settling, the checker)."""
        return self.chaos_seconds + self.settle_seconds + (600 if self.long else 90)


@dataclass(frozen=True)
class Slot:
    name: str
    module: str
    weight: int
    """How often the monkey picks it."""


def roster() -> list[Slot]:
    slots = [Slot("gateway", "longrun.services.gateway", 1), Slot("scheduler", "longrun.services.scheduler", 2),
             Slot("worker-a", "longrun.services.worker", 3), Slot("worker-b", "longrun.services.worker", 3),
             Slot("timer", "longrun.services.timer", 1), Slot("relay", "longrun.services.outbox_relay", 2)]
    if (ROOT / "services" / "reconciler" / "main.py").exists():
        slots.append(Slot("reconciler", "longrun.services.reconciler", 1))
    return slots


def service_of(slot: str) -> str:
    return slot.split("-")[0]


@dataclass
class Figures:
    seed: int
    kills: Counter[str] = field(default_factory=Counter)
    terms: Counter[str] = field(default_factory=Counter)
    pauses: Counter[str] = field(default_factory=Counter)
    forge_faults: Counter[str] = field(default_factory=Counter)
    creates: int = 0
    same_message_twice: int = 0
    same_key_again: int = 0
    upgrades: int = 0
    long_calls: int = 0
    approvals: Counter[str] = field(default_factory=Counter)
    webhooks_redelivered: int = 0
    chaos_seconds: float = 0.0
    settle_seconds: float = 0.0


async def patiently(read: Callable[[], Awaitable[T]], *, attempts: int = 60) -> T:
    """A read of our own that survives the shared PostgreSQL restarting under another test."""
    for attempt in range(attempts):
        try:
            return await read()
        except Exception as e:
            if not is_transient(e) or attempt == attempts - 1:
                raise
            await asyncio.sleep(1.0)
    raise AssertionError("unreachable")


class Chaos:
    def __init__(self, ensemble: Ensemble, engine: AsyncEngine, bus: Bus, plan: Plan, tmp: Path) -> None:
        self.ensemble = ensemble
        self.engine = engine
        self.bus = bus
        self.plan = plan
        # One stream per role, so each role's script depends on the seed alone, not on how the
        # roles happen to interleave: the monkey's kills, the producer's runs, each run's answers.
        self.monkey_rng = random.Random(f"{plan.seed}/monkey")
        self.producer_rng = random.Random(f"{plan.seed}/producer")
        self.figures = Figures(plan.seed)
        self.slots = roster()
        self.procs: dict[str, Process] = {}
        self.paused: set[str] = set()
        self.keys: list[tuple[str, str]] = []
        """(tenant, idempotency key) of every distinct run asked for."""
        self.answered: set[str] = set()
        self.approvers: dict[str, dict[str, str]] = {}
        """Each approver's authorization headers (a named token minted on first use)."""
        self.deadlines: set[str] = set()
        """Keys of the runs created with a business deadline."""
        self.queue_timeouts: set[str] = set()
        """Keys of the runs created with a short schedule-to-start."""
        self.redelivered: set[str] = set()
        self.env = {"LONGRUN_FORGE_TIMEOUT": "3", "LONGRUN_RECONCILE_INTERVAL": "0.5",
                    "LONGRUN_RUN_LEASE_TTL": str(LEASE_TTL), "LONGRUN_TENANT_SLOTS": "64",
                    "LONGRUN_WORKER_CONCURRENCY": "24", "LONGRUN_ARTIFACT_DIR": str(tmp / "artifacts"),
                    "LONGRUN_BREAKER_COOL_DOWN": str(BREAKER_COOL_DOWN),
                    "LONGRUN_RUN_KINDS": "longrun.workflows:builtin,tests.kinds:long_call",
                    # The upgrades' model calls share a rate limit: bursts of them wait in its line.
                    "LONGRUN_MODEL_REQUESTS_PER_PERIOD": str(MODEL_CALLS_PER_PERIOD),
                    "LONGRUN_MODEL_RATE_PERIOD": str(MODEL_RATE_PERIOD)}
        self._restarts: set[asyncio.Task[None]] = set()
        self.midway: list[tuple[int, tuple[str, ...]]] = []
        """The long form's checks on the moving system: (runs, violations) each."""

    # -- the ensemble ----------------------------------------------------------------------------
    def start(self, slot: Slot) -> None:
        self.procs[slot.name] = self.ensemble.start(slot.name, slot.module, **self.env)

    async def up(self) -> None:
        self.ensemble.start_forge()
        await self.ensemble.configure_forge(deliver_times=2)
        for slot in self.slots:
            self.start(slot)
        await self.ensemble.wait_http(f"{self.ensemble.gateway_url}/healthz")

    async def heal(self) -> None:
        """Every slot alive and running again: the monkey has stopped."""
        for task in list(self._restarts):
            task.cancel()
        await asyncio.gather(*self._restarts, return_exceptions=True)
        for slot in self.slots:
            proc = self.procs[slot.name]
            if slot.name in self.paused and proc.alive():
                proc.resume()
            self.paused.discard(slot.name)
            if not proc.alive():
                self.start(slot)
        await self.ensemble.wait_http(f"{self.ensemble.gateway_url}/healthz")

    # -- the monkey --------------------------------------------------------------------------------
    async def monkey(self, until: float, *, alongside: Sequence[asyncio.Task[None]] = ()) -> None:
        """Kill, stop and restart services until ``until``; stop early (raising its error) if a task
        ``alongside`` (the producer, the people) failed: chaos without new runs or answers proves little."""
        weights = [s.weight for s in self.slots]
        sure_outage_at: float | None = time.monotonic() + self.plan.chaos_seconds / 3
        while time.monotonic() < until:
            for task in alongside:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            await asyncio.sleep(self.monkey_rng.uniform(*self.plan.kill_every))
            if sure_outage_at is not None and time.monotonic() >= sure_outage_at:
                sure_outage_at = None
                await self._outage(SURE_OUTAGE_SECONDS)
                for _ in range(OUTAGE_CALLERS):
                    await self.create_one(forge_caller=True)
            slot = self.monkey_rng.choices(self.slots, weights)[0]
            how = self.monkey_rng.random()
            down = self.monkey_rng.uniform(*self.plan.down_for)
            pause = self.monkey_rng.uniform(*self.plan.pause_for)
            proc = self.procs[slot.name]
            if not proc.alive() or slot.name in self.paused:
                continue  # already down; its restart is on the way
            if self.monkey_rng.random() < 0.12:
                await self._forge_fault()
            service = service_of(slot.name)
            if service == "worker" and how < 0.3:
                self.figures.pauses[service] += 1
                self._later(self._pause(slot, proc, pause))
                continue
            if how < 0.4:
                self.figures.terms[service] += 1
                await asyncio.to_thread(proc.terminate, 10)
            else:
                self.figures.kills[service] += 1
                await asyncio.to_thread(proc.kill)
            self._later(self._restart(slot, down))

    async def _forge_fault(self) -> None:
        """The far side misbehaves once: times out after acting, fails after acting, or refuses before acting;
        or it is down for a few seconds."""
        if self.monkey_rng.random() < FORGE_OUTAGE_SHARE:
            await self._outage(self.monkey_rng.uniform(*FORGE_OUTAGE_SECONDS))
            return
        endpoint = self.monkey_rng.choice(FORGE_ENDPOINTS)
        mode = self.monkey_rng.choice(FORGE_FAULTS)
        async with httpx.AsyncClient(base_url=self.ensemble.forge_url, timeout=5) as forge:
            (await forge.post("/_control/faults", json={"endpoint": endpoint, "mode": mode, "times": 1,
                                                        "hold_seconds": 4.0})).raise_for_status()
        self.figures.forge_faults[f"{endpoint}:{mode}"] += 1

    async def _outage(self, seconds: float) -> None:
        """Every forge call answered 503 for ``seconds``."""
        async with httpx.AsyncClient(base_url=self.ensemble.forge_url, timeout=5) as forge:
            (await forge.post("/_control/unavailable", json={"seconds": seconds})).raise_for_status()
        self.figures.forge_faults["outage"] += 1

    def _later(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _restart(self, slot: Slot, after: float) -> None:
        await asyncio.sleep(after)
        self.start(slot)

    async def _pause(self, slot: Slot, proc: Process, seconds: float) -> None:
        """SIGSTOP: the process keeps its connections and leases but stops renewing them."""
        self.paused.add(slot.name)
        proc.pause()
        try:
            await asyncio.sleep(seconds)
        finally:
            if proc.alive():
                proc.resume()
            self.paused.discard(slot.name)

    # -- the producer --------------------------------------------------------------------------------
    async def producer(self, until: float) -> None:
        started = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= until and self.figures.creates >= self.plan.min_runs:
                return
            due = int((now - started) * self.plan.rate) + 1
            if self.figures.creates >= due or await patiently(self.open_runs) >= self.plan.max_open:
                await asyncio.sleep(0.1)
                continue
            await self.create_one()

    async def create_one(self, *, forge_caller: bool = False) -> None:
        """Ask for one run of the mix, or (``forge_caller``) a ``long_call`` write that calls the forge at once."""
        i = self.figures.creates
        self.figures.creates += 1  # before publishing: the monkey's callers and the producer share the count
        tenant = f"chaos-t{i % TENANTS}"
        key = f"chaos-{self.plan.seed}-{i}"
        which = self.producer_rng.random()
        if forge_caller:
            workflow, input_ = "long_call", {"repo": "acme/payments", "branch": f"chaos-outage-{self.plan.seed}-{i}",
                                             "effect": "write", "beats": 1, "every": 0.1}
            self.figures.long_calls += 1
        elif which < self.plan.upgrade_share:
            workflow, input_ = "dependency_upgrade", goal(f"{self.plan.seed}-{i}")
            self.figures.upgrades += 1
        elif which < self.plan.upgrade_share + LONG_CALL_SHARE:
            workflow, input_ = "long_call", {
                "repo": "acme/payments", "branch": f"chaos-long-{self.plan.seed}-{i}",
                "effect": self.producer_rng.choice(("read", "read", "write")),
                "beats": self.producer_rng.randint(*LONG_CALL_BEATS), "every": LONG_CALL_EVERY}
            self.figures.long_calls += 1
        else:
            workflow, input_ = "steps", {"steps": self.producer_rng.randint(2, 8)}
        body: dict[str, Any] = {"workflow": workflow, "idempotency_key": key, "input": input_,
                                "priority": self.producer_rng.randint(0, 9)}
        if workflow == "steps":
            roll = self.producer_rng.random()
            if roll < DEADLINE_SHARE:
                # Due while some of these runs are still stepping: the business deadline's protocol under faults.
                due = datetime.now(UTC) + timedelta(seconds=self.producer_rng.uniform(*DEADLINE_IN))
                body["deadline"] = due.isoformat()
                self.deadlines.add(key)
            elif roll < DEADLINE_SHARE + QUEUE_TIMEOUT_SHARE:
                body["timeouts"] = {"schedule_to_start": self.producer_rng.uniform(*SCHEDULE_TO_START)}
                self.queue_timeouts.add(key)
        envelope = make("run.create", body, producer="chaos", tenant_id=tenant)
        self.keys.append((tenant, key))
        await self._publish(envelope)
        roll = self.producer_rng.random()
        if roll < 0.05:
            await self._publish(envelope)  # the same message again: the scheduler's inbox absorbs it
            self.figures.same_message_twice += 1
        elif roll < 0.10:
            # The same request in a new message: idempotent creation answers with the same run.
            await self._publish(make("run.create", body, producer="chaos", tenant_id=tenant))
            self.figures.same_key_again += 1

    async def _publish(self, envelope: Any) -> None:
        """Publish with confirms; when the broker went away (it is shared: another test may restart
        it), reconnect and publish again, like any producer (a copy that did arrive is a duplicate
        the scheduler's inbox absorbs)."""
        for attempt in range(1, 301):
            try:
                if not self.bus.connected:
                    await self.bus.ensure_connected()
                await self.bus.publish(topology.INGRESS_EXCHANGE, "run.create",
                                       to_message(envelope, user_id=broker_user(self.bus.url)))
                return
            except Exception as e:
                if attempt == 300 or not isinstance(e, (BusUnavailable, *CONNECTION_ERRORS)) and attempt > 30:
                    raise
                if attempt == 1:
                    print(f"[chaos] publishing run.create again after {e.__class__.__name__}: {e}", flush=True)
                self.bus.lost.set()
                await asyncio.sleep(1.0)

    # -- the people (and the forge's webhook retry) ---------------------------------------------------
    async def people(self, until: float) -> None:
        async with httpx.AsyncClient(base_url=self.ensemble.gateway_url, timeout=5) as gateway, \
                httpx.AsyncClient(base_url=self.ensemble.forge_url, timeout=5) as forge:
            while time.monotonic() < until:
                try:
                    await self.approve_waiting(gateway)
                    await self.redeliver_lost_webhooks(gateway, forge)
                except httpx.HTTPError:
                    pass  # the gateway is down right now; ask again next round
                except Exception as e:
                    if not is_transient(e):
                        raise
                    # Someone else's fault test stopped the shared PostgreSQL for a moment.
                await asyncio.sleep(0.5)

    async def approve_waiting(self, gateway: httpx.AsyncClient) -> None:
        async with self.engine.connect() as conn:
            rows = (await conn.execute(text(
                "SELECT run_id, tenant_id, idempotency_key, approval_id, approved_hash, approval_owner FROM runs "
                "WHERE status = 'WAITING_USER'"))).all()
        for row in rows:
            token = f"{row.run_id}:{row.approval_id}"
            if token in self.answered:
                continue
            # The answer to each run is a function of the seed and the run's key alone.
            roll = random.Random(f"{self.plan.seed}/{row.tenant_id}/{row.idempotency_key}/{row.approval_id}").random()
            owner = row.approval_owner or "chaos"
            if owner not in self.approvers:
                self.approvers[owner] = await bearer(self.engine, owner)
            headers = self.approvers[owner]
            if roll < 0.05:
                wrong = await gateway.post(f"/runs/{row.run_id}/approve", headers=headers, json={
                    "approval_id": row.approval_id, "approved_hash": "0" * 64, "reason": "chaos: wrong hash"})
                assert wrong.status_code == 409, f"an approval of another hash was not refused: {wrong.text}"
                self.figures.approvals["wrong hash refused"] += 1
            action = "deny" if roll > 0.9 else "approve"
            answer = await gateway.post(f"/runs/{row.run_id}/{action}", headers=headers, json={
                "approval_id": row.approval_id, "approved_hash": row.approved_hash, "reason": f"chaos: {action}"})
            # 409: the run moved on meanwhile (e.g. our first answer committed but its response was lost).
            assert answer.status_code in (200, 409), answer.text
            self.answered.add(token)
            self.figures.approvals[f"{action}d" if action == "approve" else "denied"] += 1

    async def redeliver_lost_webhooks(self, gateway: httpx.AsyncClient, forge: httpx.AsyncClient) -> None:
        async with self.engine.connect() as conn:
            rows = (await conn.execute(text(
                "SELECT run_id, wait_correlation_key FROM runs WHERE status = 'WAITING_EVENT' "
                "AND wait_kind = 'ci' AND updated_at < now() - interval '4 seconds'"))).all()
        for row in rows:
            match = re.fullmatch(r"ci/(.+)/(\d+)", row.wait_correlation_key or "")
            if match is None:
                continue
            repo, ci_id = match.group(1), int(match.group(2))
            found = await forge.get(f"/repos/{repo}/ci/runs/{ci_id}")
            if found.status_code != 200 or found.json()["status"] == "running":
                continue
            ci = found.json()
            event = {"id": f"evt-redelivered-{ci_id}", "type": "ci.finished", "ci_run_id": ci_id, "repo": repo,
                     "sha": ci["sha"], "status": ci["status"],
                     "log_excerpt": "\n".join(ci["log"].splitlines()[-20:])[-2000:]}
            body = json.dumps(event, sort_keys=True, separators=(",", ":")).encode()
            answer = await gateway.post("/webhooks/forge", content=body, headers={
                "content-type": "application/json", "x-forge-event-id": event["id"],
                "x-forge-signature": sign_payload(WEBHOOK_SECRET, body)})
            if answer.status_code == 202 and event["id"] not in self.redelivered:
                self.redelivered.add(event["id"])
                self.figures.webhooks_redelivered += 1

    # -- observing ---------------------------------------------------------------------------------
    async def open_runs(self) -> int:
        async with self.engine.connect() as conn:
            return int((await conn.execute(text(
                f"SELECT count(*) FROM runs WHERE status NOT IN ({TERMINAL_SQL})"))).scalar_one())

    async def unsettled(self) -> list[tuple[str, str, str]]:
        """(run_id, status, wait kind) of runs still moving, plus asked-for runs not created yet."""
        async with self.engine.connect() as conn:
            rows = (await conn.execute(text(
                f"SELECT run_id, status, coalesce(wait_kind, '') FROM runs WHERE status NOT IN ({SETTLED_SQL}) "
                "ORDER BY run_id"))).all()
            created = int((await conn.execute(text("SELECT count(*) FROM runs"))).scalar_one())
        missing = [("<not created yet>", "", "")] * max(0, len(self.keys) - created)
        return [tuple(r) for r in rows] + missing  # type: ignore[misc]

    def count_logs(self, pattern: str) -> Counter[str]:
        """Matching lines per service across every process's log (restarts included)."""
        found: Counter[str] = Counter()
        regex = re.compile(pattern)
        for log in self.ensemble.services.logs.glob("*.log"):
            service = service_of(log.stem)
            with log.open(errors="replace") as f:
                found[service] += sum(1 for line in f if regex.search(line))
        return +found

    async def tally(self) -> dict[str, Any]:
        async with self.engine.connect() as conn:
            statuses = {f"{kind}/{status}": n for kind, status, n in (await conn.execute(text(
                "SELECT workflow, status, count(*) FROM runs GROUP BY workflow, status ORDER BY 1, 2"))).all()}
            runs = int((await conn.execute(text("SELECT count(*) FROM runs"))).scalar_one())
            steps = int((await conn.execute(text(
                "SELECT count(*) FROM actions WHERE status = 'CONFIRMED'"))).scalar_one())
            events = int((await conn.execute(text("SELECT count(*) FROM run_events"))).scalar_one())
            late = int((await conn.execute(text("SELECT count(*) FROM run_events WHERE NOT applied"))).scalar_one())
            same_run = int((await conn.execute(text(
                "SELECT count(*) FROM inbox_scheduler WHERE outcome->>'created' = 'false'"))).scalar_one())
            reconciled = dict((await conn.execute(text(
                "SELECT data->>'outcome', count(*) FROM run_events WHERE type = 'action.reconciled' "
                "GROUP BY 1"))).all())
            unavailable = int((await conn.execute(text(
                "SELECT count(*) FROM run_events WHERE type = 'action.unavailable'"))).scalar_one())
            health_waits = int((await conn.execute(text(
                "SELECT count(*) FROM run_events WHERE type = 'run.wait_started' "
                f"AND data->'wait'->>'kind' = '{TOOL_HEALTHY_WAIT}'"))).scalar_one())
            rate_waits = int((await conn.execute(text(
                "SELECT count(*) FROM run_events WHERE type = 'run.wait_started' "
                f"AND data->'wait'->>'kind' = '{RATE_LIMIT_WAIT}'"))).scalar_one())
            fired = dict((await conn.execute(text(
                "SELECT kind, count(*) FROM timers WHERE fired_at IS NOT NULL GROUP BY 1"))).all())
        return {"runs": runs, "by_kind_status": statuses, "confirmed_actions": steps, "events": events,
                "late_events_stored": late, "run_create_answered_with_existing_run": same_run,
                "reconciled": reconciled, "actions_unavailable": unavailable, "waits_for_tool_health": health_waits,
                "waits_for_a_rate_limit": rate_waits,
                "timers_fired": fired}

