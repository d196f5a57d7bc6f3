"""The run snapshot: the structured state every decision and every resume starts from.

Responsibility: hold what a run needs to continue (status, pending wait, budget, pinned
versions, confirmed facts, the action summary, open questions, the outcome) as one
frozen value that round-trips through JSON exactly.

Invariants:
- A snapshot only changes through ``longrun.domain.evolve.evolve``; it is a projection of
  the run's events and ``fold(events)`` rebuilds it.
- ``RunSnapshot.from_dict(s.to_dict()) == s`` and the dict is JSON-compatible; it carries
  ``schema_version`` and an unknown version is refused, not guessed. Snapshots stored by an
  earlier schema are upcast on read by pure functions (``upcast_snapshot_v1_v2``), so a run
  parked for days under the previous release resumes under this one.
- Facts keep their source and time, because user and external facts must stay
  distinguishable from the agent's own judgements when the run resumes.
- Rules about which combinations are valid live in ``longrun.domain.invariants``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from enum import Enum
from operator import attrgetter
from typing import cast

from longrun.domain.action import ActionRecord
from longrun.domain.budget import Budget
from longrun.domain.codec import FrozenMap, JsonValue, from_plain, to_plain
from longrun.domain.run import RunStatus
from longrun.domain.scope import Scope
from longrun.errors import UnknownSchemaVersion

SNAPSHOT_SCHEMA_VERSION = 10
"""2 adds ``labels`` (search attributes), 3 ``correlation_id``, 4 ``patches``, 5 questions (``Wait.question_id``,
``Question.answer_schema``), 6 ``permissions`` as a ``Scope``, 7 ``timeouts`` and ``deadline_passed``, 8
``Wait.provider``, 9 ``failure``, 10 a wait's reminders, escalation and validity; older ones are upcast on read."""
APPROVAL_FACT_PREFIX = "approval."
"""Approval decisions are recorded as facts under this prefix; compaction keeps them."""
APPROVAL_VALID_UNTIL = "valid_until"
"""In an approval fact's value, when the decision expires (epoch seconds): set when the approval declared
a validity (``WaitForUser.valid_for``, ``domain.approval_validity``)."""
DENIED_FACT_PREFIX = "permission_denied:"
"""A call refused as outside the run's scope is recorded as the fact ``permission_denied:<logical_action>``."""
RECEIPT_FACT_PREFIX = "receipt:"
"""A confirmed call's receipt is the fact ``receipt:<logical_action>``: what later decisions read."""
ANSWER_FACT_PREFIX = "answer:"
"""A person's answer to a question is the fact ``answer:<question_id>``; compaction keeps it."""
SIGNAL_FACT_PREFIX = "signal:"
"""A signal sent to the run is the fact ``signal:<signal_id>`` (its name and payload); compaction keeps it."""


class WakeReason(str, Enum):
    EVENT = "event"
    TIMER = "timer"
    DEADLINE = "deadline"
    APPROVAL = "approval"
    ANSWER = "answer"
    SIGNAL = "signal"


@dataclass(frozen=True, slots=True)
class PinnedVersions:
    """What the run was started with; replaying it under other versions could change history."""

    workflow: str
    prompt: str
    model_policy: str
    tool_schemas: str


@dataclass(frozen=True, slots=True)
class RunTimeouts:
    """A run's own limits (``longrun.domain.timeouts``), each in seconds, positive, or None: no limit."""

    schedule_to_start: float | None = None
    """How long the run may sit queued (READY) before a worker starts it; past it, TIMED_OUT."""
    start_to_close: float | None = None
    """A cap on every tool call's start-to-close in this run; it only shortens what a tool declares."""

    def __post_init__(self) -> None:
        for name in ("schedule_to_start", "start_to_close"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not value > 0):
                raise ValueError(f"RunTimeouts.{name} must be a positive number of seconds or None, got {value!r}")


