"""longrunctl: operate runs and the quarantine from a terminal, through the gateway's operator API.

Every mutating command takes a --reason, which is audited with who you are: the name of your token
(or your identity provider's subject), never a name you give. Answers print
as tables (``-o json`` or ``-o yaml`` for scripts); a failure is one line on stderr and a non-zero
exit. Settings come from flags, else the environment, else a config file, else the defaults.
"""

from __future__ import annotations

import json
import os
import time
import tomllib
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import click
import httpx

from longrun_client import __version__, ctl_create, ctl_limits, ctl_schedules, ctl_signal, ctl_tenants, timeline
from longrun_client.bus import TERMINAL_STATUSES
from longrun_client.ctl_examples import COMMAND_EXAMPLES
from longrun_client.ctl_output import FORMATS, View, printable, render
from longrun_client.operator_api import PERMISSIONS, ROLES

CONFIG_FILE = Path("~/.config/longrun/longrunctl.toml")
SETTINGS = {"url": ("LONGRUN_GATEWAY_URL", "http://127.0.0.1:8080"),
            "token": ("LONGRUN_OPERATOR_TOKEN", ""),
            "output": ("LONGRUNCTL_OUTPUT", "table")}
"""Each setting's environment variable and default."""
EXAMPLES = """\b
Examples:
  longrunctl run list --tenant acme --status WAITING_USER
  longrunctl run show RUN_ID
  longrunctl run timeline RUN_ID --follow
  longrunctl run approve RUN_ID --approval-id merge:e33f2c --hash 9e3f30d5... --reason "diff reviewed"
  longrunctl -o json run list --idle-for 2h | jq '.runs[].run_id'
  longrunctl token create ana --role approver --tenant acme --reason "ana joins the acme on-call"

\b
Configuration (flags win, then the environment, then the file):
  --url       LONGRUN_GATEWAY_URL      url = "https://longrun.example.com"
  --token     LONGRUN_OPERATOR_TOKEN   token = "..."
  -o          LONGRUNCTL_OUTPUT        output = "table"
  --config    LONGRUNCTL_CONFIG        (default ~/.config/longrun/longrunctl.toml)
"""


def _settings(config: str | None, given: Mapping[str, str | None]) -> dict[str, str]:
    path = Path(config or os.environ.get("LONGRUNCTL_CONFIG") or CONFIG_FILE).expanduser()
    try:
        from_file = tomllib.loads(path.read_text()) if path.exists() else {}
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise click.ClickException(f"config file {path}: {e}") from None
    unknown = set(from_file) - set(SETTINGS)
    if unknown:
        raise click.ClickException(f"config file {path}: unknown setting(s) {', '.join(sorted(unknown))}; "
                                   f"known: {', '.join(SETTINGS)}")
    chosen = {name: given.get(name) or os.environ.get(variable) or str(from_file.get(name) or default)
              for name, (variable, default) in SETTINGS.items()}
    if chosen["output"] not in FORMATS:
        raise click.ClickException(f"output must be one of {', '.join(FORMATS)}, not {chosen['output']!r}")
    return chosen


def _client(ctx: click.Context) -> httpx.Client:
    opts = ctx.obj
    headers = {"authorization": f"Bearer {opts['token']}"} if opts["token"] else {}  # none is built in
    return httpx.Client(base_url=opts["url"], timeout=30, headers=headers)


