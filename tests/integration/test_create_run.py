"""Creating runs (app/admit.py create_run) against the real database, one request at a time."""

from __future__ import annotations

import pytest

from longrun.app import admit
from longrun.authoring import Registry
from longrun.envelope import Envelope, make
from longrun.workflows import registry

pytestmark = pytest.mark.integration


def _request(key: str) -> Envelope:
    return make("run.create", {"workflow": "steps", "idempotency_key": key, "input": {"steps": 1}},
                producer="tests", tenant_id="acme")


async def test_a_repeated_request_returns_its_run_even_once_its_workflow_is_no_longer_registered(
        clean, engine) -> None:
    # Given a run created under a key while its workflow was registered
    async with engine.begin() as conn:
        first = await admit.create_run(conn, _request("k-1"), kinds=registry(), partitions=8, slots=4)
    assert first["created"] is True
    # When the same request comes again to a scheduler that no longer knows that workflow
    async with engine.begin() as conn:
        again = await admit.create_run(conn, _request("k-1"), kinds=Registry(), partitions=8, slots=4)
    # Then it answers with the run that exists, not with a rejection
    assert again == {"run_id": first["run_id"], "created": False}
    # and a new key for that workflow is rejected with the reason
    async with engine.begin() as conn:
        unknown = await admit.create_run(conn, _request("k-2"), kinds=Registry(), partitions=8, slots=4)
    assert unknown["rejected"] is True and "steps" in unknown["reason"]
