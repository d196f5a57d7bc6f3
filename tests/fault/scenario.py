"""One fault scenario over the real ensemble: start services, create runs, break things, read the outcome.

Every service is its own process (``tests.harness``) against this session's PostgreSQL
database and RabbitMQ vhost; the forge/CI stand-in is a process too, and its
``/_control/effects`` is what the checker counts external effects with. Timeouts are short
(run and partition leases of 3 s, reconciler sweeps every 0.5 s) so a crashed worker's run
is taken over within seconds. Tool calls' start-to-close (10 s) is longer than the lease, so a
dead worker's write is recovered by its lease's expiry, not by the call's durable timer (rows of
their own, ``test_call_timeouts.py``).

``finish()`` ends every scenario: the outbox drained (downstream saw every status change),
then ``longrun.testing.invariants.check(engine, effects=forge_effects, settled=True)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from longrun.bus import topology
from longrun.bus.codec import broker_user, to_message
from longrun.bus.connection import Bus
from longrun.db import actions as ledger
from longrun.db import outbox, runs
from longrun.db.errors import is_transient
from longrun.domain import TERMINAL, RunStatus
from longrun.envelope import Envelope, make
from longrun.errors import BusUnavailable
from longrun.ports.runs import StoredRun
from longrun.testing.invariants import Report, check
from tests.harness import Process, Services
from tests.infra import Infra, ctl
from longrun_dependency_upgrade.forge import sign_payload
from tests.integration.ensemble import WEBHOOK_SECRET, Ensemble, goal
from tests.integration.identities import bearer

T = TypeVar("T")
LEASE_TTL = 3
REDELIVER_AFTER = 3.0
"""Seconds a finished CI result may go untaken before the provider sends it again."""
MODULES = {
    "gateway": "longrun.services.gateway",
    "scheduler": "longrun.services.scheduler",
    "worker": "longrun.services.worker",
    "timer": "longrun.services.timer",
    "reconciler": "longrun.services.reconciler",
    "relay": "longrun.services.outbox_relay",
}
EVERYTHING = ("gateway", "scheduler", "relay", "timer", "reconciler", "worker")


class Scenario:
    def __init__(self, services: Services, infra: Infra, engine: AsyncEngine, bus: Bus, tmp: Path) -> None:
        self.services = services
        self.infra = infra
        self.engine = engine
        self.bus = bus
        self.tmp = tmp
        self.ensemble = Ensemble(services, tmp)
        self.env = {**self.ensemble.env, "LONGRUN_RUN_LEASE_TTL": str(LEASE_TTL),
                    "LONGRUN_PARTITION_LEASE_TTL": str(LEASE_TTL), "LONGRUN_RECONCILE_INTERVAL": "0.5",
                    "LONGRUN_FORGE_TIMEOUT": "10", "LONGRUN_ARTIFACT_DIR": str(tmp / "artifacts")}
        self.approved: set[tuple[str, str]] = set()
        self.tokens: dict[str, dict[str, str]] = {}
        """Each approver's authorization headers (a named token minted on first use)."""

    # -- processes ------------------------------------------------------------------------------------
    def start(self, name: str, *, clock_skew: float | None = None, **env: str) -> Process:
        return self.services.start(name, MODULES[name], clock_skew=clock_skew, **{**self.env, **env})

    async def up(self, *names: str, forge: bool = True, deliver_times: int = 1,
                 forge_faults: tuple[dict[str, Any], ...] = (), ci_delay: float = 0.2,
                 **env: str) -> dict[str, Process]:
        """Start the forge (configured) and the named services; the gateway is waited for."""
        if forge:
            self.services.start("forge", "longrun_dependency_upgrade.forge", argv_extra=[
                "--port", str(self.ensemble.forge_port), "--state", str(self.tmp / "forge.sqlite"),
                "--ci-delay", str(ci_delay)])
        started = {name: self.start(name, **env) for name in names}
        if forge:
            await self.ensemble.configure_forge(deliver_times=deliver_times, faults=forge_faults)
        if "gateway" in names:
            await self.ensemble.wait_http(f"{self.ensemble.gateway_url}/healthz")
        return started

    def running(self, name: str) -> list[Process]:
        return [p for p in self.services.started if p.name.startswith(f"{name}-") and p.alive()]

    async def crashed(self, proc: Process, point: str, timeout: float = 30) -> None:
        """Wait for ``proc`` to die at the armed crash point (and nothing else)."""
        await asyncio.to_thread(proc.wait_dead, timeout)
        assert proc.crashed_at(point), f"{proc.name} ended with {proc.popen.returncode}:\n{proc.output()[-3000:]}"

    # -- the far side --------------------------------------------------------------------------------
    async def forge_effects(self) -> list[dict[str, Any]]:
        return await self.ensemble.forge_effects()

    async def forge_counts(self) -> Counter[str]:
        """Objects the forge created, per kind (branch, commit, ci_run, merge_request)."""
        counts: Counter[str] = Counter()
        for effect in await self.forge_effects():
            counts[effect["kind"]] += effect["count"]
        return counts

    async def forge_fault(self, endpoint: str, mode: str, *, times: int = 1, hold_seconds: float = 30) -> None:
        async with httpx.AsyncClient(base_url=self.ensemble.forge_url) as forge:
            (await forge.post("/_control/faults", json={"endpoint": endpoint, "mode": mode, "times": times,
                                                        "hold_seconds": hold_seconds})).raise_for_status()

    # -- runs -----------------------------------------------------------------------------------------
    async def create(self, *, workflow: str = "dependency_upgrade", input_: dict[str, Any] | None = None,
                     budget: dict[str, Any] | None = None, tenant: str = "acme", timeout: float = 30) -> str:
        """Publish run.create as any producer would; the run id once the scheduler created it."""
        key = f"fault-{uuid.uuid4().hex[:10]}"
        payload: dict[str, Any] = {"workflow": workflow, "idempotency_key": key, "priority": 5,
                                   "input": input_ if input_ is not None else goal(key[-8:])}
        if budget is not None:
            payload["budget"] = budget
        envelope = make("run.create", payload, producer="fault-tests", tenant_id=tenant)
        await self.publish(topology.INGRESS_EXCHANGE, "run.create", envelope)

        async def created() -> str | None:
            return await self.scalar("SELECT run_id FROM runs WHERE tenant_id = :t AND idempotency_key = :k",
                                     t=tenant, k=key)

        return await self.poll(created, timeout=timeout, what=f"run {key} created")

    async def publish(self, exchange: str, routing_key: str, envelope: Envelope) -> None:
        """Publish with confirms as a producer does, reconnecting first if the connection was dropped."""
        for attempt in range(3):
            await self.bus.ensure_connected()
            try:
                await self.bus.publish(exchange, routing_key, to_message(envelope, user_id=broker_user(self.bus.url)))
                return
            except BusUnavailable:
                if attempt == 2:
                    raise
                self.bus.lost.set()

    async def db(self, work: Callable[[AsyncConnection], Awaitable[T]], *, write: bool = False) -> T:
        """``work(conn)`` on one connection (in a transaction if ``write``), riding out a database that is
        restarting: the cluster is shared, and a test of ours or of another session may restart it."""
        deadline = asyncio.get_running_loop().time() + 90
        while True:
            try:
                async with (self.engine.begin() if write else self.engine.connect()) as conn:
                    return await work(conn)
            except Exception as e:
                if not is_transient(e) or asyncio.get_running_loop().time() > deadline:
                    raise
                await self.engine.dispose()
                await asyncio.sleep(0.5)

    async def stored(self, run_id: str) -> StoredRun:
        stored = await self.db(lambda conn: runs.load(conn, run_id))
        assert stored is not None, f"no run {run_id}"
        return stored

    async def until(self, run_id: str, *statuses: RunStatus, timeout: float = 30, approve: bool = False,
                    redeliver: bool = False) -> StoredRun:
        """Wait until the run is in one of ``statuses`` (approving merges on the way if asked, and
        redelivering CI results like a provider if asked); on a timeout fail with what a user would
        look at: status, the last events, the checker's report, partitions, queues."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            stored = await self.stored(run_id)
            run = stored.snapshot
            if run.status in statuses:
                return stored
            if approve and run.status is RunStatus.WAITING_USER:
                await self.approve(run_id)
            if redeliver and run.status is RunStatus.WAITING_EVENT:
                await self.redeliver_ci_result(stored)
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(await self.explain(run_id, f"run is {run.status.value} after {timeout}s, "
                                                                f"expected {'/'.join(s.value for s in statuses)}"))
            await asyncio.sleep(0.1)

    async def to_the_end(self, run_id: str, *, timeout: float = 45, redeliver: bool = False) -> StoredRun:
        """Approve whatever it asks and wait for a terminal status."""
        return await self.until(run_id, *TERMINAL, timeout=timeout, approve=True, redeliver=redeliver)

    async def redeliver_ci_result(self, stored: StoredRun) -> None:
        """What a provider with retries does: a CI result that finished a while ago and was not taken
        (the gateway answered an error, or was unreachable) is sent again, signed, under a stable id."""
        wait = stored.snapshot.wait
        if wait is None or not (wait.correlation_key or "").startswith("ci/"):
            return
        if stored.snapshot.status_since > time.time() - REDELIVER_AFTER:
            return
        repo, ci_id = wait.correlation_key.removeprefix("ci/").rsplit("/", 1)  # type: ignore[union-attr]
        async with httpx.AsyncClient(timeout=5) as http:
            ci = (await http.get(f"{self.ensemble.forge_url}/repos/{repo}/ci/runs/{ci_id}")).json()
            if ci.get("status") not in ("passed", "failed"):
                return
            body = json.dumps({"id": f"redelivery-{repo}-{ci_id}", "type": "ci.finished", "ci_run_id": int(ci_id),
                               "repo": repo, "sha": ci["sha"], "status": ci["status"],
                               "log_excerpt": ci["log"][-2000:]}, sort_keys=True).encode()
            try:
                await http.post(f"{self.ensemble.gateway_url}/webhooks/forge", content=body, headers={
                    "x-forge-signature": sign_payload(WEBHOOK_SECRET, body), "content-type": "application/json"})
            except httpx.HTTPError:
                pass

    async def approve(self, run_id: str, *, approved_hash: str | None = None) -> httpx.Response:
        """The owner approves the pending request through the gateway's operator API."""
        wait = (await self.stored(run_id)).snapshot.wait
        assert wait is not None and wait.approval_id is not None, f"{run_id} waits for no approval"
        if approved_hash is None and (run_id, wait.wait_id) in self.approved:
            return httpx.Response(200)
        async with httpx.AsyncClient(base_url=self.ensemble.gateway_url, timeout=10) as gateway:
            response = await gateway.post(f"/runs/{run_id}/approve", json={
                "approval_id": wait.approval_id, "approved_hash": approved_hash or wait.approved_hash,
                "reason": "diff, CI and cost reviewed"},
                headers=await self.acting_as(wait.owner or "user_42"))
        if response.status_code == 200 and approved_hash is None:
            self.approved.add((run_id, wait.wait_id))
        return response

    async def acting_as(self, name: str) -> dict[str, str]:
        if name not in self.tokens:
            self.tokens[name] = await bearer(self.engine, name)
        return self.tokens[name]

    async def operate(self, run_id: str, action: str, reason: str) -> httpx.Response:
        """``action`` on the run as ops, a named operator."""
        async with httpx.AsyncClient(base_url=self.ensemble.gateway_url, timeout=10) as gateway:
            return await gateway.post(f"/runs/{run_id}/{action}", json={"reason": reason},
                                      headers=await self.acting_as("ops"))

    async def events(self, run_id: str) -> list[dict[str, Any]]:
        """The run's timeline: type, data, applied (False: stored as late) and the writer's fencing token."""
        rows = await self.rows(
            "SELECT seq, type, data, applied, fencing_token FROM run_events WHERE run_id = :r ORDER BY seq", r=run_id)
        return [{"seq": r.seq, "type": r.type, "data": r.data, "applied": r.applied, "token": r.fencing_token}
                for r in rows]

    async def trail(self, run_id: str, logical_action: str) -> list[str]:
        """The action events of one logical action, in order."""
        return [e["type"] for e in await self.events(run_id) if e["data"].get("logical_action") == logical_action]

    async def ledger(self, run_id: str) -> dict[str, ledger.LedgerRow]:
        return {row.logical_action: row for row in await self.db(lambda conn: ledger.for_run(conn, run_id))}

    async def wakeups(self, run_id: str, reason: str | None = None) -> int:
        rows = await self.rows("SELECT payload FROM outbox WHERE aggregate_id = :r AND type = 'run.wakeup'", r=run_id)
        return sum(1 for row in rows
                   if reason is None or outbox.envelope_of("run.wakeup", row.payload)["payload"]["reason"] == reason)

    async def recoveries(self, run_id: str) -> int:
        """How often the run was recovered from a lost worker: re-woken after its lease expired, or taken
        over by a worker once its holder's membership lapsed (with the scenario's TTLs of 3 s each, both
        come due together and either may come first)."""
        taken_over = sum(p.output().count(f"run {run_id}: taken over from ") for p in self.services.started
                         if p.name.startswith("worker-"))
        return await self.wakeups(run_id, "lease expired") + taken_over

    async def scalar(self, sql: str, **params: Any) -> Any:
        async def work(conn: AsyncConnection) -> Any:
            return (await conn.execute(text(sql), params)).scalar()
        return await self.db(work)

    async def rows(self, sql: str, **params: Any) -> list[Any]:
        async def work(conn: AsyncConnection) -> list[Any]:
            return list(await conn.execute(text(sql), params))
        return await self.db(work)

    async def execute(self, sql: str, **params: Any) -> None:
        async def work(conn: AsyncConnection) -> None:
            await conn.execute(text(sql), params)
        await self.db(work, write=True)

    async def check(self, *, settled: bool = True) -> Report:
        effects = await self.forge_effects() if self.running("forge") else []
        deadline = asyncio.get_running_loop().time() + 90
        while True:
            try:
                return await check(self.engine, effects=effects, settled=settled)
            except Exception as e:
                if not is_transient(e) or asyncio.get_running_loop().time() > deadline:
                    raise
                await self.engine.dispose()
                await asyncio.sleep(0.5)

    # -- the end of every scenario --------------------------------------------------------------------
    async def finish(self, *, settled: bool = True, relay: bool = True) -> Report:
        """The one checker, once the outbox is drained: the report must be clean."""
        if relay:
            await self.poll(lambda: self._outbox_drained(), timeout=20, what="every outbox row published")
        report = await self.check(settled=settled)
        report.assert_clean()
        return report

    async def _outbox_drained(self) -> bool:
        return await self.scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL") == 0

    async def explain(self, run_id: str, what: str) -> str:
        events = await self.events(run_id)
        report = await self.check()
        alive = ", ".join(f"{p.name}{'' if p.alive() else f' (ended {p.popen.returncode})'}"
                          for p in self.services.started)
        last = "\n    ".join(f"{e['seq']} {e['type']} {_brief(e['data'])}{'' if e['applied'] else ' (late)'}"
                             for e in events[-12:])
        stored = await self.stored(run_id)
        leases = await self.rows("SELECT service, partition, owner FROM partition_leases ORDER BY service, partition")
        owners = ", ".join(f"{r.service}/{r.partition}={r.owner}" for r in leases if r.service == "worker")
        unpublished = await self.scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
        stuck = await self.rows(
            "SELECT pid, state, now() - xact_start AS age, left(query, 80) AS query FROM pg_stat_activity "
            "WHERE datname = current_database() AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid() "
            "AND clock_timestamp() - xact_start > interval '1 second'")
        if stuck:
            what += f"\n  transactions left open: {[(r.pid, str(r.age), r.query) for r in stuck]}"
        queues = ""
        if self.infra.rabbitmqctl:
            listing = await asyncio.to_thread(ctl, "list_queues", "-q", "-p", self.infra.vhost, "name", "messages",
                                              "consumers", check=False)
            queues = " ".join("=".join(line.split("\t")[1:]) + f"@{line.split(chr(9))[0].rsplit('.', 1)[-1]}"
                              for line in listing.stdout.splitlines() if ".worker." in line)
        return (f"{what}\n  last events:\n    {last}\n  checker: {list(report.violations) or 'clean'}\n"
                f"  processes: {alive}\n  run partition {stored.partition}, lease {stored.lease_owner}/"
                f"{stored.fencing_token}; worker partitions: {owners}\n  unpublished outbox rows: {unpublished}; "
                f"worker queues (messages=consumers@partition): {queues}")

    @contextlib.asynccontextmanager
    async def database_setting(self, name: str, value: str) -> AsyncIterator[None]:
        """A setting of this session's database for the connections opened inside (as a DBA sets it)."""
        await self.execute(f'ALTER DATABASE "{self.infra.database}" SET {name} = \'{value}\'')
        try:
            yield
        finally:
            await self.execute(f'ALTER DATABASE "{self.infra.database}" RESET {name}')

    @staticmethod
    async def poll(check_: Any, *, timeout: float, what: str, interval: float = 0.1) -> Any:
        deadline = asyncio.get_running_loop().time() + timeout
        last = None
        while asyncio.get_running_loop().time() < deadline:
            last = await check_()
            if last:
                return last
            await asyncio.sleep(interval)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


def _brief(data: dict[str, Any]) -> str:
    keep = {k: data[k] for k in ("logical_action", "to", "status", "reason", "cause", "outcome", "wait_id")
            if k in data}
    return str(keep) if keep else ""