def _call(ctx: click.Context, method: str, path: str, body: dict[str, Any] | None = None,
          params: list[tuple[str, str]] | None = None, content: bytes | None = None,
          headers: dict[str, str] | None = None) -> Any:
    """The gateway's answer, stripped of what a terminal would act on (``printable``); any failure is a
    one-line error (and exit 1) saying what to check."""
    url = ctx.obj["url"]
    try:
        with _client(ctx) as http:
            response = http.request(method, path, json=body, params=params, content=content, headers=headers)
    except httpx.ConnectError as e:
        raise click.ClickException(f"cannot reach the gateway at {url} ({_cause(e)}): is it running? "
                                   "(--url, LONGRUN_GATEWAY_URL)") from None
    except httpx.TimeoutException:
        raise click.ClickException(f"the gateway at {url} did not answer in time") from None
    except httpx.HTTPError as e:
        raise click.ClickException(f"talking to the gateway at {url}: {_cause(e)}") from None
    try:
        data = printable(response.json())
    except ValueError:
        data = {"error": printable(response.text.strip()[:200]) or "(empty answer)"}
    if response.status_code >= 400:
        error = data.get("error", data) if isinstance(data, dict) else data
        hint = {401: " (check --token / LONGRUN_OPERATOR_TOKEN)",
                403: " (longrunctl whoami shows your roles and tenants)"}.get(response.status_code, "")
        raise click.ClickException(f"{response.status_code} {printable(response.reason_phrase)}: {error}{hint}")
    return data


def _cause(error: Exception) -> str:
    text = str(error) or type(error).__name__
    return "connection refused" if "refused" in text.lower() else text


def _print(ctx: click.Context, data: Any, view: View | None = None) -> None:
    click.echo(render(data, ctx.obj["output"], view))


@click.group(epilog=EXAMPLES)
@click.version_option(__version__, prog_name="longrunctl", message="%(prog)s %(version)s")
@click.option("--url", help="the gateway [LONGRUN_GATEWAY_URL; http://127.0.0.1:8080]")
@click.option("--token", help="your operator token, which names you [LONGRUN_OPERATOR_TOKEN]")
@click.option("-o", "--output", type=click.Choice(FORMATS), help="table (default), json or yaml [LONGRUNCTL_OUTPUT]")
@click.option("--config", type=click.Path(dir_okay=False), help="a TOML file of these settings [LONGRUNCTL_CONFIG]")
@click.pass_context
def main(ctx: click.Context, url: str | None, token: str | None, output: str | None, config: str | None) -> None:
    """Operate longrun runs through the gateway's operator API."""
    ctx.obj = _settings(config, {"url": url, "token": token, "output": output})


RUNS = View((("RUN", "run_id"), ("TENANT", "tenant_id"), ("STATUS", "status"), ("KIND", "workflow"),
             ("VERSION", "workflow_version"), ("WAIT", "wait_kind"), ("CREATED", "created_at"),
             ("KEY", "idempotency_key")),
            rows=lambda data: data["runs"], footer=lambda data: data["next_cursor"] and
            f"more: --cursor {data['next_cursor']}")
ENTRIES = View((("AT", "at"), ("ACTOR", "actor"), ("ACTION", "action"), ("TARGET", "target"),
                ("REASON", "reason")), rows=lambda data: data["entries"],
               footer=lambda data: data["next_cursor"] and f"more: --cursor {data['next_cursor']}")
ACTIONS = (("ACTION", "logical_action"), ("TOOL", "tool"), ("STATUS", "status"), ("ATTEMPTS", "attempts"),
           ("EXTERNAL ID", "external_id"), ("KEY", "idempotency_key"))


@main.group()
def run() -> None:
    """Create, search, inspect and steer runs."""


run.add_command(ctl_create.create_command(_call, _print))
run.add_command(ctl_signal.signal_command(_call, _print))


def _page_options(command: Any) -> Any:
    command = click.option("--limit", type=click.IntRange(1, 500), help="at most this many (default 50)")(command)
    return click.option("--cursor", help="the next_cursor of the page before")(command)


