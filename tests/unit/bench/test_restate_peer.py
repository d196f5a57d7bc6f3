"""Restate beside the other peers in the bench's report: its ratios are taken from the same run and
stay empty when it was not measured; the server is pinned and configured to fsync its log."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from bench import report
from bench.peers_restate import PACKAGE_DIR, server_config

FSYNCED = {"bifrost.default-provider": "replicated", "default-replication": 1,
           "log-server.rocksdb-disable-wal": False, "log-server.rocksdb-disable-wal-fsync": False}


def _run(restate: dict[str, Any]) -> dict[str, Any]:
    return {
        "started_at": "2026-12-05T00:00:00+00:00", "knobs": {"quick": False, "steps": 3, "inflight": 64, "runs": 1000},
        "ensemble": {"workers": 2, "saturate": {"runs": 1000, "steps_per_s": 450.0, "steps_per_s_overall": 440.0,
                                                    "runs_per_s": 150.0, "makespan_s": 6.8},
                     "lone": {"completed_ms": {"p50": 16.0, "p95": 20.0, "p99": 25.0}}},
        "temporal": {"measured": True, "throughput": {"steps_per_s": 45.0, "workflows_per_s": 15.0},
                     "lone_ms": {"p50": 40.0, "p95": 50.0, "p99": 60.0}},
        "restate": restate,
    }


def test_the_ensemble_is_compared_with_restate_on_throughput_and_on_the_lone_run() -> None:
    r = _run({"measured": True, "durability": FSYNCED,
              "throughput": {"steps_per_s": 300.0, "workflows_per_s": 100.0},
              "lone_ms": {"p50": 12.8, "p95": 18.0, "p99": 22.0}})

    ratios = report.ratios(r)

    assert ratios["ensemble_over_restate"] == 1.5
    assert ratios["lone_ms_longrun_over_restate"] == 1.25
    assert ratios["ensemble_over_temporal"] == 10.0  # the other peers' ratios are untouched
    r["ratios"], r["targets"] = ratios, report.targets(r, ratios)
    table = report.table(r)
    row = next(line for line in table.splitlines() if line.strip().startswith("Restate"))
    assert "(1 node, log WAL fsynced)" in row and "300" in row and "p50 13 / p95 18 / p99 22 ms" in row
    assert "ensemble_over_restate                1.50" in table


def test_a_restate_that_did_not_run_has_no_ratio_and_says_why() -> None:
    r = _run({"measured": False, "reason": "the Restate server (npm package in bench/restate) is not installed"})

    ratios = report.ratios(r)

    assert ratios["ensemble_over_restate"] is None and ratios["lone_ms_longrun_over_restate"] is None
    r["ratios"], r["targets"] = ratios, report.targets(r, ratios)
    assert "Restate: not measured: the Restate server (npm package in bench/restate) is not installed" in report.table(r)


def test_the_table_names_a_restate_log_that_was_not_fsynced() -> None:
    r = _run({"measured": True, "durability": {**FSYNCED, "log-server.rocksdb-disable-wal-fsync": True},
              "throughput": {"steps_per_s": 300.0, "workflows_per_s": 100.0}, "lone_ms": {"p50": 12.8}})
    r["ratios"] = report.ratios(r)
    r["targets"] = report.targets(r, r["ratios"])

    assert "Restate (1 node, log WAL, no fsync)" in report.table(r)


def test_the_server_is_configured_to_fsync_its_log_and_listen_on_loopback_only() -> None:
    config = tomllib.loads(server_config(fabric_port=20001, ingress_port=20002, admin_port=20003))

    assert config["bifrost"]["default-provider"] == "replicated"
    assert config["log-server"]["rocksdb-disable-wal-fsync"] is False
    assert "rocksdb-disable-wal" not in config["log-server"]
    assert config["listen-mode"] == "tcp" and config["bind-address"] == "127.0.0.1:20001"
    assert config["ingress"]["bind-address"] == "127.0.0.1:20002"
    assert config["admin"]["bind-address"] == "127.0.0.1:20003"


def test_the_server_package_is_pinned_to_one_version_and_locked() -> None:
    pinned = json.loads((PACKAGE_DIR / "package.json").read_text())["dependencies"]["@restatedev/restate-server"]
    lock = json.loads((PACKAGE_DIR / "package-lock.json").read_text())["packages"]

    assert pinned[0].isdigit() and all(c.isdigit() or c == "." for c in pinned)
    assert lock["node_modules/@restatedev/restate-server"]["version"] == pinned
    assert lock["node_modules/@restatedev/restate-server-linux-x64"]["version"] == pinned
    pyproject = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())
    assert "restate-sdk==1.3.0" in pyproject["project"]["optional-dependencies"]["bench"]
