"""What the use cases ask of storage: the worker's step loop (``app.worker``) a
``WorkerStore``, the operator's and the gateway's a ``RunTransaction``, the reconciler's sweeps that
move runs (actions in doubt, expired leases) a ``ReconcileStore``.

Two adapters keep each contract: PostgreSQL (``db.worker_store``, ``db.transaction``,
``db.reconcile_store``: the runtime, with its one-statement fast paths) and memory
(``longrun.testing.workers``, ``longrun.testing.transaction``, ``longrun.testing.reconcile_store``:
for property tests and run kinds' own tests). ``tests/integration/test_memory_contract.py`` runs the
same calls against both and demands the same answers.

Every write is guarded by the run's expected revision and the worker's fence: ``LeaseLost`` when
the fence no longer matches the stored lease, ``StaleRevision`` when someone appended meanwhile;
either way nothing is written.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from longrun.domain import PinnedVersions, RunStatus, TenantPolicy
from longrun.domain.breaker import Admission, Breaker
from longrun.domain.concurrency import KeyClaim, KeyedRun
from longrun.domain.events import RunCreated, RunEvent
from longrun.ports import inbox
from longrun.ports.inbox import Claimed, Duplicate, Handled
from longrun.ports.runs import Artifact, AtOnce, Fence, Found, LedgerOutcome, LedgerRequest, StoredRun, Transition
from longrun.ports.runs import Message as Outgoing
from longrun.ports.webhooks import Translated

CrashPoints = Callable[[str], None]
"""Called with a point's name where a worker may die (``faults.crash_point`` in a process: SIGKILL
when armed; in memory, an exception the test arms)."""


class WorkerStore(Protocol):
    async def take_on_wakeup(self, message: inbox.Message, owner: str, ttl: float,
                             served: Collection[str]) -> tuple[Handled, StoredRun | None]:
        """The wakeup's inbox row and the lease, together: the outcome (taken, with owner and token,
        or why not; a repeat gets the recorded one) and the run as taken. A run whose pins
        (``authoring.pins_key``) are not ``served`` is not taken but marked as waiting for a worker
        that runs it, if a worker has work for it."""

    async def adopt(self, owner: str, ttl: float, served: Collection[str], limit: int) -> list[StoredRun]:
        """The lease of up to ``limit`` runs marked as waiting for a worker that runs them, if their
        pins are ``served``; the mark cleared."""

    async def hand_over(self, run_id: str, fence: Fence) -> None:
        """The lease released and the run marked as waiting for a worker that runs it."""

    async def load(self, run_id: str) -> StoredRun | None: ...

    async def extend_lease(self, run_id: str, fence: Fence, ttl: float) -> bool:
        """False when the fence no longer holds the lease."""

    async def release_lease(self, run_id: str, fence: Fence) -> None: ...

    async def commit(self, transition: Transition) -> StoredRun:
        """The transition and everything with it, all or nothing (``Transition``): the move guarded by
        its revision and fence, a first call's ledger row (or, for a key the ledger holds already, one
        more attempt of the same request, refused if its hash differs), the far side's answer, an
        uploaded receipt, the timers of the wait it parks in and any event kept for the wait's key
        (which ends it at once). The common step is one statement; the state after it is returned."""

    async def tenant_policy(self, tenant_id: str) -> TenantPolicy | None:
        """The tenant's current policy, read only to re-validate an approved call (not on the common step)."""

    async def resend(self, run_id: str, fence: Fence, ttl: float, attempt: LedgerRequest,
                     timers: Sequence[Mapping[str, Any]]) -> None:
        """The lease extended and one more attempt of a known request on the ledger, watched by
        ``timers`` (the action's earlier call timers cancelled); ``LeaseLost`` if the fence no longer holds."""

    async def requests(self, run_id: str, logical_actions: Collection[str]) -> dict[str, dict[str, Any]]:
        """The arguments the ledger holds for those of ``logical_actions`` it has a row of: what a new
        lease holder sends again for a call no decision asks for any more (the loser of a join)."""

    async def beat(self, idempotency_key: str, fencing_token: int, progress: Mapping[str, Any] | None, *,
                   timer_key: str | None, due_in: float) -> bool:
        """A call's heartbeat on its ledger row (``progress``, and when) with its heartbeat timer
        ``timer_key`` moved to ``due_in`` seconds from now, in one statement; False, and nothing
        written, unless the row is SUBMITTED under ``fencing_token``."""

    def unreachable(self, error: BaseException) -> bool:
        """Whether ``error`` says the store could not be reached (nothing was decided): a step that
        failed so leaves its lease to expire without alarm."""