@run.command("list")
@click.option("--tenant")
@click.option("--status")
@click.option("--wait-kind")
@click.option("--waiting-for", metavar="KIND:WHAT", help="what holds the run, e.g. rate_limit:LIMIT")
@click.option("--version", "workflow_version")
@click.option("--key", "idempotency_key", help="the idempotency key the run was created with")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE", help="repeat to require several")
@click.option("--older-than", metavar="DURATION", help="created more than this long ago (90s, 15m, 12h, 30d)")
@click.option("--idle-for", metavar="DURATION", help="unchanged for at least this long")
@_page_options
@click.pass_context
def run_list(ctx: click.Context, tenant: str | None, status: str | None, wait_kind: str | None,
             waiting_for: str | None, workflow_version: str | None, idempotency_key: str | None, labels: tuple[str, ...],
             older_than: str | None, idle_for: str | None, limit: int | None, cursor: str | None) -> None:
    """Runs matching every filter, newest first, a page at a time (next_cursor: pass it as --cursor)."""
    query = _given(tenant_id=tenant, status=status, wait_kind=wait_kind, waiting_for=waiting_for,
                   workflow_version=workflow_version,
                   idempotency_key=idempotency_key, older_than=older_than, idle_for=idle_for, limit=limit,
                   cursor=cursor)
    _print(ctx, _call(ctx, "GET", "/runs", params=query + [("label", label) for label in labels]), RUNS)


@run.command("show")
@click.argument("run_id")
@click.pass_context
def run_show(ctx: click.Context, run_id: str) -> None:
    """A run: where it is, what it waits for, who holds it, what is next, its actions, what you may do now."""
    shown = _call(ctx, "GET", f"/runs/{run_id}")
    if ctx.obj["output"] != "table":
        _print(ctx, shown)
        return
    run, lease, timer = shown["snapshot"], shown["lease"], shown["next_timer"]
    since = datetime.fromtimestamp(run["status_since"], UTC).isoformat(timespec="seconds")
    summary = {
        "run": run["run_id"], "tenant": run["tenant_id"], "kind": f"{run['kind']}@{run['versions']['workflow']}",
        "status": f"{run['status']} since {since}" + (f" ({run['terminal_reason']})" if run["terminal_reason"] else ""),
        "failing": _failure(run.get("failure")),
        "waits for": _wait(run["wait"]) or shown["waiting_for"],
        "lease": lease and f"{lease['owner']} (token {lease['fencing_token']}) until {lease['until']}",
        "next timer": timer and f"{timer['kind']} at {timer['wake_at']}",
        "budget used": run["budget"]["used"], "allowed now": ", ".join(shown["allowed_operations"]) or "nothing",
        "history": f"{len(shown['events'])} events: longrunctl run timeline {run['run_id']}"}
    click.echo(render(summary, "table"))
    click.echo("\n" + render(run["actions"], "table", View(ACTIONS)))


def _failure(failure: Mapping[str, Any] | None) -> str | None:
    if failure is None:
        return None
    return f"{failure['phase']} raised {failure['error_type']}: {failure['message']} ({failure['attempt']} in a row)"


def _wait(wait: Mapping[str, Any] | None) -> str | None:
    if wait is None:
        return None
    if wait.get("approval_id"):
        return f"approval {wait['approval_id']} by {wait['owner']}{_escalation(wait)} of hash {wait['approved_hash']}"
    if wait.get("question_id"):
        return f"an answer to {wait['question_id']!r} from {wait['owner'] or 'anyone'}{_escalation(wait)}"
    return f"{wait['kind']} {wait.get('correlation_key') or ''} until {_at(wait['deadline'])}".replace("  ", " ")


def _escalation(wait: Mapping[str, Any]) -> str:
    """Who else may act on a person's wait: its ``escalate_to``, once escalated or from when."""
    to = wait.get("escalate_to")
    if not to:
        return ""
    return f" or {to} (escalated)" if wait.get("escalated") else f" ({to} after {wait['escalate_after']:g}s)"


