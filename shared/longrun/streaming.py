"""Live output of a call: chunks a tool or model call emits while it runs (``emit_chunk``), and its
heartbeats' details, streamed to whoever follows the run (``GET /runs/{id}/events/stream``).

Nothing emitted here is history: no run event, no snapshot change, no ledger write. A chunk is sent
once, non-persistent, on the bus's ``longrun.progress`` exchange, and each gateway keeps the last ones
of a run in memory; a follower that missed some is told so (a ``gap`` event), never given them later.

A call's chunks form a stream of their own: a random id drawn at its first chunk, and each chunk's
number in it (1, 2, ...), which is how a follower orders them and tells what it missed. The worker
sets ``CURRENT_STREAM`` around a call; nothing is created or sent for a call that emits nothing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any, Protocol

CHUNK_LIMIT = 65_536
"""Bytes a chunk may take as JSON: larger output goes as several chunks (or to an artifact)."""


class ProgressSink(Protocol):
    """Where a worker's live progress goes: the bus's progress exchange, best effort."""

    async def send(self, message: Mapping[str, Any]) -> None: ...


class CallStream:
    """The live output of one call of a run: numbered in the order it was emitted."""

    def __init__(self, sink: ProgressSink, *, run_id: str, tenant_id: str, logical_action: str) -> None:
        self.sink = sink
        self.run_id = run_id
        self.tenant_id = tenant_id
        self.logical_action = logical_action
        self.stream_id: str | None = None
        self.sent = 0

    async def send(self, kind: str, data: Any) -> None:
        """One message of this call's stream (``kind``: ``chunk`` or ``progress``), numbered next."""
        if self.stream_id is None:
            self.stream_id = uuid.uuid4().hex[:16]
        self.sent += 1
        await self.sink.send({"run_id": self.run_id, "tenant_id": self.tenant_id, "stream": self.stream_id,
                              "n": self.sent, "kind": kind, "logical_action": self.logical_action, "data": data})


CURRENT_STREAM: ContextVar[CallStream | None] = ContextVar("longrun_current_stream", default=None)
"""Set by the worker around a call when live progress has somewhere to go."""


async def emit_chunk(data: str | Mapping[str, Any]) -> None:
    """Stream a piece of a call's output (a model's tokens, a tool's log line) to the run's followers,
    from inside a tool's ``execute`` or a model adapter's call. Chunks are ephemeral: never recorded in
    the run's history, dropped when no one follows, and a follower may miss some (it is told so).
    Outside a call run by a worker (e.g. in a test of the kind's decide) it does nothing.

    Raises:
        ValueError: ``data`` is not text or a JSON object, or takes more than ``CHUNK_LIMIT`` bytes.
    """
    if isinstance(data, Mapping):
        data = dict(data)
    elif not isinstance(data, str):
        raise ValueError(f"a chunk is text or a JSON object (a mapping), got {type(data).__name__}")
    try:
        size = len(json.dumps(data, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise ValueError(f"the chunk is not JSON: {e}") from e
    if size > CHUNK_LIMIT:
        raise ValueError(f"the chunk takes {size} bytes as JSON; at most {CHUNK_LIMIT} go in one")
    stream = CURRENT_STREAM.get()
    if stream is not None:
        await stream.send("chunk", data)


async def report_progress(details: Mapping[str, Any]) -> None:
    """A heartbeat's details, to the run's followers as well as to the ledger (``authoring.heartbeat``)."""
    stream = CURRENT_STREAM.get()
    if stream is not None:
        await stream.send("progress", dict(details))
