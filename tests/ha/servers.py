"""What the replicated rows' fixtures share: servers of a test's own, started under a fresh
directory and always stopped, and this session's database and vhost placed on them."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

from tests.infra import Infra, find_infra


class Servers(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


S = TypeVar("S", bound=Servers)


@contextmanager
def of_the_test(make: Callable[[Path], S], *, available: Callable[[], str | None], prefix: str) -> Iterator[S]:
    """``make(directory)`` started, skipped with the reason ``available`` gives when it cannot be.
    The directory is not under pytest's: those are private to root, and the servers may run as
    another user."""
    why = available()
    if why:
        pytest.skip(why)
    servers = make(Path(tempfile.mkdtemp(prefix=prefix)))
    try:
        servers.start()
        yield servers
    finally:
        servers.stop()


@contextmanager
def session_on(**where: Any) -> Iterator[Infra]:
    """This session's infrastructure with ``where`` replaced (an address and the restart tool that
    does not apply to it), its database migrated and its vhost of its own."""
    found = find_infra()
    if isinstance(found, str):
        pytest.exit(found, returncode=3)
    with replace(found, **where).session(f"lrha_{uuid.uuid4().hex[:10]}") as ready:
        yield ready
