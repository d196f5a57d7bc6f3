"""The authoring API: what a workflow author writes to define a run kind.

A run kind pins its versions (workflow, prompt, model policy, tool schemas), has a
deterministic ``decide(state, ctx)`` and an ``accept(state, evidence)`` (see
``longrun.domain.decisions.Workflow``), and declares tools. A tool has a name, a
version, an argument schema, an effect kind (which decides recovery after a crash),
``execute(args, idempotency_key, fencing_token)``, ``lookup(idempotency_key)`` for
reconciliation and, optionally, ``compensate(receipt)``, and its timeouts (``start_to_close``,
``heartbeat_timeout``). A long call reports that it is alive, with its progress, by awaiting
``heartbeat(details)`` from inside ``execute``. The runtime owns persistence, retries, leases,
timers and recovery.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ValidationError

from longrun import streaming
from longrun.domain import EffectKind, PinnedVersions, RetryPolicy, RunSnapshot, RunTimeouts, Scope, Workflow
from longrun.domain.concurrency import LARGEST_LIMIT, KeyClaim, KeyPolicy, key_problem
from longrun.domain.rate_limit import RateLimit, Unit
from longrun.errors import ToolRejected
from longrun.model import ModelAdapter


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What the far side answered: its id for the object and a small JSON receipt."""

    external_id: str | None
    receipt: Mapping[str, Any]


class ToolFunction(Protocol):
    async def __call__(self, args: Mapping[str, Any], idempotency_key: str, fencing_token: int) -> ToolResult: ...


Lookup = Callable[[str], Awaitable[ToolResult | None]]
Compensate = Callable[[Mapping[str, Any]], Awaitable[ToolResult]]


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    version: str
    effect: EffectKind
    args: type[BaseModel]
    execute: ToolFunction
    lookup: Lookup | None = None
    """Query the far side by idempotency key: a result if it acted, None if it did not."""
    compensate: Compensate | None = None
    start_to_close: float = 30.0
    """Seconds a call may take from its start to its answer. Past them the worker cancels it, and the
    call's durable ``start_to_close`` timer acts for a worker that cannot (dead, frozen, or a call that
    ignores cancellation): a write's outcome is UNKNOWN (never FAILED; the reconciler settles it), and
    a pure or read call, harmless to repeat, is tried again under ``retry``."""
    heartbeat_timeout: float | None = None
    """Seconds a call may go without a ``heartbeat()``; past them it is given up on as past
    ``start_to_close``. With it, even a pure or read call is on record before it runs, so a durable
    ``heartbeat`` timer watches it. None: its heartbeats are not watched."""
    public_receipt: tuple[str, ...] = ()
    """Receipt fields a run's terminal event may show the outside world, beside the external id
    (always shown). Everything else in a receipt stays inside."""
    retry: RetryPolicy | None = None
    """How an unavailable answer (``ToolUnavailable``) is retried: each attempt charged, each delay a
    durable timer, exhaustion the action FAILED. None: the worker's default (``LONGRUN_RETRY_*``)."""
    far_side: str = ""
    """The downstream service this tool calls: tools naming the same one share its health (circuit
    breaker). Empty: the tool's own name."""

    rate_limits: tuple[RateLimit, ...] = ()
    """The far side's limits on this tool's calls (requests per period), shared by every worker: a
    call past them waits, uncharged, for its place in line (docs/flow-control.md#rate-limits-per-far-side).
    Tools naming the same far side share a limit by declaring the same one."""

    resource: Callable[[Mapping[str, Any]], str] | None = None
    """What a call acts on, read from its validated arguments (e.g. ``lambda a: f"repo:{a['repo']}"``):
    the run's scope must allow it as well as the tool. None: the tool's calls are checked by name only."""

    def __post_init__(self) -> None:
        for name in ("start_to_close", "heartbeat_timeout"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"tool {self.name!r}: {name} must be seconds > 0, got {value!r}")
        if any(limit.unit is not Unit.REQUESTS for limit in self.rate_limits):
            raise ValueError(f"tool {self.name!r}: rate_limits count requests; tokens are a model's limit")

    @property
    def health_key(self) -> str:
        """The circuit breaker this tool's calls count in and wait for."""
        return self.far_side or self.name

    def validate(self, args: Mapping[str, Any]) -> dict[str, Any]:
        try:
            return self.args.model_validate(dict(args)).model_dump(mode="json")
        except ValidationError as e:
            raise ToolRejected(self.name, 400, f"arguments do not match the schema: {e}") from e


