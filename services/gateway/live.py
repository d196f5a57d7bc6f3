"""A run's live stream, as Server-Sent Events (``GET /runs/{id}/events/stream``, and the console's run
page): its recorded events in seq order (``status``), its calls' heartbeat details (``progress``) and
output chunks (``chunk``), ``gap`` when chunks were missed, and ``end`` once the run ended and every
event was sent. Resumable with ``Last-Event-ID`` (``longrun.domain.live_progress``).

Status events are read from PostgreSQL, the source of truth, after the last seq sent: at once when the
bus says the run has a new event (``longrun.bus.progress``), and every ``REREAD`` seconds in any case,
which catches events the bus does not broadcast and notices it dropped. So a reconnect to any gateway,
after a restart too, misses and repeats none. Chunks come from this gateway's buffer of the run's last
``LONGRUN_PROGRESS_BUFFER`` chunks, then live; a follower too slow to take them drops the oldest of its
own backlog and is told so by a gap.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from longrun.app.gateway import operate
from longrun.db import operator_reads, runs
from longrun.db.errors import is_transient
from longrun.domain import TERMINAL, event_to_dict
from longrun.domain.live_progress import Chunk, Cursor, Followed, RunBuffer
from longrun.principals import Principal
from longrun.services.gateway import api

REREAD = 2.0
"""Seconds between reads of a followed run's new events when the bus said nothing of it."""
RUNS_BUFFERED = 1000
"""Runs whose last chunks a gateway keeps, the least recently heard of forgotten first."""
RETRY_MS = 1000
"""How soon a browser's EventSource reconnects after the stream broke."""


class Follower:
    """One open stream: the chunks it has yet to be sent (the oldest dropped past ``size``), and
    whether the run has new events to read."""

    def __init__(self, size: int, backlog: list[Chunk]) -> None:
        self.chunks: deque[Chunk] = deque(backlog, maxlen=size)
        self.woken = asyncio.Event()
        self.woken.set()

    def chunk(self, chunk: Chunk) -> None:
        self.chunks.append(chunk)
        self.woken.set()


class Watcher(Protocol):
    """Brings a tenant's run events while someone follows one of its runs (``longrun.bus.progress``)."""

    async def watch(self, tenant: str) -> None: ...

    async def unwatch(self, tenant: str) -> None: ...


class Hub:
    """What this gateway heard of runs' progress, handed to the streams that follow them."""

    def __init__(self, buffer_size: int) -> None:
        self.buffer_size = buffer_size
        self.watcher: Watcher | None = None
        """Without one, a followed run's new events are read every ``REREAD`` seconds only."""
        self.buffers: OrderedDict[str, RunBuffer] = OrderedDict()
        self.followers: dict[str, set[Follower]] = {}

    def received(self, source: str, body: Mapping[str, Any]) -> None:
        """A message of the feed: a run's live progress, or one of its events."""
        run_id = body.get("run_id")
        if not isinstance(run_id, str):
            return
        if source == "event":
            for follower in self.followers.get(run_id, ()):
                follower.woken.set()
            return
        try:
            chunk = Chunk(str(body["stream"]), int(body["n"]), str(body["kind"]), str(body["logical_action"]),
                          body.get("data"))
        except (KeyError, TypeError, ValueError):
            return
        buffer = self.buffers.pop(run_id, None) or RunBuffer(self.buffer_size)
        self.buffers[run_id] = buffer
        if len(self.buffers) > RUNS_BUFFERED:
            self.buffers.popitem(last=False)
        buffer.add(chunk)
        for follower in self.followers.get(run_id, ()):
            follower.chunk(chunk)

    def follow(self, run_id: str, cursor: Cursor) -> Follower:
        """A follower of the run, given the buffered chunks it has not been sent (no await between the
        two: none is missed or doubled)."""
        buffer = self.buffers.get(run_id)
        follower = Follower(self.buffer_size, buffer.after(cursor) if buffer is not None else [])
        self.followers.setdefault(run_id, set()).add(follower)
        return follower

    def leave(self, run_id: str, follower: Follower) -> None:
        followers = self.followers.get(run_id)
        if followers is not None:
            followers.discard(follower)
            if not followers:
                del self.followers[run_id]


async def respond(request: Request, engine: AsyncEngine, hub: Hub, principal: Principal) -> Response:
    """The stream of the run in the path, for a caller who sees it (404 otherwise), from the
    ``Last-Event-ID`` header's position or, on a first connection, the ``after`` query parameter's (a
    page that shows the run's events up to a seq); 400 for one that is not an id of the stream."""
    run_id = api.path_parameter("run_id", request.path_params["run_id"])
    try:
        cursor = Cursor.parse(request.headers.get("last-event-id") or request.query_params.get("after"))
    except ValueError as e:
        return JSONResponse({"error": str(e)}, status_code=400)
    async with engine.connect() as conn:
        found = await operator_reads.tenant_and_status(conn, run_id)
    if found is None or not principal.sees(found[0]):
        return JSONResponse({"error": str(operate.RunNotFound(run_id))}, status_code=404)
    return StreamingResponse(_events(engine, hub, run_id, found[0], cursor), media_type="text/event-stream",
                             headers={"cache-control": "no-store", "x-accel-buffering": "no"})


async def _events(engine: AsyncEngine, hub: Hub, run_id: str, tenant: str, cursor: Cursor) -> AsyncIterator[str]:
    if hub.watcher is not None:
        await hub.watcher.watch(tenant)
    follower = hub.follow(run_id, cursor)
    followed = Followed(cursor)
    seq, last_chunk = cursor.seq, cursor
    try:
        yield f"retry: {RETRY_MS}\n\n"
        while True:
            try:
                await asyncio.wait_for(follower.woken.wait(), timeout=REREAD)
            except TimeoutError:
                pass
            follower.woken.clear()
            try:
                # The status first: each statement sees what was committed before it began, and a run's
                # end commits with its last events, so a run seen ended has all its events in the read
                # after. Read the other way, an end committed between the two would close the stream
                # without them.
                async with engine.connect() as conn:
                    found = await operator_reads.tenant_and_status(conn, run_id)
                    events = await runs.history(conn, run_id, after=seq)
            except Exception as e:
                if not is_transient(e):
                    raise
                return  # the follower reconnects from its last id
            for event in events:
                seq = event.seq
                yield _sse("status", Cursor(seq, last_chunk.stream, last_chunk.n), event_to_dict(event))
            while follower.chunks:
                chunk = follower.chunks.popleft()
                send, gap = followed.admit(chunk)
                if not send:
                    continue
                last_chunk = Cursor(seq, chunk.stream, chunk.n)
                if gap is not None:
                    yield _sse("gap", last_chunk, {**gap.to_dict(), "logical_action": chunk.logical_action})
                yield _sse(chunk.kind, last_chunk, chunk.to_dict())
            if found is None or found[1] in {s.value for s in TERMINAL}:
                yield _sse("end", Cursor(seq, last_chunk.stream, last_chunk.n),
                           {"status": None if found is None else found[1]})
                return
            if not events:
                yield ": keepalive\n\n"  # proxies keep the stream open; a gone follower is noticed
    finally:
        hub.leave(run_id, follower)
        if hub.watcher is not None:
            await hub.watcher.unwatch(tenant)


def _sse(event: str, cursor: Cursor, data: Mapping[str, Any]) -> str:
    return f"event: {event}\nid: {cursor}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"
