"""The bench's timeline phase (``bench/timeline.py``) on real services: each lone run's way from its
create to its worker's take is marked by the three processes it passes, in the order it passes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import timeline
from bench.common import Knobs, stop_all
from bench.infra import Infra

pytestmark = pytest.mark.integration

CAUSAL = [mark for mark in timeline.MARKS if mark != "relay publish confirmed"]
"""Marks each of which a run passes only after the one before; the relay's confirm races the worker's delivery."""


@pytest.mark.long
@pytest.mark.timeout(240)
async def test_every_lone_run_is_marked_from_its_create_to_its_take(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Given the bench's own database and vhost, and a quick bench's knobs
    monkeypatch.setenv("BENCH_QUICK", "1")
    infra = Infra.create(tmp_path / "logs")
    engine = infra.engine(2)
    # When the phase runs its lone runs on a one-worker ensemble whose services mark their way
    try:
        result = await timeline.phase(infra, engine, Knobs.from_env())
    finally:
        stop_all()
        await engine.dispose()
        infra.teardown()
    # Then nearly every run (the warm-up left out) passed every mark, in the order a run passes them,
    # and completed after its take
    runs = timeline.RUNS // 5
    assert runs - 4 <= result["runs"] <= runs - 1
    at = result["after_publish_p50_ms"]
    assert [at[mark] for mark in CAUSAL] == sorted(at[mark] for mark in CAUSAL)
    assert 0 < at["create decoded"] and at["taken"] < result["lone_completed_ms"]["p50"]
