"""``longrunctl run create``: a producer's create over the gateway's ``POST /runs``, no AMQP client needed.

The create is keyed on its idempotency key: given, or made here, it is printed (on stderr, so ``-o json``
stays one document) before the request goes out, and a retry with the same key and input answers the run
the first attempt made, however far that attempt got. The token needs the ``create_runs`` permission.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import click

from longrun_client.registry import LATEST

SCHEMA_VERSION = LATEST["run.create"]
"""The payload version this command writes: the newest run.create."""
Call = Callable[..., Any]
"""Send one request (context, method, path, JSON body, headers=...) and return its answer."""
Show = Callable[[click.Context, Any], None]
"""Print an answer in the chosen output format."""


def create_command(call: Call, show: Show) -> click.Command:
    """``run create WORKFLOW``: create a run of that kind in a tenant, and print the run it made."""
    @click.command("create")
    @click.argument("workflow")
    @click.option("--tenant", required=True, help="the tenant the run belongs to")
    @click.option("--input", "input_json", default="{}", show_default=True,
                  help="the run's input: a JSON object, or @FILE to read it from a file")
    @click.option("--idempotency-key", help="what makes a retry the same create (default: a new one, printed)")
    @click.option("--workflow-version", help="pin a version of the kind (default: its newest)")
    @click.option("--priority", type=click.IntRange(0, 9), help="0 lowest, 9 highest (default 5)")
    @click.option("--label", "labels", multiple=True, metavar="KEY=VALUE", help="a label; repeat for several")
    @click.pass_context
    def command(ctx: click.Context, workflow: str, tenant: str, input_json: str, idempotency_key: str | None,
                workflow_version: str | None, priority: int | None, labels: tuple[str, ...]) -> None:
        """Create a run of WORKFLOW; a retry with the same --idempotency-key answers the same run."""
        payload: dict[str, Any] = {"workflow": workflow, "input": input_object(input_json), "labels": labels_of(labels)}
        if workflow_version is not None:
            payload["workflow_version"] = workflow_version
        if priority is not None:
            payload["priority"] = priority
        key = idempotency_key or f"ctl-{uuid.uuid4()}"
        payload["idempotency_key"] = key
        click.echo(f"idempotency key: {key}", err=True)
        show(ctx, call(ctx, "POST", "/runs", {"tenant_id": tenant, "schema_version": SCHEMA_VERSION,
                                              "payload": payload}, headers={"Idempotency-Key": key}))

    return command


def input_object(given: str) -> dict[str, Any]:
    value = json_value(given, "--input")
    if not isinstance(value, dict):
        raise click.BadParameter("the input is a JSON object", param_hint="--input")
    return value


def json_value(given: str, option: str) -> Any:
    """The JSON value an option gives: itself, or the contents of the file ``@FILE`` names."""
    text = given
    if given.startswith("@"):
        try:
            with open(given[1:], encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise click.BadParameter(f"cannot read {given[1:]}: {e.strerror}", param_hint=option) from None
    try:
        return json.loads(text)
    except ValueError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint=option) from None


def labels_of(given: tuple[str, ...]) -> dict[str, str]:
    pairs = [label.partition("=") for label in given]
    if any(not sep or not key for key, sep, _ in pairs):
        raise click.BadParameter("a label is KEY=VALUE", param_hint="--label")
    return {key: value for key, _, value in pairs}
