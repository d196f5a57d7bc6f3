"""longrun: durable execution for long-running AI-agent tasks over RabbitMQ and PostgreSQL."""

from __future__ import annotations

__version__ = "0.1.0"
"""The release of the runtime (``longrun-runtime``), its services and ``longrunctl``; ``longrun-client``'s
``__version__`` is the same (they are released together)."""