@dataclass(frozen=True, slots=True)
class Wait:
    """What a parked run waits for. Which fields must be set depends on the status (see invariants)."""

    wait_id: str
    """Names this wait; wakes and timers carry it, so a wake for an ended wait is recognised as late."""
    kind: str
    """What is awaited, e.g. "ci", "webhook", "approval"; "timer" when only a timer ends it."""
    deadline: float | None
    """Epoch seconds; when it passes the run is woken with reason DEADLINE."""
    correlation_key: str | None = None
    wake_at: float | None = None
    approval_id: str | None = None
    owner: str | None = None
    approved_hash: str | None = None
    """Hash of the exact request being approved; an approval for any other hash is refused."""
    subject: str | None = None
    """What the wait is about: the summary shown to the approver, or the action a retry re-attempts."""
    question_id: str | None = None
    """The open question whose answer ends this wait (kind "question"); its text and answer schema
    are in ``RunSnapshot.open_questions``."""
    provider: str | None = None
    """The webhook provider whose event ``correlation_key`` names: only its events end the wait (or
    void the approval). None: no webhook does (a timer or a key the runtime itself sends)."""
    reminders: tuple[float, ...] = ()
    """Seconds after the wait started at which its owner is reminded (``run.wait_reminded``), in order.
    Schema 10, as are the fields below."""
    escalate_after: float | None = None
    """Seconds after the wait started when ``escalate_to`` may also decide or answer (``run.wait_escalated``)."""
    escalate_to: str | None = None
    """Who may also decide or answer once escalated: a subject, ``role:<role>`` or ``group:<group>``."""
    escalated: bool = False
    """The escalation came due: ``escalate_to`` may decide or answer as well as ``owner``."""
    valid_for: float | None = None
    """An approval's validity in seconds: a decision older than that when the run resumes, not yet used
    by the call it gates, expires (``run.approval_expired``) and is asked again."""


@dataclass(frozen=True, slots=True)
class Wake:
    """How the last wait ended; lets ``decide`` tell an answer from a deadline."""

    reason: WakeReason
    wait_id: str
    at: float
    correlation_key: str | None = None


@dataclass(frozen=True, slots=True)
class Fact:
    key: str
    value: JsonValue
    source: str
    """Who vouches for it: "user:<id>", "webhook:<provider>", "tool:<name>", "agent"."""
    recorded_at: float


QUESTION_WAIT = "question"
"""The ``Wait.kind`` of a run waiting for a person's answer to a question."""


@dataclass(frozen=True, slots=True)
class Question:
    """What a run asked a person and is waiting on (``AskUser``): open until answered, or until its
    wait ends another way (its deadline, a cancel)."""

    question_id: str
    text: str
    answer_schema: FrozenMap
    """The JSON Schema (draft 2020-12) an answer must satisfy to be accepted."""


@dataclass(frozen=True, slots=True)
class Acceptance:
    """The deterministic acceptance check's verdict, recorded with its evidence."""

    evidence: FrozenMap
    unmet: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StepFailure:
    """The last of the consecutive steps whose ``decide`` or ``accept`` raised (``run.step_failed``)."""

    phase: str
    error_type: str
    message: str
    attempt: int
    """How many steps in a row failed; the next step carried out without raising resets it."""
    at: float