class RunTransaction(Protocol):
    """What the scheduler's, the operator's and the gateway's use cases (``app.scheduler.admit``, ``app.gateway.operate``,
    ``app.gateway.webhooks``) do inside one transaction: all of it commits together or none of it does."""

    async def load(self, run_id: str, *, lock: bool = False) -> StoredRun | None:
        """``lock``: held until the transaction ends (another writer of the run waits)."""

    async def append(self, stored: StoredRun, events: Sequence[RunEvent]) -> StoredRun:
        """The events, guarded by the run's revision (``StaleRevision``); refused by the domain
        (``DomainError``) changes nothing."""

    async def send(self, messages: Sequence[Outgoing]) -> None:
        """Published once the transaction commits (the outbox)."""

    async def notify(self, channel: str, key: str) -> None:
        """Told to whoever listens on ``channel`` once the transaction commits: admission
        (``effects.ADMISSION_CHANNEL``) of a tenant (``key``) with a run queued, which it admits at once."""

    async def audit(self, *, actor: str, action: str, target: str, reason: str, details: Mapping[str, Any]) -> None: ...

    async def record(self, outcome: LedgerOutcome) -> None:
        """The ledger row of ``outcome.key`` takes its status and columns (an operator's resolution)."""

    async def claim(self, service: str, message_id: str, message_type: str) -> Claimed | Duplicate:
        """The service's inbox row for the message: a repeat gets the outcome recorded for the first."""

    async def record_outcome(self, service: str, message_id: str, outcome: Mapping[str, Any]) -> None: ...

    async def keep(self, provider: str, event: Translated, payload: Mapping[str, Any], *, remember: bool) -> bool:
        """A verified webhook event, kept (once per provider and id) until a run's wait matches it;
        ``remember``: its delivery id is kept for good too. False, keeping nothing, when the delivery
        was seen before (an id kept or remembered: a repeat the inbox has forgotten)."""

    async def waiting_on(self, provider: str, correlation_key: str) -> str | None:
        """A run whose wait (or paused wait) an event of this provider for this key ends."""

    async def kept_for(self, provider: str, correlation_key: str) -> Translated | None:
        """The oldest kept, unmatched event of this provider for this key, locked."""

    async def matched(self, provider: str, event_id: str, run_id: str) -> None: ...

    async def signal_seen(self, run_id: str, signal_id: str) -> bool:
        """Whether the run's history holds the signal ``signal_id`` (applied or kept late)."""

    async def repin(self, run_id: str, versions: PinnedVersions) -> None:
        """The run's version columns (what searches and the versions report read) follow a migration
        its snapshot recorded."""

    async def lock_tenant(self, tenant_id: str) -> TenantPolicy | None:
        """The tenant's admission lock, held until the transaction ends: creates and admissions of one
        tenant count its slots one after another. Returns the tenant's policy, read with it (None when
        it set none)."""

    async def find(self, tenant_id: str, idempotency_key: str) -> Found | None: ...

    async def create(self, created: RunCreated, *, idempotency_key: str, input_hash: str, partition: int,
                     at_once: AtOnce, announce: Sequence[Outgoing], key: KeyClaim | None = None) -> StoredRun | None:
        """The run and its first event, ``announce`` sent, and admitted at once (its wakeup sent) while
        its tenant has a free slot and no run queued, and its concurrency ``key`` (if any) has room; None,
        and nothing sent, when (tenant, key) exists."""

    async def keyed_runs(self, tenant_id: str, claim: KeyClaim, *, up_to: int) -> list[KeyedRun]:
        """The tenant's unfinished runs with ``claim``'s key, oldest first, at most ``up_to``."""

    async def link_child(self, child_run_id: str, *, parent_run_id: str, name: str, on_parent_cancel: str) -> None:
        """Record ``child_run_id`` as the child ``name`` of ``parent_run_id`` (``domain.children``); its
        end then reaches the parent. Again for the same child: nothing changes."""

    async def children_to_cancel(self, parent_run_id: str) -> list[str]:
        """The open children of ``parent_run_id`` that cancelling it cancels (policy ``cancel``)."""


class Breakers(Protocol):
    """The far sides' circuit breakers as the worker asks them (``domain.breaker``), shared by every
    worker: whether a call may go now, and what its answer did to the breaker."""

    def view(self, far_side: str) -> Breaker:
        """The breaker of ``far_side`` as last read (clean when none is known), asking nothing."""

    async def admit(self, far_side: str, run_id: str) -> Admission:
        """Whether ``run_id`` may call ``far_side`` now: a call, the probe, or a wait."""

    async def failed(self, far_side: str) -> Breaker:
        """An unavailable answer counted; the breaker after it."""

    async def succeeded(self, far_side: str, *, probe: bool) -> None:
        """A call answered: the breaker closes."""


