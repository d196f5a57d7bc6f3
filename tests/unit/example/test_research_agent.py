"""The research agent example (``examples/research_agent``) in the kit: it reads the notes, waits for
the editor's approval of the exact report, writes it once, and says so; denied, it writes nothing."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from longrun.authoring import ToolResult
from longrun.domain import RunSnapshot, RunStatus, request_hash, thaw
from longrun.testing.kit import Kit, every_crash
from longrun_research_agent.agent import EDITOR, research_kind
from longrun_research_agent.library import library_tools

KIND = research_kind(*library_tools(Path("/nonexistent")))
REPORT = {"title": "What we know about pricing", "body": "From our notes: the starter plan goes to 12 EUR"}


def _answers() -> dict[str, Any]:
    def read_notes(args: Mapping[str, Any], key: str) -> ToolResult:
        return ToolResult(None, {"topic": args["topic"], "notes": "the starter plan goes to 12 EUR\n"})

    def write_report(args: Mapping[str, Any], key: str) -> ToolResult:
        return ToolResult("report-1", {"id": "report-1", "title": args["title"]})

    return {"library.read_notes": read_notes, "library.write_report": write_report}


def _editor(approved: bool):  # type: ignore[no-untyped-def]
    def decide(kit: Kit, run: RunSnapshot) -> bool:
        if run.status is not RunStatus.WAITING_USER:
            return False
        kit.decide(run.run_id, approved=approved)
        return True

    return decide


def research(kit: Kit) -> None:
    kit.start({"topic": "pricing"})
    kit.settle(people=_editor(True))


def test_the_report_waits_for_the_editors_approval_of_exactly_it_then_is_written_once() -> None:
    with Kit(KIND, answers=_answers()) as kit:
        run_id = kit.start({"topic": "pricing"})
        kit.settle(timers=False)
        waiting = kit.snapshot(run_id)
        assert waiting.status is RunStatus.WAITING_USER and kit.executions("library.write_report") == 0
        assert waiting.wait is not None and waiting.wait.owner == EDITOR
        assert waiting.wait.approved_hash == request_hash("library.write_report", "1", args=REPORT)
        kit.decide(run_id)
        kit.settle()
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.COMPLETED
        assert thaw(run.acceptance.evidence) == {"answer": "Wrote report-1: What we know about pricing"}  # type: ignore[union-attr]
        assert kit.executions("library.write_report") == 1 and kit.check() == []


def test_a_denied_report_is_not_written_and_the_agent_says_so() -> None:
    with Kit(KIND, answers=_answers()) as kit:
        kit.start({"topic": "pricing"})
        kit.settle(people=_editor(False))
        (run_id,) = kit.run_ids()
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.COMPLETED and kit.executions("library.write_report") == 0
        assert thaw(run.acceptance.evidence)["answer"].startswith("No report on pricing: not done: ")  # type: ignore[union-attr]


def test_a_worker_killed_anywhere_writes_the_approved_report_once() -> None:
    for outcome in every_crash(KIND, research, answers=_answers()):
        (run_id,) = outcome.kit.run_ids()
        assert outcome.kit.status(run_id) is RunStatus.COMPLETED, outcome.point
        assert outcome.kit.executions("library.write_report") == 1, outcome.point
        assert outcome.kit.check() == [], outcome.point


async def test_the_library_finds_a_report_by_the_key_it_was_written_under(tmp_path: Path) -> None:
    read_notes, write_report = library_tools(tmp_path)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "pricing.md").write_text("the starter plan goes to 12 EUR\n")
    assert (await read_notes.execute({"topic": "pricing"}, "k0", 1)).receipt["notes"].startswith("the starter")
    written = await write_report.execute(REPORT, "key-1", 1)
    assert write_report.lookup is not None
    assert await write_report.lookup("key-1") == written and await write_report.lookup("key-2") is None
    assert (tmp_path / "reports" / "report-1.md").read_text().startswith("# What we know about pricing")


def test_a_report_the_library_refuses_is_told_to_the_agent_which_says_so() -> None:
    with Kit(KIND, answers=_answers()) as kit:
        run_id = kit.start({"topic": "pricing"})
        kit.settle(timers=False)  # the notes read, the report waits for its approval
        kit.far_side.arm("rejected")  # the next call, the report, is refused
        kit.decide(run_id)
        kit.settle()
        run = kit.snapshot(run_id)
        assert run.status is RunStatus.COMPLETED
        assert [(a.tool, a.status.value) for a in run.actions] == [
            ("library.read_notes", "CONFIRMED"), ("library.write_report", "FAILED")]
        assert thaw(run.acceptance.evidence)["answer"].startswith(  # type: ignore[union-attr]
            "No report on pricing: not done: library.write_report refused the call")
        assert kit.executions("library.write_report") == 0 and kit.check() == []
