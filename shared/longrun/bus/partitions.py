"""Partition ownership: replicas of one service split P partitions and rebalance.

Each round (a third of the TTL) a replica renews its membership, computes its share
from the live member list, releases partitions that are no longer its own (after its
consumer for them has stopped) and takes the ones that are (once free or expired).
``owned`` is what the lease rows say, whether or not a consumer came up: each round ends
with ``reconcile(owned)``, which starts what is missing (a start that failed, a consumer
that died with its channel or connection) and stops what is not owned.
If it cannot renew for most of a TTL it stops consuming everything on its own, so
an old owner is gone before its lease can be taken over.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncEngine

from longrun.db import membership

logger = logging.getLogger(__name__)

Callback = Callable[[int], Awaitable[None]]
Reconcile = Callable[[set[int]], Awaitable[None]]


class PartitionOwnership:
    def __init__(self, engine: AsyncEngine, *, service: str, instance_id: str, partitions: int,
                 ttl: float, on_acquire: Callback, on_release: Callback,
                 reconcile: Reconcile | None = None) -> None:
        self.engine = engine
        self.service = service
        self.instance_id = instance_id
        self.partitions = partitions
        self.ttl = ttl
        self.on_acquire = on_acquire
        self.on_release = on_release
        self.reconcile = reconcile
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
            members = await membership.heartbeat(conn, self.service, self.instance_id, self.ttl)
        share = membership.assign(members, self.partitions).get(self.instance_id, set())
        for k in sorted(self.owned - share):
            await self._drop(k)
        async with self.engine.begin() as conn:
            held = await membership.acquire(conn, self.service, self.instance_id, share, self.ttl)
        self._last_renewal = time.monotonic()
        for k in sorted(self.owned - held):
            await self._drop(k, release=False)
        for k in sorted(held - self.owned):
            self.owned.add(k)
            logger.info("%s %s: acquired partition %d", self.service, self.instance_id, k)
            try:
                await self.on_acquire(k)
            except Exception:
                # Still owned: the lease is ours either way, and ``reconcile`` retries the start.
                logger.exception("%s: starting partition %d failed", self.service, k)
        if self.reconcile is not None:
            await self.reconcile(set(self.owned))

    async def _drop(self, k: int, *, release: bool = True) -> None:
        self.owned.discard(k)
        await self.on_release(k)
        if release:
            async with self.engine.begin() as conn:
                await membership.release(conn, self.service, self.instance_id, {k})
        logger.info("%s %s: released partition %d", self.service, self.instance_id, k)

    async def _self_fence(self) -> None:
        if self.owned and time.monotonic() - self._last_renewal > self.ttl * 0.6:
            logger.warning("%s: cannot renew leases; stopping all partitions", self.service)
            for k in sorted(self.owned):
                self.owned.discard(k)
                await self.on_release(k)

    async def stop(self) -> None:
        """Stop consuming, hand the partitions back and leave the member list."""
        self._stopping.set()
        for k in sorted(self.owned):
            self.owned.discard(k)
            await self.on_release(k)
        try:
            async with self.engine.begin() as conn:
                await membership.release(conn, self.service, self.instance_id, set(range(self.partitions)))
                await membership.leave(conn, self.service, self.instance_id)
        except Exception:
            logger.warning("%s: could not hand partitions back; they expire after %.0fs",
                           self.service, self.ttl)