class SpentTenants(Protocol):
    """Which tenants' budgets are spent for the period now running, as the worker asks before a model call."""

    async def spent_until(self, tenant_id: str, *, fresh: bool = False) -> float | None:
        """When the tenant's spent period ends (epoch seconds), or None when its budget is not spent;
        ``fresh``: read now, not from a copy."""


MatchKept = Callable[[RunTransaction, StoredRun], Awaitable[StoredRun]]
"""Run where a wait starts, in the transaction that parks the run: an event kept for the wait's key
ends it at once (``app.gateway.webhooks.match_kept``, given to the worker's store by its service)."""


@dataclass(frozen=True, slots=True)
class Doubtful:
    """An action's ledger row as a reconciler claims it: what to ask the far side and how to judge
    the answer, and ``stale``: last written more than ``abandoned_after`` ago by the store's clock."""

    idempotency_key: str
    tool: str
    effect_kind: str
    request: Mapping[str, Any]
    status: str
    last_error: str | None
    stale: bool


@dataclass(frozen=True, slots=True)
class ExpiredLease:
    """A lease the reconciler cleared, as it was: whose it was and under which fencing token."""

    run_id: str
    lease_owner: str
    fencing_token: int


class ReconcileTransaction(Protocol):
    """What the reconciler's run-moving sweeps (``app.reconciler``) do inside one
    transaction: all of it commits together or none of it does."""

    async def lock_run(self, run_id: str) -> StoredRun | None:
        """The run, locked until the transaction ends; None when it does not exist or another
        transaction holds it (skipped, not waited for: left for the next sweep)."""

    async def load(self, run_id: str, *, lock: bool = False) -> StoredRun | None:
        """``lock``: held until the transaction ends (another writer of the run waits)."""

    async def load_many(self, run_ids: Sequence[str]) -> dict[str, StoredRun]: ...

    async def doubtful(self, run_id: str, logical_action: str, *, abandoned_after: float) -> Doubtful | None:
        """The action's ledger row, locked until the transaction ends."""

    async def latest_claim(self, run_id: str, logical_action: str) -> int | None:
        """Seq of the action's latest ``action.reconciliation_started``."""

    async def ledger_status(self, idempotency_key: str) -> str | None: ...

    async def append(self, stored: StoredRun, events: Sequence[RunEvent]) -> StoredRun:
        """As ``RunTransaction.append``."""

    async def record(self, outcome: LedgerOutcome) -> None:
        """The ledger row's status and columns; restarts its staleness."""

    async def send(self, messages: Sequence[Outgoing]) -> None:
        """Published once the transaction commits (the outbox)."""

    async def register(self, artifact: Artifact, run_id: str) -> None:
        """An uploaded receipt, referenced from the run."""

    async def alert(self, *, actor: str, action: str, target: str, reason: str, details: Mapping[str, Any]) -> None:
        """An alert for a person (an audit row by ``actor``), written with the transaction."""

    async def clear_expired(self, limit: int) -> list[ExpiredLease]:
        """Up to ``limit`` expired leases, earliest expiry first, cleared (their runs locked;
        those another transaction holds are skipped)."""

    async def clear_one_expired(self, skipping: Collection[str]) -> ExpiredLease | None:
        """As ``clear_expired`` for the earliest one outside ``skipping``."""


class ReconcileStore(Protocol):
    """The reconciler's storage: a read of candidates, and one transaction per claim, settlement or sweep,
    so no transaction is held while the far side is asked."""

    def unreachable(self, error: BaseException) -> bool:
        """Whether ``error`` means the store is away (the sweep stops, to run again), rather than that
        one run could not be handled (skipped, the sweep goes on)."""

    async def in_doubt(self, *, limit: int, abandoned_after: float,
                       held: Collection[RunStatus]) -> list[tuple[str, str]]:
        """(run_id, logical_action) of up to ``limit`` actions from each of three sources, each oldest
        first, one source after the other (a pair may repeat): ledger rows UNKNOWN, or RECONCILING
        and stale; runs in ``held`` whose snapshot lists an UNKNOWN action; ledger rows SUBMITTED
        and stale under a finished run. Staleness is ``abandoned_after`` by the store's clock."""

    def transaction(self) -> AbstractAsyncContextManager[ReconcileTransaction]: ...
