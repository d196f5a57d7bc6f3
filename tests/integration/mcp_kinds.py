"""A run kind calling an MCP server's tools, loaded by the real services (``LONGRUN_RUN_KINDS=
tests.integration.mcp_kinds:kinds``).

``mcp_notes`` reads the note its goal names, appends a line to it and completes. The server
(``tests.integration.mcp_notes_server``) is started over stdio by each call, with its state in
``MCP_NOTES_STATE``; ``MCP_NOTES_HOLD`` seconds is how long it holds its first write's answer, past
the write's ``start_to_close`` (``MCP_NOTES_WRITE_TIMEOUT``).
"""

from __future__ import annotations

import os
import sys

from pydantic import BaseModel, ConfigDict

from longrun.authoring import RunKind, Tool
from longrun.config import Settings
from longrun.domain import (
    RECEIPT_FACT_PREFIX,
    CallTool,
    Complete,
    Decision,
    DecisionContext,
    EffectKind,
    FrozenMap,
    PinnedVersions,
    RunSnapshot,
    freeze,
    thaw,
)
from longrun.mcp_tools import McpServer


class ReadArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: str


class WriteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: str
    body: str


def notes_server(state: str, hold: float = 0.0) -> McpServer:
    return McpServer.stdio("notes", [sys.executable, "-m", "tests.integration.mcp_notes_server", "--state", state,
                                     "--hold-first-write", str(hold)])


def notes_tools(server: McpServer, write_timeout: float = 30.0) -> dict[str, Tool]:
    read = server.tool("read_note", args=ReadArgs, effect=EffectKind.READ, key_argument=None)
    write = server.tool("write_note", args=WriteArgs, effect=EffectKind.NON_IDEMPOTENT_WRITE, lookup="find_write",
                        external_id="id", start_to_close=write_timeout)
    return {read.name: read, write.name: write}


class AppendToNote:
    kind = "mcp_notes"

    def decide(self, state: RunSnapshot, ctx: DecisionContext) -> Decision:
        goal = thaw(state.goal)
        read = state.fact(RECEIPT_FACT_PREFIX + "read")
        if read is None:
            return CallTool(tool="notes.read_note", args=freeze({"title": goal["title"]}), logical_action="read")
        written = state.fact(RECEIPT_FACT_PREFIX + "write")
        if written is None:
            body = thaw(read.value)["body"] + goal["line"] + "\n"
            return CallTool(tool="notes.write_note", args=freeze({"title": goal["title"], "body": body}),
                            logical_action="write")
        return Complete(evidence=freeze({"note": thaw(written.value)["id"]}))

    def accept(self, state: RunSnapshot, evidence: FrozenMap) -> tuple[str, ...]:
        return ()


VERSIONS = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="mcp-notes-1")


def kinds(settings: Settings) -> list[RunKind]:
    server = notes_server(os.environ["MCP_NOTES_STATE"], float(os.environ.get("MCP_NOTES_HOLD", "0")))
    tools = notes_tools(server, float(os.environ.get("MCP_NOTES_WRITE_TIMEOUT", "30")))
    return [RunKind("mcp_notes", VERSIONS, AppendToNote(), tools)]
