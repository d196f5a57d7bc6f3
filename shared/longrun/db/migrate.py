"""Apply Alembic migrations: ``python -m longrun.db.migrate [upgrade|downgrade REV|create-database]``.

Migrations are append-only and numbered; the migrated database must equal
``longrun.db.schema.metadata`` (a test checks it).
"""

from __future__ import annotations

import sys
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from longrun.config import Settings

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def create_database(url: str) -> None:
    """Create the database named in ``url`` if it does not exist (fresh machines)."""
    target = make_url(url)
    admin = create_engine(target.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"),
                              {"n": target.database}).first()
        if not exists:
            conn.execute(text(f'CREATE DATABASE "{target.database}"'))
    admin.dispose()


def main() -> None:
    url = Settings.from_env().database_url
    args = sys.argv[1:] or ["upgrade"]
    if args[0] == "create-database":
        create_database(url)
    elif args[0] == "upgrade":
        create_database(url)
        upgrade(url, args[1] if len(args) > 1 else "head")
    elif args[0] == "downgrade" and len(args) == 2:
        downgrade(url, args[1])
    else:
        raise SystemExit("usage: python -m longrun.db.migrate [upgrade [REV] | downgrade REV | create-database]")


if __name__ == "__main__":
    main()
