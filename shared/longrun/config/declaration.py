"""How a setting is declared: a field of a concern's settings, read from one ``LONGRUN_*`` variable.

A setting is one line and its docstring in the module of its concern::

    timer_batch: int = setting("LONGRUN_TIMER_BATCH", parse.positive_int, "an integer >= 1", "500")
    \"\"\"Due timers the timer service fires per transaction. ...\"\"\"

The variable, its parser, what it expects (said in a bad value's message and the reference) and its
default live in the field's metadata; the docstring is the setting's description in
docs/configuration.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field
from typing import Any

Problem = tuple[str, str]
"""A variable and what is wrong with it."""

_VARIABLE = "longrun.variable"


@dataclass(frozen=True, slots=True)
class Variable:
    env: str
    parse: Callable[[str], Any]
    """Turns the raw text into the setting's value; raises ValueError on a bad one."""
    expected: str
    default: str | None
    """None: the variable must be set."""
    standard: str | None = None
    """A standard variable (OpenTelemetry's) that, when set, wins over ``env``."""
    secret: bool = False
    """A secret: it may come from the file ``<env>_FILE`` names (a mounted secret), and a bad value's
    message never shows it."""

    @property
    def file_env(self) -> str:
        """The variable naming the file a secret may be read from."""
        return self.env + FILE_SUFFIX


FILE_SUFFIX = "_FILE"


def setting(env: str, parse: Callable[[str], Any], expected: str, default: str | None,
            standard: str | None = None, *, secret: bool = False) -> Any:
    """A settings field read from ``env`` (a ``secret`` also from the file ``<env>_FILE`` names)."""
    return field(metadata={_VARIABLE: Variable(env, parse, expected, default, standard, secret)})


def variable(f: Field[Any]) -> Variable | None:
    """The variable a field is read from; None for a field declared without :func:`setting`."""
    return f.metadata.get(_VARIABLE)


def declared_variable(concern: type[Concern], name: str) -> Variable:
    """The variable a concern's field ``name`` is read from."""
    found = variable(concern.__dataclass_fields__[name])  # type: ignore[attr-defined]
    assert found is not None, f"{concern.__name__}.{name} is declared without setting()"
    return found


class Concern:
    """The settings of one concern: a frozen dataclass of :func:`setting` fields deriving from this."""

    @staticmethod
    def conflicts(values: Mapping[str, Any]) -> list[Problem]:
        """Problems between this concern's variables that are each valid on their own (none by default);
        ``values`` holds every setting by field name."""
        return []
