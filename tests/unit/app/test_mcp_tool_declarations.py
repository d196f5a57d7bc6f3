"""Declaring an MCP server's tools as ledger tools: a write must name the lookup that finds a call by its
idempotency key, a pure or read tool has nothing to look up, and the key is the runtime's to send."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import BaseModel

from longrun.domain import EffectKind
from longrun.mcp_tools import McpServer

SERVER = McpServer.stdio("notes", [sys.executable, "-m", "notes_server"])


class WriteArgs(BaseModel):
    title: str
    body: str


class KeyedArgs(BaseModel):
    title: str
    idempotency_key: str


@pytest.mark.parametrize("effect", [EffectKind.NON_IDEMPOTENT_WRITE, EffectKind.IDEMPOTENT_WRITE])
def test_a_write_without_a_lookup_is_refused_naming_what_to_declare(effect: EffectKind) -> None:
    with pytest.raises(ValueError, match=rf"notes.write_note is a {effect.value} without a lookup.*lookup=<the tool "
                                         "of notes that finds a call by its idempotency key>"):
        SERVER.tool("write_note", args=WriteArgs, effect=effect)


@pytest.mark.parametrize("effect", [EffectKind.PURE, EffectKind.READ])
def test_a_pure_or_read_tool_takes_no_lookup(effect: EffectKind) -> None:
    with pytest.raises(ValueError, match="there is nothing to look up"):
        SERVER.tool("read_note", args=WriteArgs, effect=effect, lookup="find_write")
    assert SERVER.tool("read_note", args=WriteArgs, effect=effect).lookup is None


def test_args_that_declare_the_key_argument_are_refused() -> None:
    with pytest.raises(ValueError, match="its args declare 'idempotency_key', which the runtime sets"):
        SERVER.tool("write_note", args=KeyedArgs, effect=EffectKind.NON_IDEMPOTENT_WRITE, lookup="find_write")
    # sent in _meta only, the key may be an argument of the model's own
    SERVER.tool("write_note", args=KeyedArgs, effect=EffectKind.NON_IDEMPOTENT_WRITE, lookup="find_write",
                key_argument=None)


def test_a_declared_write_is_a_ledger_tool_of_the_servers_far_side_with_its_options() -> None:
    tool = SERVER.tool("write_note", args=WriteArgs, effect=EffectKind.NON_IDEMPOTENT_WRITE, lookup="find_write",
                       version="2", start_to_close=5, public_receipt=("id",))
    assert (tool.name, tool.version, tool.effect, tool.health_key) == (
        "notes.write_note", "2", EffectKind.NON_IDEMPOTENT_WRITE, "notes")
    assert tool.lookup is not None and tool.start_to_close == 5 and tool.public_receipt == ("id",)


@pytest.mark.parametrize("server", [
    lambda: McpServer("notes"),
    lambda: McpServer("notes", command=("notes-server",), url="http://127.0.0.1:9/mcp"),
    lambda: McpServer("no tes", url="http://127.0.0.1:9/mcp"),
], ids=["neither", "both", "bad name"])
def test_a_server_is_reached_one_way_under_a_plain_name(server) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="MCP server"):
        server()


def test_declaring_mcp_tools_does_not_load_the_sdk() -> None:
    code = ("import sys; from pydantic import BaseModel; from longrun.domain import EffectKind; "
            "from longrun.mcp_tools import McpServer\n"
            "class A(BaseModel):\n    title: str\n"
            "McpServer.http('notes', 'http://127.0.0.1:9/mcp').tool('w', args=A, effect=EffectKind.NON_IDEMPOTENT_WRITE, "
            "lookup='f')\n"
            "print(sorted(m for m in sys.modules if m == 'mcp' or m.startswith('mcp.')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"
