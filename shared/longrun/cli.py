"""longrunctl: operate runs and the quarantine from a terminal, through the gateway's operator API.

Every mutating command takes a --reason, which is audited with the operator's name.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

import click
import httpx


def _client(ctx: click.Context) -> httpx.Client:
    opts = ctx.obj
    return httpx.Client(base_url=opts["url"], timeout=30, headers={
        "authorization": f"Bearer {opts['token']}", "x-operator": opts["operator"]})


def _call(ctx: click.Context, method: str, path: str, body: dict[str, Any] | None = None,
          params: list[tuple[str, str]] | None = None, content: bytes | None = None,
          headers: dict[str, str] | None = None) -> Any:
    with _client(ctx) as http:
        response = http.request(method, path, json=body, params=params, content=content, headers=headers)
    data = response.json()
    if response.status_code >= 400:
        raise click.ClickException(f"{response.status_code}: {data.get('error', data)}")
    return data


def _print(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))


@click.group()
@click.option("--url", default=lambda: os.environ.get("LONGRUN_GATEWAY_URL", "http://127.0.0.1:8080"),
              show_default="$LONGRUN_GATEWAY_URL or http://127.0.0.1:8080")
@click.option("--token", default=lambda: os.environ.get("LONGRUN_OPERATOR_TOKEN", "dev-operator-token"))
@click.option("--operator", default=lambda: os.environ.get("USER", "operator"), help="your name, for the audit log")
@click.pass_context
def main(ctx: click.Context, url: str, token: str, operator: str) -> None:
    ctx.obj = {"url": url, "token": token, "operator": operator}


@main.group()
def run() -> None:
    """Search, inspect and steer runs."""


def _page_options(command: Any) -> Any:
    command = click.option("--limit", type=click.IntRange(1, 500), help="at most this many (default 50)")(command)
    return click.option("--cursor", help="the next_cursor of the page before")(command)


@run.command("list")
@click.option("--tenant")
@click.option("--status")
@click.option("--wait-kind")
@click.option("--version", "workflow_version")
@click.option("--key", "idempotency_key", help="the idempotency key the run was created with")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE", help="repeat to require several")
@click.option("--older-than", metavar="DURATION", help="created more than this long ago (90s, 15m, 12h, 30d)")
@click.option("--idle-for", metavar="DURATION", help="unchanged for at least this long")
@_page_options
@click.pass_context
def run_list(ctx: click.Context, tenant: str | None, status: str | None, wait_kind: str | None,
             workflow_version: str | None, idempotency_key: str | None, labels: tuple[str, ...],
             older_than: str | None, idle_for: str | None, limit: int | None, cursor: str | None) -> None:
    """Runs matching every filter, newest first, a page at a time (next_cursor: pass it as --cursor)."""
    query = _given(tenant_id=tenant, status=status, wait_kind=wait_kind, workflow_version=workflow_version,
                   idempotency_key=idempotency_key, older_than=older_than, idle_for=idle_for, limit=limit,
                   cursor=cursor)
    _print(_call(ctx, "GET", "/runs", params=query + [("label", label) for label in labels]))


@run.command("show")
@click.argument("run_id")
@click.pass_context
def run_show(ctx: click.Context, run_id: str) -> None:
    _print(_call(ctx, "GET", f"/runs/{run_id}"))


def _steer(action: str) -> click.Command:
    @click.command(action, help=f"{action.capitalize()} a run (audited).")
    @click.argument("run_id")
    @click.option("--reason", required=True)
    @click.pass_context
    def command(ctx: click.Context, run_id: str, reason: str) -> None:
        _print(_call(ctx, "POST", f"/runs/{run_id}/{action}", {"reason": reason}))

    return command


for _action in ("cancel", "pause", "resume", "terminate"):
    run.add_command(_steer(_action))


@run.command("migrate")
@click.argument("run_id")
@click.option("--to", "to_version", required=True, help="the workflow version to move the run to")
@click.option("--reason", required=True)
@click.pass_context
def run_migrate(ctx: click.Context, run_id: str, to_version: str, reason: str) -> None:
    """Move a run to another workflow version of its kind (refused unless that version takes it over)."""
    _print(_call(ctx, "POST", f"/runs/{run_id}/migrate", {"to_version": to_version, "reason": reason}))


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
    _print(_call(ctx, "POST", f"/runs/{run_id}/{'deny' if deny else 'approve'}",
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
    _print(_call(ctx, "POST", f"/runs/{run_id}/answer", {"question_id": question_id, "answer": answer,
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
    _print(_call(ctx, "POST", f"/runs/{run_id}/resolve", {
        "logical_action": logical_action, "outcome": outcome, "external_id": external_id, "receipt": receipt,
        "reason": reason}))


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
    _print(_call(ctx, "POST", f"/runs/{run_id}/artifacts", params=[("name", given), ("reason", reason)],
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
    _print(_call(ctx, "GET", "/audit", params=_given(actor=actor, action=action, target=target, limit=limit,
                                                     cursor=cursor)))


@main.command("alerts")
@click.option("--action", help="one kind, e.g. alert.silent_run")
@click.option("--target", help="a run id")
@_page_options
@click.pass_context
def alerts(ctx: click.Context, action: str | None, target: str | None, limit: int | None, cursor: str | None) -> None:
    """The alerts the reconciler raised, newest first."""
    _print(_call(ctx, "GET", "/alerts", params=_given(action=action, target=target, limit=limit, cursor=cursor)))


def _given(**params: object) -> list[tuple[str, str]]:
    return [(k, str(v)) for k, v in params.items() if v is not None]


@main.group()
def tenant() -> None:
    """Tenants' policies: what their runs may do, whatever their kind allows."""


