"""Who acts, as the use cases see them: a ``Principal`` (a subject, its roles, the tenants it sees,
its groups) and the roles' order. ``longrun.identity`` makes one from a request's bearer token.

Roles are ordered, each allowing what the ones before it allow: a **viewer** reads runs, the audit
log, alerts and versions; an **operator** also acts on runs (cancel, pause, resume, terminate,
resolve, migrate, attach) and replays quarantined messages; an **approver** also approves, denies
and answers; an **admin** also manages tokens and tenant policies. Approving is one role higher than
steering because it lets a run act on the outside world with a person's consent.

Permissions stand beside the roles (``longrun_client.operator_api.PERMISSIONS``): ``create_runs`` lets a
producer create runs in the tenants it sees, and no role, admin included, carries it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from longrun_client.operator_api import PERMISSIONS, ROLES

EVERY_TENANT = "*"
"""In a token's tenants claim: the principal sees every tenant."""
ROLE_PREFIX = "role:"
GROUP_PREFIX = "group:"
"""An approval's owner is a subject, ``role:<role>`` (any principal whose roles include it) or
``group:<group>`` (any principal in that group)."""
BOOTSTRAP_SUBJECT = "bootstrap"
OIDC_SEPARATOR = "|"
"""An identity provider's user is the subject ``<issuer>|<sub>``: namespaced by its issuer, so no named
token (whose names hold no ``|``) and no other issuer's user is ever the same subject. A bare name
(``alice``) is the named token of that name."""


@dataclass(frozen=True, slots=True)
class Principal:
    subject: str
    roles: frozenset[str]
    tenants: frozenset[str] | None
    """None: every tenant."""
    groups: frozenset[str] = field(default_factory=frozenset)
    credential: str = ""
    """What vouched for the principal, recorded with its decisions: ``token:<id>`` (a named token),
    ``oidc:<issuer>`` or ``bootstrap``; empty for one made in code rather than from a request."""
    permissions: frozenset[str] = field(default_factory=frozenset)
    """Grants beside the roles (``PERMISSIONS``): held or not, never implied by a role."""

    def may(self, role: str) -> bool:
        """Whether the principal holds ``role`` or a role above it."""
        rank = ROLES.index(role)
        return any(r in ROLES and ROLES.index(r) >= rank for r in self.roles)

    def holds(self, permission: str) -> bool:
        return permission in PERMISSIONS and permission in self.permissions

    def sees(self, tenant: str) -> bool:
        return self.tenants is None or tenant in self.tenants

    def is_owner(self, owner: str | None) -> bool:
        """Whether the principal is who an approval or question names as its owner (None: anyone
        who may approve)."""
        if owner is None:
            return True
        if owner.startswith(ROLE_PREFIX):
            role = owner.removeprefix(ROLE_PREFIX)
            return role in ROLES and self.may(role)
        if owner.startswith(GROUP_PREFIX):
            return owner.removeprefix(GROUP_PREFIX) in self.groups
        return owner == self.subject


BOOTSTRAP = Principal(BOOTSTRAP_SUBJECT, frozenset({"admin"}), None, credential=BOOTSTRAP_SUBJECT)


def from_claims(claims: Mapping[str, Any], *, roles_claim: str, tenants_claim: str,
                groups_claim: str) -> Principal:
    """The principal a verified JWT names: its roles claim carries its roles and its permissions
    (names it does not know are ignored), and a token without a tenants claim sees no tenant."""
    tenants = _names(claims.get(tenants_claim))
    granted = frozenset(_names(claims.get(roles_claim)))
    return Principal(subject=oidc_subject(str(claims.get("iss")), str(claims["sub"])), roles=granted & set(ROLES),
                     tenants=None if EVERY_TENANT in tenants else frozenset(tenants),
                     groups=frozenset(_names(claims.get(groups_claim))), credential=f"oidc:{claims.get('iss')}",
                     permissions=granted & set(PERMISSIONS))


def oidc_subject(issuer: str, sub: str) -> str:
    """The subject of ``issuer``'s user ``sub``: what an approval names to be decided by that user."""
    return f"{issuer}{OIDC_SEPARATOR}{sub}"


def _names(value: Any) -> list[str]:
    """A claim holding names: a list of them, or one string of them separated by spaces."""
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []
