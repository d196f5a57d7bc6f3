"""Apply Alembic migrations: ``python -m longrun.db.migrate [upgrade|downgrade REV|create-database]``.

Migrations are append-only and numbered; the migrated database must equal
``longrun.db.schema.metadata`` (a test checks it). The job logs what it did (``longrun.logs``, as
the services do): the database it created, each migration applied, the revision before and after.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from longrun import logs
from longrun.config import Settings
from longrun.errors import ConfigError

logger = logging.getLogger("longrun.db.migrate")

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


def current_revision(url: str) -> str | None:
    """The revision the database is at (None: never migrated)."""
    engine = create_engine(make_url(url).set(drivername="postgresql+psycopg"))
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def create_database(url: str) -> bool:
    """Create the database named in ``url`` if it does not exist (fresh machines); True if it did."""
    target = make_url(url)
    admin = create_engine(target.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"),
                              {"n": target.database}).first()
        if not exists:
            conn.execute(text(f'CREATE DATABASE "{target.database}"'))
    admin.dispose()
    if not exists:
        logger.info("created database %s", target.database)
    return not exists


def main() -> None:
    try:
        settings = Settings.from_env()
    except ConfigError as e:
        print(f"migrate: {e}", file=sys.stderr)
        raise SystemExit(2) from e
    logs.setup("migrate", level=settings.log_level, format=settings.log_format)
    url = settings.database_url
    args = sys.argv[1:] or ["upgrade"]
    if args[0] == "create-database":
        create_database(url)
        return
    if args[0] == "upgrade":
        create_database(url)
        before = current_revision(url)
        upgrade(url, args[1] if len(args) > 1 else "head")
    elif args[0] == "downgrade" and len(args) == 2:
        before = current_revision(url)
        downgrade(url, args[1])
    else:
        raise SystemExit("usage: python -m longrun.db.migrate [upgrade [REV] | downgrade REV | create-database]")
    after = current_revision(url)
    if after == before:
        logger.info("database %s already at revision %s; nothing to do", make_url(url).database, after)
    else:
        logger.info("database %s migrated from revision %s to %s", make_url(url).database, before or "(none)", after)


if __name__ == "__main__":
    main()
