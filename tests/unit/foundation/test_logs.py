"""Log records: JSON lines naming the service and, where known, the run, the tenant and the span."""

from __future__ import annotations

import io
import json
import logging

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from longrun import logs


@pytest.fixture
def written() -> io.StringIO:
    stream = io.StringIO()
    root = logging.getLogger()
    kept, level = list(root.handlers), root.level
    yield stream
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in kept:
        root.addHandler(handler)
    root.setLevel(level)


def test_a_record_written_for_a_run_inside_a_span_is_a_json_line_naming_both(written: io.StringIO) -> None:
    logs.setup("worker", level="INFO", format="json", stream=written)
    span = TracerProvider().get_tracer("t").start_span("step")
    log = logging.getLogger("longrun.tests")
    log.info("outside any run")
    with logs.bound("run-1", "acme"), trace.use_span(span):
        log.warning("step %d", 3)
    lines = [json.loads(line) for line in written.getvalue().splitlines()]
    assert lines[0] == {"timestamp": lines[0]["timestamp"], "level": "INFO", "service": "worker",
                        "logger": "longrun.tests", "message": "outside any run"}
    context = span.get_span_context()
    assert lines[1] | {"timestamp": None} == {
        "timestamp": None, "level": "WARNING", "service": "worker", "logger": "longrun.tests", "message": "step 3",
        "run_id": "run-1", "tenant": "acme", "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}"}


def test_a_failure_s_traceback_stays_inside_its_json_line(written: io.StringIO) -> None:
    logs.setup("timer", level="INFO", format="json", stream=written)
    try:
        raise ValueError("broken")
    except ValueError:
        logging.getLogger("longrun.tests").exception("round failed")
    (line,) = written.getvalue().splitlines()
    assert "ValueError: broken" in json.loads(line)["exception"]


def test_text_is_for_people_at_a_terminal(written: io.StringIO) -> None:
    logs.setup("gateway", level="INFO", format="text", stream=written)
    with logs.bound("run-2", "beta"):
        logging.getLogger("longrun.tests").info("hello")
    assert written.getvalue().rstrip().endswith("INFO gateway longrun.tests: hello [run_id=run-2 tenant=beta]")


def test_auto_writes_json_unless_a_terminal_reads_it(written: io.StringIO) -> None:
    logs.setup("scheduler", level="INFO", format="auto", stream=written)
    logging.getLogger("longrun.tests").info("piped")
    assert json.loads(written.getvalue())["message"] == "piped"
