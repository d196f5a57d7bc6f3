"""Partition ownership: replicas of one service split P partitions and rebalance.

Each round (a third of the TTL) a replica renews its membership, computes its share
from the live member list, releases partitions that are no longer its own (after its
consumer for them has stopped) and takes the ones that are (once free or expired).
``owned`` is what the lease rows say, whether or not a consumer came up: each round ends
with ``reconcile(owned)``, which starts what is missing (a start that failed, a consumer
that died with its channel or connection) and stops what is not owned.
Partitions taken or given up in one round are started or stopped together, not one after
another: after a replica dies the survivor resumes all its partitions in one broker round trip
time, not P of them (recovery time after a SIGKILL).
If it cannot renew for most of a TTL it stops consuming everything on its own, so
an old owner is gone before its lease can be taken over.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.db import membership

logger = logging.getLogger(__name__)

Callback = Callable[[set[int]], Awaitable[None]]
Reconcile = Callable[[set[int]], Awaitable[None]]


class PartitionOwnership:
    def __init__(self, engine: AsyncEngine, *, service: str, instance_id: str, partitions: int,
                 ttl: float, on_acquire: Callback, on_release: Callback,
                 reconcile: Reconcile | None = None, advertised: Sequence[Mapping[str, str]] = ()) -> None:
        """``advertised``: what this replica can run, written into its membership row."""
        self.engine = engine
        self.service = service
        self.instance_id = instance_id
        self.partitions = partitions
        self.ttl = ttl
        self.on_acquire = on_acquire
        self.on_release = on_release
        self.reconcile = reconcile
        self.advertised = advertised
        self.owned: set[int] = set()
        self._last_renewal = 0.0
        self._stopping = asyncio.Event()

    async def run(self) -> None:
        async with self.engine.begin() as conn:
            await membership.ensure_partitions(conn, self.service, self.partitions)
        while not self._stopping.is_set():
            try:
                await self.rebalance()
            except Exception:
                logger.exception("%s: partition round failed", self.service)
                await self._self_fence()
            try:
                await asyncio.wait_for(self._stopping.wait(), timeout=self.ttl / 3)
            except TimeoutError:
                pass

    async def rebalance(self) -> None:
        async with self.engine.begin() as conn:
            members = await membership.heartbeat(conn, self.service, self.instance_id, self.ttl, self.advertised)
        share = membership.assign(members, self.partitions).get(self.instance_id, set())
        await self._drop(self.owned - share)
        async with self.engine.begin() as conn:
            held = await membership.acquire(conn, self.service, self.instance_id, share, self.ttl)
        self._last_renewal = time.monotonic()
        await self._drop(self.owned - held, release=False)
        taken = held - self.owned
        if taken:
            self.owned |= taken
            logger.info("%s %s: acquired partitions %s", self.service, self.instance_id, sorted(taken))
            try:
                await self.on_acquire(taken)
            except Exception:
                # Still owned: the leases are ours either way, and ``reconcile`` retries the starts.
                logger.exception("%s: starting partitions %s failed", self.service, sorted(taken))
        if self.reconcile is not None:
            await self.reconcile(set(self.owned))

    async def _drop(self, partitions: set[int], *, release: bool = True) -> None:
        if not partitions:
            return
        self.owned -= partitions
        await self.on_release(set(partitions))
        if release:
            async with self.engine.begin() as conn:
                await membership.release(conn, self.service, self.instance_id, partitions)
        logger.info("%s %s: released partitions %s", self.service, self.instance_id, sorted(partitions))

    async def _renew_stopping(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                async with self.engine.begin() as conn:
                    await membership.stopping(conn, self.service, self.instance_id, self.ttl)
            except Exception as e:
                logger.warning("%s: could not renew its membership while stopping (%r)", self.service, e)

    async def _self_fence(self) -> None:
        if self.owned and time.monotonic() - self._last_renewal > self.ttl * 0.6:
            logger.warning("%s: cannot renew leases; stopping all partitions", self.service)
            owned, self.owned = self.owned, set()
            await self.on_release(owned)

    async def stop(self, *, before_leaving: Callable[[], Awaitable[None]] | None = None) -> None:
        """Stop consuming, hand the partitions back and leave the member list; ``before_leaving`` runs
        between the two, while this replica is still a member (what it holds in its name, such as a
        worker's runs and tool permits, stays its own until it has let go of it) that the others leave
        out of the partitions' split (``membership.stopping``, renewed for as long as it runs)."""
        self._stopping.set()
        owned, self.owned = self.owned, set()
        if owned:
            await self.on_release(owned)
        try:
            async with self.engine.begin() as conn:
                await membership.release(conn, self.service, self.instance_id, set(range(self.partitions)))
                if before_leaving is not None:
                    await membership.stopping(conn, self.service, self.instance_id, self.ttl)
        except Exception:
            logger.warning("%s: could not hand partitions back; they expire after %.0fs",
                           self.service, self.ttl)
        if before_leaving is not None:
            # Still a member while it finishes what it holds, out of the partitions' split.
            renewing = asyncio.create_task(self._renew_stopping())
            try:
                await before_leaving()
            finally:
                renewing.cancel()
                await asyncio.gather(renewing, return_exceptions=True)
        try:
            async with self.engine.begin() as conn:
                await membership.leave(conn, self.service, self.instance_id)
        except Exception:
            logger.warning("%s: could not leave the member list; its membership lapses after %.0fs",
                           self.service, self.ttl)