PROGRESS_LIMIT = 16_384
"""Bytes a heartbeat's details may take as JSON: they are kept on the action's ledger row."""


class CallProgress(Protocol):
    """The call a worker runs in this task: what ``heartbeat`` reports to."""

    def beat(self, details: Mapping[str, Any] | None) -> None: ...


CURRENT_CALL: ContextVar[CallProgress | None] = ContextVar("longrun_current_call", default=None)
"""Set by the worker around a tool's ``execute``."""


async def heartbeat(details: Mapping[str, Any] | None = None) -> None:
    """Say, from inside a tool's ``execute``, that the call is alive, and how far it got (``details``,
    a JSON object, e.g. ``{"done": 3, "of": 10}``; None keeps the last). It resets the call's
    ``heartbeat_timeout``; the details are recorded on the action's ledger row, at most every third
    of that timeout (the last ones always), and shown with the run's actions (``GET /runs/{id}``).
    Progress is only a report: it never counts as the call's outcome.

    Raises:
        RuntimeError: called outside a tool call run by a worker.
        ValueError: ``details`` is not a JSON object of at most ``PROGRESS_LIMIT`` bytes.
    """
    call = CURRENT_CALL.get()
    if call is None:
        raise RuntimeError("heartbeat() was called outside a tool call: only a tool's execute, run by a "
                           "worker, may heartbeat")
    if details is not None:
        if not isinstance(details, Mapping):
            raise ValueError(f"heartbeat details must be a JSON object (a mapping), got {type(details).__name__}")
        try:
            size = len(json.dumps(dict(details), allow_nan=False))
        except (TypeError, ValueError) as e:
            raise ValueError(f"heartbeat details are not JSON: {e}") from e
        if size > PROGRESS_LIMIT:
            raise ValueError(f"heartbeat details take {size} bytes as JSON; at most {PROGRESS_LIMIT} are kept")
    call.beat(details)
    if details is not None:
        await streaming.report_progress(details)


@dataclass(frozen=True, slots=True)
class ScopeApproval:
    """Who may let a run make one call outside its scope, and how long the run waits for them."""

    owner: str
    """A subject, ``role:<role>`` or ``group:<group>`` (``longrun.principals``)."""
    timeout: float
    """Seconds; unanswered past them, the run goes to NEEDS_ATTENTION (a refused call asks once)."""


@dataclass(frozen=True, slots=True)
class ConcurrencyKey:
    """At most ``limit`` runs of a tenant hold one key at once, derived from each run's input (e.g.
    ``lambda i: f"repo:{i['repo']}"``: one upgrade per repository). A run takes its key at its first
    admission and holds it until it ends; kinds naming the same key share it. When the key's runs
    fill the limit, ``policy`` says what a create does (``KeyPolicy``)."""

    key: Callable[[Mapping[str, Any]], str | None]
    """The key of a run with this (validated) input; None: this run has none. A key is 1 to 200
    characters; a function that raises or returns anything else refuses the create (``input_invalid``)."""
    limit: int = 1
    policy: KeyPolicy = KeyPolicy.QUEUE
    max_waiting: int | None = None
    """``QUEUE`` only: at most this many runs wait for the key; a create past them is refused
    (``concurrency_key_held``). None: any number wait. One is a schedule's "buffer one"."""

    def __post_init__(self) -> None:
        if not 0 < self.limit <= LARGEST_LIMIT:
            raise ValueError(f"concurrency key: limit must be 1 to {LARGEST_LIMIT}, got {self.limit!r}")
        if self.max_waiting is not None and (self.policy is not KeyPolicy.QUEUE or self.max_waiting < 0):
            raise ValueError(f"concurrency key: max_waiting is a number >= 0 of runs queued behind the key, "
                             f"for the policy queue only; got {self.max_waiting!r} with {self.policy.value}")

    def claim(self, value: Mapping[str, Any]) -> KeyClaim | None:
        """The key a run with input ``value`` claims (None: none); ValueError saying why it has no valid one."""
        try:
            key = self.key(value)
        except Exception as e:
            raise ValueError(f"concurrency key cannot be derived from the input: {e!r}") from None
        if key is None:
            return None
        if problem := key_problem(key):
            raise ValueError(problem)
        return KeyClaim(key, self.limit)


