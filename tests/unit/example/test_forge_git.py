"""The forge's git repositories and its CI, directly: real commits, real diffs, real test runs."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from dulwich.repo import Repo

from longrun_dependency_upgrade.ci import run_tests
from longrun_dependency_upgrade.forge import create_app
from longrun_dependency_upgrade.repository import BadName, Repositories
from longrun_dependency_upgrade.sample_project import APPLICATION, FIX_FILES, PLAN_FILES

REPO = "acme/payments"


def files_of(repositories: Repositories, sha: str, into: Path) -> dict[str, str]:
    repositories.checkout(REPO, sha, into)
    return {str(p.relative_to(into)): p.read_text() for p in into.rglob("*") if p.is_file()}


def test_a_repository_starts_as_the_application_on_main_in_a_bare_git_repository(tmp_path: Path) -> None:
    repositories = Repositories(tmp_path / "repos")
    main = repositories.resolve(REPO, "main")

    assert main is not None and files_of(repositories, main, tmp_path / "main") == APPLICATION
    with Repo(str(tmp_path / "repos" / "acme" / "payments.git")) as git:
        assert git.bare and git.refs[b"refs/heads/main"].decode() == main
        assert git[main.encode()].message.startswith(b"Payments application")


def test_a_commit_writes_whole_files_on_its_parent_and_counts_its_diff(tmp_path: Path) -> None:
    repositories = Repositories(tmp_path / "repos")
    main = repositories.resolve(REPO, "main")
    assert main is not None
    plan = repositories.commit(REPO, main, {**PLAN_FILES, "docs/UPGRADE.md": "# 5.0\n\ncreate_charge\n"}, "plan")
    repositories.set_branch(REPO, "deps/sdk-5", plan)

    assert repositories.resolve(REPO, "deps/sdk-5") == plan and repositories.resolve(REPO, plan) == plan
    assert repositories.resolve(REPO, "main") == main, "main does not move"
    assert files_of(repositories, plan, tmp_path / "plan") == {**APPLICATION, **PLAN_FILES,
                                                               "docs/UPGRADE.md": "# 5.0\n\ncreate_charge\n"}
    assert repositories.diff(REPO, main, plan) == {
        "files": [{"path": "docs/UPGRADE.md", "added": 3, "removed": 0},
                  {"path": "payments/checkout.py", "added": 1, "removed": 1},
                  {"path": "requirements.txt", "added": 1, "removed": 1}],
        "added": 5, "removed": 2}
    assert repositories.resolve(REPO, "deps/nothing") is None and repositories.resolve(REPO, "0" * 40) is None


@pytest.mark.parametrize("path", ["../outside", "a/../../b", ".git/config", "/etc/passwd", "a//b", "x.lock", ""])
def test_a_file_name_that_leaves_the_tree_or_touches_git_is_refused(tmp_path: Path, path: str) -> None:
    repositories = Repositories(tmp_path / "repos")
    main = repositories.resolve(REPO, "main")
    assert main is not None
    with pytest.raises(BadName):
        repositories.commit(REPO, main, {path: "x"}, "hostile")
    with pytest.raises(BadName):
        repositories.resolve(f"acme/{path}" if path else "", "main")


def test_ci_runs_the_commits_own_tests_against_the_pinned_release(tmp_path: Path) -> None:
    repositories = Repositories(tmp_path / "repos")
    main = repositories.resolve(REPO, "main")
    assert main is not None
    plan = repositories.commit(REPO, main, PLAN_FILES, "plan")
    fix = repositories.commit(REPO, plan, FIX_FILES, "fix")

    started = time.monotonic()
    outcomes = [run_tests(repositories, REPO, sha) for sha in (main, plan, fix)]
    took = time.monotonic() - started

    assert [(o.status, o.summary) for o in outcomes] == [
        ("passed", "3 passed"), ("failed", "1 failed, 2 passed"), ("passed", "3 passed")]
    assert "FAILED tests.test_payments.PaymentsTest.test_refund_gives_the_amount_back\n" in outcomes[1].log
    assert "'Client' object has no attribute 'charge'" in outcomes[1].log
    assert took < 6, f"three CI runs took {took:.1f}s"


def test_ci_fails_a_commit_whose_tests_do_not_import(tmp_path: Path) -> None:
    repositories = Repositories(tmp_path / "repos")
    main = repositories.resolve(REPO, "main")
    assert main is not None
    broken = repositories.commit(REPO, main, {"payments/refunds.py": "def refund(:\n"}, "syntax error")

    outcome = run_tests(repositories, REPO, broken)

    assert outcome.status == "failed" and outcome.summary.startswith("1 failed")
    assert "SyntaxError" in outcome.log


async def test_the_forge_answers_400_to_a_hostile_file_name_and_creates_nothing(serve) -> None:
    forge = serve(create_app(ci_delay=0.05))
    async with httpx.AsyncClient(base_url=forge.url) as http:
        made = await http.post(f"/repos/{REPO}/branches", json={"name": "b", "from": "main"},
                               headers={"Idempotency-Key": "b"})
        assert made.status_code == 201
        hostile = await http.post(f"/repos/{REPO}/commits", headers={"Idempotency-Key": "c"},
                                  json={"branch": "b", "message": "m", "files": {"../../etc/passwd": "x"}})
        assert (hostile.status_code, hostile.json()["error"]) == (400, "bad_name")
        outside = await http.post("/repos/acme/../../x/branches", headers={"Idempotency-Key": "x"},
                                  json={"name": "b", "from": "main"})
        assert outside.status_code in (400, 404)
        assert [e["kind"] for e in (await http.get("/_control/effects")).json()] == ["branch"]
