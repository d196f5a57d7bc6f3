"""longrunctl against a live gateway: tables for people, JSON and YAML for scripts, the timeline, its
settings from flags, the environment or a file, and one-line errors with a non-zero exit for each way
a call can fail (connection refused, 401, 403, 404, 409)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
from click.testing import CliRunner
import pytest
import yaml

from longrun_client import ctl as longrunctl

from tests.integration.ensemble import OPERATOR_TOKEN, Ensemble
from tests.integration.identities import token
from tests.integration import test_poison_runs, test_signals
from tests.integration.runs_factory import waiting_for_event, waiting_for_user
from tests.security import test_identity

pytestmark = pytest.mark.integration

LONGRUNCTL = Path(sys.executable).parent / "longrunctl"


@pytest.fixture
async def gateway(services, tmp_path):  # type: ignore[no-untyped-def]
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("gateway", "longrun.services.gateway")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    return ensemble.gateway_url


async def ctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    quiet = {k: v for k, v in os.environ.items() if not k.startswith(("LONGRUN_", "LONGRUNCTL_"))}
    return await asyncio.to_thread(subprocess.run, [str(LONGRUNCTL), *args], capture_output=True, text=True,
                                   timeout=60, env={**quiet, "LONGRUNCTL_CONFIG": "/nonexistent", **(env or {})})


@pytest.fixture
async def ana(clean, engine) -> str:  # type: ignore[no-untyped-def]
    """The token of ana, an admin of every tenant."""
    return await token(engine, "ana", "admin")


def at(url: str, secret: str, *args: str) -> list[str]:
    return ["--url", url, "--token", secret, *args]


async def test_lists_and_shows_runs_as_tables_json_and_yaml(ana, clean, engine, gateway) -> None:
    waiting = await waiting_for_event(engine, "ci/acme/payments/21")
    run_id = waiting.snapshot.run_id
    table = await ctl(*at(gateway, ana, "run", "list", "--tenant", "acme"))
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert header.split() == ["RUN", "TENANT", "STATUS", "KIND", "VERSION", "WAIT", "CREATED", "KEY"]
    assert row.split()[:6] == [run_id, "acme", "WAITING_EVENT", "dependency_upgrade", "1", "ci"]
    as_json = json.loads((await ctl(*at(gateway, ana, "-o", "json", "run", "list"))).stdout)
    as_yaml = yaml.safe_load((await ctl(*at(gateway, ana, "-o", "yaml", "run", "list"))).stdout)
    assert as_json == as_yaml and [r["run_id"] for r in as_json["runs"]] == [run_id]
    shown = await ctl(*at(gateway, ana, "run", "show", run_id))
    assert shown.returncode == 0, shown.stderr
    summary = shown.stdout.split("\n\n")[0]
    lines = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in summary.splitlines())
    assert lines["status"].startswith("WAITING_EVENT since")
    assert lines["waits for"].startswith("ci ci/acme/payments/21 until")
    assert lines["next timer"].startswith("wait_deadline at") and lines["lease"] == "-"
    assert lines["allowed now"] == "pause, cancel, terminate"


async def test_the_timeline_prints_each_event_and_follows_until_the_run_finishes(ana, clean, engine, gateway) -> None:
    waiting = await waiting_for_event(engine, "ci/acme/payments/22")
    run_id = waiting.snapshot.run_id
    once = await ctl(*at(gateway, ana, "run", "timeline", run_id))
    assert once.returncode == 0, once.stderr
    assert [line.split()[1:3] for line in once.stdout.splitlines()] == [
        ["#1", "CREATED"], ["#2", "STATUS"], ["#3", "STATUS"]]
    following = asyncio.create_task(ctl(*at(gateway, ana, "run", "timeline", run_id, "--follow", "--interval", "0.2")))
    await asyncio.sleep(1.5)
    assert not following.done()
    ended = await ctl(*at(gateway, ana, "run", "terminate", run_id, "--reason", "stop following"))
    assert ended.returncode == 0, ended.stderr
    followed = await asyncio.wait_for(following, timeout=30)
    assert followed.returncode == 0 and "TERMINATED by ana: stop following" in followed.stdout.splitlines()[-2]
    assert "SUMMARY" in followed.stdout.splitlines()[-1]


async def test_every_failure_is_one_line_and_a_non_zero_exit(ana, clean, engine, gateway) -> None:
    asking = await waiting_for_user(engine, approval_id="merge:1", approved_hash="h1")
    run_id = asking.snapshot.run_id
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    cases: list[tuple[list[str], str]] = [
        (at(closed, ana, "run", "list"),
         f"Error: cannot reach the gateway at {closed} (connection refused): is it running?"),
        (["--url", gateway, "--token", "forged", "run", "list"], "Error: 401 Unauthorized: missing or bad bearer token"),
        (at(gateway, ana, "run", "approve", run_id, "--approval-id", "merge:1", "--hash", "h1", "--reason", "mine"),
         f"Error: 403 Forbidden: run {run_id}: only user_42 may decide this approval, not ana"),
        (at(gateway, ana, "run", "show", "run-nope"), "Error: 404 Not Found: no run 'run-nope'"),
        (at(gateway, ana, "run", "resume", run_id, "--reason", "it is not paused"), "Error: 409 Conflict:"),
    ]
    for argv, error in cases:
        done = await ctl(*argv)
        assert done.returncode == 1 and done.stdout == "", (argv, done)
        assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith(error), (argv, done.stderr)
    usage = await ctl(*at(gateway, ana, "run", "resolve", run_id, "merge", "--reason", "unsure"))
    assert usage.returncode == 2 and "say what you found: --done or --not-done" in usage.stderr


async def test_settings_come_from_flags_then_the_environment_then_the_file(clean, engine, gateway,
                                                                          tmp_path: Path) -> None:
    await waiting_for_event(engine, "ci/acme/payments/23")
    config = tmp_path / "longrunctl.toml"
    config.write_text(f'url = "{gateway}"\ntoken = "{OPERATOR_TOKEN}"\noutput = "json"\n')
    from_file = await ctl("--config", str(config), "run", "list")
    assert from_file.returncode == 0 and len(json.loads(from_file.stdout)["runs"]) == 1, from_file.stderr
    env_wins = await ctl("--config", str(config), "run", "list", env={"LONGRUNCTL_OUTPUT": "yaml"})
    assert len(yaml.safe_load(env_wins.stdout)["runs"]) == 1 and not env_wins.stdout.startswith("{")
    flag_wins = await ctl("--config", str(config), "--token", "forged", "run", "list",
                          env={"LONGRUN_OPERATOR_TOKEN": OPERATOR_TOKEN})
    assert flag_wins.returncode == 1 and "401" in flag_wins.stderr
    config.write_text('colour = "blue"\n')
    bad = await ctl("--config", str(config), "run", "list")
    assert bad.returncode == 1 and "unknown setting(s) colour; known: url, token, output" in bad.stderr


async def test_help_shows_examples_and_where_settings_come_from() -> None:
    shown = await ctl("--help")
    assert shown.returncode == 0
    assert "longrunctl run timeline RUN_ID --follow" in shown.stdout and "LONGRUNCTL_CONFIG" in shown.stdout


TESTED = {
    ("run", "list"): test_lists_and_shows_runs_as_tables_json_and_yaml,
    ("run", "show"): test_lists_and_shows_runs_as_tables_json_and_yaml,
    ("run", "timeline"): test_the_timeline_prints_each_event_and_follows_until_the_run_finishes,
    ("run", "terminate"): test_the_timeline_prints_each_event_and_follows_until_the_run_finishes,
    ("run", "approve"): test_every_failure_is_one_line_and_a_non_zero_exit,
}
"""Each longrunctl command and the test that runs it against the live gateway (filled in below)."""


@pytest.mark.long
async def test_every_other_command_against_the_live_gateway(ana, clean, engine, gateway, tmp_path: Path) -> None:
    run_id = (await waiting_for_event(engine, "ci/acme/payments/24")).snapshot.run_id

    # ana is an admin of every tenant: tenant policies, versions and the quarantine are hers.
    async def ok(*args: str) -> object:
        done = await ctl(*at(gateway, ana, "-o", "json", *args))
        assert done.returncode == 0, (args, done.stderr)
        return json.loads(done.stdout)

    async def refused(error: str, *args: str) -> None:
        done = await ctl(*at(gateway, ana, *args))
        assert done.returncode == 1 and done.stdout == "", (args, done)
        assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith(error), (args, done.stderr)

    assert (await ok("run", "pause", run_id, "--reason", "look"))["status"] == "PAUSED"
    assert (await ok("run", "resume", run_id, "--reason", "looked"))["status"] == "WAITING_EVENT"
    await refused(f"Error: 409 Conflict: run {run_id} cannot be migrated", "run", "migrate", run_id, "--to", "99",
                  "--reason", "newer")
    await refused("Error: 409 Conflict:", "run", "answer", run_id, "q1", "--json", '"yes"', "--reason", "asked")
    await refused(f"Error: 409 Conflict: run {run_id}: resolving 'merge' is not pending", "run", "resolve", run_id,
                  "merge", "--not-done", "--reason", "unsure")
    await refused(f"Error: 409 Conflict: run {run_id}: retrying 'merge' is not pending", "run", "retry-action",
                  run_id, "merge", "--reason", "again")
    evidence = tmp_path / "ci.log"
    evidence.write_text("all green\n")
    attached = await ok("run", "attach", run_id, str(evidence), "--media-type", "text/plain", "--reason", "the log")
    assert attached["artifact"]["name"] == "ci.log" and attached["artifact"]["size"] == 10
    await refused("Error: 404 Not Found:", "run", "attach", "run-nope", str(evidence), "--reason", "the log")
    assert (await ok("run", "cancel", run_id, "--reason", "done here"))["status"] == "CANCELLING"
    audit = await ok("audit", "--target", run_id)
    assert [e["action"] for e in audit["entries"]] == ["cancel", "attach", "resume", "pause"]
    assert (await ok("alerts", "--target", run_id))["entries"] == []
    policy = await ok("tenant", "policy", "globex", "--tool", "forge.*", "--resource", "repo:globex/*",
                      "--reason", "scope globex")
    assert (await ok("tenant", "policy", "globex"))["version"] == policy["version"]
    in_use = await ok("versions")
    assert [(v["kind"], v["open_runs"]) for v in in_use] == [("dependency_upgrade", {"CANCELLING": 1})]
    assert await ok("dlq", "list") == []
    await refused("Error: 404 Not Found: no quarantine entry 999999", "dlq", "replay", "999999", "--reason", "again")


async def test_a_tenants_admin_narrows_its_policy_within_the_ceiling_an_admin_of_every_tenant_sets(
        ana, clean, engine, gateway) -> None:
    tia = await token(engine, "tia", "admin", tenants=("acme",))

    async def as_(secret: str, *args: str) -> subprocess.CompletedProcess[str]:
        return await ctl(*at(gateway, secret, "-o", "json", "tenant", *args))

    set_ceiling = await as_(ana, "ceiling", "acme", "--tool", "forge.*", "--resource", "repo:acme/*",
                            "--reason", "acme's contract")
    assert set_ceiling.returncode == 0, set_ceiling.stderr
    assert json.loads(set_ceiling.stdout)["version"] == 1
    shown = json.loads((await as_(tia, "ceiling", "acme")).stdout)
    assert (shown["tools"], shown["resources"]) == (["forge.*"], ["repo:acme/*"])
    narrowed = await as_(tia, "policy", "acme", "--tool", "forge.open_merge_request", "--resource", "repo:acme/web",
                         "--reason", "web only")
    assert narrowed.returncode == 0 and json.loads(narrowed.stdout)["version"] == 1, narrowed.stderr
    widened = await as_(tia, "policy", "acme", "--tool", "*", "--resource", "*", "--reason", "everything")
    assert widened.returncode == 1 and widened.stderr.startswith(
        "Error: 403 Forbidden: tia may only narrow the policy of tenant 'acme' within its ceiling"), widened.stderr
    not_hers = await as_(tia, "ceiling", "acme", "--tool", "*", "--resource", "*", "--reason", "mine")
    assert not_hers.returncode == 1 and "only a principal of every tenant may" in not_hers.stderr
    no_reason = await as_(ana, "ceiling", "acme", "--tool", "*")
    assert no_reason.returncode == 2 and "--reason is required to change a ceiling" in no_reason.stderr


TESTED[("tenant", "ceiling")] = test_a_tenants_admin_narrows_its_policy_within_the_ceiling_an_admin_of_every_tenant_sets


@pytest.mark.long
async def test_tenant_limits_change_setting_by_setting_and_a_tenants_admin_only_lowers_them_within_the_ceiling(
        ana, clean, engine, gateway) -> None:
    tia = await token(engine, "tia", "admin", tenants=("acme",))

    async def as_(secret: str, *args: str) -> subprocess.CompletedProcess[str]:
        return await ctl(*at(gateway, secret, "-o", "json", "tenant", *args))

    async def limits(secret: str, *args: str) -> dict[str, Any]:
        done = await as_(secret, "limits", "acme", *args)
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    # An admin of every tenant sets acme's slots and a tool group, then a budget: the rest is kept
    assert (await limits(ana, "--slots", "6", "--tool", "forge.*=3", "--reason", "acme grows"))["version"] == 1
    both = await limits(ana, "--token-budget", "1000", "--reason", "a budget")
    assert (both["run_slots"], both["token_budget"], both["tool_concurrency"]) == (6, 1000, {"forge.*": 3})
    # acme's admin lowers its slots, and cannot raise them past the ceiling (the value in force)
    assert (await limits(tia, "--slots", "2", "--reason", "fewer"))["in_force"]["run_slots"] == 2
    raised = await as_(tia, "limits", "acme", "--slots", "9", "--reason", "more")
    assert raised.returncode == 1 and raised.stderr.startswith(
        "Error: 403 Forbidden: tia may only lower the limits of tenant 'acme' within its ceiling"), raised.stderr
    # until an admin of every tenant sets the ceiling higher
    ceiling = await as_(ana, "limits-ceiling", "acme", "--slots", "9", "--reason", "acme's contract")
    assert ceiling.returncode == 0 and json.loads(ceiling.stdout)["run_slots"] == 9, ceiling.stderr
    assert (await limits(tia, "--slots", "9", "--reason", "more"))["run_slots"] == 9
    assert json.loads((await as_(tia, "limits-ceiling", "acme")).stdout)["run_slots"] == 9
    not_hers = await as_(tia, "limits-ceiling", "acme", "--slots", "50", "--reason", "mine")
    assert not_hers.returncode == 1 and "only a principal of every tenant may" in not_hers.stderr
    # a setting goes back to the platform's default by name; a change needs a reason, a group its bound
    assert (await limits(ana, "--default", "token_budget", "--reason", "no budget"))["token_budget"] is None
    no_reason = await as_(ana, "limits", "acme", "--slots", "1")
    assert no_reason.returncode == 2 and "--reason is required to change limits" in no_reason.stderr
    bad = await as_(ana, "limits", "acme", "--tool", "forge.*", "--reason", "r")
    assert bad.returncode == 2 and "GROUP=N" in bad.stderr


TESTED[("tenant", "limits")] = (
    test_tenant_limits_change_setting_by_setting_and_a_tenants_admin_only_lowers_them_within_the_ceiling)
TESTED[("tenant", "limits-ceiling")] = (
    test_tenant_limits_change_setting_by_setting_and_a_tenants_admin_only_lowers_them_within_the_ceiling)


async def test_run_create_prints_its_key_and_a_retry_with_it_answers_the_same_run(clean, engine, gateway) -> None:
    # Given a producer of acme (create_runs, no role)
    producer = await token(engine, "acme-bot", tenants=("acme",), permissions=("create_runs",))
    # When it creates a run without a key
    made = await ctl(*at(gateway, producer, "-o", "json", "run", "create", "steps", "--tenant", "acme",
                         "--input", '{"steps": 1}', "--label", "order=o-7"))
    # Then the run is made, and the key made for it is printed on stderr, apart from the answer
    assert made.returncode == 0, made.stderr
    key = made.stderr.strip().removeprefix("idempotency key: ")
    answer = json.loads(made.stdout)
    assert (answer["workflow"], answer["idempotency_key"], answer["labels"], answer["repeated"]) == (
        "steps", key, {"order": "o-7"}, False)
    # When it retries with that key, Then it is answered the same run, as a repeat
    again = await ctl(*at(gateway, producer, "-o", "json", "run", "create", "steps", "--tenant", "acme",
                          "--input", '{"steps": 1}', "--label", "order=o-7", "--idempotency-key", key))
    assert again.returncode == 0, again.stderr
    assert (json.loads(again.stdout)["run_id"], json.loads(again.stdout)["repeated"]) == (answer["run_id"], True)
    # and the same key with another input is one line naming the refusal, exit 1
    reused = await ctl(*at(gateway, producer, "run", "create", "steps", "--tenant", "acme", "--input", '{"steps": 2}',
                           "--idempotency-key", key))
    assert reused.returncode == 1 and reused.stderr.splitlines()[-1].startswith("Error: 409 Conflict:"), reused.stderr
    # and an input that is not a JSON object is refused before anything is sent
    bad = await ctl(*at(gateway, producer, "run", "create", "steps", "--tenant", "acme", "--input", "[1]"))
    assert bad.returncode == 2 and "JSON object" in bad.stderr


TESTED[("run", "create")] = test_run_create_prints_its_key_and_a_retry_with_it_answers_the_same_run
TESTED[("run", "signal")] = test_signals.test_longrunctl_signals_a_run
TESTED.update({(*name.split(),): test_every_other_command_against_the_live_gateway for name in (
    "run pause", "run resume", "run cancel", "run migrate", "run answer", "run resolve", "run retry-action",
    "run attach", "audit", "alerts", "tenant policy", "versions", "dlq list", "dlq replay")})
TESTED[("run", "retry")] = (test_poison_runs.
                            test_a_run_whose_decide_raises_backs_off_then_needs_attention_and_a_retry_after_the_fix_completes)
TESTED.update({(*name.split(),): test_identity.test_longrunctl_creates_lists_and_revokes_named_tokens for name in (
    "whoami", "token create", "token list", "token revoke")})


def _leaves(group: click.Group, path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every command of ``group``'s tree, as the words that call it."""
    found: set[tuple[str, ...]] = set()
    for name, command in group.commands.items():
        found |= _leaves(command, (*path, name)) if isinstance(command, click.Group) else {(*path, name)}
    return found