@dataclass(frozen=True, slots=True)
class CleanupStep:
    """What a finished run releases (a workspace, a temporary credential): a call of one of the kind's
    tools, through the action ledger, once the run ended COMPLETED, FAILED, CANCELLED, TIMED_OUT or
    BUDGET_EXHAUSTED (a TERMINATED run skips it). A failed step is retried and raises
    ``alert.cleanup_failed``; it never changes how the run ended."""

    name: str
    """The step's name: its ledger action is ``cleanup:<name>``."""
    tool: str
    """The tool it calls (one of the kind's ``tools``): its effect kind, lookup and time limit apply. A
    non-idempotent write must declare a lookup (a step cut short is looked up, never sent blind)."""
    args: Callable[[RunSnapshot], Mapping[str, Any] | None]
    """The call's arguments, from the finished run; None: this run has nothing for the step to release."""


@dataclass(frozen=True)
class RunKind:
    """A workflow plus everything the runtime needs to run it at one pinned version."""

    name: str
    versions: PinnedVersions
    workflow: Workflow
    tools: Mapping[str, Tool]
    allowed_actions: Callable[[RunSnapshot, str], Sequence[str]] = field(default=lambda state, purpose: ())
    """What the model may propose for a given purpose; proposals outside it are refused."""
    migrates_from: Mapping[str, Collection[str]] = field(default_factory=dict)
    """Runs this version can take over: workflow version -> the stages (``RunSnapshot.stage``; ``*``
    for any) a run of that version may be in. An operator's migration to this version is refused
    for any other run."""

    model: ModelAdapter | None = None
    """The model this kind's ``AskModel`` asks, in place of the worker's (``LONGRUN_MODEL``): a kind that
    brings its own, e.g. a Pydantic AI agent's (``longrun.pydantic_ai``). Its calls share the worker's
    model limits, health and retries, and are charged to the run's budget as any model call."""
    model_retry: RetryPolicy | None = None
    """How a model that answers unavailable is asked again (as a tool's ``retry``). None: the
    worker's default (``LONGRUN_RETRY_*``)."""
    step_retry: RetryPolicy | None = None
    """How a step whose ``decide`` or ``accept`` raised is tried again: on a durable timer, after the
    policy's delay; after its ``maximum_attempts`` failures in a row the run goes NEEDS_ATTENTION until
    an operator retries it (once a fixed kind is deployed). None: the worker's default (``LONGRUN_RETRY_*``)."""
    scope: Scope = Scope()
    """The most a run of this kind may do (tools, resources); its tenant's policy and its producer
    narrow it, never widen it. By default every tool on every resource."""
    scope_approval: ScopeApproval | None = None
    """What a call outside the run's scope does: with this, it asks a person to approve exactly that
    request; without, the run goes to NEEDS_ATTENTION."""
    timeouts: RunTimeouts = RunTimeouts()
    """Default schedule-to-start and start-to-close of this kind's runs; a producer's run.create
    (v4 ``timeouts``) sets either for its run. By default neither limits a run."""

    next_far_side: Callable[[RunSnapshot], str | None] | None = None
    """The far side (``Tool.health_key``) the run's next call needs, when the kind can tell from the
    run as it stands, e.g. ``lambda run: "forge"`` for a kind whose every step ends in a call to the
    forge: while its breaker is open, a run a worker takes parks at once, before it decides or asks a
    model anything, and gives its slot back (docs/flow-control.md). None, or None returned: the
    breaker is asked at the call."""

    model_script: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    """What the scripted model (``LONGRUN_MODEL=scripted``) proposes for each purpose this kind asks
    about: the n-th entry for its n-th ask. For demos and tests without a model endpoint."""
    input_schema: type[BaseModel] | Mapping[str, Any] | None = None
    """What a run's input (run.create's ``input``) must be: a pydantic model (validated strictly, as
    the JSON it arrived as) or a JSON Schema (draft 2020-12). A create whose input fails it is
    refused with ``run.rejected`` (``input_invalid``, naming each field that failed) and creates
    nothing, so ``decide`` never meets an input it cannot read. None: any JSON object."""

    concurrency: ConcurrencyKey | None = None
    """The concurrency key a run of this kind takes, from its input. None: its runs take none."""

    cleanup: Sequence[CleanupStep] = ()
    """Steps run, in order, after a run of this kind ended (``CleanupStep``); a step waits for the
    ones before it."""
    cleanup_retry: RetryPolicy = RetryPolicy(initial_interval=5.0, maximum_interval=600.0)
    """The backoff between attempts of a failed cleanup; past ``maximum_attempts`` it keeps its
    longest delay (a cleanup is never given up)."""

    signals: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """The signals a run of this kind accepts: name -> the JSON Schema (draft 2020-12) its payload must
    satisfy. A signal of any other name, or whose payload fails its schema, is refused and changes
    nothing (``longrun.app.signals``). Empty: the kind accepts no signal."""

    def __post_init__(self) -> None:
        names = [step.name for step in self.cleanup]
        if len(set(names)) != len(names):
            raise ValueError(f"run kind {self.name!r}: cleanup step names repeat: {names}")
        for step in self.cleanup:
            if step.tool not in self.tools:
                raise ValueError(f"run kind {self.name!r}: cleanup step {step.name!r} calls {step.tool!r}, "
                                 f"which is not one of its tools ({', '.join(sorted(self.tools)) or 'none'})")
            tool = self.tools[step.tool]
            if tool.effect is EffectKind.NON_IDEMPOTENT_WRITE and tool.lookup is None:
                raise ValueError(f"run kind {self.name!r}: cleanup step {step.name!r} calls {step.tool!r}, a "
                                 "non-idempotent write without a lookup: a step cut short could be neither "
                                 "sent again nor found (declare its lookup)")
        schemas = {"input_schema": self.input_schema} if isinstance(self.input_schema, Mapping) else {}
        schemas |= {f"signals[{name!r}]": schema for name, schema in self.signals.items()}
        for what, schema in schemas.items():
            try:
                Draft202012Validator.check_schema(dict(schema))
            except SchemaError as e:
                raise ValueError(f"run kind {self.name!r}: {what} is not a JSON Schema: {e.message}") from None

    def signal_problems(self, name: str, payload: object) -> list[str]:
        """Why this kind refuses a signal named ``name`` with ``payload``, each way as ``<field>: <why>``;
        none when it accepts it."""
        schema = self.signals.get(name)
        if schema is None:
            accepted = ", ".join(sorted(self.signals)) or "none"
            return [f"run kind {self.name!r} accepts no signal named {name[:100]!r} (it accepts: {accepted})"]
        return [_problem(("payload", *e.absolute_path), e.message)
                for e in Draft202012Validator(dict(schema)).iter_errors(payload)]

    def input_problems(self, value: Mapping[str, Any]) -> list[str]:
        """Each way ``value`` fails this kind's input schema, as ``<field>: <why>``; none when it fits."""
        schema = self.input_schema
        if schema is None:
            return []
        if isinstance(schema, Mapping):
            return [_problem(e.absolute_path, e.message)
                    for e in Draft202012Validator(dict(schema)).iter_errors(dict(value))]
        try:
            schema.model_validate_json(orjson.dumps(dict(value)), strict=True)
        except ValidationError as e:
            return [_problem(item["loc"], item["msg"]) for item in e.errors()]
        return []

    def takes_over(self, run: RunSnapshot) -> bool:
        stages = self.migrates_from.get(run.versions.workflow, ())
        return "*" in stages or run.stage in stages


