"""Typed settings, read once from ``LONGRUN_*`` variables.

This is the only package that reads the environment. Each concern declares its settings in its
own module (a field, its variable and its docstring together; see ``declaration.py``), and
:class:`Settings` is every concern's settings in one value. To add a setting, add a field to its
concern's class; to add a concern, add a module and list its class among Settings' bases. A bad or
missing value is reported together with every other bad value, naming each variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import Field, dataclass, fields
from pathlib import Path
from typing import Any

from longrun.config.admission import AdmissionSettings
from longrun.config.artifacts import ArtifactSettings
from longrun.config.bus import DEFAULT_AMQP_URL, BusSettings
from longrun.config.calls import CallSettings
from longrun.config.declaration import Concern, Problem, Variable, variable
from longrun.config.extensions import ExtensionSettings
from longrun.config.faults import FaultSettings
from longrun.config.gateway import GatewaySettings
from longrun.config.identity import IdentitySettings
from longrun.config.observability import ObservabilitySettings, apply_opentelemetry_variables
from longrun.config.process import ProcessSettings
from longrun.config.rate_limits import RateLimitSettings
from longrun.config.reconciler import ReconcilerSettings
from longrun.config.retention import RetentionSettings
from longrun.config.storage import DEFAULT_DATABASE_URL, StorageSettings
from longrun.config.timers import TimerSettings
from longrun.config.worker import WorkerSettings
from longrun.errors import ConfigError

__all__ = ["DEFAULT_AMQP_URL", "DEFAULT_DATABASE_URL", "Settings"]


@dataclass(frozen=True)
class Settings(StorageSettings, ArtifactSettings, BusSettings, ProcessSettings, ObservabilitySettings,
               AdmissionSettings, WorkerSettings, CallSettings, TimerSettings, ReconcilerSettings, RetentionSettings,
               RateLimitSettings, GatewaySettings, IdentitySettings, ExtensionSettings, FaultSettings):
    """Process-wide settings; build with :meth:`from_env`."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Parse every variable; raise ConfigError listing all problems at once."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        problems: list[Problem] = []
        for field in declared_fields():
            spec = variable(field)
            assert spec is not None, f"Settings.{field.name} is declared without setting()"
            name = spec.standard if spec.standard and env.get(spec.standard) else spec.env
            raw, unread = _raw(env, spec, name)
            if unread is not None:
                problems.append(unread)
                continue
            if raw is None:
                problems.append((name, f"missing; expected {spec.expected}"))
                continue
            try:
                values[field.name] = spec.parse(raw)
            except ValueError:
                shown = "a value that is not one (not shown: it is a secret)" if spec.secret else repr(raw)
                problems.append((name, f"got {shown}; expected {spec.expected}"))
        problems += apply_opentelemetry_variables(env, values)
        if not problems:
            for concern in concerns():
                problems += concern.conflicts(values)
        if problems:
            raise ConfigError(problems)
        return cls(**values)

    @staticmethod
    def variables() -> dict[str, str]:
        """Every variable with what it expects (for docs and manifests), a secret's file variable too."""
        specs = [spec for spec in map(variable, declared_fields()) if spec]
        return {**{spec.env: spec.expected for spec in specs},
                **{spec.file_env: f"a file holding {spec.expected}" for spec in specs if spec.secret}}


def _raw(env: Mapping[str, str], spec: Variable, name: str) -> tuple[str | None, Problem | None]:
    """The text of ``spec``'s variable (``name``), or its default; for a secret whose ``<env>_FILE`` is
    set, that file's content without its final line break (a mounted secret), never both."""
    path = env.get(spec.file_env) if spec.secret else None
    if not path:
        return env.get(name, spec.default), None
    if spec.env in env:
        return None, (spec.file_env, f"set together with {spec.env}; expected one of them")
    try:
        return Path(path).read_text().removesuffix("\n").removesuffix("\r"), None
    except OSError as e:
        return None, (spec.file_env, f"cannot read {path} ({e.strerror}); expected a readable file holding "
                                     f"{spec.expected}")


def concerns() -> tuple[type[Concern], ...]:
    """Every concern's settings class, in the order Settings lists them."""
    return Settings.__bases__


def declared_fields() -> list[Field[Any]]:
    """Every setting's field, concern by concern."""
    return [field for concern in concerns() for field in fields(concern)]
