"""longrunctl's ``schedule`` commands: create, list, show, pause, resume, backfill and delete a
schedule (runs of a kind made on a cron expression or an interval) through the operator API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from longrun_client.ctl_create import input_object, labels_of
from longrun_client.ctl_output import View, render

Call = Callable[..., Any]
"""Send one request (context, method, path, JSON body, params=...) and return its answer."""
Show = Callable[..., None]
"""Print an answer in the chosen output format (a ``View`` for tables)."""

OVERLAPS = ("skip", "buffer_one", "cancel_previous", "allow")
SCHEDULES = View((("SCHEDULE", "schedule_id"), ("TENANT", "tenant_id"), ("KIND", "workflow"), ("CRON", "cron"),
                  ("EVERY", "every"), ("OVERLAP", "overlap"), ("PAUSED", "paused"), ("NEXT DUE", "next_due_at")),
                 rows=lambda data: data["schedules"])
FIRES = View((("DUE", "due_at"), ("OUTCOME", "outcome"), ("RUN", "run_id"), ("BACKFILL", "backfill"),
              ("THROUGH", "through"), ("REASON", "reason")))


def schedule_group(call: Call, show: Show) -> click.Group:
    @click.group("schedule")
    def schedule() -> None:
        """Schedules: runs of a kind made on a cron expression or an interval, never two for one due time."""

    @schedule.command("create")
    @click.argument("workflow")
    @click.option("--tenant", required=True, help="the tenant the runs belong to")
    @click.option("--cron", help="five fields (minute hour day-of-month month day-of-week), UTC")
    @click.option("--every", type=float, help="an interval in seconds, instead of --cron")
    @click.option("--input", "input_json", default="{}", show_default=True,
                  help="each run's input: a JSON object, or @FILE to read it from a file")
    @click.option("--overlap", type=click.Choice(OVERLAPS), default="skip", show_default=True,
                  help="what a due time does while the schedule's run before it is open")
    @click.option("--catch-up", type=click.FloatRange(min=0), help="seconds: due times older than this after a "
                  "downtime are recorded as missed, not fired (default 300)")
    @click.option("--anchor", help="RFC 3339: due times are the anchor plus whole intervals (default: now)")
    @click.option("--workflow-version", help="pin a version of the kind (default: its newest)")
    @click.option("--priority", type=click.IntRange(0, 9), help="0 lowest, 9 highest (default 5)")
    @click.option("--label", "labels", multiple=True, metavar="KEY=VALUE", help="a label of each run; repeatable")
    @click.option("--reason", required=True, help="why, for the audit log")
    @click.pass_context
    def create(ctx: click.Context, workflow: str, tenant: str, cron: str | None, every: float | None,
               input_json: str, overlap: str, catch_up: float | None, anchor: str | None,
               workflow_version: str | None, priority: int | None, labels: tuple[str, ...], reason: str) -> None:
        """Create a schedule of WORKFLOW runs (--cron or --every)."""
        run: dict[str, Any] = {"workflow": workflow, "input": input_object(input_json), "labels": labels_of(labels)}
        if workflow_version is not None:
            run["workflow_version"] = workflow_version
        if priority is not None:
            run["priority"] = priority
        body: dict[str, Any] = {"tenant_id": tenant, "run": run, "cron": cron, "every": every, "overlap": overlap,
                                "anchor": anchor, "reason": reason}
        if catch_up is not None:
            body["catch_up_window"] = catch_up
        show(ctx, call(ctx, "POST", "/schedules", body))

    @schedule.command("list")
    @click.option("--tenant", help="only this tenant's")
    @click.pass_context
    def listing(ctx: click.Context, tenant: str | None) -> None:
        """The schedules of the tenants you see."""
        show(ctx, call(ctx, "GET", "/schedules", params=[("tenant_id", tenant)] if tenant else None), SCHEDULES)

    @schedule.command("show")
    @click.argument("schedule_id")
    @click.pass_context
    def show_one(ctx: click.Context, schedule_id: str) -> None:
        """A schedule and what its latest due times did (created, skipped, missed)."""
        found = call(ctx, "GET", f"/schedules/{schedule_id}")
        if ctx.obj["output"] != "table":
            show(ctx, found)
            return
        show(ctx, {k: v for k, v in found.items() if k != "fires"})
        click.echo("\n" + render(found["fires"], "table", FIRES))

    def steering(act: str, summary: str) -> click.Command:
        @click.command(act, help=summary)
        @click.argument("schedule_id")
        @click.option("--reason", required=True, help="why, for the audit log")
        @click.pass_context
        def command(ctx: click.Context, schedule_id: str, reason: str) -> None:
            show(ctx, call(ctx, "POST", f"/schedules/{schedule_id}/{act}", {"reason": reason}))
        return command

    schedule.add_command(steering("pause", "Pause the schedule: no due time fires until it is resumed."))
    schedule.add_command(steering("resume", "Resume the schedule from its next due time after now."))
    schedule.add_command(steering("delete", "Delete the schedule; its runs stay."))

    @schedule.command("backfill")
    @click.argument("schedule_id")
    @click.option("--from", "start", required=True, help="RFC 3339: the range's start (included)")
    @click.option("--to", "end", required=True, help="RFC 3339: the range's end (excluded), in the past")
    @click.option("--reason", required=True, help="why, for the audit log")
    @click.pass_context
    def backfill(ctx: click.Context, schedule_id: str, start: str, end: str, reason: str) -> None:
        """Create the runs of the schedule's due times in a past range (a time that has its run keeps it)."""
        show(ctx, call(ctx, "POST", f"/schedules/{schedule_id}/backfill",
                       {"start": start, "end": end, "reason": reason}))

    return schedule
