"""A service replica: its name, its share of the partitions, its start."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from longrun.config import parse
from longrun.config.declaration import Concern, setting


@dataclass(frozen=True)
class ProcessSettings(Concern):
    """Process: a service replica"""

    instance_id: str = setting("LONGRUN_INSTANCE_ID", parse.text, "a non-empty name",
                               f"{socket.gethostname()}-{os.getpid()}")
    """Names this replica in leases, logs and audit rows."""
    partitions: int = setting("LONGRUN_PARTITIONS", parse.positive_int, "an integer >= 1", "8")
    """P: the partitions of the worker's wakeups (and of the outbox the relay publishes); changing it is a drain-and-switch migration."""
    partition_lease_ttl: float = setting("LONGRUN_PARTITION_LEASE_TTL", parse.positive_float,
                                         "seconds, a number > 0", "6")
    """Seconds a replica keeps a partition, and its membership, without renewing them; a worker whose
    membership lapsed has its runs taken over by the live workers."""
    startup_patience: float = setting("LONGRUN_STARTUP_PATIENCE", parse.positive_float, "seconds, a number > 0",
                                      "60")
    """Seconds a starting service waits for PostgreSQL and RabbitMQ before it stops and says what to start."""
