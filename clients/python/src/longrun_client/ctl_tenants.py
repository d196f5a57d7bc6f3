"""longrunctl's tenant commands: a tenant's policy and its ceiling, each shown or replaced the same way.

``tenant policy`` and ``tenant ceiling`` take the same patterns (``--tool``, ``--resource``) and differ
in what they name and who may change it: a tenant's admins set its policy within its ceiling, an admin
of every tenant sets the ceiling (the gateway decides; this module only asks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

Ask = Callable[[click.Context, str, str, dict[str, Any] | None], None]
"""Send one request (context, method, path, JSON body) and print its answer."""

HELP = {
    "policy": "Show the tenant's policy or, given --tool/--resource and --reason, replace it under a new version. "
              "Runs created later are narrowed by it; approved calls of open runs are re-validated under it. An "
              "admin of one tenant may only set it within the tenant's ceiling (tenant ceiling).",
    "ceiling": "Show how far the tenant's own admins may set its policy or, given --tool/--resource and --reason (an "
               "admin of every tenant), replace that ceiling under a new version. The policy in force is not changed.",
}


def scope_command(what: str, ask: Ask) -> click.Command:
    """``tenant <what>``: show the tenant's ``what`` or, given --tool/--resource and --reason, replace it."""
    @click.command(what, help=HELP[what])
    @click.argument("tenant_id")
    @click.option("--tool", "tools", multiple=True, metavar="PATTERN",
                  help=f"a tool name or a prefix ending in '*'; repeat for several (with --resource: replaces the {what})")
    @click.option("--resource", "resources", multiple=True, metavar="PATTERN",
                  help="what tools act on (e.g. 'repo:acme/*'); repeat for several")
    @click.option("--reason", help=f"required to change the {what}")
    @click.pass_context
    def command(ctx: click.Context, tenant_id: str, tools: tuple[str, ...], resources: tuple[str, ...],
                reason: str | None) -> None:
        if not tools and not resources:
            ask(ctx, "GET", f"/tenants/{tenant_id}/{what}", None)
            return
        if not reason:
            raise click.UsageError(f"--reason is required to change a {what}")
        ask(ctx, "PUT", f"/tenants/{tenant_id}/{what}",
            {"tools": list(tools), "resources": list(resources), "reason": reason})

    return command
