"""Webhook intake: verify, deduplicate by the provider's event id, match to a waiting run.

Each provider declares how it signs a delivery (``Signature``) and with it how a captured request
is kept from being sent again: a provider that signs the time of sending has a delivery outside the
replay window refused; for the others, whose signatures never run out, the delivery's id is kept
for as long as they are accepted (``webhook_deliveries``, beyond the inbox's horizon).
A verified event is stored once (the gateway inbox absorbs redeliveries, so the same
webhook three times makes one transition). Correlation keys are the provider's: a wait declares
the provider whose event ends it (``Wait.provider``), and an event matches only a wait of its
provider. When a run waits on the event's provider and key, the event's fact and the wake are
appended to that run in the same transaction; otherwise the event is kept and matched the moment
such a wait starts (until ``LONGRUN_RETAIN_UNMATCHED_WEBHOOK_EVENTS`` runs out).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import SpanKind

from longrun import logs, metrics, otel
from longrun.app import effects
from longrun.domain import AWAITING_ANSWER, RunStatus, WakeReason, freeze
from longrun.domain import events as ev
from longrun.ports import inbox
from longrun.ports.runs import StoredRun
from longrun.ports.webhooks import Provider, Signature, Translated
from longrun_client.storable import unstorable

if TYPE_CHECKING:
    from longrun.ports.stores import RunTransaction

PRODUCER = "gateway"
MAX_EVENT_ID = 200
MAX_CORRELATION_KEY = 500
"""Characters. Both are index keys, and a btree entry holds at most 2704 bytes (a character takes up to 4)."""


def refusal(signature: Signature, secret: str, headers: Mapping[str, str], body: bytes, *, now: float,
            replay_window: float) -> str | None:
    """Why a delivery is refused, or None when it is genuine and, for a timestamped provider, fresh.
    ``headers`` looks names up without regard to case (as an HTTP request's do)."""
    signed = body
    sent_at: float | None = None
    if signature.timestamp_header is not None:
        stamp = headers.get(signature.timestamp_header)
        if stamp is None:
            return f"missing {signature.timestamp_header} header"
        try:
            sent_at = float(stamp)
        except ValueError:
            return f"{signature.timestamp_header} is not Unix seconds: {stamp[:40]!r}"
        signed = stamp.encode() + b"." + body
    expected = signature.prefix + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    given = headers.get(signature.header)
    if given is None or not given.isascii() or not hmac.compare_digest(expected, given):
        return "bad or missing signature"
    if sent_at is not None and now - sent_at > replay_window:
        return f"sent {now - sent_at:.0f}s ago, outside the {replay_window:g}s replay window"
    if sent_at is not None and sent_at - now > replay_window:
        return (f"stamped {sent_at - now:.0f}s ahead of the gateway's clock, outside the {replay_window:g}s "
                "replay window")
    return None


async def receive(tx: RunTransaction, provider: str, payload: dict[str, Any], *, providers: Mapping[str, Provider],
                  clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """Store and match one verified event; a repeat returns the first outcome and changes nothing."""
    return await intake(tx, provider, bounded(providers[provider].translate(payload)), payload, clock=clock,
                        stamped=providers[provider].signature.timestamp_header is not None)


def bounded(event: Translated) -> Translated:
    """``event`` if its id and correlation key fit the indexes that hold them, else ``ValueError``."""
    for what, value, limit in (("event id", event.event_id, MAX_EVENT_ID),
                               ("correlation key", event.correlation_key, MAX_CORRELATION_KEY)):
        if len(value) > limit:
            raise ValueError(f"{what} of {len(value)} characters; at most {limit} are accepted")
    return event


async def intake(tx: RunTransaction, provider: str, event: Translated, payload: Mapping[str, Any], *,
                 clock: Callable[[], float] = time.time, stamped: bool = False) -> dict[str, Any]:
    """``receive`` of an event already translated. The delivery id of a provider that signs the body
    alone (not ``stamped``) is kept for good: its signature never runs out, so a captured delivery
    sent again after the inbox forgot it is still a repeat, answered as one and matched to nothing."""
    message_id = f"webhook:{provider}:{event.event_id}"
    claim = await tx.claim("gateway", message_id, f"webhook.{provider}")
    if isinstance(claim, inbox.Duplicate):
        metrics.DUPLICATES.labels("gateway").inc()
        return {**claim.outcome, "duplicate": True}
    outcome = {"event_id": event.event_id, "correlation_key": event.correlation_key, "matched_run_id": None}
    if not await tx.keep(provider, event, payload, remember=not stamped):
        metrics.DUPLICATES.labels("gateway").inc()
        await tx.record_outcome("gateway", message_id, outcome)
        return {**outcome, "duplicate": True}
    outcome["matched_run_id"] = await _match(tx, provider, event, clock)
    await tx.record_outcome("gateway", message_id, outcome)
    return outcome


async def _match(tx: RunTransaction, provider: str, event: Translated, clock: Callable[[], float]) -> str | None:
    run_id = await tx.waiting_on(provider, event.correlation_key)
    if run_id is None:
        return None
    stored = await tx.load(run_id, lock=True)
    wait = None if stored is None else stored.snapshot.wait
    if stored is None or wait is None or (wait.provider, wait.correlation_key) != (provider, event.correlation_key):
        return None
    with logs.bound(run_id, stored.snapshot.tenant_id), otel.run_span(
            f"webhook {provider}", stored.trace_root, kind=SpanKind.SERVER, attributes={
                "longrun.run_id": run_id, "longrun.tenant": stored.snapshot.tenant_id,
                "longrun.webhook.provider": provider, "longrun.webhook.event_id": event.event_id,
                "longrun.correlation_key": event.correlation_key}):
        await deliver(tx, stored, provider, event, clock)
    return run_id


async def deliver(tx: RunTransaction, stored: StoredRun, provider: str, event: Translated,
                  clock: Callable[[], float]) -> StoredRun:
    """Append the event's fact and the wake, mark the event matched, and wake a worker."""
    wait = stored.snapshot.wait
    assert wait is not None
    now = clock()
    after = await tx.append(stored, [
        ev.FactRecorded(seq=stored.seq(1), at=now, key=event.fact_key, value=freeze(event.fact),
                        source=f"webhook:{provider}"),
        ev.RunWoken(seq=stored.seq(2), at=now, wait_id=wait.wait_id, reason=WakeReason.EVENT,
                    correlation_key=event.correlation_key),
    ])
    await tx.matched(provider, event.event_id, stored.snapshot.run_id)
    cause = f"webhook:{provider}:{event.event_id}"
    broadcast = effects.broadcast_message(stored.snapshot, after, producer=PRODUCER, cause=cause)
    wakeup = (effects.wake_message(after, reason=f"webhook {provider}:{event.event_id}", producer=PRODUCER, cause=cause)
              if after.snapshot.status is RunStatus.READY else None)
    await tx.send([m for m in (broadcast, wakeup) if m is not None])
    return after


async def match_kept(tx: RunTransaction, stored: StoredRun, *, clock: Callable[[], float] = time.time) -> StoredRun:
    """Called when a wait starts: an event for its key that arrived earlier ends it now."""
    wait = stored.snapshot.wait
    if stored.snapshot.status not in AWAITING_ANSWER or wait is None or wait.correlation_key is None or \
            wait.provider is None:
        return stored
    event = await tx.kept_for(wait.provider, wait.correlation_key)
    if event is None:
        return stored
    return await deliver(tx, stored, wait.provider, event, clock)


def parse(body: bytes) -> dict[str, Any]:
    """A delivery's JSON object; ``ValueError`` naming what is wrong with anything else, including
    NaN and Infinity (not JSON), nesting past the parser's limit and text PostgreSQL cannot store."""
    try:
        data = json.loads(body, parse_constant=_not_json)
    except RecursionError as e:
        raise ValueError("webhook body is nested deeper than the parser's recursion limit") from e
    if not isinstance(data, dict):
        raise ValueError("webhook body is not a JSON object")
    where = unstorable(data)
    if where is not None:
        raise ValueError(f"the text at {where} holds U+0000 or a lone surrogate, which cannot be stored")
    return data


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON value")
