"""``Context``: what a code-first function awaits and reads. Time, ids and randomness come from it,
derived from the run and its journal, so every replay of a history sees the same values."""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from longrun.codefirst.awaits import (
    ApprovalWait,
    ChildrenStart,
    ChildrenWait,
    EventWait,
    ModelAsk,
    QuestionWait,
    SignalWait,
    Sleep,
    ToolCall,
    ToolCalls,
)
from longrun.codefirst.journal import Journal
from longrun.domain import Child, RunSnapshot, freeze, joins


class Context:
    """Passed to a code-first function with its input. Every ``await`` on it is journaled: replayed
    from the history when recorded, asked of the engine (and the run parked) when not."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._random = random.Random(journal.state.run_id)
        self._ids = random.Random(f"{journal.state.run_id}:ids")

    @property
    def run(self) -> RunSnapshot:
        """The run as the engine holds it now (read-only): its id and labels. What changes as it runs (facts,
        actions, budget) is not journaled at this point of the function: read results from awaits."""
        return self._journal.state

    def now(self) -> float:
        """Epoch seconds: when the run was created, moved to the time of each recorded result the replay
        has passed. The same on every replay; the engine's own clock sets the waits' deadlines."""
        return self._journal.clock

    def uuid(self) -> str:
        """A UUID, the same at the same point of every replay."""
        return str(uuid.UUID(int=self._ids.getrandbits(128), version=4))

    def random(self) -> float:
        """A number in [0, 1), the same at the same point of every replay."""
        return self._random.random()

    def patched(self, patch: str) -> bool:
        """Patch point ``patch`` (docs/authoring.md "Patch points"): taken by a run reaching it under this
        code, not by a replay through a stretch the history recorded without it."""
        return self._journal.patched(patch)

    def call_tool(self, tool: str, args: Mapping[str, Any], *, name: str | None = None,
                  approval_id: str | None = None, raises: bool = False) -> ToolCall:
        """Call ledger tool ``tool`` with ``args``; the result is its receipt. ``name`` says what the call is
        for, unique in the run: its logical action (None: ``<await index>:<tool>``); ``approval_id`` the
        approval it needs. A call the far side refused leaves the run NEEDS_ATTENTION for an operator to
        retry it, or, with ``raises``, raises ``ToolFailed`` here. The low-level await integrations use."""
        return ToolCall(tool=tool, args=freeze(args), name=name, approval_id=approval_id, raises=raises)

    def call_tools(self, calls: Sequence[ToolCall], *, join: joins.Join = joins.ALL) -> ToolCalls:
        """Several ``call_tool`` requests at once; the result lists each one's receipt, ``ToolFailed`` or None."""
        return ToolCalls(calls=tuple(calls), join=join)

    def ask_model(self, purpose: str, payload: Mapping[str, Any] | None = None) -> ModelAsk:
        """Ask the model for ``purpose``, shown the run's resume context and ``payload`` (JSON: e.g. an agent
        framework's messages, as its ``request``); the result is its proposal (``action``, ``args``,
        ``rationale``). The low-level await integrations use; other ``payload`` on replay is a divergence."""
        return ModelAsk(purpose=purpose, payload=None if payload is None else freeze(payload))

    def wait_event(self, kind: str, correlation_key: str, *, fact: str, timeout: float,
                   provider: str | None = None) -> EventWait:
        """Wait for the webhook event keyed ``correlation_key`` that records fact ``fact``; its value is the
        result. Raises ``WaitTimedOut`` after ``timeout`` seconds."""
        return EventWait(kind=kind, correlation_key=correlation_key, fact=fact, timeout=timeout, provider=provider)

    def approval(self, approval_id: str, *, owner: str, approved_hash: str, summary: str, timeout: float,
                 invalidated_by: str | None = None, invalidated_fact: str | None = None,
                 **options: Any) -> ApprovalWait:
        """Wait for ``owner``'s decision on the request hashed ``approved_hash`` (``request_hash``); the
        result is the decision (``approved``, ``decided_by``). An event keyed ``invalidated_by`` voids the
        request: ``ApprovalVoided`` is raised, carrying the fact ``invalidated_fact`` it recorded.
        ``options``: ``WaitForUser``'s others (``provider``, ``remind_after``, ``valid_for``...)."""
        return ApprovalWait(approval_id=approval_id, owner=owner, approved_hash=approved_hash, summary=summary,
                            timeout=timeout, invalidated_by=invalidated_by, invalidated_fact=invalidated_fact,
                            options=options)

    def ask(self, question_id: str, text: str, *, answer_schema: Mapping[str, Any], timeout: float,
            owner: str | None = None) -> QuestionWait:
        """Ask a person; the result is the answer, valid against ``answer_schema``."""
        return QuestionWait(question_id=question_id, text=text, answer_schema=freeze(answer_schema),
                            timeout=timeout, owner=owner)

    def wait_signal(self, name: str, *, timeout: float) -> SignalWait:
        """Wait for the next signal ``name`` sent to the run; the result is its payload."""
        return SignalWait(name=name, timeout=timeout)

    def sleep(self, seconds: float) -> Sleep:
        """A durable timer: the run parks, holding nothing, and resumes after ``seconds``."""
        return Sleep(seconds=seconds)

    def start_children(self, children: Sequence[Child]) -> ChildrenStart:
        """Start child runs; the result is their run ids."""
        return ChildrenStart(children=tuple(children))

    def wait_children(self, names: Sequence[str], *, timeout: float, until: str | int = "all") -> ChildrenWait:
        """Wait until ``until`` of the children ``names`` ended; the result maps each name to its outcome."""
        return ChildrenWait(names=tuple(names), timeout=timeout, until=until)
