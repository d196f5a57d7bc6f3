"""An operation of the operator API: its method and path, the role or permission it needs, what it
takes and answers (``api.OPERATIONS`` lists them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from longrun.services.gateway.api_responses import Error
from longrun.services.gateway.api_types import Permission, Role


@dataclass(frozen=True, slots=True)
class Operation:
    method: Literal["GET", "POST", "PUT"]
    path: str
    name: str
    summary: str
    response: type[BaseModel] | None
    """None: the answer is bytes of the media type they were stored with."""
    errors: tuple[int, ...]
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    role: Role | None = "viewer"
    """The least role the caller needs (``longrun.identity``); None: none (``authenticated`` says whether a
    bearer token is needed at all)."""
    every_tenant: bool = False
    """Only a principal of every tenant may call it: what it shows or changes is not one tenant's."""
    raw_body: bool = False
    """The request's body is the bytes themselves, of the media type its Content-Type names."""
    permission: Permission | None = None
    """The grant beside the roles the caller needs (``longrun.principals``); with it, no role is needed."""
    any_principal: bool = False
    """Any caller with a valid bearer token may call it, whatever it holds (who am I)."""
    refusal: type[BaseModel] = Error
    """The body of its 4xx and 5xx answers."""
    idempotency_key: bool = False
    """It takes a required ``Idempotency-Key`` header, and answers 201 for what it creates, 200 for a repeat."""
    event_stream: tuple[str, ...] = ()
    """The names of the events it streams as Server-Sent Events (``text/event-stream``); empty: not a stream."""

    @property
    def authenticated(self) -> bool:
        """Whether the caller needs a bearer token."""
        return self.role is not None or self.permission is not None or self.any_principal


READ = (400, 401, 403, 503)
ACT = (400, 401, 403, 404, 409, 422, 503)
