"""What the operator API names that a client of it needs too: its roles.

Roles are ordered, each allowing what the ones before it allow (``longrun.principals`` says what each
may do); ``longrunctl token create --role`` offers them.
"""

from __future__ import annotations

ROLES = ("viewer", "operator", "approver", "admin")
"""From least to most: each role allows what the roles before it allow."""
