"""longrunctl's ``tenant limits`` and ``tenant limits-ceiling``: a tenant's run slots, token and cost
budgets per period and tool concurrency, shown or changed setting by setting (the gateway decides who
may; this module only asks).

``tenant limits`` changes only the settings named: it reads the limits as they are and sends them
whole with those replaced (``--default NAME`` sets one back to the platform's default).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

Call = Callable[..., Any]
"""Send one request (context, method, path, JSON body) and return its answer."""
Show = Callable[[click.Context, Any], None]

SETTINGS = ("run_slots", "token_budget", "cost_budget", "tool_concurrency")


def _groups(pairs: tuple[str, ...]) -> dict[str, int]:
    groups = {}
    for pair in pairs:
        group, sep, bound = pair.rpartition("=")
        if not sep or not group or not bound.isdigit():
            raise click.BadParameter(f"expected GROUP=N (a tool name or prefix ending in '*', N >= 1), not {pair!r}",
                                     param_hint="--tool")
        groups[group] = int(bound)
    return groups


def _options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed((
            click.option("--slots", type=click.IntRange(min=0), help="runs admitted at once"),
            click.option("--token-budget", type=click.IntRange(min=0), help="model tokens per budget period"),
            click.option("--cost-budget", type=click.FloatRange(min=0), help="model cost per budget period"),
            click.option("--tool", "tools", multiple=True, metavar="GROUP=N",
                         help="calls in flight at once to a tool group; repeat for several"),
            click.option("--reason", help="required to change them"))):
        command = option(command)
    return command


def _asked(slots: int | None, token_budget: int | None, cost_budget: float | None,
           tools: tuple[str, ...]) -> dict[str, Any]:
    asked = {"run_slots": slots, "token_budget": token_budget, "cost_budget": cost_budget}
    given = {k: v for k, v in asked.items() if v is not None}
    if tools:
        given["tool_concurrency"] = _groups(tools)
    return given


def limits_commands(call: Call, show: Show) -> list[click.Command]:
    @click.command("limits", help="Show the tenant's limits (as set, in force, their ceiling, the period's use) or "
                   "change the settings given, with --reason. An admin of one tenant may only lower them within the "
                   "ceiling (tenant limits-ceiling). Changes hold at once.")
    @click.argument("tenant_id")
    @_options
    @click.option("--default", "defaults", multiple=True, type=click.Choice(SETTINGS),
                  help="set back to the platform's default (tool_concurrency: no group bounded); repeatable")
    @click.pass_context
    def limits(ctx: click.Context, tenant_id: str, slots: int | None, token_budget: int | None,
               cost_budget: float | None, tools: tuple[str, ...], reason: str | None,
               defaults: tuple[str, ...]) -> None:
        asked = _asked(slots, token_budget, cost_budget, tools)
        path = f"/tenants/{tenant_id}/limits"
        if not asked and not defaults:
            show(ctx, call(ctx, "GET", path))
            return
        if not reason:
            raise click.UsageError("--reason is required to change limits")
        current = call(ctx, "GET", path)
        body = {name: current[name] for name in SETTINGS}
        body.update({name: {} if name == "tool_concurrency" else None for name in defaults})
        show(ctx, call(ctx, "PUT", path, {**body, **asked, "reason": reason}))

    @click.command("limits-ceiling", help="Set how far the tenant's own admins may set its limits (an admin of every "
                   "tenant): each setting given, with --reason; --unbounded NAME lifts one.")
    @click.argument("tenant_id")
    @_options
    @click.option("--unbounded", multiple=True, type=click.Choice(SETTINGS), help="no ceiling for it; repeatable")
    @click.pass_context
    def limits_ceiling(ctx: click.Context, tenant_id: str, slots: int | None, token_budget: int | None,
                       cost_budget: float | None, tools: tuple[str, ...], reason: str | None,
                       unbounded: tuple[str, ...]) -> None:
        asked = {**{name: None for name in unbounded}, **_asked(slots, token_budget, cost_budget, tools)}
        if not asked:
            show(ctx, call(ctx, "GET", f"/tenants/{tenant_id}/limits")["ceiling"])
            return
        if not reason:
            raise click.UsageError("--reason is required to change a ceiling")
        show(ctx, call(ctx, "PUT", f"/tenants/{tenant_id}/limits/ceiling", {**asked, "reason": reason}))

    return [limits, limits_ceiling]
