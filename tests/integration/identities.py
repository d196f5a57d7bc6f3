"""Operators' named tokens for tests: minted in PostgreSQL as ``longrunctl token create`` would."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.db import tokens

_minted: dict[tuple[str, tuple[str, ...], tuple[str, ...] | None, tuple[str, ...]], str] = {}
"""The secret last minted for each name, roles, tenants and permissions: a test asking again gets the
same token, as a live token's name belongs to one holder."""


async def token(engine: AsyncEngine, name: str, *roles: str, tenants: tuple[str, ...] | None = None,
                permissions: tuple[str, ...] = ()) -> str:
    """The secret of a live token naming ``name`` (default role: approver, unless it holds permissions;
    every tenant by default): the one minted before for the same roles, tenants and permissions, else a
    new one, replacing (revoking) any other live token of that name."""
    key = (name, roles or (() if permissions else ("approver",)), tenants, permissions)
    async with engine.begin() as conn:
        known = _minted.get(key)
        if known is not None and await tokens.find(conn, known) is not None:
            return known
        for live in await tokens.listing(conn, include_revoked=False):
            if live.name == name:
                await tokens.revoke(conn, live.id)
        _, secret = await tokens.create(conn, name=name, roles=key[1], tenants=tenants, created_by="tests",
                                        permissions=permissions)
    _minted[key] = secret
    return secret


async def bearer(engine: AsyncEngine, name: str, *roles: str, tenants: tuple[str, ...] | None = None,
                 permissions: tuple[str, ...] = ()) -> dict[str, str]:
    """Authorization headers acting as ``name``."""
    return {"authorization": f"Bearer {await token(engine, name, *roles, tenants=tenants, permissions=permissions)}"}
