"""Ports for the servers a test starts in another process.

A port the kernel hands out for ``bind(0)`` comes from its ephemeral range, the same range every outgoing
connection (each service's to PostgreSQL and RabbitMQ) takes its local port from; between the test closing
the probe socket and the server binding, one of those connections can take it (a gateway once failed with
EADDRINUSE that way). So the ports come from below that range, each handed out once per test process.
"""

from __future__ import annotations

import itertools
import os
import socket
from pathlib import Path

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _candidates() -> itertools.cycle[int]:
    low = int(_RANGE.read_text().split()[0]) if _RANGE.exists() else 32768
    first = max(1024, low - 12000)
    span = low - first
    # Processes started at once (a CI run beside a developer's) start at different places in the span.
    start = first + (os.getpid() * 7919) % span
    return itertools.cycle(itertools.chain(range(start, low), range(first, start)))


_PORTS = _candidates()


def free_port() -> int:
    """A port outside the ephemeral range that nothing listens on or is connected from right now."""
    for _ in range(2000):
        port = next(_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")
