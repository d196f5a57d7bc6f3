"""Operators' named tokens for tests: minted in PostgreSQL as ``longrunctl token create`` would."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.db import tokens


async def token(engine: AsyncEngine, name: str, *roles: str, tenants: tuple[str, ...] | None = None) -> str:
    """The secret of a new token naming ``name`` (default role: approver; every tenant by default)."""
    async with engine.begin() as conn:
        _, secret = await tokens.create(conn, name=name, roles=roles or ("approver",), tenants=tenants,
                                        created_by="tests")
    return secret


async def bearer(engine: AsyncEngine, name: str, *roles: str, tenants: tuple[str, ...] | None = None) -> dict[str, str]:
    """Authorization headers acting as ``name``."""
    return {"authorization": f"Bearer {await token(engine, name, *roles, tenants=tenants)}"}