@tenant.command("policy")
@click.argument("tenant_id")
@click.option("--tool", "tools", multiple=True, metavar="PATTERN",
              help="a tool name or a prefix ending in '*'; repeat for several (with --resource: replaces the policy)")
@click.option("--resource", "resources", multiple=True, metavar="PATTERN",
              help="what tools act on (e.g. 'repo:acme/*'); repeat for several")
@click.option("--reason", help="required to change the policy")
@click.pass_context
def tenant_policy(ctx: click.Context, tenant_id: str, tools: tuple[str, ...], resources: tuple[str, ...],
                  reason: str | None) -> None:
    """Show the tenant's policy or, given --tool/--resource and --reason, replace it under a new version.
    Runs created later are narrowed by it; approved calls of open runs are re-validated under it."""
    if not tools and not resources:
        _print(_call(ctx, "GET", f"/tenants/{tenant_id}/policy"))
        return
    if not reason:
        raise click.UsageError("--reason is required to change a policy")
    _print(_call(ctx, "PUT", f"/tenants/{tenant_id}/policy",
                 {"tools": list(tools), "resources": list(resources), "reason": reason}))


@main.command("versions")
@click.pass_context
def versions(ctx: click.Context) -> None:
    """Per run kind and pinned versions: open runs by status, the oldest wait, the live workers serving it."""
    _print(_call(ctx, "GET", "/versions"))


@main.group()
def dlq() -> None:
    """Quarantined messages: list them, replay one after re-validation."""


@dlq.command("list")
@click.option("--all", "include_replayed", is_flag=True)
@click.pass_context
def dlq_list(ctx: click.Context, include_replayed: bool) -> None:
    _print(_call(ctx, "GET", "/quarantine" + ("?all=1" if include_replayed else "")))


@dlq.command("replay")
@click.argument("entry_id", type=int)
@click.option("--reason", required=True)
@click.pass_context
def dlq_replay(ctx: click.Context, entry_id: int, reason: str) -> None:
    _print(_call(ctx, "POST", f"/quarantine/{entry_id}/replay", {"reason": reason}))
