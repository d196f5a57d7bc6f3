"""The timeline phase's arithmetic (``bench.timeline.summarize``): marks of three processes joined by
the run's idempotency key and run id, each mark after the publish, each gap to the mark before."""

from __future__ import annotations

from pathlib import Path

from bench.timeline import MARKS, read_marks, summarize


def _write_run(directory: Path, key: str, run_id: str, published: float, step: float) -> None:
    """One run's marks as the services write them: the scheduler's by key, the others' by run id."""
    scheduler, relay, worker = MARKS[:7], MARKS[7:9], MARKS[9:]
    at = iter(published + step * (i + 1) for i in range(len(MARKS)))
    with open(directory / "scheduler.marks", "a") as f:
        for name in scheduler:
            f.write(f"{next(at):.6f}\t{name}\t{key}\n")
        f.write(f"{published:.6f}\trun\t{key}\t{run_id}\n")
    with open(directory / "relay.marks", "a") as f:
        for name in relay:
            f.write(f"{next(at):.6f}\t{name}\t{run_id}\n")
    with open(directory / "worker-0.marks", "a") as f:
        for name in worker:
            f.write(f"{next(at):.6f}\t{name}\t{run_id}\n")


def test_each_mark_is_timed_from_the_publish_and_from_the_mark_before(tmp_path: Path) -> None:
    # Given three runs whose marks come 1, 2 and 3 ms apart, the first a warm-up
    published = {}
    for i, step in enumerate((0.010, 0.001, 0.003)):
        published[f"k{i}"] = 1000.0 + i
        _write_run(tmp_path, f"k{i}", f"run-{i}", published[f"k{i}"], step)
    # When they are summarized
    summary = summarize(published, *read_marks(tmp_path))
    # Then the warm-up is left out, and each mark is the median of the other two (2 ms apart)
    assert summary["runs"] == 2
    assert list(summary["after_publish_p50_ms"]) == list(MARKS)
    assert summary["after_publish_p50_ms"]["create decoded"] == 2.0
    assert summary["after_publish_p50_ms"]["taken"] == 2.0 * len(MARKS)
    assert set(summary["gap_p50_ms"].values()) == {2.0}


def test_a_run_that_missed_a_mark_is_left_out(tmp_path: Path) -> None:
    # Given a warm-up, a whole run, and a run whose relay wrote nothing
    published = {"k0": 1.0, "k1": 2.0, "k2": 3.0}
    for key, run_id, at in (("k0", "run-0", 1.0), ("k1", "run-1", 2.0), ("k2", "run-2", 3.0)):
        _write_run(tmp_path, key, run_id, at, 0.001)
    relay = tmp_path / "relay.marks"
    relay.write_text("".join(line + "\n" for line in relay.read_text().splitlines() if "run-2" not in line))
    # Then only the whole run counts
    assert summarize(published, *read_marks(tmp_path))["runs"] == 1
