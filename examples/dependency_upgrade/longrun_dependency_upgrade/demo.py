"""``make run``: bring the whole ensemble up on this machine and run one dependency upgrade end to end.

Migrates the database, starts the demo forge (real git, real CI) and every service as separate processes
(``longrun.launcher``; logs in var/logs/), waits until each reports ready, publishes ``run.create``
on the ingress exchange with longrun-client exactly as an external producer would, and prints the
run's timeline live — state changes, actions with idempotency keys and receipts, waits and what
woke them, each commit's diff and each CI run's test result — acting as the approver when the run
asks. It ends when the run reaches a terminal state, then checks the forge: the merge request must
exist exactly once.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from longrun_client import Client

from longrun.config import Settings
from longrun.domain import RunStatus
from longrun.launcher import Launcher, follow, run_stoppable
from longrun_dependency_upgrade import FORGE_URL

TENANT = "acme"
GATEWAY_SECRETS = ("LONGRUN_OPERATOR_TOKENS", "LONGRUN_WEBHOOK_SECRET", "LONGRUN_CONSOLE_SECRET")
"""Drawn at random for this demo unless the environment gives them: the gateway has none built in."""


async def publish_run_create(settings: Settings, key: str, goal: dict[str, Any]) -> None:
    async with await Client.connect(settings.amqp_url, producer="make-run") as client:
        envelope = await client.create_run(TENANT, "dependency_upgrade", goal, idempotency_key=key, priority=5)
    print(f"  published run.create {envelope.event_id} (tenant {TENANT}, idempotency key {key})")


def diff_line(action: str, receipt: dict[str, Any]) -> str:
    """``DIFF  commit:1 <sha>: 2 files, +2 -2 (requirements.txt +1 -1, ...)`` from a commit's receipt."""
    diff = receipt["diff"]
    files = ", ".join(f"{f['path']} +{f['added']} -{f['removed']}" for f in diff["files"])
    return (f"         -> DIFF  {action} {receipt['sha'][:12]}: {len(diff['files'])} file(s), "
            f"+{diff['added']} -{diff['removed']} ({files})")


def ci_line(ci_run: str, result: dict[str, Any]) -> str:
    """``TESTS ci 1 on <sha>: 1 failed, 2 passed; FAILED <test>`` from a CI result's log excerpt."""
    lines = result.get("log_excerpt", "").splitlines()
    # The CI's own lines, not unittest's "FAILED (errors=1)".
    failed = [line.removeprefix("FAILED ") for line in lines if line.startswith("FAILED ") and "(" not in line]
    summary = lines[-1] if lines else result["status"]
    return (f"         -> TESTS ci {ci_run} on {result['sha'][:12]} {result['status']}: {summary}"
            + (f"; FAILED {', '.join(failed)}" if failed else ""))


async def approve(gateway: httpx.AsyncClient, settings: Settings, run_id: str, wait: dict[str, Any]) -> None:
    """The approver the request names signs in with a token of their own (created here with the
    bootstrap token, as an admin would with ``longrunctl token create``): the gateway records who
    approved from the token, never from what the caller says."""
    print(f"         -> {wait['owner']} reviews {wait['subject']!r} and approves hash {wait['approved_hash'][:12]}")
    admin = {"authorization": f"Bearer {settings.operator_tokens[0]}"}
    # A name belongs to one live token: an earlier demo's token for the approver is revoked first.
    listed = await gateway.get("/tokens", headers=admin)
    listed.raise_for_status()
    for earlier in (t for t in listed.json() if t["name"] == wait["owner"]):
        (await gateway.post(f"/tokens/{earlier['id']}/revoke", headers=admin,
                            json={"reason": "make run: a new token for the approver"})).raise_for_status()
    created = await gateway.post("/tokens", json={"name": wait["owner"], "roles": ["approver"], "tenants": [TENANT],
                                                  "reason": "make run: the approver's token"}, headers=admin)
    created.raise_for_status()
    response = await gateway.post(
        f"/runs/{run_id}/approve", json={"approval_id": wait["approval_id"], "approved_hash": wait["approved_hash"],
                                         "reason": "diff, tests and cost reviewed"},
        headers={"authorization": f"Bearer {created.json()['secret']}"})
    response.raise_for_status()


