"""One line per run event, for people: what changed, which action under which key, what woke the run."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def _short(value: Any, width: int = 70) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def describe(seq: int, type_: str, data: dict[str, Any], applied: bool, at: datetime) -> str:
    clock = at.strftime("%H:%M:%S.%f")[:-3]
    late = "" if applied else "  (late: stored, not applied)"
    return f"  {clock} #{seq:<3} {_what(type_, data)}{late}"


def _what(type_: str, d: dict[str, Any]) -> str:
    match type_:
        case "run.created":
            return f"CREATED   {d['kind']} for {d['tenant_id']}: {_short(d['goal'])}"
        case "run.status_changed":
            return f"STATUS -> {d['to']:<16} {d['reason']}"
        case "run.wait_started":
            wait = d["wait"]
            if d["status"] == "WAITING_USER" and wait.get("question_id"):
                return (f"STATUS -> WAITING_USER     answer to question {wait['question_id']} "
                        f"by {wait.get('owner') or 'an approver'}")
            if d["status"] == "WAITING_USER":
                return (f"STATUS -> WAITING_USER     approval {wait['approval_id']} by {wait['owner']} "
                        f"for hash {wait['approved_hash'][:12]}")
            on = wait.get("correlation_key") or f"timer at {wait.get('wake_at')}"
            return f"STATUS -> {d['status']:<16} waits for {wait['kind']} on {on}"
        case "run.deadline_passed":
            return f"STATUS -> CANCELLING       {d['reason']} (ends TIMED_OUT once its actions settle)"
        case "run.woken":
            return f"WOKEN     by {d['reason']} {d.get('correlation_key') or ''}".rstrip()
        case "run.approval_decided":
            verdict = "approved" if d["approved"] else "denied"
            return f"APPROVAL  {d['approval_id']} {verdict} by {d['decided_by']} (hash {d['approved_hash'][:12]})"
        case "run.wait_reminded":
            return f"REMINDER  #{d['reminder']} of wait {d['wait_id']} sent to its owner"
        case "run.wait_escalated":
            return f"ESCALATED wait {d['wait_id']}: {d['to']} may now decide too"
        case "run.approval_expired":
            return (f"EXPIRED   approval {d['approval_id']}: decided {_utc(d['decided_at'])}, valid until "
                    f"{_utc(d['valid_until'])}; asked again")
        case "run.paused" | "run.resumed" | "run.cancel_requested" | "run.terminated":
            act = {"run.paused": "PAUSED", "run.resumed": "RESUMED", "run.cancel_requested": "CANCEL",
                   "run.terminated": "TERMINATED"}[type_]
            return f"{act:<9} by {d['by']}: {_short(d['reason'])}"
        case "run.versions_migrated":
            return f"MIGRATED  to workflow version {d['versions']['workflow']} by {d['by']}: {_short(d['reason'])}"
        case "question.opened":
            return f"QUESTION  {d['question_id']} asked: {_short(d['text'])}"
        case "question.resolved":
            return f"ANSWER    to {d['question_id']} by {d['answered_by']}: {_short(d['answer'], 60)}"
        case "action.prepared":
            return f"ACTION    {d['logical_action']:<14} {d['tool']} key {d['idempotency_key']}"
        case "action.recorded":
            return (f"ACTION    {d['logical_action']:<14} {d['tool']} key {d['idempotency_key']} "
                    f"CONFIRMED with its answer, external id {d.get('external_id')}")
        case "action.submitted":
            return f"ACTION    {d['logical_action']:<14} submitted"
        case "action.confirmed":
            return f"ACTION    {d['logical_action']:<14} CONFIRMED external id {d.get('external_id')}"
        case "action.unavailable":
            return f"ACTION    {d['logical_action']:<14} RETRYABLE, unavailable: {_short(d['cause'])}"
        case "action.unknown":
            return f"ACTION    {d['logical_action']:<14} UNKNOWN: {_short(d['cause'])}"
        case "action.reconciliation_started":
            return f"ACTION    {d['logical_action']:<14} RECONCILING: looked up by its idempotency key"
        case "action.compensation_started":
            return f"ACTION    {d['logical_action']:<14} COMPENSATING"
        case "action.compensated":
            return f"ACTION    {d['logical_action']:<14} COMPENSATED"
        case "action.failed":
            return f"ACTION    {d['logical_action']:<14} FAILED: {_short(d['error'])}"
        case "action.reconciled" | "action.resolved":
            return f"ACTION    {d['logical_action']:<14} {d['outcome']} after {type_.split('.')[1]}: {d.get('note') or d.get('reason', '')}"
        case "run.permission_denied":
            return f"DENIED    {d['logical_action']:<14} {_short(d['reason'], 100)}"
        case "fact.recorded":
            return f"FACT      {d['key']} from {d['source']}: {_short(d['value'], 60)}"
        case "budget.charged":
            parts = [f"{k}+{d[k]}" for k in ("model_calls", "tool_calls") if d.get(k)]
            return f"BUDGET    {' '.join(parts)} cost+{d.get('cost', 0):.3f}"
        case "run.completed":
            return f"STATUS -> COMPLETED        acceptance passed on evidence: {_short(sorted(d['evidence']))}"
        case "run.summary":
            summary, used = d["summary"], d["summary"]["used"]
            return (f"SUMMARY   {len(summary['done'])} action(s) done, {used['tool_calls']} tool and "
                    f"{used['model_calls']} model call(s), cost {used['cost']:.3f}, "
                    f"{summary['duration_seconds']:.1f}s")
        case "run.step_failed":
            then = "NEEDS_ATTENTION" if d.get("retry") is None else f"retry at {d['retry']['wake_at']}"
            return (f"FAILED    {d['phase']} raised {d['error_type']}: {_short(d['message'], 60)} "
                    f"({d['attempt']} in a row; {then})")
        case "run.correction_needed":
            return f"CORRECTION {d['logical_action']}: {_short(d['reason'])}"
        case "run.cleanup" if d["outcome"] == "done":
            return f"CLEANUP   {d['step']:<14} done (attempt {d['attempt']}): {d.get('external_id') or 'no external id'}"
        case "run.cleanup":
            return f"CLEANUP   {d['step']:<14} FAILED (attempt {d['attempt']}, retried): {_short(d['error'])}"
        case _:
            return f"{type_:<9} {_short(d)}"