@pytest.mark.long
async def test_schedule_commands_create_list_show_pause_resume_backfill_and_delete(ana, clean, engine,
                                                                                    gateway) -> None:
    async def ok(*args: str) -> Any:
        done = await ctl(*at(gateway, ana, "-o", "json", *args))
        assert done.returncode == 0, (args, done.stderr)
        return json.loads(done.stdout)

    made = await ok("schedule", "create", "steps", "--tenant", "acme", "--cron", "*/5 * * * *", "--input",
                    '{"steps": 1}', "--overlap", "buffer_one", "--catch-up", "60", "--label", "team=sec",
                    "--reason", "every five minutes")
    schedule_id = made["schedule_id"]
    assert (made["cron"], made["overlap"], made["catch_up_window"], made["run"]["labels"]) == \
        ("*/5 * * * *", "buffer_one", 60.0, {"team": "sec"})
    assert (await ok("schedule", "pause", schedule_id, "--reason", "quiet"))["paused"]
    assert not (await ok("schedule", "resume", schedule_id, "--reason", "back"))["paused"]
    hour = (datetime.now(UTC) - timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
    filled = await ok("schedule", "backfill", schedule_id, "--from", hour.isoformat(), "--to",
                      (hour + timedelta(hours=1)).isoformat(), "--reason", "the outage")
    assert filled == {"schedule_id": schedule_id, "times": 12, "created": 12}
    assert [s["schedule_id"] for s in (await ok("schedule", "list", "--tenant", "acme"))["schedules"]] == [schedule_id]
    assert len((await ok("schedule", "show", schedule_id))["fires"]) == 12
    table = await ctl(*at(gateway, ana, "schedule", "show", schedule_id))
    assert table.returncode == 0 and "DUE" in table.stdout and "OUTCOME" in table.stdout, table
    assert (await ok("schedule", "delete", schedule_id, "--reason", "done"))["schedule_id"] == schedule_id
    gone = await ctl(*at(gateway, ana, "schedule", "show", schedule_id))
    assert gone.returncode == 1 and gone.stderr.startswith("Error: 404 Not Found:"), gone


for _verb in ("create", "list", "show", "pause", "resume", "backfill", "delete"):
    TESTED[("schedule", _verb)] = test_schedule_commands_create_list_show_pause_resume_backfill_and_delete


def test_every_command_has_a_test_against_the_live_gateway() -> None:
    """A command added to longrunctl fails this until a test runs it and is named in ``TESTED``."""
    assert _leaves(longrunctl.main) == set(TESTED)


def test_every_commands_help_ends_with_an_example_of_it() -> None:
    # In process: the help click prints is the one the installed command prints (test_distributions
    # runs longrunctl itself), without a start of the interpreter per command.
    for path in sorted(_leaves(longrunctl.main)):
        shown = CliRunner().invoke(longrunctl.main, [*path, "--help"], prog_name="longrunctl")
        assert shown.exit_code == 0, (path, shown.output)
        assert f"Example:\n    longrunctl {' '.join(path)} " in shown.output or shown.output.rstrip().endswith(
            f"longrunctl {' '.join(path)}"), (path, shown.output)
