"""An author's testing kit: a run kind through the real engine, in memory, in milliseconds.

    kit = Kit(kind, answers={"forge.create_branch": lambda args, key: ToolResult(...)}, model=model)
    run_id = kit.start({"repo": "acme/app"})
    kit.settle(people=answer_ci_and_approve)   # workers step, timers fire, people answer
    kit.answer(run_id, {"module": "billing"})  # the question the run asks, checked against its schema
    kit.signal(run_id, "ship", {"by": "ana"})    # a signal its kind declares, checked against its schema
    assert kit.status(run_id) is RunStatus.COMPLETED and kit.check() == []

The workers are the runtime's own ``Worker`` (``app.worker``) over the memory store (``testing.workers``); the
rest of the ensemble (creation, timers, webhooks, operators, the reconciler) is ``testing.world``.
Each tool of the kind keeps its name, version, effect kind and argument schema; its calls go to the
kit's far side, which answers with the test's ``answers`` (or a receipt echoing the arguments),
keeps one object per idempotency key, counts executions, answers lookups and can be told to fail the
next call (``FarSide.arm``: unavailable, rejected, or a time-out after acting). Time is the kit's
clock: timers fire as ``settle`` or ``advance`` moves it. ``every_crash`` runs a scenario once to
learn each crash point it passes, then once per point with the worker killed there, and returns
each outcome: a successor takes the run over once the dead worker's lease expired.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from longrun.app.worker import loop
from longrun.authoring import Registry, RunKind
from longrun.domain import (
    TERMINAL,
    EffectKind,
    JsonValue,
    Question,
    ReceivedSignal,
    RunSnapshot,
    RunStatus,
    event_to_dict,
    received_signals,
    violations,
)
from longrun.domain.rate_limit import RateLimit
from longrun.model import ModelAdapter
from longrun.ports.runs import Fence
from longrun.testing.checkpoints import CrashAt
from longrun.testing.invariants import _history, _ledger
from longrun.testing.workers import MemoryWorker, Steps
from longrun.testing.world import Answer, FarSide, Webhook, World, on_far_side

People = Callable[["Kit", RunSnapshot], bool]
"""Answers what a run waits for (a webhook, an approval, a question); True if it did something."""
SETTLED = TERMINAL | {RunStatus.NEEDS_ATTENTION}


class Kit:
    def __init__(self, kind: RunKind, *, answers: Mapping[str, Answer] | None = None,
                 model: ModelAdapter | None = None, lease_ttl: float = 30.0, crash: CrashAt | None = None,
                 duplicate_deliveries: bool = False, model_limits: tuple[RateLimit, ...] = (),
                 children: Sequence[RunKind] = ()) -> None:
        """``crash``: the first worker's crash points (later workers never crash);
        ``duplicate_deliveries``: every wakeup is delivered twice (the second must change nothing);
        ``model_limits``: the model provider's rate limits (a tool's are on the tool); ``children``: the
        kinds of the child runs ``kind`` starts (``StartChildren``), run by the same workers."""
        self.far_side = FarSide(answers=dict(answers or {}))
        self.world = World(far_side=self.far_side, lease_ttl=lease_ttl,
                           kinds=Registry([on_far_side(k, self.far_side) for k in (kind, *children)]))
        self.kind = kind
        self.model = model
        self.model_limits = model_limits
        self.lease_ttl = lease_ttl
        self.duplicate_deliveries = duplicate_deliveries
        self.crashes: list[str] = []
        """The crash points workers died at."""
        self.failures: list[str] = []
        """Steps that failed (the worker logged them and left the lease to expire): ``check`` reports them."""
        self._generation = 0
        self._worker = self._new_worker(crash)
        self._keys = 0
        self._signals = 0

    def _new_worker(self, crash: CrashAt | None = None) -> MemoryWorker:
        self._generation += 1
        return MemoryWorker(self.world, f"worker-{self._generation}", lease_ttl=self.lease_ttl, model=self.model,
                            model_limits=self.model_limits, crash_points=crash or CrashAt())

    def deploy(self, kind: RunKind) -> None:
        """Ship ``kind`` (e.g. a new version of the kit's kind) beside what runs: the workers restart with it.
        Runs keep the version they pinned; new runs pin the newest."""
        self.world.kinds.add(on_far_side(kind, self.far_side))
        self._worker = self._new_worker()

    def __enter__(self) -> Kit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.world.close()

    # -- what a test does -----------------------------------------------------------------------------
    def start(self, goal: Mapping[str, Any], *, tenant: str = "t", key: str | None = None,
              tool_calls: int = 50, timeouts: Mapping[str, float] | None = None) -> str:
        """``timeouts``: the create's (``run.create`` v4), else the kind's defaults."""
        self._keys += 1
        return self.world.create(tenant_id=tenant, key=key or f"key-{self._keys}", kind=self.kind.name, goal=goal,
                                 tool_calls=tool_calls, timeouts=timeouts)

    def event(self, correlation_key: str, fact_key: str, fact: Mapping[str, Any], *,
              event_id: str | None = None) -> dict[str, Any]:
        """A webhook: recorded as ``fact_key`` on the run waiting for ``correlation_key`` (now or when it
        starts waiting); the same ``event_id`` again changes nothing."""
        return self.world.receive_webhook(Webhook(event_id or f"evt-{fact_key}", correlation_key, fact_key, fact))

    def decide(self, run_id: str, *, approved: bool = True, by: str | None = None) -> None:
        """The approval the run waits for is answered, bound to the request it asks about, by ``by``
        (default: the owner it names; anyone else is refused, ``operate.NotPermitted``)."""
        wait = self.snapshot(run_id).wait
        if wait is None or wait.approval_id is None:
            raise ValueError(f"run {run_id} waits for no approval")
        self.world.decide(run_id, approval_id=wait.approval_id, approved_hash=wait.approved_hash or "",
                          approved=approved, actor=by or wait.owner or "operator")

    def question(self, run_id: str) -> Question | None:
        """The question the run waits for an answer to (its text and answer schema), if any."""
        run = self.snapshot(run_id)
        waited = run.wait.question_id if run.wait is not None else None
        return next((q for q in run.open_questions if q.question_id == waited), None)

    def answer(self, run_id: str, answer: Any, *, by: str | None = None) -> dict[str, Any]:
        """A person answers the question the run waits on, as through the operator API: checked against
        its schema (``operate.AnswerRefused`` lists the violations, and nothing is recorded), by ``by``
        (default: the owner it names, else "operator"; anyone else is refused, ``operate.NotPermitted``)."""
        question, wait = self.question(run_id), self.snapshot(run_id).wait
        if question is None or wait is None:
            raise ValueError(f"run {run_id} waits for no answer")
        return self.world.answer(run_id, question_id=question.question_id, answer=answer,
                                 actor=by or wait.owner or "operator")

    def notices(self, run_id: str) -> list[dict[str, Any]]:
        """What the run's ``run.notice`` broadcasts said, in order: a person asked (``requested``),
        reminded (``reminder``), the request escalated (``escalated``); each payload as JSON."""
        return [e.payload.model_dump(mode="json") for e in self.world.broadcasts
                if e.type == "run.notice" and e.run_id == run_id]

    def signal(self, run_id: str, name: str, payload: JsonValue = None, *, signal_id: str | None = None,
               by: str = "ops") -> dict[str, Any]:
        """A signal sent to the run by ``by``, as the operator API and a producer's ``run.signal`` send it: checked
        against the kind's ``signals`` (``app.signals.SignalRefused`` names why, and nothing is recorded);
        the same ``signal_id`` again changes nothing. The answer's ``outcome`` says what it did: ``woke``,
        ``recorded``, ``late`` (the run had ended: kept, not applied) or ``duplicate``."""
        self._signals += 1
        return self.world.signal(run_id, name=name, payload={} if payload is None else payload,
                                 signal_id=signal_id or f"signal-{self._signals}", actor=by)

    def signals(self, run_id: str, name: str | None = None) -> tuple[ReceivedSignal, ...]:
        """The signals the run received (named ``name``, if given), oldest first: what its ``decide`` reads."""
        return received_signals(self.snapshot(run_id), name)

    def advance(self, seconds: float) -> int:
        """Time passes: the timers that come due fire, and the schedules due; how many timers fired."""
        self.world.clock.advance(seconds)
        fired = self.world.fire_due_timers()
        self.world.fire_due_schedules()
        return fired

    def schedule(self, goal: Mapping[str, Any], *, tenant: str = "t", **cadence: Any) -> str:
        """A schedule of the kind's runs with input ``goal`` (``every`` or ``cron``, ``overlap``,
        ``catch_up``, ``anchor``: ``testing.schedules.MemorySchedules.add``), fired as ``advance`` moves the
        clock; its id. What each due time did is ``world.schedules.fires``."""
        return self.world.schedules.add(tenant, self.kind.name, dict(goal), **cadence)

    def settle(self, *, people: People | None = None, timers: bool = True, rounds: int = 500) -> None:
        """Until nothing moves: wakeups delivered and stepped through, people answer, the reconciler
        settles actions in doubt and runs the cleanups due, dead workers' leases expire, and
        (``timers``) time runs on to the next timer while a run still waits for one, or to the next
        retry of a failed cleanup."""
        for _ in range(rounds):
            if self.world.pending:
                self._deliver()
            elif people is not None and any(people(self, self.snapshot(r)) for r in self.run_ids()
                                             if self.snapshot(r).status not in SETTLED):
                continue
            elif self.world.in_doubt():
                self.world.reconcile_unknown()
            elif any(row.lease_owner is not None for row in self.world.store.runs.values()):
                self.world.clock.advance(self.lease_ttl + 1)
                self.world.rewake_expired_leases()
            elif (self.world.next_cleanup() or float("inf")) <= self.world.clock():
                self.world.clean_up()
            elif not timers or not self._next_timer():
                return
        raise AssertionError(f"still moving after {rounds} rounds")

    # -- what a test reads -----------------------------------------------------------------------------
    def run_ids(self) -> list[str]:
        return list(self.world.store.runs)

    def snapshot(self, run_id: str) -> RunSnapshot:
        stored = self.world.store.load(run_id)
        if stored is None:
            raise KeyError(run_id)
        return stored.snapshot

    def history(self, run_id: str) -> list[dict[str, Any]]:
        """The run's events as JSON (``event_to_dict``), late ones included: what ``testing.replay`` replays."""
        return [event_to_dict(e) for e in self.world.store.history(run_id)]

    def status(self, run_id: str) -> RunStatus:
        return self.snapshot(run_id).status

    def executions(self, tool: str) -> int:
        """How many times the far side acted for ``tool`` (every key)."""
        return sum(n for (name, _), n in self.far_side.executions.items() if name == tool)

    def check(self, *, settled: bool = True) -> list[str]:
        """The invariant checker over every run: snapshots that obey the domain's invariants and are
        the fold of their histories, a ledger that agrees with each run and (``settled``) explains
        every action, no non-idempotent request executed twice, and no worker step failed."""
        problems = [f"a worker step failed: {failure}" for failure in self.failures]
        store = self.world.store
        for run_id in self.run_ids():
            stored = store.load(run_id)
            assert stored is not None
            history = store.history(run_id)
            problems += [f"{run_id}: {v}" for v in violations(stored.snapshot)]
            problems += _history(run_id, history, stored)
            problems += _ledger(stored, store.for_run(run_id), settled=settled, history=history)
        once = {name for name, tool in self.kind.tools.items() if tool.effect is EffectKind.NON_IDEMPOTENT_WRITE}
        problems += [f"{tool} under {key} executed {n} times"
                     for (tool, key), n in self.far_side.executions.items() if tool in once and n > 1]
        return problems

    # -- the loop -------------------------------------------------------------------------------------
    def _deliver(self) -> None:
        message = self.world.pending.pop(0)
        self.world.delivered.append(message)
        outcome, _ = self._worker.on_wakeup(message)
        if self.duplicate_deliveries:
            before = self.world.store.tables()
            again, duplicate = self._worker.on_wakeup(message)
            assert duplicate and again == outcome and self.world.store.tables() == before, \
                f"delivering {message.event_id} again changed something"
        if outcome.get("taken"):
            assert message.run_id is not None
            self._run(self._worker.advance(message.run_id, Fence(outcome["owner"], outcome["token"])))

    def _run(self, steps: Steps) -> None:
        errors = _Errors()
        worker_log = logging.getLogger(loop.logger.name)
        worker_log.addHandler(errors)
        try:
            for _ in steps:
                pass
        finally:
            worker_log.removeHandler(errors)
        self.failures += errors.messages
        crashed = steps.crashed
        if crashed is not None:  # the process died there: a new one replaces it
            self.crashes.append(crashed)
            self._worker = self._new_worker()

    def _next_timer(self) -> bool:
        """Time runs on to the next timer a run still waits for, or the next cleanup due; False: none."""
        timer_at = self.world.store.next_wake_at()
        if all(self.status(r) in SETTLED for r in self.run_ids()):
            timer_at = None
        due = [at for at in (timer_at, self.world.next_cleanup()) if at is not None]
        if not due:
            return False
        self.world.clock.advance(max(0.0, min(due) - self.world.clock()) + 0.001)
        self.world.fire_due_timers()
        return True


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        self.messages.append(record.getMessage() + (f": {error!r}" if error else ""))


@dataclass(frozen=True, slots=True)
class CrashOutcome:
    """One scenario run with its first worker killed at ``point`` (its ``nth`` passage)."""

    point: str
    nth: int
    kit: Kit


def every_crash(kind: RunKind, scenario: Callable[[Kit], None], **options: Any) -> list[CrashOutcome]:
    """Run ``scenario`` (it builds its runs and settles them) on a fresh ``Kit(kind, **options)``
    once to learn the crash points its first worker passes, then once more per passage, that worker
    killed there. The caller checks each outcome (``kit.check()``, statuses, executions)."""
    probe = CrashAt()
    with Kit(kind, crash=probe, **options) as kit:
        scenario(kit)
    passages: dict[str, int] = {}
    outcomes = []
    for point in probe.reached:
        passages[point] = passages.get(point, 0) + 1
        with Kit(kind, crash=CrashAt(point, passages[point]), **options) as kit:
            scenario(kit)
        assert kit.crashes == [point], f"{point} #{passages[point]}: the worker died at {kit.crashes}"
        outcomes.append(CrashOutcome(point, passages[point], kit))
    return outcomes
