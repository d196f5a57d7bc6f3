"""Follow one run over the gateway's live stream (``GET /runs/{id}/events/stream``, Server-Sent Events):
its recorded events and its calls' live output, with the consumer's rules (``longrun_client.consumer``).

- **Each once, in seq order.** A status event whose ``seq`` is not above the last one handed on (a
  repeat after a reconnect) is skipped. The stream carries every event the run records, so its seqs
  follow one another: a jump is a ``Gap(run_id, after_seq, before_seq)`` handed on before the event
  (events pruned by retention, for one).
- **Resuming.** A dropped connection (or a 5xx answer) is opened again with ``Last-Event-ID`` (the
  last id received), to any gateway behind the URL, after ``retry`` seconds; no status event is
  missed or repeated.
- **Chunks** (``Chunk``: a call's output, ``kind`` ``chunk``, or its heartbeat's details, ``progress``)
  are live only: each once, by their call's ``stream`` and number ``n``; what the gateway could not
  send (dropped past its buffer, or kept by another gateway) comes as ``ChunksMissed``.
- **The end:** the iteration ends once the run ended and every event was handed on.

``follow`` is an async iterator::

    async for item in follow("https://longrun.example", run_id, token=TOKEN):
        ...   # StatusEvent, Chunk, Gap or ChunksMissed
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from longrun_client.resequence import Gap

__all__ = ["Chunk", "ChunksMissed", "StatusEvent", "follow"]


@dataclass(frozen=True)
class StatusEvent:
    """An event the run recorded (``type``: ``run.status_changed``, ``action.submitted``, ...)."""

    run_id: str
    seq: int
    type: str
    data: dict[str, Any]


@dataclass(frozen=True)
class Chunk:
    """A piece of a call's live output (``kind`` ``chunk``) or its heartbeat's details (``progress``)."""

    run_id: str
    kind: str
    stream: str
    n: int
    logical_action: str
    data: Any


@dataclass(frozen=True)
class ChunksMissed:
    """Chunks ``first`` to ``last`` of the call's ``stream`` will not come."""

    run_id: str
    stream: str
    first: int
    last: int
    logical_action: str


Followed = StatusEvent | Chunk | Gap | ChunksMissed


async def follow(gateway: str, run_id: str, *, token: str, last_event_id: str | None = None,
                 retry: float = 1.0, timeout: float = 30.0) -> AsyncIterator[Followed]:
    """The run's events and live output from ``last_event_id`` on (None: from its first event).

    Raises:
        httpx.HTTPStatusError: the gateway refused the stream (401, 403, 404 for a run the token does
            not see, 400 for a ``last_event_id`` that is not one of the stream's); a 5xx is retried.
    """
    last_seq, last_id = 0, last_event_id
    if last_event_id:
        last_seq = int(last_event_id.split(".", 1)[0])
    sent: dict[str, int] = {}
    headers = {"authorization": f"Bearer {token}", "accept": "text/event-stream"}
    async with httpx.AsyncClient(base_url=gateway, timeout=httpx.Timeout(timeout, read=None)) as http:
        while True:
            try:
                async with http.stream("GET", f"/runs/{run_id}/events/stream", headers={
                        **headers, **({"last-event-id": last_id} if last_id else {})}) as response:
                    response.raise_for_status()
                    async for event, id_, data in _events(response):
                        last_id = id_ or last_id
                        if event == "end":
                            return
                        if event == "status":
                            seq = int(data["seq"])
                            if seq <= last_seq:
                                continue
                            if seq > last_seq + 1:
                                yield Gap(run_id, last_seq, seq)
                            last_seq = seq
                            yield StatusEvent(run_id, seq, str(data["type"]),
                                              {k: v for k, v in data.items() if k not in ("type", "seq")})
                        elif event == "gap":
                            yield ChunksMissed(run_id, data["stream"], data["first"], data["last"],
                                               data["logical_action"])
                        elif event in ("chunk", "progress") and data["n"] > sent.get(data["stream"], 0):
                            sent[data["stream"]] = data["n"]
                            yield Chunk(run_id, event, data["stream"], data["n"], data["logical_action"],
                                        data["data"])
            except httpx.HTTPStatusError as e:
                if e.response.status_code < 500:
                    raise
            except httpx.HTTPError:
                pass  # the connection dropped: open it again from the last id
            await asyncio.sleep(retry)


async def _events(response: httpx.Response) -> AsyncIterator[tuple[str, str, dict[str, Any]]]:
    """(event, id, data) of each event of a Server-Sent Events stream; comments are skipped."""
    event, id_, data = "message", "", ""
    async for line in response.aiter_lines():
        if line == "":
            if data:
                yield event, id_, json.loads(data)
            event, data = "message", ""
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("id:"):
            id_ = line[3:].strip()
        elif line.startswith("data:"):
            data = f"{data}\n{line[5:].strip()}" if data else line[5:].strip()
