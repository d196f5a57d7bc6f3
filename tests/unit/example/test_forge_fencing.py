"""The tool side of fencing, in the example forge: a write older than the newest one seen for its
idempotency key comes from a worker that lost its lease, and is refused."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from longrun_dependency_upgrade.forge import create_app
from longrun_dependency_upgrade.forge_client import ForgeClient
from longrun.errors import ToolRejected

REPO = "acme/payments"


@pytest.fixture
async def client(serve) -> AsyncIterator[ForgeClient]:  # type: ignore[no-untyped-def]
    async with ForgeClient(serve(create_app(ci_delay=0.05)).url, timeout=2.0) as forge_client:
        yield forge_client


async def branch(client: ForgeClient, token: int | None) -> str:
    made = await client.create_branch(REPO, name="deps/sdk-5", from_ref="main", idempotency_key="run1:branch",
                                      fencing_token=token)
    return made["name"]


async def test_a_write_under_an_older_token_than_seen_for_its_key_is_refused(client: ForgeClient) -> None:
    # Given the successor (token 2) made the branch under the action's key
    assert await branch(client, 2) == "deps/sdk-5"
    # When the stalled worker it replaced (token 1) sends the same write late
    with pytest.raises(ToolRejected) as refused:
        await branch(client, 1)
    # Then the forge refuses it, and still holds one branch
    assert refused.value.status == 409 and "older than 2" in str(refused.value)
    assert [e["count"] for e in await client.effects() if e["idempotency_key"] == "run1:branch"] == [1]


async def test_the_current_holder_and_its_successors_write_as_before(client: ForgeClient) -> None:
    assert await branch(client, 3) == "deps/sdk-5"
    assert await branch(client, 3) == "deps/sdk-5"  # the same request again: replayed
    assert await branch(client, 4) == "deps/sdk-5"  # a newer lease: replayed too
    with pytest.raises(ToolRejected, match="older than 4"):
        await branch(client, 3)
