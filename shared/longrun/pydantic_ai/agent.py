"""A Pydantic AI agent run inside a code-first function, its model requests and tool calls the run's
journaled awaits.

``LedgerAgent(agent, tools, name=...)`` wraps an ``Agent`` whose tools are ledger tools (``AgentTool``:
a ``longrun.authoring.Tool`` with its effect kind, lookup and arguments model, the description the
model reads, and the approval it needs, if any). ``await ledger_agent.run(ctx, prompt)`` in a
code-first function runs the agent's loop (``bridge``): each model request is the run's model call
(``model``), each tool call ``ctx.call_tool`` through the action ledger, after ``ctx.approval`` of the
exact arguments' hash for a tool that needs one. Every wake replays the loop from the journal, so
nothing the agent did is done again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from weakref import WeakKeyDictionary

from pydantic_ai import Agent
from pydantic_ai import Tool as AgentFunction
from pydantic_ai.exceptions import ModelRetry
from pydantic_ai.models import infer_model
from pydantic_ai.toolsets import FunctionToolset

from longrun.authoring import Tool
from longrun.codefirst.awaits import ToolFailed
from longrun.codefirst.context import Context
from longrun.domain import RunSnapshot, request_hash
from longrun.errors import ToolRejected
from longrun.model import Price
from longrun.pydantic_ai.bridge import Bridge, BridgedModel, Finished, ModelCall, ToolCall
from longrun.pydantic_ai.model import RESPOND, AgentModel, payload_of, response_of

APPROVAL_TIMEOUT = 3 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class Approval:
    """Who approves each call of a tool, bound to the hash of its exact arguments, and how long the run waits."""

    owner: str
    """A subject, ``role:<role>`` or ``group:<group>``."""
    timeout: float = APPROVAL_TIMEOUT
    options: dict[str, Any] = field(default_factory=dict)
    """``WaitForUser``'s other fields: ``remind_after``, ``escalate_after``, ``escalate_to``, ``valid_for``."""


@dataclass(frozen=True, slots=True)
class AgentTool:
    """A ledger tool as the agent's model sees it: named ``name`` (default: the tool's name, its dots
    as underscores), described by ``description``, with the JSON Schema of the tool's arguments model."""

    tool: Tool
    description: str
    approval: Approval | None = None
    name: str = ""

    @property
    def model_name(self) -> str:
        return self.name or self.tool.name.replace(".", "_")


_calls: WeakKeyDictionary[Context, int] = WeakKeyDictionary()
"""How many tool calls the agents of one replay made: an approval's id counts them."""


class LedgerAgent:
    """A Pydantic AI ``agent`` whose model requests and tool calls are the run's, journaled and replayed.

    Its kind declares ``tools`` and asks ``model`` (``RunKind(..., tools=ledger.tools, model=ledger.model,
    allowed_actions=ledger.allowed_actions)``). The agent's own model makes the requests (``price``
    prices them; None: the provider's published prices). The agent may have no tools of its own:
    every tool it calls is an ``AgentTool``, so that every effect goes through the ledger.
    """

    def __init__(self, agent: Agent[Any, Any], tools: Sequence[AgentTool] = (), *, name: str | None = None,
                 price: Price | None = None) -> None:
        self.name = name or agent.name or ""
        if not self.name:
            raise ValueError("a ledger agent needs a name (the agent's, or name=): it names its model calls")
        own = [tool_name for toolset in agent.toolsets
               for tool_name in (toolset.tools if isinstance(toolset, FunctionToolset) else [toolset.label])]
        if own:
            raise ValueError(f"agent {self.name!r} has tools of its own ({', '.join(sorted(own))}): their calls would "
                             "not be journaled; declare each as an AgentTool of a ledger tool")
        if agent.model is None:
            raise ValueError(f"agent {self.name!r} has no model: give it the model that answers its requests")
        self._tools = {t.model_name: t for t in tools}
        if len(self._tools) != len(tools):
            raise ValueError(f"agent {self.name!r}: two tools share a name the model calls them by")
        self._agent = agent
        self._live = infer_model(agent.model)
        self.purpose = f"agent:{self.name}"
        self.model = AgentModel(self._live, price=price)

    @property
    def tools(self) -> dict[str, Tool]:
        """The ledger tools the kind declares for this agent."""
        return {t.tool.name: t.tool for t in self._tools.values()}

    def allowed_actions(self, state: RunSnapshot, purpose: str) -> tuple[str, ...]:
        """What the kind's model may propose: the agent's response, for the agent's purpose."""
        return (RESPOND,) if purpose == self.purpose else ()

    async def run(self, ctx: Context, prompt: str, **options: Any) -> Any:
        """Run the agent on ``prompt`` to its output; its model requests and tool calls are ``ctx``'s awaits.
        ``options``: ``Agent.run``'s others (``deps``, ``instructions``, ``model_settings``...), the same on
        every replay."""
        bridge = Bridge()
        toolset = FunctionToolset([self._function(bridge, t) for t in self._tools.values()])
        model = BridgedModel(self._live, bridge)
        bridge.start(lambda: self._agent.run(prompt, model=model, toolsets=[toolset], **options))
        try:
            while True:
                request = bridge.next()
                if isinstance(request, Finished):
                    if request.error is not None:
                        raise request.error
                    return request.output.output
                if isinstance(request, ModelCall):
                    proposal = await ctx.ask_model(self.purpose, payload_of(request))
                    bridge.answer(response_of(proposal["args"]))
                else:
                    _calls[ctx] = _calls.get(ctx, 0) + 1
                    await self._call(ctx, bridge, request, _calls[ctx])
        finally:
            bridge.stop()

    async def _call(self, ctx: Context, bridge: Bridge, request: ToolCall, n: int) -> None:
        """The agent's ``n``-th tool call of this run: approved first if its tool needs it, then made
        through the ledger; the agent gets the receipt, or what stopped the call."""
        declared = self._tools[request.name]
        tool = declared.tool
        try:
            args = tool.validate(request.args)
        except ToolRejected as e:
            bridge.fail(ModelRetry(e.detail))
            return
        approval_id = None
        if declared.approval is not None:
            approval_id = f"{declared.model_name}:{n}"
            decided = await ctx.approval(
                approval_id, owner=declared.approval.owner, timeout=declared.approval.timeout,
                approved_hash=request_hash(tool.name, tool.version, args=args),
                summary=f"{tool.name} {json.dumps(args, sort_keys=True)}"[:500], **declared.approval.options)
            if not decided["approved"]:
                bridge.answer(f"not done: {decided['decided_by']} did not approve this call")
                return
        try:
            receipt = await ctx.call_tool(tool.name, args, approval_id=approval_id, raises=True)
        except ToolFailed as e:
            bridge.answer(f"not done: {tool.name} refused the call ({e.detail or 'no detail'})")
            return
        bridge.answer(receipt)

    @staticmethod
    def _function(bridge: Bridge, declared: AgentTool) -> AgentFunction[Any]:
        async def call(**args: Any) -> Any:
            return bridge.ask(ToolCall(declared.model_name, args))

        return AgentFunction.from_schema(call, name=declared.model_name, description=declared.description,
                                         json_schema=declared.tool.args.model_json_schema())
