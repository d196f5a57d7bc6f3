"""The tools of an MCP server as ledger tools.

A run kind declares each MCP tool it calls as a ``longrun.authoring.Tool``: its effect kind, its
arguments (a pydantic model) and, for a write, its lookup, the tool of the same server that finds
a call by its idempotency key. A write's answer may be lost (the server acted, then the connection
dropped, or it answered past the call's ``start_to_close``): its outcome is then UNKNOWN, and only
that lookup can settle it, so a write without one is refused at declaration.

Every call carries its idempotency key and the caller's fencing token in the request's ``_meta``
(``io.longrun/idempotency-key``, ``io.longrun/fencing-token``), and the key also as an argument
(``key_argument``) for servers whose tools take it as one. Each call opens its own connection
(a process started over stdio, or a streamable HTTP session): a worker that dies leaves nothing
that another worker needs, and the server keeps what its lookup finds.

The ``mcp`` SDK is the optional extra ``longrun-runtime[mcp]``, imported at the first connection:
a service whose kinds call no MCP tool never loads it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from longrun.authoring import Tool, ToolResult
from longrun.domain import EffectKind
from longrun.errors import ActionOutcomeUnknown, ToolRejected, ToolUnavailable

if TYPE_CHECKING:
    from mcp.client import Client

KEY_META = "io.longrun/idempotency-key"
TOKEN_META = "io.longrun/fencing-token"
WRITES = frozenset({EffectKind.IDEMPOTENT_WRITE, EffectKind.NON_IDEMPOTENT_WRITE})
ANSWERED_WITH_AN_ERROR = 422
"""The status a refusal carries when the server answered the call with an error (``isError``, or a
JSON-RPC error): it answered, so it did not act."""


@dataclass(frozen=True, slots=True)
class McpServer:
    """Where an MCP server answers: a command started for each call over stdio, or a streamable HTTP URL.
    ``name`` is the far side its tools share (their health, and the prefix of their ledger names)."""

    name: str
    command: tuple[str, ...] = ()
    url: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables a stdio server is started with, besides the few the SDK passes on (``PATH``, ``HOME``...)."""

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"an MCP server's name is letters, digits, - and _, got {self.name!r}")
        if bool(self.command) == (self.url is not None):
            raise ValueError(f"MCP server {self.name!r}: give either a command (stdio) or a url (streamable HTTP)")

    @classmethod
    def stdio(cls, name: str, command: Sequence[str], *, env: Mapping[str, str] | None = None) -> McpServer:
        return cls(name, command=tuple(command), env=dict(env or {}))

    @classmethod
    def http(cls, name: str, url: str) -> McpServer:
        return cls(name, url=url)

    def tool(self, tool: str, *, args: type[BaseModel], effect: EffectKind, version: str = "1",
             lookup: str | None = None, key_argument: str | None = "idempotency_key",
             external_id: str | None = None, **options: Any) -> Tool:
        """The server's tool ``tool`` as a ledger tool named ``<server>.<tool>``.

        ``lookup``: the server's tool that finds a call by its idempotency key (it takes the key as
        ``key_argument``, or from ``_meta`` when that is None): it answers what the call answered, or
        an empty object when no call was made under the key. Required for a write, refused for a
        pure or read tool (whose lost answer is simply asked again). ``key_argument``: the argument the
        key is sent as besides ``_meta`` (None: only in ``_meta``); ``args`` must not declare it, the
        runtime sets it. ``external_id``: the answer's field that is the far side's id of what it made.
        ``options``: the other fields of ``Tool`` (``start_to_close``, ``retry``, ``resource``...).
        """
        name = f"{self.name}.{tool}"
        if effect in WRITES and lookup is None:
            raise ValueError(
                f"MCP tool {name} is a {effect.value} without a lookup: a write whose answer is lost could "
                f"not be settled. Declare lookup=<the tool of {self.name} that finds a call by its "
                "idempotency key>, or declare the tool pure or read if it changes nothing")
        if effect not in WRITES and lookup is not None:
            raise ValueError(f"MCP tool {name} is {effect.value}: a lost answer is asked again, there is nothing "
                             f"to look up (lookup={lookup!r} would never be used)")
        if key_argument is not None and key_argument in args.model_fields:
            raise ValueError(f"MCP tool {name}: its args declare {key_argument!r}, which the runtime sets to the "
                             "call's idempotency key; remove it from the model")
        call = _Call(self, tool, key_argument, external_id, writes=effect in WRITES)
        find = None if lookup is None else _Lookup(_Call(self, lookup, key_argument, external_id, writes=False))
        return Tool(name, version, effect, args, call, lookup=find, far_side=options.pop("far_side", self.name),
                    **options)

    @contextlib.asynccontextmanager
    async def _connected(self, tool: str) -> AsyncIterator[Client]:
        """A connected client, closed on the way out whatever happens; ``ToolUnavailable`` when it cannot
        connect (nothing was sent)."""
        from mcp.client import Client
        from mcp.client.stdio import StdioServerParameters

        target: Any = self.url
        if self.command:
            target = StdioServerParameters(command=self.command[0], args=list(self.command[1:]), env=dict(self.env))
        stack = contextlib.AsyncExitStack()
        try:
            client = await stack.enter_async_context(Client(target))
        except Exception as e:
            await _close(stack)
            raise ToolUnavailable(tool, f"cannot connect to MCP server {self.name}: {_reason(e)}") from None
        try:
            yield client
        finally:
            await _close(stack)


