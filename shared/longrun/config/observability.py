"""Logs, spans, health and metrics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from longrun.config import parse
from longrun.config.declaration import Concern, Problem, setting

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
EXPORTERS = ("none", "console", "otlp")
OTLP_PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
"""Spans go over OTLP/HTTP with protobuf: any other protocol asked for is a configuration error."""


def _log_level(raw: str) -> str:
    if raw.upper() not in LOG_LEVELS:
        raise ValueError
    return raw.upper()


def _log_format(raw: str) -> str:
    if raw.lower() not in ("auto", "json", "text"):
        raise ValueError
    return raw.lower()


def _exporter(raw: str) -> str:
    if raw.strip().lower() not in EXPORTERS:
        raise ValueError
    return raw.strip().lower()


def apply_opentelemetry_variables(env: Mapping[str, str], values: dict[str, Any]) -> list[Problem]:
    """OpenTelemetry's own variables, which its SDK reads too: ``OTEL_SDK_DISABLED=true`` turns spans
    off, and a protocol other than OTLP/HTTP with protobuf is a problem."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        values["otel_exporter"] = "none"
    return [(name, f"got {env[name]!r}; expected http/protobuf (spans go over OTLP/HTTP)")
            for name in OTLP_PROTOCOLS if env.get(name, "http/protobuf").strip() != "http/protobuf"]


@dataclass(frozen=True)
class ObservabilitySettings(Concern):
    """Observability: logs, spans, health and metrics"""

    log_level: str = setting("LONGRUN_LOG_LEVEL", _log_level, "one of " + ", ".join(LOG_LEVELS), "INFO")
    """Lowest level of the log records the process writes to stderr."""
    log_format: str = setting("LONGRUN_LOG_FORMAT", _log_format, "auto, json or text", "auto")
    """How records are written: "json" (one object a line), "text", or "auto" (text when stderr is a terminal)."""
    otel_exporter: str = setting("LONGRUN_OTEL_EXPORTER", _exporter, "none, console or otlp", "none",
                                 standard="OTEL_TRACES_EXPORTER")
    """Where spans go: "none" (propagate traceparents only), "console", or "otlp" (OTLP/HTTP, configured by
    the standard ``OTEL_EXPORTER_OTLP_*`` variables). ``OTEL_TRACES_EXPORTER``, when set, wins; so does
    ``OTEL_SDK_DISABLED=true`` (none)."""
    health_port: int = setting("LONGRUN_HEALTH_PORT", parse.port, "a port 0-65535 (0 = off)", "0")
    """Port for /healthz, /readyz and /metrics (Prometheus); 0 turns that server off."""
    health_bind: str = setting("LONGRUN_HEALTH_BIND", parse.word, "an IP address or host name to listen on",
                               "0.0.0.0")
    """Address the /healthz, /readyz and /metrics server listens on. Not meant for the public network:
    expose it to the cluster's probes and Prometheus only (e.g. a NetworkPolicy), never on an Ingress."""
    metrics_interval: float = setting("LONGRUN_METRICS_INTERVAL", parse.positive_float, "seconds, a number > 0",
                                      "15")
    """Seconds between the database gauges' collections (runs by status, actions, outbox backlog,
    quarantine, silent runs), done by the one reconciler replica that holds the collector's lease."""
    metrics_tenant_label: bool = setting("LONGRUN_METRICS_TENANT_LABEL", parse.switch, "true or false", "false")
    """Whether run metrics carry a ``tenant`` label: one series per tenant, so only for a bounded
    number of tenants."""
