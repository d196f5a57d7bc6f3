"""``longrunctl run signal``: send a run a named signal through the gateway's ``POST /runs/{run_id}/signals``.

The signal's id is what makes a retry the same signal: given, or made here and printed (on stderr, so
``-o json`` stays one document) before the request goes out, so a retry after a lost answer records
it once and wakes the run once.
"""

from __future__ import annotations

import uuid

import click

from longrun_client.ctl_create import Call, Show, json_value


def signal_command(call: Call, show: Show) -> click.Command:
    """``run signal RUN_ID NAME``: the answer says what the signal did (woke, recorded, late, duplicate)."""
    @click.command("signal")
    @click.argument("run_id")
    @click.argument("name")
    @click.option("--payload", "payload_json", default="{}", show_default=True,
                  help="the signal's payload: JSON, or @FILE to read it from a file")
    @click.option("--id", "signal_id", help="what makes a retry the same signal (default: a new one, printed)")
    @click.option("--reason", default="signalled the run", show_default=True)
    @click.pass_context
    def command(ctx: click.Context, run_id: str, name: str, payload_json: str, signal_id: str | None,
                reason: str) -> None:
        """Send the run the signal NAME (one its kind declares, its payload checked against the kind's
        schema: a refusal names every violation, and nothing is recorded)."""
        key = signal_id or f"ctl-{uuid.uuid4()}"
        payload = json_value(payload_json, "--payload")
        click.echo(f"signal id: {key}", err=True)
        show(ctx, call(ctx, "POST", f"/runs/{run_id}/signals",
                       {"signal_id": key, "name": name, "payload": payload, "reason": reason}))

    return command