@dataclass(frozen=True, slots=True)
class _Call:
    """One tool of a server, called with a key: what the ledger's ``execute`` (or a lookup) runs."""

    server: McpServer
    tool: str
    key_argument: str | None
    external_id: str | None
    writes: bool

    async def __call__(self, args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult:
        from mcp.shared.exceptions import MCPError

        name = f"{self.server.name}.{self.tool}"
        arguments = dict(args)
        if self.key_argument is not None:
            arguments[self.key_argument] = idempotency_key
        meta = {KEY_META: idempotency_key, TOKEN_META: fencing_token}
        failure: Exception | None = None
        async with self.server._connected(name) as client:
            # Classified here, inside the connection: an error leaving it may come wrapped in a group.
            try:
                result = await client.call_tool(self.tool, arguments, meta=meta)
            except MCPError as e:
                failure = self._lost(name, idempotency_key, e) if _connection_lost(e) else ToolRejected(
                    name, ANSWERED_WITH_AN_ERROR, f"MCP error {e.code}: {e.message}")
            except Exception as e:
                failure = self._lost(name, idempotency_key, e)
        if failure is not None:
            raise failure
        if result.is_error:
            raise ToolRejected(name, ANSWERED_WITH_AN_ERROR, _text(result)[:500] or "the tool answered an error")
        answer = _answer(result)
        found = answer.get(self.external_id) if self.external_id is not None else None
        return ToolResult(None if found is None else str(found), answer)

    def _lost(self, name: str, key: str, error: Exception) -> Exception:
        """The request was sent and no answer came back: a write may have acted; anything else did not."""
        if self.writes:
            return ActionOutcomeUnknown(name, key, f"the MCP server's answer was lost: {_reason(error)}")
        return ToolUnavailable(name, f"no answer from the MCP server: {_reason(error)}")


@dataclass(frozen=True, slots=True)
class _Lookup:
    """A write's lookup: its server's finding tool asked for the key; None when no call was made under it."""

    call: _Call

    async def __call__(self, idempotency_key: str) -> ToolResult | None:
        found = await self.call({}, idempotency_key, 0)
        return found if found.receipt else None


def _answer(result: Any) -> dict[str, Any]:
    """A tool's answer as a JSON object: its structured content, else its text read as a JSON object,
    else the text itself under ``text``."""
    if isinstance(result.structured_content, Mapping):
        return dict(result.structured_content)
    text = _text(result)
    try:
        value = json.loads(text)
    except ValueError:
        return {"text": text}
    return value if isinstance(value, dict) else {"value": value}


def _text(result: Any) -> str:
    return "".join(getattr(item, "text", "") for item in result.content)


def _connection_lost(error: Exception) -> bool:
    from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

    return getattr(error, "code", None) in (CONNECTION_CLOSED, REQUEST_TIMEOUT)


def _reason(error: BaseException) -> str:
    if isinstance(error, BaseExceptionGroup) and error.exceptions:
        return _reason(error.exceptions[0])
    return f"{type(error).__name__}: {error}"


async def _close(stack: contextlib.AsyncExitStack) -> None:
    """Close a connection; a server that fails to shut down cleanly changes nothing about the call's answer."""
    with contextlib.suppress(Exception):
        await stack.aclose()