def _at(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


@run.command("timeline")
@click.argument("run_id")
@click.option("--follow", "-f", is_flag=True, help="keep printing new events until the run finishes")
@click.option("--interval", default=1.0, show_default=True, help="seconds between looks, with --follow")
@click.pass_context
def run_timeline(ctx: click.Context, run_id: str, follow: bool, interval: float) -> None:
    """The run's history, one line per event (as `make run` prints it)."""
    shown = 0
    while True:
        answer = _call(ctx, "GET", f"/runs/{run_id}")
        for event in answer["events"][shown:]:
            data = {k: v for k, v in event.items() if k not in ("type", "seq", "at")}
            click.echo(timeline.describe(event["seq"], event["type"], data, True,
                                         datetime.fromtimestamp(event["at"], UTC)))
        shown = len(answer["events"])
        if not follow or answer["snapshot"]["status"] in TERMINAL_STATUSES:
            return
        time.sleep(interval)


def _steer(action: str) -> click.Command:
    @click.command(action, help=f"{action.capitalize()} a run (audited).")
    @click.argument("run_id")
    @click.option("--reason", required=True)
    @click.pass_context
    def command(ctx: click.Context, run_id: str, reason: str) -> None:
        _print(ctx, _call(ctx, "POST", f"/runs/{run_id}/{action}", {"reason": reason}))

    return command


for _action in ("cancel", "pause", "resume", "retry", "terminate"):
    run.add_command(_steer(_action))


@run.command("migrate")
@click.argument("run_id")
@click.option("--to", "to_version", required=True, help="the workflow version to move the run to")
@click.option("--reason", required=True)
@click.pass_context
def run_migrate(ctx: click.Context, run_id: str, to_version: str, reason: str) -> None:
    """Move a run to another workflow version of its kind (refused unless that version takes it over)."""
    _print(ctx, _call(ctx, "POST", f"/runs/{run_id}/migrate", {"to_version": to_version, "reason": reason}))


@run.command("approve")
@click.argument("run_id")
@click.option("--approval-id", required=True)
@click.option("--hash", "approved_hash", required=True, help="the hash shown in the approval request")
@click.option("--reason", required=True)
@click.option("--deny", is_flag=True)
@click.pass_context
def run_approve(ctx: click.Context, run_id: str, approval_id: str, approved_hash: str, reason: str,
                deny: bool) -> None:
    """Approve (or --deny) exactly the request with this hash."""
    _print(ctx, _call(ctx, "POST", f"/runs/{run_id}/{'deny' if deny else 'approve'}",
                 {"approval_id": approval_id, "approved_hash": approved_hash, "reason": reason}))


@run.command("answer")
@click.argument("run_id")
@click.argument("question_id")
@click.option("--json", "answer_json", metavar="JSON", help="the answer, as JSON")
@click.option("--answer-file", type=click.File("r"), help="a file holding the answer as JSON ('-': stdin)")
@click.option("--reason", default="answered the run's question", show_default=True)
@click.pass_context
def run_answer(ctx: click.Context, run_id: str, question_id: str, answer_json: str | None,
               answer_file: IO[str] | None, reason: str) -> None:
    """Answer the question a run asks (its text and answer schema: `run show`); an answer that does
    not satisfy the schema is refused with every violation, and nothing is recorded."""
    if (answer_json is None) == (answer_file is None):
        raise click.UsageError("give the answer with exactly one of --json and --answer-file")
    source = answer_json if answer_file is None else answer_file.read()
    try:
        answer = json.loads(source)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint="--json / --answer-file") from None
    _print(ctx, _call(ctx, "POST", f"/runs/{run_id}/answer", {"question_id": question_id, "answer": answer,
                                                         "reason": reason}))


@run.command("resolve")
@click.argument("run_id")
@click.argument("logical_action")
@click.option("--done", "outcome", flag_value="confirmed", help="it took effect: give --external-id (and --receipt)")
@click.option("--not-done", "outcome", flag_value="not_done", help="it did not: submitted again under the same key")
@click.option("--external-id", help="the id the far side gave the effect")
@click.option("--receipt", "receipt_json", metavar="JSON", help="what the far side shows of it, a JSON object")
@click.option("--reason", required=True, help="what you checked, for the audit log")
@click.pass_context
def run_resolve(ctx: click.Context, run_id: str, logical_action: str, outcome: str | None, external_id: str | None,
                receipt_json: str | None, reason: str) -> None:
    """Settle an action whose outcome is in doubt (UNKNOWN or NEEDS_ATTENTION) with what you found on
    the far side: --done with its external id, or --not-done."""
    if outcome is None:
        raise click.UsageError("say what you found: --done or --not-done")
    try:
        receipt = None if receipt_json is None else json.loads(receipt_json)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint="--receipt") from None
    _print(ctx, _call(ctx, "POST", f"/runs/{run_id}/resolve", {
        "logical_action": logical_action, "outcome": outcome, "external_id": external_id, "receipt": receipt,
        "reason": reason}))


