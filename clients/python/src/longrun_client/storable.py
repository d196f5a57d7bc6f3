"""Text PostgreSQL can keep. JSON may carry U+0000 and lone surrogates (``"\\u0000"``, ``"\\ud800"``), and
an AMQP header or property may carry U+0000, yet PostgreSQL's ``text`` and ``jsonb`` refuse both: a
message holding them would fail at every write. ``unstorable`` finds them, so that what must be
read is refused at the door with where they are; ``storable`` replaces them, for what must be kept
whatever it holds (a quarantined message's headers, the reason it was refused)."""

from __future__ import annotations

from typing import Any


def unstorable(value: Any, where: str = "") -> str | None:
    """Where in a JSON value (``payload['input']``) the first string PostgreSQL cannot store is, key or
    value; None when there is none."""
    if isinstance(value, str):
        return (where or "<root>") if _refused(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{where}[{key!r}]"
            if isinstance(key, str) and _refused(key):
                return f"the key {here}"
            found = unstorable(item, here)
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = unstorable(item, f"{where}[{i}]")
            if found is not None:
                return found
    return None


def storable(text: str) -> str:
    """``text`` with U+0000 written ``\\x00`` and a lone surrogate as its escape (``\\ud800``)."""
    if not _refused(text):
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def storable_json(value: Any) -> Any:
    """``storable`` applied to every key and string of a JSON value."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, dict):
        return {storable(k) if isinstance(k, str) else k: storable_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable_json(v) for v in value]
    return value


def _refused(text: str) -> bool:
    if "\x00" in text:
        return True
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
