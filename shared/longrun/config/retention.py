"""Retention: how long each kind of row is kept, and the passes that prune and archive."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from longrun.config import parse
from longrun.config.declaration import Concern, Problem, setting


@dataclass(frozen=True)
class RetentionSettings(Concern):
    """Retention: horizons, pruning and archiving"""

    retention_interval: float = setting("LONGRUN_RETENTION_INTERVAL", parse.positive_float, "seconds, a number > 0",
                                        "600")
    """Seconds between the reconciler's retention passes (pruning by the horizons below, archiving
    finished runs, the artifact orphan sweep)."""
    retention_batch: int = setting("LONGRUN_RETENTION_BATCH", parse.positive_int, "an integer >= 1", "1000")
    """Rows one retention statement deletes at most: each delete is short and locks only its rows."""
    archive_batch: int = setting("LONGRUN_ARCHIVE_BATCH", parse.positive_int, "an integer >= 1", "100")
    """Finished runs archived (and their events and actions pruned) per transaction."""
    retain_outbox: float = setting("LONGRUN_RETAIN_OUTBOX", parse.duration, parse.DURATION, "7d")
    """How long a published outbox row is kept after it was published."""
    retain_inbox: float = setting("LONGRUN_RETAIN_INBOX", parse.duration, parse.DURATION, "30d")
    """How long an inbox row (a handled message's id and outcome) is kept after handling; it must be
    longer than ``LONGRUN_QUARANTINE_REPLAY_WINDOW``, so a replay within the window meets its inbox row."""
    quarantine_replay_window: float = setting("LONGRUN_QUARANTINE_REPLAY_WINDOW", parse.duration, parse.DURATION,
                                              "14d")
    """How old a quarantined message may be (since it was sent) for its replay to rely on the inbox;
    an older one is checked first against what outlives the inbox (the run's creating key, the run's
    state) and is not sent again when its effect is already there."""
    retain_timers: float = setting("LONGRUN_RETAIN_TIMERS", parse.duration, parse.DURATION, "7d")
    """How long a fired or cancelled timer is kept after it fired or was cancelled (an open timer of an
    archived run goes with it)."""
    retain_webhook_events: float = setting("LONGRUN_RETAIN_WEBHOOK_EVENTS", parse.duration, parse.DURATION, "30d")
    """How long a webhook event matched to a run is kept after it was matched."""
    retain_unmatched_webhook_events: float = setting("LONGRUN_RETAIN_UNMATCHED_WEBHOOK_EVENTS", parse.duration,
                                                     parse.DURATION, "7d")
    """How long a webhook event no wait has matched is kept for a wait to start on its key; then it
    expires (the retention pass deletes it) and no later wait is ended by it. Its delivery id stays
    (``webhook_deliveries``), so the same delivery sent again is not taken as new."""
    retain_delivery_failures: float = setting("LONGRUN_RETAIN_DELIVERY_FAILURES", parse.duration, parse.DURATION,
                                              "30d")
    """How long a message's count of failed deliveries is kept after its last failure."""
    retain_replayed_quarantine: float = setting("LONGRUN_RETAIN_REPLAYED_QUARANTINE", parse.duration,
                                                parse.DURATION, "30d")
    """How long a quarantine entry is kept after it was replayed (unreplayed entries stay)."""
    retain_dead_members: float = setting("LONGRUN_RETAIN_DEAD_MEMBERS", parse.duration, parse.DURATION, "1d")
    """How long a service member's row is kept after its last heartbeat ran out."""
    retain_audit: float = setting("LONGRUN_RETAIN_AUDIT", parse.duration, parse.DURATION, "365d")
    """How long an audit row is kept."""
    retain_finished_runs: float = setting("LONGRUN_RETAIN_FINISHED_RUNS", parse.duration, parse.DURATION, "30d")
    """How long a finished run keeps its events and actions after its last change; then they are
    archived (JSON Lines in the artifact store) and pruned, and the run row stays as a tombstone."""
    artifact_orphan_grace: float = setting("LONGRUN_ARTIFACT_ORPHAN_GRACE", parse.duration, parse.DURATION, "1h")
    """Age after which a stored artifact that no row references is deleted by the orphan sweep: longer
    than any transaction that uploads an artifact and then registers it."""

    @staticmethod
    def conflicts(values: Mapping[str, Any]) -> list[Problem]:
        if values["retain_inbox"] <= values["quarantine_replay_window"]:
            return [("LONGRUN_RETAIN_INBOX", f"got {values['retain_inbox']:.15g} s; expected more than "
                     f"LONGRUN_QUARANTINE_REPLAY_WINDOW ({values['quarantine_replay_window']:.15g} s): a replay "
                     "within the window must still find the inbox row of a message handled before")]
        return []
