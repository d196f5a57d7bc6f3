"""Log records as JSON lines, each saying which service wrote it and, where known, which run,
tenant and span it was written for.

``setup`` installs one stderr handler for the process. Its records are JSON objects, one a line
(``timestamp``, ``level``, ``service``, ``logger``, ``message``, and ``run_id``, ``tenant``,
``trace_id``, ``span_id`` when known, ``exception`` with a traceback), or readable text when
``LONGRUN_LOG_FORMAT=text``, or ``auto`` and stderr is a terminal. The run comes from
``bound`` (a context variable: a task started inside inherits it, and each task has its own); the trace and
span from the current OpenTelemetry span, which is there whenever a message carried a
traceparent, spans exported or not. Nothing is computed for a record that is not written.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TextIO

from opentelemetry import trace
from pythonjsonlogger.json import JsonFormatter

FORMATS = ("auto", "json", "text")
_FIELDS = ("run_id", "tenant", "trace_id", "span_id")
_run: ContextVar[tuple[str | None, str | None]] = ContextVar("longrun_run", default=(None, None))


@contextmanager
def bound(run_id: str | None, tenant: str | None) -> Iterator[None]:
    """Records written inside name this run and tenant."""
    token = _run.set((run_id, tenant))
    try:
        yield
    finally:
        _run.reset(token)


class _Context(logging.Filter):
    """Adds the service, the run and the current span to every record the handler writes."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def filter(self, record: logging.LogRecord) -> bool:
        record.service = self.service
        record.run_id, record.tenant = _run.get()
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id, record.span_id = f"{context.trace_id:032x}", f"{context.span_id:016x}"
        else:
            record.trace_id = record.span_id = None
        return True


class _Json(JsonFormatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(service)s %(name)s %(message)s",
                         rename_fields={"asctime": "timestamp", "levelname": "level", "name": "logger",
                                        "exc_info": "exception"},
                         timestamp=False, json_ensure_ascii=False)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - logging's name
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"

    def add_fields(self, log_record: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]) -> None:
        super().add_fields(log_record, record, message_dict)
        for name in _FIELDS:
            if log_record.get(name) is None:
                log_record.pop(name, None)
        log_record.pop("color_message", None)  # uvicorn's terminal copy of the message


class _Text(logging.Formatter):
    """What a person reads at a terminal: the line, then what is known of the run."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(service)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        known = [f"{name}={getattr(record, name)}" for name in ("run_id", "tenant", "trace_id")
                 if getattr(record, name, None) is not None]
        if not known:
            return line
        first, newline, rest = line.partition("\n")
        return f"{first} [{' '.join(known)}]{newline}{rest}"


def setup(service: str, *, level: str, format: str, stream: TextIO | None = None) -> None:  # noqa: A002
    """Send this process's records to ``stream`` (stderr) as ``format`` says (one of ``FORMATS``)."""
    stream = sys.stderr if stream is None else stream
    if format == "auto":
        format = "text" if stream.isatty() else "json"  # noqa: A001
    handler = logging.StreamHandler(stream)
    handler.addFilter(_Context(service))
    handler.setFormatter(_Json() if format == "json" else _Text())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("aiormq").setLevel(logging.WARNING)
    logging.getLogger("aio_pika").setLevel(logging.WARNING)
