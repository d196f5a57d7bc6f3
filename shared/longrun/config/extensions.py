"""Where run kinds and webhook providers are loaded from."""

from __future__ import annotations

from dataclasses import dataclass

from longrun.config import parse
from longrun.config.declaration import Concern, setting


@dataclass(frozen=True)
class ExtensionSettings(Concern):
    """Extensions: run kinds and webhook providers"""

    run_kinds: tuple[str, ...] = setting("LONGRUN_RUN_KINDS", parse.name_list,
                                         "comma-separated package.module:attribute references",
                                         "longrun.workflows:builtin")
    """Where the run kinds come from: ``package.module:attribute`` references, comma-separated, each a
    ``RunKind``, a sequence of them or a function of the Settings returning either; installed
    distributions' ``longrun.run_kinds`` entry points are loaded too (``longrun.run_kinds``). The gateway
    loads the same kinds as the scheduler: it admits the runs created over HTTP (``POST /runs``)."""
    webhook_providers: tuple[tuple[str, str], ...] = setting("LONGRUN_WEBHOOK_PROVIDERS", parse.named_references,
                                                             "comma-separated name=package.module:attribute", "")
    """Webhook providers by name (``POST /webhooks/<name>``): ``name=package.module:attribute``,
    comma-separated, each a ``longrun.ports.webhooks.Provider``; installed
    distributions' ``longrun.webhook_providers`` entry points are loaded too."""
