"""The worker's watch over one tool call (``app.worker.calls``): start-to-close, the heartbeat watchdog,
a call that ignores cancellation, and heartbeats' progress written at most every interval."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from longrun.app.worker.calls import UNRECORDED, Call, supervise
from longrun.authoring import Tool, heartbeat
from longrun.domain import EffectKind
from longrun.errors import CallTimedOut, LeaseLost
from longrun.workflows.steps import EchoArgs


class Recorder:
    def __init__(self, *, accept: bool = True) -> None:
        self.written: list[Mapping[str, Any] | None] = []
        self.accept = accept

    async def __call__(self, details: Mapping[str, Any] | None) -> bool:
        self.written.append(details)
        return self.accept


def _watch(record: Recorder | None = None, interval: float = 0.1) -> Call:
    return Call(record=record or Recorder(), interval=interval, refused=LeaseLost("run-1", 3))


async def _beating(beats: int, every: float) -> str:
    for done in range(1, beats + 1):
        await asyncio.sleep(every)
        await heartbeat({"done": done, "of": beats})
    return "answered"


async def test_heartbeat_outside_a_call_and_details_that_are_not_json_are_refused_by_name() -> None:
    with pytest.raises(RuntimeError, match="outside a tool call"):
        await heartbeat({"done": 1})

    async def bad(details: Any) -> None:
        await heartbeat(details)

    for details, says in (([1, 2], "a JSON object"), ({"at": object()}, "not JSON"), ({"x": "y" * 20_000}, "at most")):
        with pytest.raises(ValueError, match=says):
            await supervise(bad(details), UNRECORDED, start_to_close=1, heartbeat_timeout=None)


def test_a_tool_s_timeouts_must_be_positive_seconds() -> None:
    async def never(args: Mapping[str, Any], key: str, token: int) -> Any: ...

    with pytest.raises(ValueError, match="'t': heartbeat_timeout must be seconds > 0, got 0"):
        Tool("t", "1", EffectKind.READ, EchoArgs, never, heartbeat_timeout=0)
    with pytest.raises(ValueError, match="start_to_close must be seconds > 0"):
        Tool("t", "1", EffectKind.READ, EchoArgs, never, start_to_close=-1)


async def test_a_call_past_start_to_close_is_cancelled_whether_or_not_it_heartbeats() -> None:
    with pytest.raises(CallTimedOut, match="start_to_close: no answer within 0.2s"):
        await supervise(asyncio.sleep(5), UNRECORDED, start_to_close=0.2, heartbeat_timeout=None)
    with pytest.raises(CallTimedOut, match="start_to_close: no answer within 0.3s"):
        await supervise(_beating(100, 0.02), _watch(), start_to_close=0.3, heartbeat_timeout=0.1)


async def test_a_watched_call_that_stops_heartbeating_is_cancelled_and_one_that_beats_answers() -> None:
    async def goes_silent() -> None:
        await heartbeat({"done": 1})
        await asyncio.sleep(5)

    with pytest.raises(CallTimedOut, match="heartbeat: no heartbeat within 0.15s"):
        await supervise(goes_silent(), _watch(), start_to_close=5, heartbeat_timeout=0.15)
    assert await supervise(_beating(10, 0.05), _watch(), start_to_close=5, heartbeat_timeout=0.15) == "answered"


async def test_a_call_that_ignores_cancellation_holds_the_watch_until_it_answers() -> None:
    async def stubborn() -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            await asyncio.sleep(0.2)  # refuses to stop at once, then answers
        return "answered late"

    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await supervise(stubborn(), _watch(), start_to_close=5, heartbeat_timeout=0.1) == "answered late"
    assert loop.time() - started >= 0.3


async def test_progress_is_written_at_most_every_interval_and_the_last_details_on_close() -> None:
    record = Recorder()
    assert await supervise(_beating(20, 0.01), _watch(record, interval=0.1), start_to_close=5,
                           heartbeat_timeout=1) == "answered"
    assert 2 <= len(record.written) <= 4, record.written  # 0.2 s of beats: the first, one or two more, the last
    assert record.written[0] == {"done": 1, "of": 20} and record.written[-1] == {"done": 20, "of": 20}


async def test_a_call_not_on_record_heartbeats_freely_and_a_refused_heartbeat_ends_a_watched_call() -> None:
    assert await supervise(_beating(3, 0.01), UNRECORDED, start_to_close=5, heartbeat_timeout=None) == "answered"
    with pytest.raises(ValueError, match="its watch must be a Call"):
        await supervise(_beating(3, 0.01), UNRECORDED, start_to_close=5, heartbeat_timeout=1)
    refused = Recorder(accept=False)
    with pytest.raises(LeaseLost):
        await supervise(_beating(100, 0.02), _watch(refused), start_to_close=5, heartbeat_timeout=1)
    assert len(refused.written) == 1
