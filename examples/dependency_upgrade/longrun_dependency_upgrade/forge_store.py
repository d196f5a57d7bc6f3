"""The forge's state in SQLite: its objects (branches, commits, CI runs, merge requests), the
response each idempotency key was answered with, and its settings (faults, webhook, CI scripts,
fencing tokens). A restarted forge opened on the same file still knows what it created."""

from __future__ import annotations

import json
import sqlite3
from typing import Any, NamedTuple

SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL, repo TEXT NOT NULL, ref TEXT NOT NULL,
    -- not unique by itself: idempotency.key is, and /_control/effects counts these rows to show it
    idempotency_key TEXT NOT NULL,
    body TEXT NOT NULL,
    UNIQUE (kind, repo, ref)
);
CREATE TABLE IF NOT EXISTS idempotency (
    key TEXT PRIMARY KEY, request_hash TEXT NOT NULL, response TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def public(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if not k.startswith("_")}


class Store:
    """The forge's SQLite state; each method is one transaction on the server's loop."""

    def __init__(self, path: str) -> None:
        # Created by whoever builds the app, used from the thread uvicorn serves on.
        self._db = sqlite3.connect(path, check_same_thread=False)
        self._db.executescript(SCHEMA)

    def get(self, kind: str, repo: str, ref: str) -> dict[str, Any] | None:
        row = self._db.execute(
            "SELECT body FROM objects WHERE kind = ? AND repo = ? AND ref = ?", (kind, repo, ref)
        ).fetchone()
        return json.loads(row[0]) if row else None

    def count(self, kind: str, repo: str | None = None, **fields: str) -> int:
        sql, params = "SELECT count(*) FROM objects WHERE kind = ?", [kind]
        if repo is not None:
            sql, params = sql + " AND repo = ?", [*params, repo]
        for name, value in fields.items():
            sql, params = sql + " AND json_extract(body, ?) = ?", [*params, f"$.{name}", value]
        return self._db.execute(sql, params).fetchone()[0]

    def create(self, created: Created, key: str, request_hash: str) -> None:
        repo = created.obj["repo"]
        with self._db:
            self._db.execute(
                "INSERT INTO objects (kind, repo, ref, idempotency_key, body) VALUES (?, ?, ?, ?, ?)",
                (created.kind, repo, created.ref, key, json.dumps(created.obj)),
            )
            self._db.execute(
                "INSERT INTO idempotency VALUES (?, ?, ?)",
                (key, request_hash, json.dumps(public(created.obj))),
            )
            for kind, ref, obj in created.updates:
                self._update(kind, repo, ref, obj)

    def update(self, kind: str, repo: str, ref: str, obj: dict[str, Any]) -> None:
        with self._db:
            self._update(kind, repo, ref, obj)

    def _update(self, kind: str, repo: str, ref: str, obj: dict[str, Any]) -> None:
        self._db.execute(
            "UPDATE objects SET body = ? WHERE kind = ? AND repo = ? AND ref = ?",
            (json.dumps(obj), kind, repo, ref),
        )

    def recorded(self, key: str) -> tuple[str, dict[str, Any]] | None:
        row = self._db.execute(
            "SELECT request_hash, response FROM idempotency WHERE key = ?", (key,)
        ).fetchone()
        return (row[0], json.loads(row[1])) if row else None

    def by_key(self, key: str) -> tuple[str, dict[str, Any]] | None:
        row = self._db.execute(
            "SELECT kind, body FROM objects WHERE idempotency_key = ? ORDER BY seq LIMIT 1", (key,)
        ).fetchone()
        return (row[0], public(json.loads(row[1]))) if row else None

    def running_runs(self) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT body FROM objects WHERE kind = 'ci_run'"
            " AND json_extract(body, '$.status') = 'running'"
        )
        return [json.loads(body) for (body,) in rows]

    def effects(self) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT kind, idempotency_key, count(*) FROM objects"
            " GROUP BY kind, idempotency_key ORDER BY min(seq)"
        )
        return [{"kind": k, "idempotency_key": key, "count": n} for k, key, n in rows]

    def setting(self, name: str, default: Any = None) -> Any:
        row = self._db.execute("SELECT value FROM settings WHERE name = ?", (name,)).fetchone()
        return json.loads(row[0]) if row else default

    def put_setting(self, name: str, value: Any) -> None:
        with self._db:
            self._db.execute("INSERT OR REPLACE INTO settings VALUES (?, ?)", (name, json.dumps(value)))

    def drop_setting(self, name: str) -> None:
        with self._db:
            self._db.execute("DELETE FROM settings WHERE name = ?", (name,))

    def reset(self) -> None:
        with self._db:
            self._db.execute("DELETE FROM objects")
            self._db.execute("DELETE FROM idempotency")
            self._db.execute("DELETE FROM settings")

    def close(self) -> None:
        self._db.close()


class Created(NamedTuple):
    kind: str
    ref: str
    obj: dict[str, Any]
    updates: tuple[tuple[str, str, dict[str, Any]], ...] = ()
