"""Row: the PostgreSQL primary is SIGKILLed under a steady load of runs and the standby is promoted.

Every service holds the pair's multi-host address (``?host=primary&host=standby``,
``target_session_attrs=read-write``): its engine, its statement pool and its LISTEN loops find
the promoted standby by themselves, with no restart and no change of configuration. The
standby is synchronous (``remote_apply``), so nothing a client saw committed is missing after
the promotion. The row ends in the invariant checker: every run completes, no external effect
twice, per-run event order intact, and every create the producer saw confirmed has its run.

With the protection switched off (services given the primary's address alone, the way a
single-host URL was read before) the same load must not complete: that variant shows the row
depends on the multi-host address, not on luck.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.fault.scenario import EVERYTHING, Scenario
from tests.ha.load import NOMINAL, all_completed, steady
from tests.ha.pg_pair import PgPair

pytestmark = [pytest.mark.ha, pytest.mark.fault, pytest.mark.integration]

BEFORE, AFTER = 6, 6
"""Runs created before the primary dies and after the standby is promoted."""
OUTAGE = 1.5
"""Seconds between the primary's death and the promotion (an operator's or a failover manager's)."""


@pytest.mark.parametrize("multi_host", [True, False], ids=["multi-host address", "primary's address alone"])
async def test_the_primary_killed_and_the_standby_promoted_loses_nothing(
        scenario: Scenario, pg_pair: PgPair, multi_host: bool) -> None:
    # Given the whole ensemble on the replicated database, under a steady load of dependency upgrades
    address = {} if multi_host else {"LONGRUN_DATABASE_URL": pg_pair.url(scenario.infra.database, both=False)}
    await scenario.up(*EVERYTHING, ci_delay=0.5, **address)
    keys: list[str] = []
    await steady(scenario, BEFORE, keys)
    # When the primary is SIGKILLed mid-load, and promoting the standby takes a moment
    pg_pair.kill_primary()
    await asyncio.sleep(OUTAGE)
    await asyncio.to_thread(pg_pair.promote)
    await steady(scenario, AFTER, keys)
    completed, statuses = await all_completed(scenario, keys, timeout=90 if multi_host else 30)
    if not multi_host:
        # Then, with the primary's address alone, the services never reach the promoted standby
        assert not completed, "the load completed without the multi-host address: this row proves nothing"
        return
    # Then, with no service restarted, every create the producer saw confirmed has its run, each
    # completed with one effect per intent, and the checker finds nothing
    assert completed, statuses
    assert all(p.alive() for p in scenario.services.started), [p.name for p in scenario.services.started
                                                              if not p.alive()]
    counts = await scenario.forge_counts()
    assert dict(counts) == {kind: n * len(keys) for kind, n in NOMINAL.items()}
    assert await scenario.scalar("SELECT pg_is_in_recovery()") is False
    await scenario.finish()
