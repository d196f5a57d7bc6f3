"""Typed settings, read once from ``LONGRUN_*`` variables.

This is the only module that reads the environment. Every variable is declared once
below with its parser, default and a short statement of what is expected; a bad or
missing value is reported together with every other bad value, naming each variable.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from longrun.domain.breaker import BreakerSettings
from longrun.domain.retry import RetryPolicy
from longrun.domain.run import TERMINAL, RunStatus
from longrun.errors import ConfigError

DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/longrun"
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError
    return value


def _port(raw: str) -> int:
    value = int(raw)
    if not 0 <= value <= 65535:
        raise ValueError
    return value


def _positive_float(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise ValueError
    return value


def _database_url(raw: str) -> str:
    if urlsplit(raw).scheme not in ("postgresql", "postgresql+psycopg"):
        raise ValueError
    return raw.replace("postgresql://", "postgresql+psycopg://", 1)


def _amqp_url(raw: str) -> str:
    scheme, sep, rest = raw.partition("://")
    hosts = rest.partition("/")[0].rpartition("@")[2]
    if not sep or scheme not in ("amqp", "amqps") or not all(h.strip() for h in hosts.split(",")):
        raise ValueError
    return raw


def _log_level(raw: str) -> str:
    if raw.upper() not in LOG_LEVELS:
        raise ValueError
    return raw.upper()


def _text(raw: str) -> str:
    if not raw.strip():
        raise ValueError
    return raw


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(raw: str) -> float:
    """Seconds, or a number with a unit: ``90s``, ``15m``, ``12h``, ``30d``."""
    text = raw.strip()
    unit = _UNITS.get(text[-1:].lower()) if text else None
    value = float(text[:-1] if unit else text) * (unit or 1)
    if not 0 < value < float("inf"):
        raise ValueError
    return value


def _model_kind(raw: str) -> str:
    if raw not in ("scripted", "openai"):
        raise ValueError
    return raw


def _silence_limits(raw: str) -> Mapping[RunStatus, float]:
    """``STATUS=seconds`` pairs, comma separated; only open statuses can fall silent."""
    limits: dict[RunStatus, float] = {}
    for pair in (p.strip() for p in raw.split(",") if p.strip()):
        name, sep, seconds = pair.partition("=")
        status = RunStatus(name.strip())
        if not sep or status in TERMINAL:
            raise ValueError
        limits[status] = _positive_float(seconds)
    return MappingProxyType(limits)


def _at_least_one_float(raw: str) -> float:
    value = float(raw)
    if not 1 <= value < float("inf"):
        raise ValueError
    return value


def _float(raw: str) -> float:
    value = float(raw)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError
    return value


def _switch(raw: str) -> bool:
    if raw.strip().lower() not in ("true", "false"):
        raise ValueError
    return raw.strip().lower() == "true"


def _host(raw: str) -> str:
    if not raw.strip() or any(c.isspace() for c in raw.strip()):
        raise ValueError
    return raw.strip()


EXPORTERS = ("none", "console", "otlp")


def _exporter(raw: str) -> str:
    if raw.strip().lower() not in EXPORTERS:
        raise ValueError
    return raw.strip().lower()


def _log_format(raw: str) -> str:
    if raw.lower() not in ("auto", "json", "text"):
        raise ValueError
    return raw.lower()


def _name_list(raw: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in raw.split(",") if t.strip())


def _named_references(raw: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in _name_list(raw):
        name, equals, reference = (part.strip() for part in item.partition("="))
        if not equals or not name or not reference:
            raise ValueError
        pairs.append((name, reference))
    return tuple(pairs)


def _optional_url(raw: str) -> str:
    """An http(s) URL, or nothing ("": the feature it configures is off)."""
    if raw.strip() and urlsplit(raw.strip()).scheme not in ("http", "https"):
        raise ValueError
    return raw.strip()


def _claim(raw: str) -> str:
    if not raw.strip() or any(c.isspace() for c in raw.strip()):
        raise ValueError
    return raw.strip()


def _token_list(raw: str) -> tuple[str, ...]:
    tokens = tuple(t.strip() for t in raw.split(",") if t.strip())
    if not tokens:
        raise ValueError
    return tokens


@dataclass(frozen=True, slots=True)
class _Var:
    env: str
    parse: Callable[[str], Any]
    expected: str
    default: str | None
    standard: str | None = None
    """A standard variable (OpenTelemetry's) that, when set, wins over ``env``."""


def _var(env: str, parse: Callable[[str], Any], expected: str, default: str | None,
         standard: str | None = None) -> Any:
    return _Var(env, parse, expected, default, standard)


OTLP_PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
"""Spans go over OTLP/HTTP with protobuf: any other protocol asked for is a configuration error."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Process-wide settings; build with :meth:`from_env`."""

    database_url: str
    """PostgreSQL URL (SQLAlchemy form, psycopg 3 driver)."""
    amqp_url: str
    """RabbitMQ URL; a cluster's nodes as ``host1:port,host2:port`` in its host part."""
    instance_id: str
    """Names this replica in leases, logs and audit rows."""
    partitions: int
    """P: work partitions per consuming service; changing it is a drain-and-switch migration."""
    partition_lease_ttl: float
    """Seconds a replica keeps a partition without renewing its lease."""
    run_lease_ttl: float
    """Seconds a worker keeps a run without a heartbeat."""
    idle_transaction_timeout: float
    """Seconds PostgreSQL lets a session sit idle inside a transaction before ending it: a frozen
    process must not hold a run's row lock for everyone."""
    prefetch: int
    """Unacked deliveries per consumer channel."""
    amqp_heartbeat: int
    """Seconds between AMQP heartbeats; a frozen replica loses its queues after about two missed ones."""
    delivery_limit: int
    """Deliveries of one message before the broker dead-letters it to quarantine."""
    relay_poll_interval: float
    """Seconds between outbox polls when no NOTIFY arrives."""
    relay_batch: int
    """Outbox rows claimed per relay round."""
    timer_batch: int
    """Due timers the timer service fires per transaction. Each batch pays a fixed share (its
    statements, its commit, one wake through the domain); 500 fired 10,000 due at once 20-30 %
    faster than 200 (docs/cost-model.md), and holds its runs' locks for tens of milliseconds."""
    log_level: str
    """Lowest level of the log records the process writes to stderr."""
    log_format: str
    """How records are written: "json" (one object a line), "text", or "auto" (text when stderr is a terminal)."""
    otel_exporter: str
    """Where spans go: "none" (propagate traceparents only), "console", or "otlp" (OTLP/HTTP, configured by
    the standard ``OTEL_EXPORTER_OTLP_*`` variables). ``OTEL_TRACES_EXPORTER``, when set, wins; so does
    ``OTEL_SDK_DISABLED=true`` (none)."""
    startup_patience: float
    """Seconds a starting service waits for PostgreSQL and RabbitMQ before it stops and says what to start."""
    health_port: int
    """Port for /healthz, /readyz and /metrics (Prometheus); 0 turns that server off."""
    health_bind: str
    """Address the /healthz, /readyz and /metrics server listens on. Not meant for the public network:
    expose it to the cluster's probes and Prometheus only (e.g. a NetworkPolicy), never on an Ingress."""
    metrics_interval: float
    """Seconds between the database gauges' collections (runs by status, actions, outbox backlog,
    quarantine, silent runs), done by the one reconciler replica that holds the collector's lease."""
    metrics_tenant_label: bool
    """Whether run metrics carry a ``tenant`` label: one series per tenant, so only for a bounded
    number of tenants."""
    gateway_port: int
    """Port the gateway's operator API listens on (and its webhook intake, unless
    ``LONGRUN_WEBHOOK_PORT`` serves that apart)."""
    webhook_port: int
    """Port the gateway's webhook intake (``POST /webhooks/<provider>``) listens on, apart from the
    operator API, so the two can be exposed differently (webhooks to the providers, the operator API
    to operators only); 0 serves both on ``LONGRUN_GATEWAY_PORT``."""
    webhook_secret: str
    """HMAC secret shared with webhook senders: every provider's, unless ``LONGRUN_WEBHOOK_SECRETS``
    gives it its own."""
    webhook_secrets: tuple[tuple[str, str], ...]
    """Providers' own HMAC secrets, ``provider=secret`` comma-separated (a secret holds no comma); a
    provider not named uses ``LONGRUN_WEBHOOK_SECRET``. Naming a provider the gateway does not know
    stops it."""
    webhook_replay_window: float
    """How far the time a timestamped webhook was sent may be from the gateway's clock, either way,
    before the delivery is refused as a replay (providers that sign no time rely on dedup)."""
    operator_tokens: tuple[str, ...]
    """Bootstrap tokens, comma separated: each is taken by the operator API as the admin
    ``bootstrap`` of every tenant, so a fresh install can create named tokens
    (``longrunctl token create``); keep them secret and few, and use named tokens or OIDC for
    people."""
    oidc_issuer: str
    """The OIDC issuer (its ``iss``) whose bearer JWTs the operator API takes; empty: none is
    taken. Needs ``LONGRUN_OIDC_AUDIENCE`` and ``LONGRUN_OIDC_JWKS_URL``."""
    oidc_audience: str
    """The audience (``aud``) a JWT must be issued for."""
    oidc_jwks_url: str
    """Where the issuer publishes its signing keys (JWKS), fetched when a token names a key not yet
    cached."""
    oidc_roles_claim: str
    """The JWT claim holding the operator's roles (viewer, operator, approver, admin)."""
    oidc_tenants_claim: str
    """The JWT claim holding the tenants the operator sees (``*``: every tenant; none: no tenant)."""
    oidc_groups_claim: str
    """The JWT claim holding the operator's groups (an approval may name a group as its approver)."""
    oidc_client_id: str
    """The web console's client id at the OIDC issuer: set, the console's sign-in page offers signing
    in there (the authorization-code flow with PKCE, redirecting back to ``/console/oidc/callback``);
    empty: named tokens only. The access token it gets must be one the operator API takes."""
    oidc_client_secret: str
    """The console's client secret at the issuer (empty for a public client, which PKCE protects)."""
    console_secret: str
    """Key the web console (``/console``) seals its session cookies and CSRF tokens with: every gateway
    replica needs the same one, and changing it ends every console session."""
    run_kinds: tuple[str, ...]
    """Where the run kinds come from: ``package.module:attribute`` references, comma-separated, each a
    ``RunKind``, a sequence of them or a function of the Settings returning either; installed
    distributions' ``longrun.run_kinds`` entry points are loaded too (``longrun.run_kinds``)."""
    webhook_providers: tuple[tuple[str, str], ...]
    """Webhook providers by name (``POST /webhooks/<name>``): ``name=package.module:attribute``,
    comma-separated, each a ``longrun.app.webhooks.Provider``; installed
    distributions' ``longrun.webhook_providers`` entry points are loaded too."""
    artifact_dir: str
    """Root of the filesystem artifact store."""
    tenant_slots: int
    """Admitted, unfinished runs per tenant at most."""
    producer_tenants: tuple[tuple[str, str], ...]
    """The tenants each broker user may create runs in: ``user=tenant``, comma-separated, once per
    tenant (``user=*``: every tenant). The runtime's own user (``LONGRUN_AMQP_URL``'s) may create in
    every tenant; ``guest`` only when the broker is on this machine (development). A ``run.create``
    whose AMQP ``user_id`` is missing or not allowed its tenant is refused (``tenant_not_allowed``)."""
    max_input_bytes: int
    """Largest ``run.create`` input accepted, in bytes of its JSON; a larger one is refused with
    ``run.rejected`` (input_too_large). Large inputs belong in the artifact store, referenced by hash."""
    max_attachment_bytes: int
    """The largest artifact an operator may attach to a run through the gateway."""
    priority_aging: float
    """Seconds of waiting that count as one priority point (so nothing starves)."""
    worker_concurrency: int
    """Runs one worker process advances at once."""
    model: str
    """Model adapter: "scripted" (deterministic demo script) or "openai" (an OpenAI-compatible server)."""
    model_url: str
    """Base URL of the OpenAI-compatible API the worker calls when ``LONGRUN_MODEL`` is openai."""
    model_name: str
    """Model the worker asks for at that API."""
    model_api_key: str
    """API key for that API; keep it in a secret."""
    crash_points: tuple[str, ...]
    """Fault tests only: named crash points to arm (see longrun.faults); empty in production."""
    clock_skew: float
    """Fault tests only: seconds added to this process's wall clock (may be negative); 0 in production."""
    tool_timeout: float
    """Default attempt (start-to-close) timeout of tool calls; past it an outcome is UNKNOWN, never FAILED."""
    reconcile_interval: float
    """Seconds between the reconciler's sweeps (unknown actions, expired leases, silent runs)."""
    drift_interval: float
    """Seconds between the reconciler's drift checks of confirmed actions against the far side."""
    silence_limits: Mapping[RunStatus, float]
    """How long a run may stay in a status (without a live lease) before the reconciler alerts."""
    retention_interval: float
    """Seconds between the reconciler's retention passes (pruning by the horizons below, archiving
    finished runs, the artifact orphan sweep)."""
    retention_batch: int
    """Rows one retention statement deletes at most: each delete is short and locks only its rows."""
    archive_batch: int
    """Finished runs archived (and their events and actions pruned) per transaction."""
    retain_outbox: float
    """How long a published outbox row is kept after it was published."""
    retain_inbox: float
    """How long an inbox row (a handled message's id and outcome) is kept after handling; it must be
    longer than ``LONGRUN_QUARANTINE_REPLAY_WINDOW``, so a replay within the window meets its inbox row."""
    quarantine_replay_window: float
    """How old a quarantined message may be (since it was sent) for its replay to rely on the inbox;
    an older one is checked first against what outlives the inbox (the run's creating key, the run's
    state) and is not sent again when its effect is already there."""
    retain_timers: float
    """How long a fired or cancelled timer is kept after it fired or was cancelled (an open timer of an
    archived run goes with it)."""
    retain_webhook_events: float
    """How long a webhook event matched to a run is kept after it was matched (unmatched ones stay)."""
    retain_delivery_failures: float
    """How long a message's count of failed deliveries is kept after its last failure."""
    retain_replayed_quarantine: float
    """How long a quarantine entry is kept after it was replayed (unreplayed entries stay)."""
    retain_dead_members: float
    """How long a service member's row is kept after its last heartbeat ran out."""
    retain_audit: float
    """How long an audit row is kept."""
    retain_finished_runs: float
    """How long a finished run keeps its events and actions after its last change; then they are
    archived (JSON Lines in the artifact store) and pruned, and the run row stays as a tombstone."""
    artifact_orphan_grace: float
    """Age after which a stored artifact that no row references is deleted by the orphan sweep: longer
    than any transaction that uploads an artifact and then registers it."""
    retry_initial_interval: float
    """Default retry policy of tool and model calls answered unavailable: seconds before the second attempt."""
    retry_backoff_coefficient: float
    """Default retry policy: each further delay is the previous one times this (1 keeps it constant)."""
    retry_maximum_interval: float
    """Default retry policy: cap on any one delay, in seconds (at least the initial interval)."""
    retry_maximum_attempts: int
    """Default retry policy: attempts in total, the first included; then the call is a recorded failure."""
    breaker_threshold: int
    """Unavailable answers from one far side within ``LONGRUN_BREAKER_WINDOW`` that open its circuit breaker."""
    breaker_window: float
    """Seconds over which a far side's unavailable answers are counted."""
    breaker_cool_down: float
    """Seconds an open breaker lets no call through; then one probe call goes (at most one per cool-down)."""
    breaker_cache: float
    """Seconds a worker trusts its copy of the breakers before reading them again (its own failures
    and probes update it at once)."""
    breaker_max_wait: float
    """Seconds a run waiting for a far side to be healthy waits at most before it looks again by itself."""

    def retry_policy(self) -> RetryPolicy:
        """The default retry policy of tool and model calls."""
        return RetryPolicy(initial_interval=self.retry_initial_interval,
                           backoff_coefficient=self.retry_backoff_coefficient,
                           maximum_interval=self.retry_maximum_interval,
                           maximum_attempts=self.retry_maximum_attempts)

    def breaker(self) -> BreakerSettings:
        """The circuit breakers' settings (every far side's)."""
        return BreakerSettings(threshold=self.breaker_threshold, window=self.breaker_window,
                               cool_down=self.breaker_cool_down)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Parse every variable; raise ConfigError listing all problems at once."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        problems: list[tuple[str, str]] = []
        for field in fields(cls):
            spec: _Var = _SPEC[field.name]
            name = spec.standard if spec.standard and env.get(spec.standard) else spec.env
            raw = env.get(name, spec.default)
            if raw is None:
                problems.append((name, f"missing; expected {spec.expected}"))
                continue
            try:
                values[field.name] = spec.parse(raw)
            except ValueError:
                problems.append((name, f"got {raw!r}; expected {spec.expected}"))
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            values["otel_exporter"] = "none"
        problems += [(name, f"got {env[name]!r}; expected http/protobuf (spans go over OTLP/HTTP)")
                     for name in OTLP_PROTOCOLS if env.get(name, "http/protobuf").strip() != "http/protobuf"]
        if not problems:
            problems += _inconsistencies(values)
        if problems:
            raise ConfigError(problems)
        return cls(**values)

    @staticmethod
    def variables() -> dict[str, str]:
        """Every variable with what it expects (for docs and manifests)."""
        return {spec.env: spec.expected for spec in _SPEC.values()}


def _inconsistencies(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Problems between variables that are each valid on their own."""
    problems = []
    if values["retain_inbox"] <= values["quarantine_replay_window"]:
        problems.append(("LONGRUN_RETAIN_INBOX", f"got {values['retain_inbox']:.15g} s; expected more than "
                         f"LONGRUN_QUARANTINE_REPLAY_WINDOW ({values['quarantine_replay_window']:.15g} s): a replay "
                         "within the window must still find the inbox row of a message handled before"))
    if values["retry_maximum_interval"] < values["retry_initial_interval"]:
        problems.append((_SPEC["retry_maximum_interval"].env,
                         f"got {values['retry_maximum_interval']}; expected at least "
                         f"{_SPEC['retry_initial_interval'].env} ({values['retry_initial_interval']})"))
    if values["oidc_issuer"]:
        problems += [(_SPEC[name].env, f"missing; expected it with LONGRUN_OIDC_ISSUER ({_SPEC[name].expected})")
                     for name in ("oidc_audience", "oidc_jwks_url") if not values[name].strip()]
    if values["oidc_client_id"] and not values["oidc_issuer"]:
        problems.append(("LONGRUN_OIDC_CLIENT_ID", "set without LONGRUN_OIDC_ISSUER: the console has no issuer "
                         "to send operators to"))
    if values["webhook_port"] and values["webhook_port"] == values["gateway_port"]:
        problems.append(("LONGRUN_WEBHOOK_PORT", f"got {values['webhook_port']}; expected 0 or a port other than "
                         "LONGRUN_GATEWAY_PORT"))
    return problems


_DURATION = "a duration: seconds, or a number with a unit s, m, h or d (e.g. 30d)"

_SPEC: dict[str, _Var] = {
    "database_url": _var("LONGRUN_DATABASE_URL", _database_url,
                         "a postgresql:// or postgresql+psycopg:// URL", DEFAULT_DATABASE_URL),
    "amqp_url": _var("LONGRUN_AMQP_URL", _amqp_url,
                     "an amqp:// or amqps:// URL (a cluster: amqp://user:pass@node1:5672,node2:5672/vhost)",
                     DEFAULT_AMQP_URL),
    "instance_id": _var("LONGRUN_INSTANCE_ID", _text, "a non-empty name",
                        f"{socket.gethostname()}-{os.getpid()}"),
    "partitions": _var("LONGRUN_PARTITIONS", _positive_int, "an integer >= 1", "8"),
    "partition_lease_ttl": _var("LONGRUN_PARTITION_LEASE_TTL", _positive_float,
                                "seconds, a number > 0", "6"),
    "run_lease_ttl": _var("LONGRUN_RUN_LEASE_TTL", _positive_float, "seconds, a number > 0", "30"),
    "idle_transaction_timeout": _var("LONGRUN_IDLE_TRANSACTION_TIMEOUT", _positive_float,
                                     "seconds, a number > 0", "30"),
    "prefetch": _var("LONGRUN_PREFETCH", _positive_int, "an integer >= 1", "100"),
    "amqp_heartbeat": _var("LONGRUN_AMQP_HEARTBEAT", _positive_int, "seconds, an integer >= 1", "10"),
    "delivery_limit": _var("LONGRUN_DELIVERY_LIMIT", _positive_int, "an integer >= 1", "5"),
    "relay_poll_interval": _var("LONGRUN_RELAY_POLL_INTERVAL", _positive_float,
                                "seconds, a number > 0", "1"),
    "relay_batch": _var("LONGRUN_RELAY_BATCH", _positive_int, "an integer >= 1", "200"),
    "timer_batch": _var("LONGRUN_TIMER_BATCH", _positive_int, "an integer >= 1", "500"),
    "log_level": _var("LONGRUN_LOG_LEVEL", _log_level, "one of " + ", ".join(LOG_LEVELS), "INFO"),
    "log_format": _var("LONGRUN_LOG_FORMAT", _log_format, "auto, json or text", "auto"),
    "otel_exporter": _var("LONGRUN_OTEL_EXPORTER", _exporter, "none, console or otlp", "none",
                          standard="OTEL_TRACES_EXPORTER"),
    "startup_patience": _var("LONGRUN_STARTUP_PATIENCE", _positive_float, "seconds, a number > 0", "60"),
    "health_port": _var("LONGRUN_HEALTH_PORT", _port, "a port 0-65535 (0 = off)", "0"),
    "health_bind": _var("LONGRUN_HEALTH_BIND", _host, "an IP address or host name to listen on", "0.0.0.0"),
    "metrics_interval": _var("LONGRUN_METRICS_INTERVAL", _positive_float, "seconds, a number > 0", "15"),
    "metrics_tenant_label": _var("LONGRUN_METRICS_TENANT_LABEL", _switch, "true or false", "false"),
    "gateway_port": _var("LONGRUN_GATEWAY_PORT", _port, "a port 0-65535", "8080"),
    "webhook_port": _var("LONGRUN_WEBHOOK_PORT", _port, "a port 0-65535 (0 = LONGRUN_GATEWAY_PORT)", "0"),
    "webhook_secret": _var("LONGRUN_WEBHOOK_SECRET", _text, "a non-empty secret",
                           "dev-webhook-secret"),
    "webhook_secrets": _var("LONGRUN_WEBHOOK_SECRETS", _named_references, "comma-separated provider=secret", ""),
    "webhook_replay_window": _var("LONGRUN_WEBHOOK_REPLAY_WINDOW", duration, _DURATION, "5m"),
    "operator_tokens": _var("LONGRUN_OPERATOR_TOKENS", _token_list,
                            "comma-separated bearer tokens", "dev-operator-token"),
    "oidc_issuer": _var("LONGRUN_OIDC_ISSUER", _optional_url, "an http(s) URL, or empty (off)", ""),
    "oidc_audience": _var("LONGRUN_OIDC_AUDIENCE", str, "the audience tokens are issued for", ""),
    "oidc_jwks_url": _var("LONGRUN_OIDC_JWKS_URL", _optional_url, "an http(s) URL, or empty", ""),
    "oidc_roles_claim": _var("LONGRUN_OIDC_ROLES_CLAIM", _claim, "a claim name", "roles"),
    "oidc_tenants_claim": _var("LONGRUN_OIDC_TENANTS_CLAIM", _claim, "a claim name", "tenants"),
    "oidc_groups_claim": _var("LONGRUN_OIDC_GROUPS_CLAIM", _claim, "a claim name", "groups"),
    "oidc_client_id": _var("LONGRUN_OIDC_CLIENT_ID", str, "a client id, or empty (off)", ""),
    "oidc_client_secret": _var("LONGRUN_OIDC_CLIENT_SECRET", str, "a client secret, or empty", ""),
    "console_secret": _var("LONGRUN_CONSOLE_SECRET", _text, "a non-empty secret", "dev-console-secret"),
    "run_kinds": _var("LONGRUN_RUN_KINDS", _name_list, "comma-separated package.module:attribute references",
                      "longrun.workflows:builtin"),
    "webhook_providers": _var("LONGRUN_WEBHOOK_PROVIDERS", _named_references,
                              "comma-separated name=package.module:attribute", ""),
    "artifact_dir": _var("LONGRUN_ARTIFACT_DIR", _text, "a directory path", "/tmp/longrun-artifacts"),
    "tenant_slots": _var("LONGRUN_TENANT_SLOTS", _positive_int, "an integer >= 1", "4"),
    "producer_tenants": _var("LONGRUN_PRODUCER_TENANTS", _named_references,
                             "comma-separated user=tenant (tenant * for every tenant)", ""),
    "max_input_bytes": _var("LONGRUN_MAX_INPUT_BYTES", _positive_int, "bytes, an integer >= 1", "262144"),
    "max_attachment_bytes": _var("LONGRUN_MAX_ATTACHMENT_BYTES", _positive_int, "bytes, an integer >= 1",
                                 str(10 * 1024 * 1024)),
    "priority_aging": _var("LONGRUN_PRIORITY_AGING", _positive_float, "seconds, a number > 0", "30"),
    "worker_concurrency": _var("LONGRUN_WORKER_CONCURRENCY", _positive_int, "an integer >= 1", "64"),
    "model": _var("LONGRUN_MODEL", _model_kind, "scripted or openai", "scripted"),
    "model_url": _var("LONGRUN_MODEL_URL", _text, "an http(s) URL of an OpenAI-compatible API",
                      "http://127.0.0.1:8091/v1"),
    "model_name": _var("LONGRUN_MODEL_NAME", _text, "a model name", "gpt-4o-mini"),
    "model_api_key": _var("LONGRUN_MODEL_API_KEY", _text, "an API key", "not-needed-locally"),
    "crash_points": _var("LONGRUN_CRASH_POINTS", _name_list, "comma-separated crash point names", ""),
    "clock_skew": _var("LONGRUN_CLOCK_SKEW", _float, "seconds, a finite number (may be negative)", "0"),
    "tool_timeout": _var("LONGRUN_TOOL_TIMEOUT", _positive_float, "seconds, a number > 0", "10"),
    "reconcile_interval": _var("LONGRUN_RECONCILE_INTERVAL", _positive_float, "seconds, a number > 0", "1"),
    "drift_interval": _var("LONGRUN_DRIFT_INTERVAL", _positive_float, "seconds, a number > 0", "60"),
    "silence_limits": _var("LONGRUN_SILENCE_LIMITS", _silence_limits,
                           "comma-separated STATUS=seconds for open run statuses",
                           "RUNNING=300,READY=600,ACTION_UNKNOWN=3600"),
    "retention_interval": _var("LONGRUN_RETENTION_INTERVAL", _positive_float, "seconds, a number > 0", "600"),
    "retention_batch": _var("LONGRUN_RETENTION_BATCH", _positive_int, "an integer >= 1", "1000"),
    "archive_batch": _var("LONGRUN_ARCHIVE_BATCH", _positive_int, "an integer >= 1", "100"),
    "retain_outbox": _var("LONGRUN_RETAIN_OUTBOX", duration, _DURATION, "7d"),
    "retain_inbox": _var("LONGRUN_RETAIN_INBOX", duration, _DURATION, "30d"),
    "quarantine_replay_window": _var("LONGRUN_QUARANTINE_REPLAY_WINDOW", duration, _DURATION, "14d"),
    "retain_timers": _var("LONGRUN_RETAIN_TIMERS", duration, _DURATION, "7d"),
    "retain_webhook_events": _var("LONGRUN_RETAIN_WEBHOOK_EVENTS", duration, _DURATION, "30d"),
    "retain_delivery_failures": _var("LONGRUN_RETAIN_DELIVERY_FAILURES", duration, _DURATION, "30d"),
    "retain_replayed_quarantine": _var("LONGRUN_RETAIN_REPLAYED_QUARANTINE", duration, _DURATION, "30d"),
    "retain_dead_members": _var("LONGRUN_RETAIN_DEAD_MEMBERS", duration, _DURATION, "1d"),
    "retain_audit": _var("LONGRUN_RETAIN_AUDIT", duration, _DURATION, "365d"),
    "retain_finished_runs": _var("LONGRUN_RETAIN_FINISHED_RUNS", duration, _DURATION, "30d"),
    "artifact_orphan_grace": _var("LONGRUN_ARTIFACT_ORPHAN_GRACE", duration, _DURATION, "1h"),
    "retry_initial_interval": _var("LONGRUN_RETRY_INITIAL_INTERVAL", _positive_float, "seconds, a number > 0", "1"),
    "retry_backoff_coefficient": _var("LONGRUN_RETRY_BACKOFF_COEFFICIENT", _at_least_one_float,
                                      "a number >= 1", "2"),
    "retry_maximum_interval": _var("LONGRUN_RETRY_MAXIMUM_INTERVAL", _positive_float, "seconds, a number > 0",
                                   "300"),
    "retry_maximum_attempts": _var("LONGRUN_RETRY_MAXIMUM_ATTEMPTS", _positive_int, "an integer >= 1", "5"),
    "breaker_threshold": _var("LONGRUN_BREAKER_THRESHOLD", _positive_int, "an integer >= 1", "5"),
    "breaker_window": _var("LONGRUN_BREAKER_WINDOW", _positive_float, "seconds, a number > 0", "30"),
    "breaker_cool_down": _var("LONGRUN_BREAKER_COOL_DOWN", _positive_float, "seconds, a number > 0", "15"),
    "breaker_cache": _var("LONGRUN_BREAKER_CACHE", _positive_float, "seconds, a number > 0", "1"),
    "breaker_max_wait": _var("LONGRUN_BREAKER_MAX_WAIT", _positive_float, "seconds, a number > 0", "600"),
}
