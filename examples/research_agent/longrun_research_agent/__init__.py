"""An example research agent for longrun, written with Pydantic AI: it reads a topic's notes, asks an
editor to approve the exact report it wants to write, writes it, and answers with what it did.

Its run kind is ``run_kinds`` (``LONGRUN_RUN_KINDS=longrun_research_agent:run_kinds``; its library is
the directory ``RESEARCH_LIBRARY``). Its model is a Pydantic AI ``FunctionModel`` (``offline_model``),
so it runs without a model endpoint.
"""

from __future__ import annotations

import os
from pathlib import Path

from longrun.authoring import RunKind
from longrun.config import Settings
from longrun.errors import ConfigError
from longrun_research_agent.agent import research_kind
from longrun_research_agent.library import library_tools

LIBRARY = "RESEARCH_LIBRARY"


def run_kinds(settings: Settings) -> list[RunKind]:
    """The ``research`` kind, its library the directory ``RESEARCH_LIBRARY`` names."""
    root = os.environ.get(LIBRARY)
    if not root or not Path(root).is_dir():
        raise ConfigError([(LIBRARY, f"expected the library's directory (notes/<topic>.md, reports/), got {root!r}")])
    return [research_kind(*library_tools(Path(root)))]
