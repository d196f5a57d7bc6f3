"""A finished run's outcome, as its terminal event shows it: only what each tool declares public."""

from __future__ import annotations

from longrun.app.effects import run_outcome
from longrun.domain import (
    RECEIPT_FACT_PREFIX,
    Acceptance,
    ActionRecord,
    ActionStatus,
    EffectKind,
    Fact,
    RunStatus,
    freeze,
)
from tests.unit.domain.support import History


def _action(name: str, tool: str, status: ActionStatus, external_id: str | None) -> ActionRecord:
    return ActionRecord(logical_action=name, tool=tool, tool_version="1", effect_kind=EffectKind.IDEMPOTENT_WRITE,
                        status=status, idempotency_key=f"key-{name}", request_hash="h", external_id=external_id)


def test_an_outcome_shows_external_ids_and_declared_fields_and_nothing_else_of_a_receipt() -> None:
    # Given a finished run with a merge request made, a CI run in doubt and a token-bearing receipt
    run = History().snapshot.replace(
        status=RunStatus.COMPLETED, terminal_reason="acceptance check passed",
        acceptance=Acceptance(evidence=freeze({"merged": True}), unmet=()),
        actions=(_action("merge", "forge.mr", ActionStatus.CONFIRMED, "17"),
                 _action("ci", "forge.ci", ActionStatus.UNKNOWN, None),
                 _action("login", "vault.login", ActionStatus.CONFIRMED, "session-9")),
        facts=(Fact(f"{RECEIPT_FACT_PREFIX}merge", freeze({"url": "https://forge/mr/17", "token": "s3cret"}),
                    "tool:forge.mr", 1.0),
               Fact(f"{RECEIPT_FACT_PREFIX}login", freeze({"token": "s3cret"}), "tool:vault.login", 2.0)))
    # When its outcome is built with only the merge request's url declared public
    outcome = run_outcome(run, {"forge.mr": ("url", "number"), "vault.login": ()})
    # Then each action that took effect shows its external id, and only declared fields that exist
    assert outcome == {
        "status": "COMPLETED", "terminal_reason": "acceptance check passed",
        "acceptance": {"evidence": {"merged": True}, "unmet": []},
        "receipts": [
            {"logical_action": "merge", "tool": "forge.mr", "external_id": "17",
             "fields": {"url": "https://forge/mr/17"}},
            {"logical_action": "login", "tool": "vault.login", "external_id": "session-9", "fields": {}}],
        "summary": {"status": "COMPLETED", "terminal_reason": "acceptance check passed",
                    "done": [{"logical_action": "merge", "tool": "forge.mr", "status": "CONFIRMED", "external_id": "17"},
                             {"logical_action": "login", "tool": "vault.login", "status": "CONFIRMED",
                              "external_id": "session-9"}],
                    "used": {"model_calls": 0, "tool_calls": 0, "cost": 0.0},
                    "duration_seconds": run.status_since - run.created_at}}
    assert "s3cret" not in repr(outcome)
    # and a writer that does not know the run kind shows the external ids alone
    assert [r["fields"] for r in run_outcome(run, {})["receipts"]] == [{}, {}]