@run.command("retry-action")
@click.argument("run_id")
@click.argument("logical_action")
@click.option("--reason", required=True, help="why it should work now, for the audit log")
@click.pass_context
def run_retry_action(ctx: click.Context, run_id: str, logical_action: str, reason: str) -> None:
    """Send an action that FAILED again under the same idempotency key, once its cause is fixed; the
    run must not have ended."""
    _print(ctx, _call(ctx, "POST", f"/runs/{run_id}/retry-action",
                      {"logical_action": logical_action, "reason": reason}))


@run.command("attach")
@click.argument("run_id")
@click.argument("file", type=click.File("rb"))
@click.option("--name", help="what the run calls it (the fact artifact:<name>); default: the file's name")
@click.option("--media-type", default="application/octet-stream", show_default=True)
@click.option("--reason", required=True)
@click.pass_context
def run_attach(ctx: click.Context, run_id: str, file: IO[bytes], name: str | None, media_type: str,
               reason: str) -> None:
    """Attach a file to a run as evidence; the run records it as the fact artifact:<name>."""
    given = name or Path(file.name).name
    _print(ctx, _call(ctx, "POST", f"/runs/{run_id}/artifacts", params=[("name", given), ("reason", reason)],
                 content=file.read(), headers={"content-type": media_type}))


@main.command("audit")
@click.option("--actor")
@click.option("--action", help="e.g. approve, resolve, webhook.refused, alert.silent_run")
@click.option("--target", help="a run id, a tenant, a provider")
@_page_options
@click.pass_context
def audit(ctx: click.Context, actor: str | None, action: str | None, target: str | None, limit: int | None,
          cursor: str | None) -> None:
    """The audit log, newest first: who did what to which target, and why."""
    _print(ctx, _call(ctx, "GET", "/audit", params=_given(actor=actor, action=action, target=target, limit=limit,
                                                          cursor=cursor)), ENTRIES)


@main.command("alerts")
@click.option("--action", help="one kind, e.g. alert.silent_run")
@click.option("--target", help="a run id")
@_page_options
@click.pass_context
def alerts(ctx: click.Context, action: str | None, target: str | None, limit: int | None, cursor: str | None) -> None:
    """The alerts the reconciler raised, newest first."""
    _print(ctx, _call(ctx, "GET", "/alerts", params=_given(action=action, target=target, limit=limit,
                                                           cursor=cursor)), ENTRIES)


def _given(**params: object) -> list[tuple[str, str]]:
    return [(k, str(v)) for k, v in params.items() if v is not None]


@main.group()
def tenant() -> None:
    """Tenants' policies (what their runs may do, whatever their kind allows), limits (slots, budgets, tool
    concurrency) and their ceilings."""


def _ask(ctx: click.Context, method: str, path: str, body: dict[str, Any] | None) -> None:
    _print(ctx, _call(ctx, method, path, body))


for _what in ("policy", "ceiling"):
    tenant.add_command(ctl_tenants.scope_command(_what, _ask))
for _command in ctl_limits.limits_commands(_call, _print):
    tenant.add_command(_command)
main.add_command(ctl_schedules.schedule_group(_call, _print))


@main.command("versions")
@click.pass_context
def versions(ctx: click.Context) -> None:
    """Per run kind and pinned versions: open runs by status, the oldest wait, the live workers serving it."""
    _print(ctx, _call(ctx, "GET", "/versions"))


