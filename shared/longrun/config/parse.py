"""Parsers of variables' text shared by several concerns; each raises ValueError on a bad value."""

from __future__ import annotations

from urllib.parse import urlsplit

DURATION = "a duration: seconds, or a number with a unit s, m, h or d (e.g. 30d)"

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(raw: str) -> float:
    """Seconds, or a number with a unit: ``90s``, ``15m``, ``12h``, ``30d``."""
    text = raw.strip()
    unit = _UNITS.get(text[-1:].lower()) if text else None
    value = float(text[:-1] if unit else text) * (unit or 1)
    if not 0 < value < float("inf"):
        raise ValueError
    return value


def positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError
    return value


def optional_count(raw: str) -> int | None:
    """An integer >= 0, or empty: none (unlimited)."""
    if not raw.strip():
        return None
    value = int(raw)
    if value < 0:
        raise ValueError
    return value


def optional_amount(raw: str) -> float | None:
    """A finite number >= 0, or empty: none (unlimited)."""
    if not raw.strip():
        return None
    value = float(raw)
    if not 0 <= value < float("inf"):
        raise ValueError
    return value


def port(raw: str) -> int:
    value = int(raw)
    if not 0 <= value <= 65535:
        raise ValueError
    return value


def positive_float(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise ValueError
    return value


def non_negative_float(raw: str) -> float:
    value = float(raw)
    if not 0 <= value < float("inf"):
        raise ValueError
    return value


def at_least_one_float(raw: str) -> float:
    value = float(raw)
    if not 1 <= value < float("inf"):
        raise ValueError
    return value


def finite_float(raw: str) -> float:
    value = float(raw)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError
    return value


def switch(raw: str) -> bool:
    if raw.strip().lower() not in ("true", "false"):
        raise ValueError
    return raw.strip().lower() == "true"


def text(raw: str) -> str:
    if not raw.strip():
        raise ValueError
    return raw


def word(raw: str) -> str:
    """One word (a host name, a claim name): stripped, non-empty, no space inside."""
    if not raw.strip() or any(c.isspace() for c in raw.strip()):
        raise ValueError
    return raw.strip()


def optional_url(raw: str) -> str:
    """An http(s) URL, or nothing ("": the feature it configures is off)."""
    if raw.strip() and urlsplit(raw.strip()).scheme not in ("http", "https"):
        raise ValueError
    return raw.strip()


def name_list(raw: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in raw.split(",") if t.strip())


PROTECTIONS = ("publisher-confirms",)
"""What a fault test may switch off (``longrun.faults.protected``)."""


def protections(raw: str) -> tuple[str, ...]:
    names = name_list(raw)
    unknown = [n for n in names if n not in PROTECTIONS]
    if unknown:
        raise ValueError(f"unknown protection(s) {', '.join(unknown)}; known: {', '.join(PROTECTIONS)}")
    return names


def bootstrap_tokens(raw: str) -> tuple[str, ...] | None:
    """Comma-separated tokens; ``off``: none, deliberately; empty: not set (None)."""
    if raw.strip().lower() == "off":
        return ()
    return name_list(raw) or None


def named_references(raw: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in name_list(raw):
        name, equals, reference = (part.strip() for part in item.partition("="))
        if not equals or not name or not reference:
            raise ValueError
        pairs.append((name, reference))
    return tuple(pairs)