async def main_async(args: argparse.Namespace) -> int:
    drawn = {name: os.environ.get(name) or secrets.token_urlsafe(32) for name in GATEWAY_SECRETS}
    settings = Settings.from_env({**os.environ, **drawn})
    root = Path.cwd()
    gateway_port, forge_port = args.port_base, args.port_base + 10
    forge_url = f"http://127.0.0.1:{forge_port}"
    launcher = Launcher(root, gateway_port=gateway_port, health_base=args.port_base + 100,
                        env={FORGE_URL: forge_url, "LONGRUN_FORGE_TIMEOUT": "3"})
    launcher.base_env.update(drawn)
    print("longrun: starting the ensemble")
    launcher.migrate()
    (launcher.logs.parent / "forge.sqlite").unlink(missing_ok=True)
    shutil.rmtree(launcher.logs.parent / "forge.sqlite.repos", ignore_errors=True)
    launcher.start("forge", [sys.executable, "-m", "longrun_dependency_upgrade.forge", "--port", str(forge_port),
                             "--state", str(launcher.logs.parent / "forge.sqlite"), "--ci-delay", "0.5"],
                   f"{forge_url}/healthz")
    launcher.start_services()
    try:
        await launcher.ready()
        async with httpx.AsyncClient(base_url=forge_url) as forge:
            # The CI reports through a signed webhook, delivered twice: the gateway inbox absorbs the repeat.
            (await forge.post("/_control/webhook", json={
                "url": f"http://127.0.0.1:{gateway_port}/webhooks/forge", "secret": settings.webhook_secret,
                "deliver_times": 2})).raise_for_status()
            if args.mr_timeout:
                (await forge.post("/_control/faults", json={"endpoint": "merge_requests",
                                                            "mode": "timeout_after_commit", "times": 1,
                                                            "hold_seconds": 8})).raise_for_status()
        key = args.key or f"upgrade-payment-sdk-{uuid.uuid4().hex[:8]}"
        goal = {"repo": "acme/payments", "package": "payment-sdk", "from": "4.2.0", "to": "5.0.0",
                "branch": f"agent/payment-sdk-v5-{key[-8:]}", "owner": "user_42"}
        print("\nlongrun: timeline")
        await publish_run_create(settings, key, goal)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway_port}", timeout=10) as gateway:
            async def on_event(run_id: str, type_: str, data: dict[str, Any]) -> None:
                if type_ == "run.wait_started" and data["status"] == RunStatus.WAITING_USER.value:
                    await approve(gateway, settings, run_id, data["wait"])
                if type_ == "fact.recorded" and data["key"].startswith("receipt:commit:"):
                    print(diff_line(data["key"].removeprefix("receipt:"), data["value"]))
                if type_ == "fact.recorded" and data["key"].startswith("ci_result:"):
                    print(ci_line(data["key"].removeprefix("ci_result:"), data["value"]))

            status = await follow(settings, TENANT, key, time.monotonic() + args.timeout, on_event)
        async with httpx.AsyncClient(base_url=forge_url) as forge:
            effects = (await forge.get("/_control/effects")).json()
        mrs = [e for e in effects if e["kind"] == "merge_request"]
        print(f"\nlongrun: run ended {status}; forge effects: "
              + ", ".join(f"{e['kind']}×{e['count']}" for e in effects))
        created = sum(e["count"] for e in mrs)
        print(f"longrun: merge requests created for this run: {created}")
        return 0 if status == RunStatus.COMPLETED.value and created == 1 else 1
    finally:
        if not args.keep:
            launcher.stop()
            print("longrun: services stopped (logs in var/logs/)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the run to finish")
    parser.add_argument("--key", help="idempotency key of the run.create (default: a new one)")
    parser.add_argument("--mr-timeout", action=argparse.BooleanOptionalAction, default=True,
                        help="the forge times out after creating the merge request, so the action goes UNKNOWN "
                             "and the reconciler settles it by idempotency key (the story of seed 004)")
    parser.add_argument("--keep", action="store_true", help="leave the services running afterwards")
    parser.add_argument("--port-base", type=int, default=8280,
                        help="gateway on this port, forge on +10, health probes from +100")
    run_stoppable(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
