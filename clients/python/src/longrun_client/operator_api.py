"""What the operator API names that a client of it needs too: its roles and its permissions.

Roles are ordered, each allowing what the ones before it allow (``longrun.principals`` says what each
may do); ``longrunctl token create --role`` offers them. Permissions stand beside the roles, outside
their order: no role implies one, and holding one implies no role (``--permission``).
"""

from __future__ import annotations

ROLES = ("viewer", "operator", "approver", "admin")
"""From least to most: each role allows what the roles before it allow."""
CREATE_RUNS = "create_runs"
"""May create runs (``POST /runs``) in the tenants the principal sees: a producer's grant, which an
operator's roles do not carry, so steering runs never lets one start them, nor the other way round."""
PERMISSIONS = (CREATE_RUNS,)
"""Grants beside the roles, each on its own."""