@main.group()
def dlq() -> None:
    """Quarantined messages: list them, replay one after re-validation."""


@dlq.command("list")
@click.option("--all", "include_replayed", is_flag=True)
@click.pass_context
def dlq_list(ctx: click.Context, include_replayed: bool) -> None:
    _print(ctx, _call(ctx, "GET", "/quarantine" + ("?all=1" if include_replayed else "")))


@dlq.command("replay")
@click.argument("entry_id", type=int)
@click.option("--reason", required=True)
@click.pass_context
def dlq_replay(ctx: click.Context, entry_id: int, reason: str) -> None:
    _print(ctx, _call(ctx, "POST", f"/quarantine/{entry_id}/replay", {"reason": reason}))


@main.command("whoami")
@click.pass_context
def whoami(ctx: click.Context) -> None:
    """Who your token names: subject, roles, tenants (none: every tenant), groups."""
    _print(ctx, _call(ctx, "GET", "/me"))


TOKENS = View((("ID", "id"), ("NAME", "name"), ("ROLES", "roles"), ("PERMISSIONS", "permissions"),
               ("TENANTS", "tenants"), ("EXPIRES", "expires_at"),
               ("CREATED BY", "created_by"), ("CREATED", "created_at"), ("LAST USED", "last_used_at"),
               ("REVOKED", "revoked_at")), rows=lambda data: data if isinstance(data, list) else [data])


@main.group()
def token() -> None:
    """Named API tokens (admins of every tenant only): the name is who acts with the token."""


@token.command("create")
@click.argument("name")
@click.option("--role", "roles", multiple=True, type=click.Choice(ROLES),
              help="repeat for several; each allows what the ones before it allow")
@click.option("--permission", "permissions", multiple=True, type=click.Choice(PERMISSIONS),
              help="a grant beside the roles, which no role carries (create_runs: run create); repeat for several")
@click.option("--tenant", "tenants", multiple=True, help="a tenant it sees; repeat for several (none: every tenant)")
@click.option("--expires-in", help="refused this long after creation: 90m, 12h, 30d (none: until revoked)")
@click.option("--reason", required=True)
@click.pass_context
def token_create(ctx: click.Context, name: str, roles: tuple[str, ...], permissions: tuple[str, ...],
                 tenants: tuple[str, ...], expires_in: str | None, reason: str) -> None:
    """Create a token for NAME (a role, a permission or both); its secret is printed this once and kept nowhere."""
    created = _call(ctx, "POST", "/tokens", {"name": name, "roles": list(roles), "permissions": list(permissions),
                                             "tenants": list(tenants) or None,
                                             "reason": reason, **({"expires_in": expires_in} if expires_in else {})})
    if ctx.obj["output"] != "table":
        _print(ctx, created)
        return
    click.echo(render([created["token"]], "table", TOKENS))
    click.echo(f"\nsecret (shown once): {created['secret']}")


@token.command("list")
@click.option("--all", "include_revoked", is_flag=True, help="the revoked tokens too")
@click.pass_context
def token_list(ctx: click.Context, include_revoked: bool) -> None:
    _print(ctx, _call(ctx, "GET", "/tokens", params=_given(all=1 if include_revoked else None)), TOKENS)


@token.command("revoke")
@click.argument("token_id", type=int)
@click.option("--reason", required=True)
@click.pass_context
def token_revoke(ctx: click.Context, token_id: int, reason: str) -> None:
    """Revoke a token by its id (token list): it is refused from now on."""
    _print(ctx, _call(ctx, "POST", f"/tokens/{token_id}/revoke", {"reason": reason}), TOKENS)


for _path, _example in COMMAND_EXAMPLES.items():
    _command: click.Command = main
    for _name in _path:
        assert isinstance(_command, click.Group)
        _command = _command.commands[_name]
    _command.epilog = f"\b\nExample:\n  longrunctl {_example}"