PROBLEM_CHARS = 200
"""What one input problem may take of a refusal's reason (a message may quote the value)."""


def _problem(path: Iterable[str | int], why: str) -> str:
    where = ".".join(str(part) for part in path) or "input"
    return f"{where}: {why}"[:PROBLEM_CHARS]


_NONE_PUBLIC: Mapping[str, tuple[str, ...]] = MappingProxyType({})

PIN_SEPARATOR = "\x1f"
"""Joins a run's kind and four pins into one key (``pins_key``); no name contains it."""


def pins_key(kind: str, versions: PinnedVersions) -> str:
    """What a worker must serve to run a run: its kind and every pin, compared for equality (a
    worker with the same workflow version but another prompt does not run it). ``db.runs`` builds
    the same key from a run's columns."""
    return PIN_SEPARATOR.join((kind, versions.workflow, versions.prompt, versions.model_policy,
                               versions.tool_schemas))


class Registry:
    """Run kinds by (name, workflow version); a run always runs at the version it pinned."""

    def __init__(self, kinds: Sequence[RunKind] = ()) -> None:
        self._kinds: dict[tuple[str, str], RunKind] = {}
        self._public: dict[tuple[str, str], Mapping[str, tuple[str, ...]]] = {}
        for kind in kinds:
            self.add(kind)

    def add(self, kind: RunKind) -> None:
        try:
            Version(kind.versions.workflow)
        except InvalidVersion:
            raise ValueError(f"run kind {kind.name!r}: workflow version {kind.versions.workflow!r} is not a version "
                             "(expected e.g. 1, 2.1 or 3.0rc1: versions are ordered, and the newest is pinned)") from None
        if pins_key(kind.name, kind.versions).count(PIN_SEPARATOR) != 4:
            raise ValueError(f"run kind {kind.name!r}: a name or pin contains the control character \\x1f")
        self._kinds[(kind.name, kind.versions.workflow)] = kind
        self._public[(kind.name, kind.versions.workflow)] = MappingProxyType(
            {tool.name: tool.public_receipt for tool in kind.tools.values()})

    def get(self, name: str, version: str) -> RunKind:
        try:
            return self._kinds[(name, version)]
        except KeyError:
            raise LookupError(f"no run kind {name!r} at workflow version {version!r} in this worker") from None

    def newest(self, name: str) -> RunKind:
        versions = [k for (n, _), k in self._kinds.items() if n == name]
        if not versions:
            raise LookupError(f"unknown run kind {name!r}")
        return max(versions, key=lambda k: Version(k.versions.workflow))

    def known(self, name: str) -> bool:
        return any(n == name for n, _ in self._kinds)

    def public_receipts(self, name: str, version: str) -> Mapping[str, tuple[str, ...]]:
        """Tool name -> its public receipt fields, for a run of kind ``name`` at ``version``
        (none when this build does not know that kind)."""
        return self._public.get((name, version), _NONE_PUBLIC)

    def model_script(self) -> dict[str, list[Mapping[str, Any]]]:
        """The scripted model's answers for every purpose any kind here brings a script for."""
        script: dict[str, list[Mapping[str, Any]]] = {}
        for kind in self._kinds.values():
            for purpose, entries in kind.model_script.items():
                script.setdefault(purpose, list(entries))
        return script

    def advertised(self) -> list[tuple[str, str]]:
        return sorted(self._kinds)

    def serves(self) -> list[str]:
        """The ``pins_key`` of every run kind and version here: the runs a worker with it may take."""
        return sorted(pins_key(name, kind.versions) for (name, _), kind in self._kinds.items())

    def pins(self) -> list[dict[str, str]]:
        """Every kind with all its pinned versions: what a worker advertises in its membership row."""
        return [{"kind": name, "workflow": kind.versions.workflow, "prompt": kind.versions.prompt,
                 "model_policy": kind.versions.model_policy, "tool_schemas": kind.versions.tool_schemas}
                for (name, _), kind in sorted(self._kinds.items())]
