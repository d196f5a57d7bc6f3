"""A slot handed on in the statement that frees it (``ports.runs.Handover``): the CTEs a transition
statement (``db.runs``) adds when its run finishes, or parks in a wait that holds no slot, and the
handover's parameters. The tenant's best queued run is admitted and its wakeup kept as data in the
outbox; admission is notified when nobody could take the slot, or a concurrency key was given back."""

from __future__ import annotations

from typing import Any

from longrun.bus.wakeup import TYPE as WAKEUP
from longrun.db import admission, jsonb, keys, outbox
from longrun.ports.runs import Handover

FINISHED_FREES = "SELECT 1 FROM moved WHERE moved.admitted_at IS NOT NULL"
# RETURNING shows the row as updated (admitted_at cleared): whether the run held a slot is read from
# the row as the statement found it (every part of one statement reads the same snapshot). Only a
# worker holding the run parks it, and admission changes admitted_at of queued runs alone.
PARKED_FREES = ("SELECT 1 FROM moved JOIN runs AS was ON was.run_id = moved.run_id "
                "WHERE was.admitted_at IS NOT NULL")


def ctes(freed: str) -> list[str]:
    """``Handover``'s CTEs: only if the run that moved was admitted (``freed``: a query of one row if
    it was); the chosen run's wakeup is kept as data (``bus.wakeup``): the handover's wake with that
    run, its revision, a fresh id and the time. A run that ends holding a concurrency key hands the key
    on with its slot (``keys.hands_on``)."""
    chosen = admission.best_queued(tenant=":h_tenant", aging="CAST(:h_aging AS float8)", limit="1",
                                   ended_key=keys.ENDED_KEY)
    wakeup = (
        "(SELECT jsonb_build_object("
        "  'payload', CAST(:h_wake AS jsonb) || jsonb_build_object('event_id', CAST(gen_random_uuid() AS text), "
        "     'occurred_at', now(), 'run_id', handed.run_id, 'revision', handed.revision), "
        f"  'type', '{WAKEUP}', 'exchange', CAST(:h_exchange AS text), 'partition', handed.partition, "
        "  'routing_key', CAST(:h_routes AS jsonb) -> CAST(handed.partition AS text)) AS row, 1 AS n FROM handed) AS r")
    return [
        f"freed AS ({freed})",
        f"handed AS (UPDATE runs SET admitted_at = now(), {admission.TAKES_KEY} WHERE run_id IN ({chosen}) "
        f"AND EXISTS (SELECT 1 FROM freed) AND {keys.hands_on('runs')} "
        f"AND {admission.hands_on(':h_tenant', ':h_slots')} RETURNING run_id, partition, revision)",
        f"woken AS ({outbox.insert_sql(wakeup)})",
        # Admission is woken for a slot no queued run took, and for a key given back (it may let a queued
        # run start that this statement could not hand a slot to).
        "unfilled AS (SELECT pg_notify(:h_channel, :h_tenant) FROM moved WHERE (EXISTS (SELECT 1 FROM freed) "
        f"AND NOT EXISTS (SELECT 1 FROM handed)) OR {keys.GAVE_BACK})"]


def params(handover: Handover) -> dict[str, Any]:
    """The parameters of ``ctes``."""
    return {"h_tenant": handover.tenant_id, "h_slots": handover.slots, "h_aging": handover.aging_seconds,
            "h_channel": handover.channel, "h_wake": jsonb.dumps(handover.wake), "h_exchange": handover.exchange,
            "h_routes": jsonb.dumps({str(k): key for k, key in handover.routes.items()})}
