"""`make run`'s main job, as a user runs it: every service up, one agent run end to end, printed as a timeline."""

from __future__ import annotations

import os
import random
import re
import socket
import subprocess
import sys

import pytest

from tests.harness import ROOT

pytestmark = pytest.mark.integration


def _free_base() -> int:
    """A port base whose gateway, forge and probe ports are all free."""
    for _ in range(50):
        base = random.randint(20000, 50000)
        ports = [base, base + 10, *range(base + 100, base + 108)]
        try:
            for port in ports:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port range")


@pytest.mark.long
def test_the_main_job_completes_with_exactly_one_merge_request(clean, infra, tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LONGRUN_")}
    env.update(LONGRUN_DATABASE_URL=infra.database_url, LONGRUN_AMQP_URL=infra.amqp_url,
               LONGRUN_ARTIFACT_DIR=str(tmp_path / "artifacts"), PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "longrun_dependency_upgrade.demo", "--timeout", "120",
                           "--port-base", str(_free_base())],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    # The story: CI fails, the model fixes it, CI passes, approval, an unknown outcome reconciled, completion.
    for line in ("STATUS -> WAITING_EVENT    waits for ci on ci/acme/payments/1",
                 "FACT      ci_result:1 from webhook:forge", "proposal:fix:1",
                 "STATUS -> WAITING_USER     approval merge:", "APPROVAL  merge:",
                 "merge_request  UNKNOWN", "merge_request  RECONCILING", "merge_request  CONFIRMED after reconciled",
                 "STATUS -> COMPLETED", "longrun: run ended COMPLETED",
                 "longrun: merge requests created for this run: 1"):
        assert line in out, f"missing {line!r} in:\n{out}"
    assert out.index("merge_request  UNKNOWN") < out.index("STATUS -> COMPLETED")
    # The far side is real: each commit's diff, and CI running the repository's tests on it.
    diffs = re.findall(r"-> DIFF  (commit:\d) [0-9a-f]{12}: (.*)", out)
    assert diffs == [("commit:1", "2 file(s), +2 -2 (payments/checkout.py +1 -1, requirements.txt +1 -1)"),
                     ("commit:2", "1 file(s), +1 -1 (payments/refunds.py +1 -1)")], out
    tests = re.findall(r"-> TESTS ci (\d) on [0-9a-f]{12} (.*)", out)
    assert tests == [("1", "failed: 1 failed, 2 passed; FAILED tests.test_payments.PaymentsTest."
                           "test_refund_gives_the_amount_back"),
                     ("2", "passed: 3 passed")], out
