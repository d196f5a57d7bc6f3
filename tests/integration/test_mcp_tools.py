"""An MCP server's tools as ledger tools, through the real services: a write whose answer is lost is
UNKNOWN and settled by its declared lookup, another tool of the same server, with one effect.

The run kind is ``tests/integration/mcp_kinds.py``; the server (``mcp_notes_server.py``) is started
over stdio by each call, and counts its writes in a file.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from longrun.db import actions as ledger
from longrun.domain import EffectKind
from longrun.errors import ToolRejected, ToolUnavailable
from longrun.mcp_tools import McpServer
from tests.fixtures import eventually
from tests.integration.ensemble import Ensemble, event_types, new_key, publish_create, run_id_for, status_of
from tests.integration.mcp_kinds import ReadArgs, notes_server, notes_tools
from tests.ports import free_port

pytestmark = pytest.mark.integration


def _writes(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in state.read_text().splitlines()] if state.exists() else []


@pytest.mark.long
async def test_a_write_whose_answer_is_lost_is_settled_by_its_lookup_with_one_effect(
        clean, engine, bus, services, tmp_path) -> None:
    # Given an MCP server that holds its first write's answer 12 s after acting, past the write's 4 s
    state = tmp_path / "notes.jsonl"
    Ensemble(services, tmp_path).start_services(
        "scheduler", "worker", "relay", "reconciler", LONGRUN_RUN_KINDS="tests.integration.mcp_kinds:kinds",
        MCP_NOTES_STATE=str(state), MCP_NOTES_HOLD="12", MCP_NOTES_WRITE_TIMEOUT="4",
        LONGRUN_RECONCILE_INTERVAL="0.3")
    # When a run reads a note through the server and appends a line to it
    key = new_key()
    await publish_create(bus, tenant="acme", key=key, workflow="mcp_notes",
                         input_={"title": "standup", "line": "shipped the MCP tools"})
    run_id = str(await eventually(lambda: run_id_for(engine, "acme", key), what="the run"))

    async def completed() -> bool:
        return await status_of(engine, run_id) == "COMPLETED"

    await eventually(completed, timeout=45, what="the run completed")
    # Then the write went UNKNOWN (never FAILED, never sent again) and the reconciler found it by its
    # idempotency key through find_write: one effect, confirmed with the server's own receipt
    (written,) = _writes(state)
    async with engine.connect() as conn:
        rows = {row.logical_action: row for row in await ledger.for_run(conn, run_id)}
    assert rows["write"].status == "CONFIRMED" and rows["write"].attempts == 1
    assert written["idempotency_key"] == written["meta_key"] == rows["write"].idempotency_key
    assert rows["write"].external_id == written["id"]
    assert written["body"] == "shipped the MCP tools\n"
    trail = [(t, d.get("outcome")) for t, d in await event_types(engine, run_id) if d.get("logical_action") == "write"]
    assert trail == [("action.prepared", None), ("action.submitted", None), ("action.unknown", None),
                     ("action.reconciliation_started", None), ("action.reconciled", "CONFIRMED")]
    assert rows["read"].status == "CONFIRMED"


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_the_key_reaches_the_server_and_its_lookup_finds_the_write(transport: str, tmp_path, services) -> None:
    # Given the notes server over stdio (started by each call) or streamable HTTP (started here)
    state = tmp_path / "notes.jsonl"
    server = notes_server(str(state))
    if transport == "http":
        port = free_port()
        services.start("mcp-notes", "tests.integration.mcp_notes_server",
                       argv_extra=["--state", str(state), "--http-port", str(port)])
        server = McpServer.http("notes", f"http://127.0.0.1:{port}/mcp")
        await eventually(lambda: _listening(port), timeout=20, what=f"the MCP server on port {port}")
    tools = notes_tools(server)
    read, write = tools["notes.read_note"], tools["notes.write_note"]
    assert write.lookup is not None
    # When a write is made under a key, and its lookup asked for that key and another
    receipt = await write.execute({"title": "standup", "body": "hello\n"}, "key-1", 7)
    found, nothing = await write.lookup("key-1"), await write.lookup("key-2")
    # Then the server got the key as an argument and in _meta, made one note, and the lookup finds it
    (written,) = _writes(state)
    assert written["idempotency_key"] == written["meta_key"] == "key-1"
    assert receipt.external_id == written["id"] == "note-1" and receipt.receipt["body"] == "hello\n"
    assert found is not None and found.external_id == "note-1" and found.receipt == receipt.receipt
    assert nothing is None
    assert (await read.execute({"title": "standup"}, "key-3", 7)).receipt == {"title": "standup", "body": "hello\n"}


async def test_a_tool_error_is_a_refusal_and_a_server_that_cannot_start_is_unavailable(tmp_path) -> None:
    refuse = notes_server(str(tmp_path / "notes.jsonl")).tool("refuse", args=ReadArgs, effect=EffectKind.READ)
    with pytest.raises(ToolRejected, match="no such note"):
        await refuse.execute({"title": "no such note"}, "key-1", 1)
    missing = McpServer.stdio("notes", [sys.executable, "-m", "tests.integration.no_such_server"])
    with pytest.raises(ToolUnavailable, match="cannot connect to MCP server notes"):
        await missing.tool("read_note", args=ReadArgs, effect=EffectKind.READ).execute({"title": "x"}, "key-1", 1)


async def _listening(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    return True


async def test_the_authoring_chapters_server_and_tools_run_as_written(tmp_path, monkeypatch) -> None:
    # Given the server and the declarations of docs/authoring.md's "MCP tools", as written
    blocks = _chapter_code("## MCP tools")
    server, declarations = next(b for b in blocks if "MCPServer" in b), next(b for b in blocks if "McpServer" in b)
    (tmp_path / "acme_notes").mkdir()
    (tmp_path / "acme_notes" / "__init__.py").write_text("")
    (tmp_path / "acme_notes" / "server.py").write_text(server)
    monkeypatch.chdir(tmp_path)  # the stdio server starts here: its package and its database
    names: dict[str, Any] = {}
    exec(compile(declarations, "authoring.md", "exec"), names)
    read_note, write_note = names["read_note"], names["write_note"]
    # When a note is written and looked up through them
    written = await write_note.execute({"title": "standup", "body": "hello"}, "key-1", 1)
    # Then the server wrote it under the key, the lookup finds it, and a read reads it
    assert written.external_id == "note-1" and await write_note.lookup("key-1") == written
    assert await write_note.lookup("key-2") is None
    assert (await read_note.execute({"title": "standup"}, "key-3", 1)).receipt == {"title": "standup", "body": "hello"}
    assert sorted(names["tools"]) == ["notes.read_note", "notes.write_note"]


def _chapter_code(heading: str) -> list[str]:
    """The Python blocks of a chapter of docs/authoring.md, unindented."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "authoring.md").read_text()
    chapter = text.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
    return [textwrap.dedent(block) for block in re.findall(r"```python\n(.*?)^\s*```", chapter, re.DOTALL | re.MULTILINE)]
