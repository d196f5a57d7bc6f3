"""The rules of a run's live stream (``GET /runs/{id}/events/stream``), apart from its I/O.

A stream's position is a cursor, sent as each event's id and given back in ``Last-Event-ID``:
``<seq>`` (the last status event sent, by the run's own seq) or ``<seq>.<stream>.<n>`` (and the last
chunk sent: the call's stream id and the chunk's number in it). Status events are history, so a
reconnect to any gateway goes on from ``seq`` without missing or repeating one. Chunks are not: each
gateway keeps the last ``size`` of a run (``RunBuffer``), and a follower is told of what it cannot
have any more by a gap (``Followed.admit``): the chunks of a stream between the last it was sent and
the one it is sent now.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DIGITS = frozenset("0123456789")
HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of a call's live output (``kind`` ``chunk``) or its heartbeat's details (``progress``)."""

    stream: str
    n: int
    kind: str
    logical_action: str
    data: Any

    def to_dict(self) -> dict[str, Any]:
        return {"stream": self.stream, "n": self.n, "logical_action": self.logical_action, "data": self.data}


@dataclass(frozen=True, slots=True)
class Cursor:
    seq: int = 0
    stream: str | None = None
    n: int = 0

    @classmethod
    def parse(cls, raw: str | None) -> Cursor:
        """ValueError names what is wrong with a ``Last-Event-ID`` that is not one of this stream's ids."""
        if raw is None or raw == "":
            return cls()
        parts = raw.split(".")
        if not (len(parts) in (1, 3) and _number(parts[0], least=0)
                and (len(parts) == 1 or (0 < len(parts[1]) <= 32 and set(parts[1]) <= HEX
                                         and _number(parts[2], least=1)))):
            raise ValueError(f"Last-Event-ID {raw[:80]!r} is not an id of this stream: <seq> or <seq>.<stream>.<n>")
        return cls(int(parts[0])) if len(parts) == 1 else cls(int(parts[0]), parts[1], int(parts[2]))

    def __str__(self) -> str:
        return str(self.seq) if self.stream is None else f"{self.seq}.{self.stream}.{self.n}"


@dataclass(frozen=True, slots=True)
class Gap:
    """Chunks ``first`` to ``last`` of ``stream`` will not come."""

    stream: str
    first: int
    last: int

    def to_dict(self) -> dict[str, Any]:
        return {"stream": self.stream, "first": self.first, "last": self.last}


def _number(text: str, *, least: int) -> bool:
    """A decimal of at most 18 digits without leading zeros, at least ``least``."""
    return (0 < len(text) <= 18 and set(text) <= DIGITS and (text == "0" or text[0] != "0")
            and int(text) >= least)


class RunBuffer:
    """The last ``size`` chunks of one run a gateway received, oldest first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.chunks: list[Chunk] = []

    def add(self, chunk: Chunk) -> None:
        self.chunks.append(chunk)
        if len(self.chunks) > self.size:
            del self.chunks[0]

    def after(self, cursor: Cursor) -> list[Chunk]:
        """What a follower at ``cursor`` has not been sent: every chunk when it was sent none; those after
        its last when this gateway still holds that one; else (another gateway sent it, or it was dropped
        since) every chunk but those of its stream up to its number."""
        held = self.chunks
        if cursor.stream is None:
            return held
        for i, chunk in enumerate(held):
            if chunk.stream == cursor.stream and chunk.n == cursor.n:
                return held[i + 1:]
        return [c for c in held if c.stream != cursor.stream or c.n > cursor.n]


class Followed:
    """What one follower was sent of each stream: a chunk sent already is not sent again, and a chunk
    past the next one expected comes after a gap naming those in between."""

    def __init__(self, cursor: Cursor) -> None:
        self.last: dict[str, int] = {} if cursor.stream is None else {cursor.stream: cursor.n}

    def admit(self, chunk: Chunk) -> tuple[bool, Gap | None]:
        """(send it, the gap to report before it)."""
        last = self.last.get(chunk.stream, 0)
        if chunk.n <= last:
            return False, None
        self.last[chunk.stream] = chunk.n
        return True, None if chunk.n == last + 1 else Gap(chunk.stream, last + 1, chunk.n - 1)
