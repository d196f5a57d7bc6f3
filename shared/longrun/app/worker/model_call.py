"""A decision's question to the model: asked with the run's resume context, its proposal recorded as a
fact (a claim check when it is large: ``claim_checks``) and charged; a model that does not answer is
retried on a durable timer by the retry policy, one that refuses the request leaves the run NEEDS_ATTENTION."""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import SpanKind

from longrun import metrics, otel
from longrun.app.worker import live, model_health, rate_limit
from longrun.app.worker.claim_checks import PROPOSAL_FACT_PREFIX, check_in
from longrun.app.worker.commit import Step
from longrun.app.worker import tenant_budget
from longrun.app.worker.far_side import FarSide
from longrun.authoring import RunKind
from longrun.domain import AskModel, RunStatus, ScheduleRetry, build_resume_context, compact, freeze, thaw, to_plain, wait_for
from longrun.domain import events as ev
from longrun.errors import ToolRejected, ToolUnavailable
from longrun.model import ModelAdapter, ModelRateLimited, Proposal, validate_proposal
from longrun.ports.runs import StoredRun

MODEL_RETRY_FACT_PREFIX = "model_retry:"
"""The model answered unavailable for the n-th ask of a purpose: the fact ``model_retry:<purpose>:<n>``
counts its attempts (what the retry policy reads, whichever worker asks next)."""
MODEL_CONTEXT_ITEMS = 40


async def ask_model(far: FarSide, step: Step, stored: StoredRun, kind: RunKind, decision: AskModel) -> StoredRun | None:
    if await tenant_budget.parked(far, step, stored, decision.purpose):
        return None
    run = stored.snapshot
    allowed = tuple(kind.allowed_actions(run, decision.purpose))
    context = dict(to_plain(compact(build_resume_context(run), MODEL_CONTEXT_ITEMS)))
    context["run_stage"], context["stage"] = context.get("stage"), decision.purpose
    if decision.payload is not None:
        context["request"] = thaw(decision.payload)
    context["stage_attempt"] = sum(1 for f in run.facts
                                   if f.key.startswith(f"{PROPOSAL_FACT_PREFIX}{decision.purpose}:"))
    model = kind.model or far.model
    try:
        answer = await rate_limit.ask_model(far, step, stored, decision.purpose, context, allowed, lambda: (
            model_health.ask(far, step, stored, decision.purpose,
                             lambda: live.streamed(far, run, f"model:{decision.purpose}",
                                                   _traced_propose(model, decision.purpose, context, allowed)))))
    except ToolUnavailable as e:
        await _unavailable(far, step, stored, kind, decision.purpose, context["stage_attempt"] + 1, e)
        return None
    except ToolRejected as e:
        # The provider refused the request itself (bad request, key, model): asking again changes nothing.
        await step.commit(stored, [step.event(stored, ev.BudgetCharged, model_calls=1),
                                   step.event(stored, ev.RunStatusChanged, offset=2, to=RunStatus.NEEDS_ATTENTION,
                                              reason=f"model for {decision.purpose!r}: {e}")], release=True)
        return None
    if answer is None:  # parked for its place in the model's rate limits, or for its health
        return None
    proposal = validate_proposal(answer, allowed)
    metrics.MODEL_TOKENS.labels(run.kind, "input").inc(proposal.usage.input_tokens)
    metrics.MODEL_TOKENS.labels(run.kind, "output").inc(proposal.usage.output_tokens)
    metrics.MODEL_COST.labels(run.kind).inc(proposal.usage.cost_usd)
    key = f"{PROPOSAL_FACT_PREFIX}{decision.purpose}:{context['stage_attempt'] + 1}"
    value, artifact = await check_in(far.artifacts, run.tenant_id, {
        "action": proposal.action, "args": dict(proposal.args), "rationale": proposal.rationale})
    return await step.commit(stored, [
        step.event(stored, ev.BudgetCharged, model_calls=1, cost=proposal.usage.cost_usd,
                   tokens=proposal.usage.input_tokens + proposal.usage.output_tokens),
        step.event(stored, ev.FactRecorded, offset=2, key=key, source="agent", value=value),
    ], artifact=artifact)


async def _unavailable(far: FarSide, step: Step, stored: StoredRun, kind: RunKind, purpose: str, ask: int,
                       error: ToolUnavailable) -> None:
    """The model did not answer: the attempt is charged and counted (a fact, so any worker reads the
    count), and the run waits for the retry policy's delay, or a 429's wait when longer; past its
    attempts, NEEDS_ATTENTION."""
    fact_key = f"{MODEL_RETRY_FACT_PREFIX}{purpose}:{ask}"
    previous = stored.snapshot.fact(fact_key)
    attempts = (thaw(previous.value)["attempts"] if previous is not None else 0) + 1  # type: ignore[index]
    delay, failure = far.retry_delay(kind.model_retry or far.retry, attempts, error, str(error))
    if delay is not None and isinstance(error, ModelRateLimited) and error.retry_after:
        delay = max(delay, error.retry_after)  # never sooner than the server asked, limits configured or not
    events = [step.event(stored, ev.BudgetCharged, model_calls=1),
              step.event(stored, ev.FactRecorded, offset=2, key=fact_key, source="runtime",
                         value=freeze({"attempts": attempts, "error": str(error)}))]
    if delay is None:
        events.append(step.event(stored, ev.RunStatusChanged, offset=3, to=RunStatus.NEEDS_ATTENTION,
                                 reason=f"model for {purpose!r}: {failure}"))
    else:
        status, wait = wait_for(ScheduleRetry(logical_action=f"model:{purpose}", delay=delay), far.context())
        events.append(step.event(stored, ev.WaitStarted, offset=3, status=status, wait=wait))
    await step.commit(stored, events, release=True)


async def _traced_propose(model: ModelAdapter, purpose: str, context: dict[str, Any],
                          allowed: tuple[str, ...]) -> Proposal:
    """A model call, in its span (GenAI's ``chat``: model, tokens in and out, cost) when spans are exported."""
    if not otel.exporting():
        return await model.propose(context=context, allowed_actions=allowed)
    name = getattr(model, "model", type(model).__name__)
    with otel.tracer.start_as_current_span(f"chat {name}", kind=SpanKind.CLIENT, attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": name, "longrun.model.purpose": purpose}) as span:
        answer = await model.propose(context=context, allowed_actions=allowed)
        span.set_attributes({"gen_ai.usage.input_tokens": answer.usage.input_tokens,
                             "gen_ai.usage.output_tokens": answer.usage.output_tokens,
                             "longrun.model.cost_usd": answer.usage.cost_usd,
                             "longrun.model.proposed_action": answer.action})
        return answer
