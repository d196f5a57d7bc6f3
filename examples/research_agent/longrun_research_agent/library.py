"""The research agent's far side: a library directory. ``library.read_notes`` reads
``notes/<topic>.md``; ``library.write_report`` writes ``reports/<n>.md`` (a non-idempotent write: every
call makes a new file) and indexes it under its idempotency key in ``reports/index.jsonl``, where its
lookup finds it after a lost answer."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from longrun.authoring import Tool, ToolResult
from longrun.domain import EffectKind


class Topic(BaseModel):
    model_config = ConfigDict(extra="forbid")
    topic: str


class Report(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: str
    body: str


def library_tools(root: Path) -> tuple[Tool, Tool]:
    """The read and the write on the library at ``root``."""
    reports = root / "reports"
    index = reports / "index.jsonl"

    def indexed() -> list[dict[str, Any]]:
        return [json.loads(line) for line in index.read_text().splitlines()] if index.exists() else []

    async def read_notes(args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult:
        notes = root / "notes" / f"{Path(args['topic']).name}.md"
        return ToolResult(None, {"topic": args["topic"], "notes": notes.read_text() if notes.exists() else ""})

    async def write_report(args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult:
        reports.mkdir(exist_ok=True)
        report = {"id": f"report-{len(indexed()) + 1}", "title": args["title"]}
        (reports / f"{report['id']}.md").write_text(f"# {args['title']}\n\n{args['body']}\n")
        with index.open("a") as written:
            written.write(json.dumps({**report, "idempotency_key": idempotency_key}) + "\n")
        return ToolResult(report["id"], report)

    async def find_report(idempotency_key: str) -> ToolResult | None:
        found = [r for r in indexed() if r["idempotency_key"] == idempotency_key]
        return ToolResult(found[0]["id"], {"id": found[0]["id"], "title": found[0]["title"]}) if found else None

    return (Tool("library.read_notes", "1", EffectKind.READ, Topic, read_notes),
            Tool("library.write_report", "1", EffectKind.NON_IDEMPOTENT_WRITE, Report, write_report,
                 lookup=find_report))
