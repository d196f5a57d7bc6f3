"""A call run with somewhere for its live output to go (``longrun.streaming``): what it emits, and its
heartbeats' details, reach the run's followers. Without a progress sink the call runs as it is. Nothing
is sent until the call emits, so a call that emits nothing costs no I/O."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

from longrun.app.worker.far_side import FarSide
from longrun.domain import RunSnapshot
from longrun.streaming import CURRENT_STREAM, CallStream

T = TypeVar("T")


def streamed(far: FarSide, run: RunSnapshot, logical_action: str,
             call: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
    if far.progress is None:
        return call
    return _streaming(CallStream(far.progress, run_id=run.run_id, tenant_id=run.tenant_id,
                                 logical_action=logical_action), call)


async def _streaming(stream: CallStream, call: Coroutine[Any, Any, T]) -> T:
    token = CURRENT_STREAM.set(stream)
    try:
        return await call
    finally:
        CURRENT_STREAM.reset(token)
