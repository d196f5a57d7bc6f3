"""A Pydantic AI agent run on a thread of its own, each of its model requests and tool calls handed to
the caller, one at a time.

Pydantic AI runs an agent on asyncio, with tasks, events and waits of its own, which a function
driven by hand through its journaled awaits cannot host. So the agent runs here, on its own event
loop in its own thread, with its tools run one at a time (``parallel_execution_mode('sequential')``).
Its only ways out are a model request and a tool call, and each blocks the agent until the caller
answers it: from the journal when replaying, by doing it when live. Between two of them the agent
only computes, so the same answers bring the same requests in the same order: the agent is as
deterministic as its journal.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models import Model, ModelRequestParameters, StreamedResponse
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tool_manager import ToolManager

STEP_TIMEOUT = 60.0
"""Seconds the agent may compute between two requests before the caller gives up on it."""


@dataclass(frozen=True, slots=True)
class ModelCall:
    messages: list[ModelMessage]
    settings: ModelSettings | None
    parameters: ModelRequestParameters


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Finished:
    """The agent's run ended: its output, or what it raised."""

    output: Any
    error: BaseException | None


class Stopped(BaseException):
    """The caller stopped the agent (its function ended, or waits): unwinds the agent's thread. A
    BaseException, so that no handler of the agent's takes it for a tool's or model's failure."""


@dataclass(frozen=True, slots=True)
class _Failure:
    error: BaseException


_STOP = object()


class Bridge:
    """The channel between the agent's thread and its caller: requests one way, answers the other."""

    def __init__(self) -> None:
        self._requests: queue.Queue[ModelCall | ToolCall | Finished] = queue.Queue()
        self._answers: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None

    # -- the caller's side --------------------------------------------------------------------------
    def start(self, run: Callable[[], Awaitable[Any]]) -> None:
        """Run ``run()`` (the agent's run) on a new event loop in a thread of its own, tools sequential."""

        async def sequential() -> Any:
            with ToolManager.parallel_execution_mode("sequential"):
                return await run()

        def main() -> None:
            try:
                output = asyncio.run(sequential())
            except Stopped:
                return
            except BaseException as e:  # the caller re-raises it in the run kind's function
                self._requests.put(Finished(None, e))
                return
            self._requests.put(Finished(output, None))

        self._thread = threading.Thread(target=main, name="pydantic-ai-agent", daemon=True)
        self._thread.start()

    def next(self) -> ModelCall | ToolCall | Finished:
        """The agent's next request, or its end. Blocks while the agent computes (it does no I/O)."""
        try:
            return self._requests.get(timeout=STEP_TIMEOUT)
        except queue.Empty:
            raise TimeoutError(f"the agent made no request within {STEP_TIMEOUT:g}s") from None

    def answer(self, value: Any) -> None:
        self._answers.put(value)

    def fail(self, error: BaseException) -> None:
        """Raise ``error`` in the agent, where it waits for its answer."""
        self._answers.put(_Failure(error))

    def stop(self) -> None:
        """End the agent's thread wherever it waits (idempotent)."""
        if self._thread is None:
            return
        self._answers.put(_STOP)
        self._thread.join(timeout=STEP_TIMEOUT)
        self._thread = None

    # -- the agent's side ---------------------------------------------------------------------------
    def ask(self, request: ModelCall | ToolCall) -> Any:
        """Hand ``request`` to the caller and wait for its answer (blocking this thread's own loop:
        nothing else runs on it meanwhile, tools being sequential)."""
        self._requests.put(request)
        answer = self._answers.get()
        if answer is _STOP:
            raise Stopped()
        if isinstance(answer, _Failure):
            raise answer.error
        return answer


class BridgedModel(WrapperModel):
    """The agent's model as the agent's thread sees it: each request is handed to the caller, which
    makes it with the real model (or reads its answer from the journal)."""

    def __init__(self, wrapped: Model, bridge: Bridge) -> None:
        super().__init__(wrapped)
        self._bridge = bridge

    async def __aenter__(self) -> BridgedModel:
        return self  # the real model is the caller's, entered (if ever) on its own loop

    async def __aexit__(self, *args: Any) -> None:
        return None

    async def request(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                      model_request_parameters: ModelRequestParameters) -> ModelResponse:
        response: ModelResponse = self._bridge.ask(ModelCall(messages, model_settings, model_request_parameters))
        return response

    def request_stream(self, *args: Any, **kwargs: Any) -> AbstractAsyncContextManager[StreamedResponse]:
        raise NotImplementedError("a ledger agent's model requests are whole answers, recorded once: "
                                  "use agent.run, not run_stream")
