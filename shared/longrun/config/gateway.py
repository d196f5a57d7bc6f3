"""The gateway: its ports, the webhook intake's secrets, attachments and the console's key."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from longrun.config import parse
from longrun.config.declaration import Concern, Problem, setting


@dataclass(frozen=True)
class GatewaySettings(Concern):
    """Gateway: operator API, webhooks and console"""

    gateway_port: int = setting("LONGRUN_GATEWAY_PORT", parse.port, "a port 0-65535", "8080")
    """Port the gateway's operator API listens on (and its webhook intake, unless
    ``LONGRUN_WEBHOOK_PORT`` serves that apart)."""
    webhook_port: int = setting("LONGRUN_WEBHOOK_PORT", parse.port, "a port 0-65535 (0 = LONGRUN_GATEWAY_PORT)",
                                "0")
    """Port the gateway's webhook intake (``POST /webhooks/<provider>``) listens on, apart from the
    operator API, so the two can be exposed differently (webhooks to the providers, the operator API
    to operators only); 0 serves both on ``LONGRUN_GATEWAY_PORT``."""
    webhook_secret: str = setting("LONGRUN_WEBHOOK_SECRET", str, "a random secret of 32 bytes or more", "",
                                  secret=True)
    """HMAC secret of the webhook provider when the gateway loads one alone; with several, each has
    its own in ``LONGRUN_WEBHOOK_SECRETS`` and this one is not used (no secret is shared across
    providers). None is built in: the gateway refuses to start without it while a lone provider has
    no secret of its own, or with one that is known or under 32 bytes."""
    webhook_secrets: tuple[tuple[str, str], ...] = setting("LONGRUN_WEBHOOK_SECRETS", parse.named_references,
                                                           "comma-separated provider=secret", "",
                                                           secret=True)
    """Providers' own HMAC secrets, ``provider=secret`` comma-separated (a secret holds no comma). The
    gateway stops when a provider it loads has none (a lone provider may take ``LONGRUN_WEBHOOK_SECRET``),
    when two providers are given the same one, and when a provider named here is not loaded."""
    webhook_replay_window: float = setting("LONGRUN_WEBHOOK_REPLAY_WINDOW", parse.duration, parse.DURATION, "5m")
    """How far the time a timestamped webhook was sent may be from the gateway's clock, either way,
    before the delivery is refused as a replay (providers that sign no time rely on dedup)."""
    max_attachment_bytes: int = setting("LONGRUN_MAX_ATTACHMENT_BYTES", parse.positive_int,
                                        "bytes, an integer >= 1", str(10 * 1024 * 1024))
    """The largest artifact an operator may attach to a run through the gateway."""
    progress_buffer: int = setting("LONGRUN_PROGRESS_BUFFER", parse.positive_int, "chunks, an integer >= 1", "256")
    """Live chunks of a run each gateway keeps for its followers (``GET /runs/{id}/events/stream``), and
    the most one follower may fall behind: past it the oldest are dropped and the follower gets a gap.
    The gateway's own queue on ``longrun.progress`` holds at most 16 times as many messages."""
    forwarded_allow_ips: str = setting("LONGRUN_FORWARDED_ALLOW_IPS", str,
                                       "comma-separated addresses or networks, * for any, or empty", "")
    """The proxies in front of the gateway (the TLS ingress) whose ``X-Forwarded-Proto`` and
    ``X-Forwarded-For`` it believes, so the console sees ``https``, sets its ``__Host-`` Secure
    cookie and builds ``https`` URLs; empty: none is believed."""
    console_secret: str = setting("LONGRUN_CONSOLE_SECRET", str, "a random secret of 32 bytes or more", "",
                                  secret=True)
    """Key the web console (``/console``) seals its session cookies and CSRF tokens with: every gateway
    replica needs the same one, and changing it ends every console session. None is built in: the
    gateway refuses to start without it, or with one that is known or under 32 bytes."""

    @staticmethod
    def conflicts(values: Mapping[str, Any]) -> list[Problem]:
        if values["webhook_port"] and values["webhook_port"] == values["gateway_port"]:
            return [("LONGRUN_WEBHOOK_PORT", f"got {values['webhook_port']}; expected 0 or a port other than "
                     "LONGRUN_GATEWAY_PORT")]
        return []