@dataclass(frozen=True, slots=True)
class RunSnapshot:
    run_id: str
    tenant_id: str
    kind: str
    """The workflow (run kind) name."""
    status: RunStatus
    revision: int
    """Number of applied events; storage guards writes with it (optimistic concurrency)."""
    last_seq: int
    """Seq of the last applied event (late events are stored but not applied)."""
    created_at: float
    status_since: float
    goal: FrozenMap
    versions: PinnedVersions
    budget: Budget
    priority: int = 0
    permissions: Scope | None = None
    """The run's scope, computed when it was created (``scope.narrow``); no call outside it is
    prepared. The agent may propose changes but never widen it. Schema 5; None for a run created
    before scopes existed, which is not restricted."""
    deadline: float | None = None
    """The run's business deadline, if any (epoch seconds)."""
    timeouts: RunTimeouts = RunTimeouts()
    """The run's schedule-to-start and start-to-close limits, set when it was created. Schema 7; a run
    stored under an earlier schema has none."""
    deadline_passed: bool = False
    """The business deadline passed while the run was open: it cancels for it (``cancel_requested``
    too) and ends TIMED_OUT. Schema 7."""
    stage: str = ""
    wait: Wait | None = None
    paused_from: RunStatus | None = None
    cancel_requested: bool = False
    facts: tuple[Fact, ...] = ()
    """Oldest first; recording a key again replaces it and moves it to the end."""
    actions: tuple[ActionRecord, ...] = ()
    """One record per logical action, in the order they were prepared."""
    open_questions: tuple[Question, ...] = ()
    """Asked and not answered yet; each closes with its wait (answer, deadline, cancel...), so outside
    a worker's step the only open question is the one the run waits for."""
    last_wake: Wake | None = None
    acceptance: Acceptance | None = None
    terminal_reason: str | None = None
    labels: FrozenMap = FrozenMap()
    """Search attributes (team, cost centre, ticket) operators filter runs by; never read by
    ``decide``. Schema 2; runs stored under schema 1 have none."""
    correlation_id: str | None = None
    """What the run's broadcasts carry for their producer to match them by. Schema 3; runs stored
    under an earlier schema have none."""
    patches: tuple[str, ...] = ()
    """The patch points the run has taken (``run.patch_taken``), in the order it took them: what
    ``ctx.patched`` answers from when its history is replayed. Schema 4; runs stored under an earlier
    schema have taken none."""
    failure: StepFailure | None = None
    """The kind's code raised in the run's last steps (``run.step_failed``) and no step has been carried
    out since. Schema 9."""

    def action(self, logical_action: str) -> ActionRecord | None:
        return next((a for a in self.actions if a.logical_action == logical_action), None)

    def fact(self, key: str) -> Fact | None:
        return next((f for f in self.facts if f.key == key), None)

    def replace(self, **changes: object) -> RunSnapshot:
        """``dataclasses.replace`` for the snapshot, at less than half its cost: every event's
        ``evolve`` makes two or three, and a frozen dataclass's ``__init__`` sets each of its
        fields through ``object.__setattr__``. Here the slots are filled directly; a name that is
        not a field is refused with TypeError, as ``dataclasses.replace`` does."""
        copy = object.__new__(RunSnapshot)
        for set_slot, value in zip(_SLOT_SETTERS, _FIELD_VALUES(self), strict=True):
            set_slot(copy, value)
        for name, value in changes.items():
            index = _FIELD_INDEX.get(name)
            if index is None:
                raise TypeError(f"RunSnapshot has no field {name!r}")
            _SLOT_SETTERS[index](copy, value)
        return copy

    def to_dict(self) -> dict[str, object]:
        plain = cast(dict[str, object], to_plain(self))
        return {"schema_version": SNAPSHOT_SCHEMA_VERSION, **plain}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> RunSnapshot:
        """Decode a stored snapshot of this schema or of an earlier one (upcast step by step)."""
        version = data.get("schema_version")
        if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= SNAPSHOT_SCHEMA_VERSION:
            known = list(range(1, SNAPSHOT_SCHEMA_VERSION + 1))
            raise UnknownSchemaVersion("run.snapshot", version if isinstance(version, int) else -1, known)
        while version < SNAPSHOT_SCHEMA_VERSION:
            data = SNAPSHOT_UPCASTERS[version](data)
            version = data["schema_version"]
        return from_plain(cls, {k: v for k, v in data.items() if k != "schema_version"})


_FIELD_NAMES = tuple(f.name for f in fields(RunSnapshot))
_FIELD_VALUES = attrgetter(*_FIELD_NAMES)
_FIELD_INDEX = {name: i for i, name in enumerate(_FIELD_NAMES)}
_SLOT_SETTERS = tuple(getattr(RunSnapshot, name).__set__ for name in _FIELD_NAMES)
"""The slots' own descriptors: setting through them skips the frozen ``__setattr__``."""


def upcast_snapshot_v1_v2(data: Mapping[str, object]) -> dict[str, object]:
    """Schema 1 -> 2: a run recorded before labels existed has none. Pure: a new dict, input untouched."""
    if data.get("schema_version") != 1:
        raise ValueError(f"upcast_snapshot_v1_v2 takes schema_version 1, got {data.get('schema_version')!r}")
    if "labels" in data:
        raise ValueError("a schema-1 snapshot has no labels field")
    return {**data, "schema_version": 2, "labels": {}}


def upcast_snapshot_v2_v3(data: Mapping[str, object]) -> dict[str, object]:
    """Schema 2 -> 3: a run created before correlation ids were kept has none. Pure."""
    if data.get("schema_version") != 2:
        raise ValueError(f"upcast_snapshot_v2_v3 takes schema_version 2, got {data.get('schema_version')!r}")
    if "correlation_id" in data:
        raise ValueError("a schema-2 snapshot has no correlation_id field")
    return {**data, "schema_version": 3, "correlation_id": None}


def upcast_snapshot_v3_v4(data: Mapping[str, object]) -> dict[str, object]:
    """Schema 3 -> 4: a run stored before patch points existed has taken none. Pure."""
    if data.get("schema_version") != 3:
        raise ValueError(f"upcast_snapshot_v3_v4 takes schema_version 3, got {data.get('schema_version')!r}")
    if "patches" in data:
        raise ValueError("a schema-3 snapshot has no patches field")
    return {**data, "schema_version": 4, "patches": []}


