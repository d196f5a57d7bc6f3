"""An MCP server of notes, started over stdio by the tools that call it (``tests.integration.mcp_kinds``).

``read_note`` reads, ``write_note`` writes (one line per write in the ``--state`` file: the effects a
test counts, with the idempotency key each came with), ``find_write`` finds a write by its key.
``refuse`` always fails. ``--hold-first-write S`` holds the answer of the first write S seconds after acting (its caller
gives up first: the answer is lost), once per state file.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer

from longrun.mcp_tools import KEY_META


def serve(state: Path, hold_first_write: float, port: int | None) -> None:
    server = MCPServer("notes")
    held = state.with_suffix(".held")

    def writes() -> list[dict[str, Any]]:
        return [json.loads(line) for line in state.read_text().splitlines()] if state.exists() else []

    @server.tool()
    def read_note(title: str) -> dict[str, Any]:
        """The body of the note ``title`` (empty when there is none)."""
        bodies = [w["body"] for w in writes() if w["title"] == title]
        return {"title": title, "body": bodies[-1] if bodies else ""}

    @server.tool()
    async def write_note(title: str, body: str, idempotency_key: str, ctx: Context) -> dict[str, Any]:
        """Write the note ``title``: one effect per call."""
        meta = ctx.request_context.meta
        written = {"id": f"note-{len(writes()) + 1}", "title": title, "body": body,
                   "idempotency_key": idempotency_key, "meta_key": (meta or {}).get(KEY_META), "at": time.time()}
        with state.open("a") as effects:
            effects.write(json.dumps(written) + "\n")
        if hold_first_write and not held.exists():
            held.touch()
            await anyio.sleep(hold_first_write)
        return written

    @server.tool()
    def refuse(reason: str) -> dict[str, Any]:
        """Always fails, saying ``reason``."""
        raise ValueError(reason)

    @server.tool()
    def find_write(idempotency_key: str) -> dict[str, Any]:
        """The write made under ``idempotency_key``, or an empty object when none was."""
        found = [w for w in writes() if w["idempotency_key"] == idempotency_key]
        return found[0] if found else {}

    if port is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=port)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--hold-first-write", type=float, default=0.0)
    parser.add_argument("--http-port", type=int, help="serve streamable HTTP on this port instead of stdio")
    options = parser.parse_args()
    serve(options.state, options.hold_first_write, options.http_port)


if __name__ == "__main__":
    main()
