"""The operator API's shared vocabulary: the text it accepts, the statuses and roles it names, and the
base of its models, which refuses a field it does not name."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from longrun.domain import RunStatus
from longrun.principals import PERMISSIONS, ROLES

Text = Annotated[str, Field(pattern=r"^[^\x00]*$")]
Reason = Annotated[str, Field(min_length=1, pattern=r"^[^\x00]*$",
                              description="Why, for the audit log; required for every operator action.")]
RUN_STATUS = Literal[tuple(s.value for s in RunStatus)]  # type: ignore[valid-type]
Role = Literal[ROLES]  # type: ignore[valid-type]
Permission = Literal[PERMISSIONS]  # type: ignore[valid-type]
DURATION = "seconds, or a number with s, m, h or d: 90s, 15m, 12h, 30d"
TOKEN_NAME = r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,199}$"
"""A token's name is who acts with it: letters, digits, ``.``, ``_``, ``@``, ``-`` (no ``:``, which
marks an approval's owner as a role or group)."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Query(Strict):
    """Query parameters: one not named is refused (a misspelt filter would otherwise widen a search)."""
