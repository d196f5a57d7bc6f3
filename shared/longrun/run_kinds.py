"""The run kinds a deployment runs, loaded from configuration, so authors bring their own without
editing longrun.

Two sources, both read by every service that needs run kinds (worker, scheduler, timer, reconciler,
gateway): the references in ``LONGRUN_RUN_KINDS`` (``package.module:attribute``, comma-separated),
and the ``longrun.run_kinds`` entry points of the installed distributions. A reference names a
``RunKind``, a sequence of them, or a function of the ``Settings`` returning either (where tools
need configuration: a client's URL, a timeout). A reference that cannot be loaded stops the process
with a ``ConfigError`` naming where it came from, the reference and why.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from longrun.authoring import Registry, RunKind
from longrun.config import Settings
from longrun.errors import ConfigError

VARIABLE = "LONGRUN_RUN_KINDS"
ENTRY_POINT_GROUP = "longrun.run_kinds"


def load(settings: Settings) -> Registry:
    """Every run kind the configuration names, at every version; ``ConfigError`` when none is named."""
    registry = Registry()
    for reference in settings.run_kinds:
        _add(registry, import_reference(reference, VARIABLE), reference, VARIABLE, settings)
    for installed in installed_entry_points(ENTRY_POINT_GROUP):
        _add(registry, installed.target, installed.reference, installed.where, settings)
    if not registry.advertised():
        raise ConfigError([(VARIABLE, f"no run kinds: name at least one (package.module:attribute) here or "
                                      f"install a distribution with a {ENTRY_POINT_GROUP} entry point")])
    return registry


@dataclass(frozen=True, slots=True)
class Installed:
    name: str
    reference: str
    where: str
    """The entry point and its distribution, for errors."""
    target: Any


def installed_entry_points(group: str) -> list[Installed]:
    """What the installed distributions' entry points of ``group`` name, loaded; ``ConfigError`` naming
    the entry point and its distribution when one cannot be."""
    loaded = []
    for point in entry_points(group=group):
        where = f"entry point {point.name} ({group}) of {point.dist.name if point.dist else '?'}"
        try:
            target = point.load()
        except Exception as e:
            raise ConfigError([(where, f"{point.value!r} cannot be loaded: {e!r}")]) from e
        loaded.append(Installed(point.name, point.value, where, target))
    return loaded


def import_reference(reference: str, where: str) -> Any:
    """The object ``package.module:attribute`` names; ``ConfigError`` naming ``where`` and why not."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ConfigError([(where, f"{reference!r} is not package.module:attribute")])
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise ConfigError([(where, f"{reference!r}: cannot import {module_name}: {e!r}")]) from e
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ConfigError([(where, f"{reference!r}: {module_name} has no attribute {attribute!r}")]) from None


def _add(registry: Registry, target: Any, reference: str, where: str, settings: Settings) -> None:
    if callable(target) and not isinstance(target, RunKind):
        try:
            target = target(settings)
        except ConfigError as e:  # a setting of the package's own, named as it named it
            raise ConfigError([(variable, f"{why} (read by {reference!r}, {where})")
                               for variable, why in e.problems]) from e
        except Exception as e:
            raise ConfigError([(where, f"{reference!r} failed to build its run kinds: {e!r}")]) from e
    kinds = [target] if isinstance(target, RunKind) else target
    if not isinstance(kinds, Iterable) or not all(isinstance(k, RunKind) for k in kinds):
        raise ConfigError([(where, f"{reference!r} is neither a RunKind nor a sequence of them "
                                   f"(nor a function of the Settings returning one): got {type(target).__name__}")])
    for kind in kinds:
        try:
            registry.add(kind)
        except ValueError as e:
            raise ConfigError([(where, f"{reference!r}: {e}")]) from e
