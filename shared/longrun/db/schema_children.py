"""The table of child runs (``domain.children``): which run started which, under what name, and what
cancelling the parent does to it. On the one MetaData (``schema_base``)."""

from __future__ import annotations

from sqlalchemy import CheckConstraint, Column, DateTime, ForeignKey, Index, Table, Text, UniqueConstraint, func

from longrun.db.schema_base import metadata

children = Table(
    "children", metadata,
    Column("child_run_id", Text, ForeignKey("runs.run_id"), primary_key=True),
    Column("parent_run_id", Text, ForeignKey("runs.run_id"), nullable=False),
    Column("name", Text, nullable=False),
    Column("on_parent_cancel", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    UniqueConstraint("parent_run_id", "name"),
    CheckConstraint("on_parent_cancel IN ('cancel', 'abandon')", name="on_parent_cancel_known"),
    Index("ix_children_parent", "parent_run_id"),
)
"""One row per child run, written with the child's creation in its parent's step: a child that finishes
reaches its parent through a ``child_ended`` timer its finishing statement writes from this row."""
