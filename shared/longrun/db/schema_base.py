"""The one MetaData every table is defined on, its naming convention, and how names from the domain's
enums are written into SQL text (statuses are rendered from the enums, never retyped)."""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

from sqlalchemy import Column, DateTime, MetaData, func

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)



def sql_name(value: str | Enum) -> str:
    """A name (a status, a kind) as an SQL string literal: ``'READY'``. Statuses in SQL text are
    rendered from the domain's enums and sets, never retyped."""
    name = value.value if isinstance(value, Enum) else value
    if not isinstance(name, str) or "'" in name or "\\" in name:
        raise ValueError(f"not a plain name: {name!r}")
    return f"'{name}'"


def sql_names(values: Iterable[str | Enum]) -> str:
    """Names as an SQL list of literals, in the order given: ``'WAITING_EVENT', 'WAITING_USER'``."""
    return ", ".join(sql_name(v) for v in values)


def one_of(column: str, values: Iterable[str | Enum]) -> str:
    return f"{column} IN ({sql_names(values)})"


def created_at() -> Column[object]:
    return Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now())


