"""Stand-in for ``longrun.identity`` until it lands: the operator tokens of LONGRUN_OPERATOR_TOKENS,
each an admin of every tenant."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.config import Settings

ROLES = ("viewer", "operator", "approver", "admin")


@dataclass(frozen=True, slots=True)
class Principal:
    subject: str
    roles: frozenset[str]
    tenants: frozenset[str] | None
    groups: frozenset[str] = frozenset()

    def may(self, role: str) -> bool:
        return "admin" in self.roles or role in self.roles

    def sees(self, tenant: str) -> bool:
        return self.tenants is None or tenant in self.tenants


class Authenticator:
    def __init__(self, engine: AsyncEngine, settings: Settings) -> None:
        self.settings = settings

    async def from_bearer(self, token: str) -> Principal | None:
        if not any(hmac.compare_digest(token, t) for t in self.settings.operator_tokens):
            return None
        return Principal("user_42", frozenset({"admin"}), None)
