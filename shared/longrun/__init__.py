"""longrun: durable execution for long-running AI-agent tasks over RabbitMQ and PostgreSQL."""

from __future__ import annotations

__version__ = "0.1.0"
