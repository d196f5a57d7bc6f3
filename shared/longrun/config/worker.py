"""The worker: how many runs it advances, how long it holds one, and its model."""

from __future__ import annotations

from dataclasses import dataclass

from longrun.config import parse
from longrun.config.declaration import Concern, setting


def _model_kind(raw: str) -> str:
    if raw not in ("scripted", "openai"):
        raise ValueError
    return raw


@dataclass(frozen=True)
class WorkerSettings(Concern):
    """Worker: runs in hand and the model"""

    run_lease_ttl: float = setting("LONGRUN_RUN_LEASE_TTL", parse.positive_float, "seconds, a number > 0", "30")
    """Seconds a worker keeps a run without a heartbeat."""
    worker_concurrency: int = setting("LONGRUN_WORKER_CONCURRENCY", parse.positive_int, "an integer >= 1", "64")
    """Runs one worker process advances at once."""
    model: str = setting("LONGRUN_MODEL", _model_kind, "scripted or openai", "scripted")
    """Model adapter: "scripted" (deterministic demo script) or "openai" (an OpenAI-compatible server)."""
    model_url: str = setting("LONGRUN_MODEL_URL", parse.text, "an http(s) URL of an OpenAI-compatible API",
                             "http://127.0.0.1:8091/v1")
    """Base URL of the OpenAI-compatible API the worker calls when ``LONGRUN_MODEL`` is openai."""
    model_name: str = setting("LONGRUN_MODEL_NAME", parse.text, "a model name", "gpt-4o-mini")
    """Model the worker asks for at that API."""
    model_api_key: str = setting("LONGRUN_MODEL_API_KEY", parse.text, "an API key", "not-needed-locally",
                                 secret=True)
    """API key for that API; keep it in a secret."""
