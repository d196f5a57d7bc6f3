"""Where state lives: PostgreSQL and the artifact store."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from longrun.config import parse
from longrun.config.declaration import Concern, setting

DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/longrun"


def _database_url(raw: str) -> str:
    if urlsplit(raw).scheme not in ("postgresql", "postgresql+psycopg"):
        raise ValueError
    return raw.replace("postgresql://", "postgresql+psycopg://", 1)


@dataclass(frozen=True)
class StorageSettings(Concern):
    """Storage: PostgreSQL and the artifact store"""

    database_url: str = setting("LONGRUN_DATABASE_URL", _database_url,
                                "a postgresql:// or postgresql+psycopg:// URL", DEFAULT_DATABASE_URL, secret=True)
    """PostgreSQL URL (SQLAlchemy form, psycopg 3 driver)."""
    idle_transaction_timeout: float = setting("LONGRUN_IDLE_TRANSACTION_TIMEOUT", parse.positive_float,
                                              "seconds, a number > 0", "30")
    """Seconds PostgreSQL lets a session sit idle inside a transaction before ending it: a frozen
    process must not hold a run's row lock for everyone."""
    artifact_dir: str = setting("LONGRUN_ARTIFACT_DIR", parse.text, "a directory path", "/tmp/longrun-artifacts")
    """Root of the filesystem artifact store."""
