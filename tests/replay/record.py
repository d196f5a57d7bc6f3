"""Record run histories into ``tests/replay/histories/`` (run by hand; the replay test only reads them).

Two ways in:

``python -m tests.replay.record from-db --database-url URL --run-id RUN --name NAME --story TEXT
[--workflow-at REV]`` copies one finished run as it is stored (events, late or applied, and the
snapshot in the schema it was written with) and derives its decisions. ``--workflow-at`` takes
the run kind's ``decide`` from the git revision that was deployed when the run was recorded
(read with ``git show``), so the recorded decisions are the ones that release took.

``python -m tests.replay.record rederive --name NAME [--workflow-at REV]`` derives the decisions
of a recorded history again, from its events, when the derivation rules below improve.

``python -m tests.replay.record live [--stories engine|questions|signals ...]`` starts the ensemble
(forge, gateway, scheduler, workers, timer, reconciler, relay) in a database and vhost of its own,
plays the stories below through it like production would (run.create on the bus, approvals and
answers through the operator API, a forge that times out, a worker that dies at a crash point, a
question left unanswered past its deadline, a signal sent twice and one after the end) and records
each finished run.

Every derived decision is checked against what followed it in the history before the file is
written (``replay.record``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.authoring import Registry, RunKind
from longrun.db.engine import make_engine
from tests.replay import replay

HERE = Path(__file__).resolve().parent
HISTORIES = HERE / "histories"
ROOT = HERE.parents[1]


def _write(name: str, data: dict[str, Any]) -> Path:
    HISTORIES.mkdir(exist_ok=True)
    path = HISTORIES / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path.relative_to(ROOT)}: {len(data['events'])} events, {len(data['decisions'])} decisions")
    return path


async def _stored(engine: AsyncEngine, run_id: str) -> tuple[list[tuple[dict[str, Any], bool]], dict[str, Any]]:
    async with engine.connect() as conn:
        rows = (await conn.execute(text("SELECT data, applied FROM run_events WHERE run_id = :r ORDER BY seq"),
                                   {"r": run_id})).all()
        snapshot = (await conn.execute(text("SELECT snapshot FROM runs WHERE run_id = :r"), {"r": run_id})).scalar()
    if snapshot is None:
        raise SystemExit(f"no run {run_id}")
    return [(dict(r.data), bool(r.applied)) for r in rows], dict(snapshot)


WORKFLOW_PATHS = ("examples/dependency_upgrade/longrun_dependency_upgrade/workflow.py",
                  "shared/longrun/workflows/dependency_upgrade.py")
"""Where the upgrade workflow lived, newest first."""


def _exists_at(rev: str, path: str) -> bool:
    return subprocess.run(["git", "cat-file", "-e", f"{rev}:{path}"], cwd=ROOT, capture_output=True).returncode == 0


def _kinds_at(rev: str | None) -> Registry:
    """Today's run kinds, or the upgrade workflow's ``decide`` as it was at git revision ``rev``."""
    kinds = replay.kinds()
    if rev is None:
        return kinds
    path = next(p for p in WORKFLOW_PATHS if _exists_at(rev, p))
    source = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "dependency_upgrade_then.py"
        file.write_text(source)
        spec = importlib.util.spec_from_file_location(f"dependency_upgrade_at_{rev[:10]}", file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    today = kinds.newest(module.KIND)
    kinds.add(RunKind(today.name, today.versions, module.DependencyUpgrade(), today.tools, today.allowed_actions))
    return kinds


async def from_db(args: argparse.Namespace) -> None:
    engine = make_engine(args.database_url, pool_size=1)
    try:
        rows, snapshot = await _stored(engine, args.run_id)
    finally:
        await engine.dispose()
    source = {"how": "copied from a database by tests/replay/record.py from-db", "run_id": args.run_id,
              "database": args.database_url.rsplit("/", 1)[-1], "copied_at": _now(),
              "workflow_build": args.workflow_at or "the working tree at copy time", "note": args.note or ""}
    data = replay.record(name=args.name, story=args.story, source=source, rows=rows, snapshot=snapshot,
                         kinds=_kinds_at(args.workflow_at))
    if args.workflow_at:
        # Where today's decide differs from the build that recorded the run, say so in the file: the
        # replay test then demands exactly these differences, so any other change still fails it.
        data["known_divergences"] = replay.divergences(replay.kinds(), data, why=args.why or "")
    _write(args.name, data)


async def rederive(args: argparse.Namespace) -> None:
    """Derive the decisions of a recorded history again (after the derivation rules improved)."""
    path = HISTORIES / f"{args.name}.json"
    old = json.loads(path.read_text())
    rows = [(row["event"], row["applied"]) for row in old["events"]]
    data = replay.record(name=old["name"], story=old["story"], source=old["recorded"], rows=rows,
                         snapshot=old["snapshot"], kinds=_kinds_at(args.workflow_at))
    if args.workflow_at:
        why = args.why or next((d["why"] for d in old.get("known_divergences", [])), "")
        data["known_divergences"] = replay.divergences(replay.kinds(), data, why=why)
    _write(args.name, data)


def _now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()


# -- live -----------------------------------------------------------------------------------------


async def live(args: argparse.Namespace) -> None:
    from longrun.bus.connection import Bus
    from tests.fixtures import test_topology
    from tests.harness import Services
    from tests.infra import find_infra
    from tests.integration.ensemble import Ensemble, run_id_for
    from tests.integration.identities import bearer

    found = find_infra()
    if isinstance(found, str):
        raise SystemExit(found)
    session = f"lrrec_{uuid.uuid4().hex[:8]}"
    with found.session(session) as infra, tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        (tmp / "logs").mkdir()
        services = Services(infra, tmp / "logs", partitions=8, delivery_limit=5)
        engine = make_engine(infra.database_url, pool_size=2)
        bus = Bus(infra.amqp_url, topology=test_topology(), name="recorder")
        await bus.connect()
        ensemble = Ensemble(services, tmp)
        common = {"LONGRUN_FORGE_TIMEOUT": "2", "LONGRUN_RECONCILE_INTERVAL": "0.5",
                  "LONGRUN_ARTIFACT_DIR": str(tmp / "artifacts"),
                  "LONGRUN_RUN_KINDS": "longrun.workflows:builtin,tests.kinds:ASKING,"
                                       "tests.integration.signal_kinds:SIGNALLED"}
        try:
            ensemble.start_forge()
            await ensemble.configure_forge(deliver_times=2)
            for name, module in (("gateway", "longrun.services.gateway"), ("scheduler", "longrun.services.scheduler"),
                                 ("timer", "longrun.services.timer"), ("reconciler", "longrun.services.reconciler"),
                                 ("relay", "longrun.services.outbox_relay")):
                ensemble.start(name, module, **common)
            crashing = ensemble.start("worker", "longrun.services.worker", **common,
                                      LONGRUN_CRASH_POINTS="worker.after_tool_response_before_record:2")
            await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")

            async def finished(key: str, *, answer: str = "approve", reply: object = None,
                               timeout: float = 120) -> str:
                """Waits for the run made under ``key`` to finish, deciding its approvals (``answer``)
                and answering its question with ``reply`` (None: nobody answers)."""
                run_id = None
                deadline = time.monotonic() + timeout
                async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as gateway:
                    while time.monotonic() < deadline:
                        if not crashing.alive() and all(not p.alive() for p in services.started
                                                        if p.name.startswith("worker")):
                            ensemble.start("worker", "longrun.services.worker", **common)
                        run_id = run_id or await run_id_for(engine, "acme", key)
                        if run_id is not None:
                            async with engine.connect() as conn:
                                row = (await conn.execute(text(
                                    "SELECT status, wait_kind, snapshot #>> '{wait,question_id}' AS question_id, "
                                    "approval_id, approved_hash, approval_owner FROM runs "
                                    "WHERE run_id = :r"), {"r": run_id})).one()
                            if row.status == "WAITING_USER" and row.wait_kind == "question":
                                if reply is not None:
                                    (await gateway.post(f"/runs/{run_id}/answer", json={
                                        "question_id": row.question_id, "answer": reply,
                                        "reason": "recorder: answer"},
                                        headers=await bearer(engine, row.approval_owner or "recorder"))).raise_for_status()
                            elif row.status == "WAITING_USER":
                                (await gateway.post(f"/runs/{run_id}/{answer}", json={
                                    "approval_id": row.approval_id, "approved_hash": row.approved_hash,
                                    "reason": f"recorder: {answer}"},
                                    headers=await bearer(engine, row.approval_owner or "recorder"))).raise_for_status()
                            if row.status in ("COMPLETED", "FAILED", "CANCELLED", "TERMINATED", "TIMED_OUT",
                                              "BUDGET_EXHAUSTED"):
                                return run_id
                        await asyncio.sleep(0.2)
                raise SystemExit(f"run {key} did not finish; logs in {tmp / 'logs'}:\n{services.dump()}")

            stories: list[tuple[str, str, str]] = []
            if "engine" in args.stories:
                stories += await engine_stories(bus, ensemble, finished)
            if "questions" in args.stories:
                stories += await question_stories(bus, finished)
            if "signals" in args.stories:
                stories += await signal_stories(bus, engine, ensemble.gateway_url, finished)
            for name, run_id, story in stories:
                rows, snapshot = await _stored(engine, run_id)
                source = {"how": "played live through the ensemble by tests/replay/record.py live",
                          "run_id": run_id, "recorded_at": _now(), "workflow_build": "the working tree at record time"}
                _write(name, replay.record(name=name, story=story, source=source, rows=rows, snapshot=snapshot,
                                           kinds=replay.kinds()))
        finally:
            services.stop_all()
            await bus.close()
            await engine.dispose()


async def engine_stories(bus: Any, ensemble: Any, finished: Any) -> list[tuple[str, str, str]]:
    """The steps and the dependency upgrade: a worker crash, an unknown outcome, a denial."""
    from tests.integration.ensemble import goal, publish_create

    stories: list[tuple[str, str, str]] = []
    # 1. steps: the worker dies after the second step's answer, before recording it.
    key = f"steps-{uuid.uuid4().hex[:6]}"
    await publish_create(bus, tenant="acme", key=key, input_={"steps": 3}, workflow="steps")
    stories.append(("steps-worker-killed-after-tool-response", await finished(key),
                    "Three pure steps; the worker is killed (crash point) after step 1's answer came back "
                    "and before it was recorded. A new worker takes the run once the lease expires and "
                    "re-runs step 1 under the same idempotency key (a pure tool re-runs), then completes."))
    # 2. the upgrade, with a merge request that times out after the forge created it.
    async with httpx.AsyncClient(base_url=ensemble.forge_url) as forge:
        (await forge.post("/_control/faults", json={"endpoint": "merge_requests",
                                                    "mode": "timeout_after_commit", "times": 1,
                                                    "hold_seconds": 4})).raise_for_status()
    key = f"upgrade-{uuid.uuid4().hex[:6]}"
    await publish_create(bus, tenant="acme", key=key, input_=goal(key[-6:]))
    stories.append(("upgrade-mr-timeout-reconciled", await finished(key),
                    "The dependency upgrade end to end: plan, branch, commit, CI fails (webhook twice), "
                    "fix, commit, CI passes, approval of the exact merge request hash, the merge request "
                    "times out after the forge created it (UNKNOWN), the reconciler finds it by key, "
                    "the run completes on the recorded evidence."))
    # 3. the upgrade, denied by its approver.
    key = f"denied-{uuid.uuid4().hex[:6]}"
    await publish_create(bus, tenant="acme", key=key, input_=goal(key[-6:]))
    stories.append(("upgrade-denied", await finished(key, answer="deny"),
                    "The dependency upgrade until the approval, which its owner denies: the run fails "
                    "with the reason, no merge request is requested."))
    return stories


async def question_stories(bus: Any, finished: Any) -> list[tuple[str, str, str]]:
    """The test-only ``asking`` kind (``tests.kinds``): a question answered, and one left unanswered."""
    from tests.integration.ensemble import publish_create

    key = f"asked-{uuid.uuid4().hex[:6]}"
    await publish_create(bus, tenant="acme", key=key, workflow="asking",
                         input_={"task": "retry storms", "owner": "alice"})
    answered = ("asking-answered", await finished(key, reply={"module": "billing"}),
                "A run asks its owner which module its task is about and waits in WAITING_USER; the owner "
                "answers through the operator API, the answer is checked against the question's schema and "
                "recorded as the fact answer:module, and the run completes with it as evidence.")
    key = f"unanswered-{uuid.uuid4().hex[:6]}"
    await publish_create(bus, tenant="acme", key=key, workflow="asking",
                         input_={"task": "retry storms", "owner": "alice", "answer_within": 2})
    unanswered = ("asking-unanswered", await finished(key),
                  "A run asks its owner a question that nobody answers: at its deadline the timer wakes the "
                  "run (reason deadline), the question closes unanswered, and the run fails saying so.")
    return [answered, unanswered]


async def signal_stories(bus: Any, engine: AsyncEngine, gateway_url: str,
                         finished: Any) -> list[tuple[str, str, str]]:
    """The test-only ``signalled`` kind (``tests.integration.signal_kinds``): its signal sent twice, and
    one sent after it completed."""
    from tests.fixtures import eventually
    from tests.integration.ensemble import publish_create, run_id_for, status_of
    from tests.integration.identities import bearer

    key = f"signalled-{uuid.uuid4().hex[:6]}"
    await publish_create(bus, tenant="acme", key=key, workflow="signalled", input_={})
    run_id = await eventually(lambda: run_id_for(engine, "acme", key), what="the run")

    async def waiting() -> bool:
        return await status_of(engine, run_id) == "WAITING_EVENT"

    await eventually(waiting, timeout=60, what="the wait for ship")
    async with httpx.AsyncClient(base_url=gateway_url, timeout=10) as gateway:
        headers = await bearer(engine, "recorder", "operator")
        for signal_id, name, payload in (("ship-1", "ship", {"by": "ana"}), ("ship-1", "ship", {"by": "ana"})):
            (await gateway.post(f"/runs/{run_id}/signals", headers=headers, json={
                "signal_id": signal_id, "name": name, "payload": payload, "reason": "recorder"})).raise_for_status()
        await finished(key)
        (await gateway.post(f"/runs/{run_id}/signals", headers=headers, json={
            "signal_id": "late-1", "name": "note", "payload": "after the end", "reason": "recorder"})).raise_for_status()
    return [("signalled-twice-and-late", run_id,
             "A run waits for its ship signal (WaitForSignal, WAITING_EVENT); an operator sends it twice under one "
             "signal id: it is recorded once (signal.received, the fact signal:ship-1) and wakes the run once, "
             "which completes with it as evidence; a note signal sent after the run completed is kept in the "
             "history, not applied.")]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.replay.record", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="how", required=True)
    db = sub.add_parser("from-db", help="copy one finished run from a database")
    db.add_argument("--database-url", required=True)
    db.add_argument("--run-id", required=True)
    db.add_argument("--name", required=True)
    db.add_argument("--story", required=True)
    db.add_argument("--note")
    db.add_argument("--workflow-at", help="git revision whose dependency_upgrade decide() recorded the run")
    db.add_argument("--why", help="with --workflow-at: why today's decide differs from that build's")
    played = sub.add_parser("live", help="play the stories through the ensemble and record them")
    played.add_argument("--stories", nargs="+", choices=("engine", "questions", "signals"),
                        default=["engine", "questions", "signals"])
    again = sub.add_parser("rederive", help="derive the decisions of a recorded history again")
    again.add_argument("--name", required=True)
    again.add_argument("--workflow-at")
    again.add_argument("--why")
    args = parser.parse_args()
    asyncio.run({"from-db": from_db, "live": live, "rederive": rederive}[args.how](args))
    sys.exit(0)


if __name__ == "__main__":
    main()
