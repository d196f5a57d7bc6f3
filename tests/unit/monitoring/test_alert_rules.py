"""The alert rules: the committed files are what ``longrun.monitoring`` renders, promtool accepts them,
every alert has a ``promtool test rules`` case that passes, and a runbook section in docs/operations.md.

promtool comes from Debian's ``prometheus`` package, installed by ``make tools`` (``make test`` and CI
run it): a missing promtool fails these tests rather than skipping them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from longrun import monitoring
from longrun.monitoring import alerts

ROOT = Path(__file__).resolve().parents[3]
CASES = Path(__file__).parent / "rules_test.yml"


def promtool() -> str:
    found = shutil.which("promtool")
    assert found is not None, ("promtool is missing: `make tools` (infra/local/ensure-tools.sh) installs Debian's "
                               "prometheus package, which provides it")
    return found


def test_the_committed_files_are_what_the_source_renders() -> None:
    for path, render in monitoring.FILES.items():
        assert (ROOT / path).read_text() == render(), f"{path} drifted: run `make monitoring`"


def test_the_plain_rules_and_the_prometheus_rule_carry_the_same_groups() -> None:
    plain = yaml.safe_load((ROOT / monitoring.RULES_FILE).read_text())
    manifest = yaml.safe_load((ROOT / monitoring.PROMETHEUS_RULE).read_text())
    assert manifest["kind"] == "PrometheusRule" and manifest["spec"] == plain


def test_promtool_accepts_the_rules() -> None:
    done = subprocess.run([promtool(), "check", "rules", str(ROOT / monitoring.RULES_FILE)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts.alerts())} rules found" in done.stdout


def test_every_alert_fires_in_its_promtool_case() -> None:
    cases = yaml.safe_load(CASES.read_text())
    firing = {t["alertname"] for case in cases["tests"] for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert firing == {a.name for a in alerts.alerts()}
    done = subprocess.run([promtool(), "test", "rules", str(CASES)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_wrong_expectation_fails_promtool(tmp_path: Path) -> None:
    broken = CASES.read_text().replace("eval_time: 16m", "eval_time: 5m")
    (tmp_path / "rules_test.yml").write_text(broken.replace("../../../infra", str(ROOT / "infra")))
    done = subprocess.run([promtool(), "test", "rules", str(tmp_path / "rules_test.yml")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "LongrunUnknownActionsStale" in done.stdout + done.stderr


def test_every_alert_has_a_runbook_section() -> None:
    page = (ROOT / "docs/operations.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).strip().replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", page, re.MULTILINE)}
    for alert in alerts.alerts():
        assert alert.runbook in anchors, f"{alert.name}: no section #{alert.runbook} in docs/operations.md"
        assert f"`{alert.name}`" in page, f"{alert.name} is not described in docs/operations.md"
