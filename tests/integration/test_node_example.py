"""Any AMQP client: the Node.js example (examples/node, amqplib) creates a run and follows it to its end."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil

import pytest

from tests.infra import Infra
from tests.integration.ensemble import ROOT, Ensemble, new_key, run_id_for, status_of

pytestmark = pytest.mark.integration

EXAMPLE = ROOT / "examples" / "node"
TIMEOUT = 90.0
ACCEPTED = re.compile(r"^run\.accepted run_id=(\S+) workflow=(\S+) repeated=(\S+)$")
STATUS = re.compile(r"^status seq=(\d+) ([A-Z_]+)(?: \(from ([A-Z_]+)\))?$")
OUTCOME = re.compile(r"^outcome (\{.*\})$")


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node (Node.js 20+) is not on PATH: install it, then run `make node-deps`")
    if not (EXAMPLE / "node_modules" / "amqplib").is_dir():
        pytest.fail(f"{EXAMPLE / 'node_modules'} has no amqplib: run `make node-deps`")
    return node


async def _run_example(node: str, infra: Infra, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LONGRUN_")}
    env["LONGRUN_AMQP_URL"] = infra.amqp_url  # carries the session's vhost
    proc = await asyncio.create_subprocess_exec(
        node, "create-and-follow.mjs", *args, cwd=EXAMPLE, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=TIMEOUT)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        pytest.fail(f"the example did not end within {TIMEOUT}s\nstdout:\n{out.decode()}\nstderr:\n{err.decode()}")
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_node_example_creates_a_run_and_prints_its_events_until_it_completes(
        infra, clean, engine, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = _node()
    # Given the scheduler, a worker and the relay
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_services("scheduler", "worker", "relay")
    key = new_key()
    # When the Node.js client creates a `steps` run and follows it
    code, out, err = await _run_example(node, infra, "--tenant", "acme", "--key", key, "--timeout", "60")
    shown = f"exit {code}\nstdout:\n{out}\nstderr:\n{err}"
    print(shown)
    assert code == 0, shown
    lines = out.splitlines()
    # Then it printed run.accepted with the run the key made, before any status event
    accepted = [(i, m) for i, m in ((i, ACCEPTED.match(line)) for i, line in enumerate(lines)) if m]
    assert len(accepted) == 1, shown
    at, match = accepted[0]
    run_id = await run_id_for(engine, "acme", key)
    assert run_id is not None, shown
    assert (match.group(1), match.group(2), match.group(3)) == (run_id, "steps", "false"), shown
    statuses = [(i, m) for i, m in ((i, STATUS.match(line)) for i, line in enumerate(lines)) if m]
    assert statuses and all(i > at for i, _ in statuses), shown
    # and each status change once, which in seq order chain from one to the next and end COMPLETED
    changes = sorted((int(m.group(1)), m.group(3), m.group(2)) for _, m in statuses)
    seqs = [seq for seq, _, _ in changes]
    assert len(set(seqs)) == len(seqs), shown
    assert changes[0][1] == "READY", shown  # a run is created READY
    for (_, _, to), (_, after, _) in zip(changes, changes[1:]):
        assert after == to, shown
    assert changes[-1][2] == "COMPLETED", shown
    assert await status_of(engine, run_id) == "COMPLETED"
    # and, last, the terminal event's outcome
    assert OUTCOME.match(lines[-1]), shown
    outcome = json.loads(OUTCOME.match(lines[-1]).group(1))  # type: ignore[union-attr]
    assert outcome["status"] == "COMPLETED", shown


async def test_the_node_example_exits_non_zero_naming_the_code_when_its_create_is_rejected(
        infra, clean, bus, services, tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = _node()
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("scheduler", "longrun.services.scheduler")
    ensemble.start("relay", "longrun.services.outbox_relay")
    code, out, err = await _run_example(node, infra, "--tenant", "acme", "--workflow", "no_such_workflow",
                                        "--timeout", "60")
    assert code == 1, f"exit {code}\nstdout:\n{out}\nstderr:\n{err}"
    assert "run.rejected unknown_workflow" in err, err
    assert not any(ACCEPTED.match(line) for line in out.splitlines()), out