def upcast_snapshot_v4_v5(data: Mapping[str, object]) -> dict[str, object]:
    """Schema 4 -> 5: a pending wait of a run stored before questions existed waits on no question, and
    an open question (none was ever opened then) accepts any answer (the empty schema). Pure."""
    if data.get("schema_version") != 4:
        raise ValueError(f"upcast_snapshot_v4_v5 takes schema_version 4, got {data.get('schema_version')!r}")
    wait, questions = data.get("wait"), data.get("open_questions", [])
    if isinstance(wait, Mapping) and "question_id" in wait:
        raise ValueError("a schema-4 wait has no question_id field")
    if not isinstance(questions, list) or any(not isinstance(q, Mapping) or "answer_schema" in q for q in questions):
        raise ValueError("schema-4 open questions are a list of objects without answer_schema")
    return {**data, "schema_version": 5,
            "wait": {**wait, "question_id": None} if isinstance(wait, Mapping) else wait,
            "open_questions": [{**q, "answer_schema": {}} for q in questions]}


def upcast_snapshot_v5_v6(data: Mapping[str, object]) -> dict[str, object]:
    """Schema 5 -> 6: ``permissions`` was a list nothing ever set; a run created before scopes has
    none (None: not restricted). Pure."""
    if data.get("schema_version") != 5:
        raise ValueError(f"upcast_snapshot_v5_v6 takes schema_version 5, got {data.get('schema_version')!r}")
    if data.get("permissions", []) != []:
        raise ValueError(f"a schema-5 snapshot's permissions were never set, got {data.get('permissions')!r}")
    return {**data, "schema_version": 6, "permissions": None}


def upcast_snapshot_v6_v7(data: Mapping[str, object]) -> dict[str, object]:
    """Schema 6 -> 7: a run stored before per-run timeouts has none, and its deadline (the old timer
    ended a run TIMED_OUT outright) has not sent it cancelling. Pure."""
    if data.get("schema_version") != 6:
        raise ValueError(f"upcast_snapshot_v6_v7 takes schema_version 6, got {data.get('schema_version')!r}")
    if "timeouts" in data or "deadline_passed" in data:
        raise ValueError("a schema-6 snapshot has no timeouts or deadline_passed field")
    return {**data, "schema_version": 7, "timeouts": {"schedule_to_start": None, "start_to_close": None},
            "deadline_passed": False}


def upcast_snapshot_v7_v8(data: Mapping[str, object]) -> dict[str, object]:
    """Schema 7 -> 8: a wait names the webhook provider whose event ends it. The database migration
    0029 wrote it into the stored snapshot of each run waiting on a webhook (whatever its schema);
    any other wait is ended by no webhook. Pure."""
    if data.get("schema_version") != 7:
        raise ValueError(f"upcast_snapshot_v7_v8 takes schema_version 7, got {data.get('schema_version')!r}")
    wait = data.get("wait")
    return {**data, "schema_version": 8,
            "wait": {**wait, "provider": wait.get("provider")} if isinstance(wait, Mapping) else wait}


def upcast_snapshot_v8_v9(data: Mapping[str, object]) -> dict[str, object]:
    """Schema 8 -> 9: a run stored before failed steps were recorded has none on record. Pure."""
    if data.get("schema_version") != 8:
        raise ValueError(f"upcast_snapshot_v8_v9 takes schema_version 8, got {data.get('schema_version')!r}")
    if "failure" in data:
        raise ValueError("a schema-8 snapshot has no failure field")
    return {**data, "schema_version": 9, "failure": None}


def upcast_snapshot_v9_v10(data: Mapping[str, object]) -> dict[str, object]:
    """Schema 9 -> 10: a wait recorded before reminders, escalation and approval validity has none of them. Pure."""
    if data.get("schema_version") != 9:
        raise ValueError(f"upcast_snapshot_v9_v10 takes schema_version 9, got {data.get('schema_version')!r}")
    wait = data.get("wait")
    if isinstance(wait, Mapping) and "reminders" in wait:
        raise ValueError("a schema-9 wait has no reminders field")
    attention = {"reminders": [], "escalate_after": None, "escalate_to": None, "escalated": False, "valid_for": None}
    return {**data, "schema_version": 10, "wait": {**wait, **attention} if isinstance(wait, Mapping) else wait}


SNAPSHOT_UPCASTERS: Mapping[int, Callable[[Mapping[str, object]], dict[str, object]]] = {
    1: upcast_snapshot_v1_v2, 2: upcast_snapshot_v2_v3, 3: upcast_snapshot_v3_v4, 4: upcast_snapshot_v4_v5,
    5: upcast_snapshot_v5_v6, 6: upcast_snapshot_v6_v7, 7: upcast_snapshot_v7_v8, 8: upcast_snapshot_v8_v9,
    9: upcast_snapshot_v9_v10}
"""Version n -> the function that turns a stored schema-n snapshot into schema n+1."""
