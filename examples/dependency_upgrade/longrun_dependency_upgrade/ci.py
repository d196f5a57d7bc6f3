"""The forge's CI: a commit's own tests, run for real.

The commit is checked out into a scratch directory, each ``name==version`` pin of its
``requirements.txt`` is taken from the forge's package index (``sample_project.RELEASES``: no
network, no pip) onto ``PYTHONPATH``, and ``unittest`` discovers and runs ``tests/`` in a
subprocess of this interpreter. The log ends with one ``FAILED <test id>`` line per failing test
and the count (``3 passed``, ``1 failed, 2 passed``), so the webhook's log excerpt carries both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from longrun_dependency_upgrade.repository import Repositories
from longrun_dependency_upgrade.sample_project import install_release, pinned

TIMEOUT_SECONDS = 60.0
_RUNNER = """\
import json, sys, unittest
suite = unittest.defaultTestLoader.discover("tests", top_level_dir=".")
result = unittest.TextTestRunner(stream=sys.stdout, verbosity=2).run(suite)
print(json.dumps({"ran": result.testsRun, "failed": [t.id() for t, _ in result.failures + result.errors]}))
"""


@dataclass(frozen=True)
class CiOutcome:
    status: str
    """``passed`` or ``failed``."""
    summary: str
    log: str


def run_tests(repositories: Repositories, repo: str, sha: str, *, timeout: float = TIMEOUT_SECONDS) -> CiOutcome:
    with tempfile.TemporaryDirectory(prefix="forge-ci-") as scratch:
        checkout = Path(scratch) / "checkout"
        repositories.checkout(repo, sha, checkout)
        requirements = checkout / "requirements.txt"
        paths = [checkout]
        for name, version in pinned(requirements.read_text() if requirements.is_file() else ""):
            try:
                paths.append(install_release(name, version, Path(scratch) / "site"))
            except KeyError:
                return _finished(False, f"no release {name}=={version}",
                                 f"$ install {name}=={version}\nERROR: the package index has no {name}=={version}\n")
        if not (checkout / "tests").is_dir():
            return _finished(False, "no tests", "$ python -m unittest\nno tests/ directory in this commit\n")
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join(map(str, paths)),
               "PYTHONDONTWRITEBYTECODE": "1"}
        command = "$ python -m unittest discover tests\n"
        try:
            done = subprocess.run([sys.executable, "-B", "-c", _RUNNER], cwd=checkout, env=env, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return _finished(False, f"timed out after {timeout:.0f}s", f"{command}timed out after {timeout:.0f}s\n")
    output, _, last = done.stdout.rstrip("\n").rpartition("\n")
    try:
        counts = json.loads(last)
    except ValueError:
        return _finished(False, "the test runner crashed", command + done.stdout + done.stderr)
    failed, ran = counts["failed"], counts["ran"]
    if not ran:
        return _finished(False, "no tests ran", command + output + "\n")
    summary = f"{len(failed)} failed, {ran - len(failed)} passed" if failed else f"{ran} passed"
    lines = "".join(f"FAILED {test}\n" for test in failed)
    return _finished(not failed, summary, f"{command}{output}\n{lines}")


def _finished(passed: bool, summary: str, log: str) -> CiOutcome:
    return CiOutcome("passed" if passed else "failed", summary, f"{log}{summary}\n")
