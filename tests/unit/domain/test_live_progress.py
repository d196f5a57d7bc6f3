"""The rules of a run's live stream: its cursor (``Last-Event-ID``), what a gateway's buffer gives a
follower at a cursor, and the gaps a follower is told of."""

from __future__ import annotations

import pytest

from longrun.domain.live_progress import Chunk, Cursor, Followed, Gap, RunBuffer


def _chunk(stream: str, n: int) -> Chunk:
    return Chunk(stream, n, "chunk", "say", f"{stream}{n}")


@pytest.mark.parametrize("raw, cursor", [
    (None, Cursor()), ("", Cursor()), ("0", Cursor()), ("12", Cursor(12)), ("12.ab3.4", Cursor(12, "ab3", 4))])
def test_a_cursor_is_read_back_from_the_id_it_was_sent_as(raw: str | None, cursor: Cursor) -> None:
    assert Cursor.parse(raw) == cursor
    assert raw in (None, "") or str(cursor) == raw


@pytest.mark.parametrize("raw", ["x", "-1", "01", "1.", "1.ab", "1.AB.2", "1.ab.0", "1.ab.2.3", "9" * 19,
                                 "1." + "a" * 33 + ".1", "1.ab.x"])
def test_an_id_that_is_not_one_of_the_stream_is_refused_naming_it(raw: str) -> None:
    with pytest.raises(ValueError, match="Last-Event-ID"):
        Cursor.parse(raw)


def test_the_buffer_keeps_the_last_chunks_and_gives_what_follows_the_cursor() -> None:
    buffer = RunBuffer(3)
    for chunk in (_chunk("a", 1), _chunk("a", 2), _chunk("b", 1), _chunk("a", 3)):
        buffer.add(chunk)
    assert buffer.after(Cursor(5)) == [_chunk("a", 2), _chunk("b", 1), _chunk("a", 3)]
    assert buffer.after(Cursor(5, "b", 1)) == [_chunk("a", 3)]
    # a cursor this gateway no longer holds: every chunk but its stream's up to its number
    assert buffer.after(Cursor(5, "a", 1)) == [_chunk("a", 2), _chunk("b", 1), _chunk("a", 3)]
    assert buffer.after(Cursor(5, "a", 2)) == [_chunk("a", 2), _chunk("b", 1), _chunk("a", 3)][1:]


def test_a_follower_gets_each_chunk_once_and_a_gap_for_those_it_cannot_have() -> None:
    followed = Followed(Cursor(3, "a", 2))
    assert followed.admit(_chunk("a", 2)) == (False, None)
    assert followed.admit(_chunk("a", 3)) == (True, None)
    assert followed.admit(_chunk("b", 3)) == (True, Gap("b", 1, 2))
    assert followed.admit(_chunk("a", 6)) == (True, Gap("a", 4, 5))
    assert followed.admit(_chunk("a", 5)) == (False, None)
