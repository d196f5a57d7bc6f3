"""longrunctl, the operator's terminal: it sends no bearer token it was not given (none is built in),
and what a producer, a webhook sender or another operator put into a run or the audit log reaches the
terminal without the escape sequences that would retitle it, clear it or hide a link."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.integration.ensemble import OPERATOR_TOKEN, Ensemble
from tests.integration.runs_factory import created

pytestmark = pytest.mark.integration

LONGRUNCTL = Path(sys.executable).parent / "longrunctl"
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b[1;31mred\x1b[0m \x1b]8;;https://evil.example\x1b\\link\x1b]8;;\x1b\\\x9b31m"


async def longrunctl(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """longrunctl as an operator runs it, with no setting but those given (no file, no LONGRUN_*)."""
    quiet = {k: v for k, v in os.environ.items() if not k.startswith(("LONGRUN_", "LONGRUNCTL_"))}
    return await asyncio.to_thread(subprocess.run, [str(LONGRUNCTL), *args], capture_output=True, text=True,
                                   timeout=60, env={**quiet, "LONGRUNCTL_CONFIG": "/nonexistent", **env})


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """An HTTP server that answers every GET with an empty run list and keeps each request's headers."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
            seen.append({k.lower(): v for k, v in self.headers.items()})
            body = b'{"runs": [], "next_cursor": null}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the signature it overrides
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


@pytest.fixture
async def gateway(services, tmp_path) -> str:  # type: ignore[no-untyped-def]
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("gateway", "longrun.services.gateway")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    return ensemble.gateway_url


async def test_longrunctl_without_a_configured_token_sends_no_authorization_header(
        clean, recorder, gateway) -> None:
    url, seen = recorder
    # When longrunctl lists runs with no token configured, then with one in the environment
    without = await longrunctl("--url", url, "run", "list")
    with_token = await longrunctl("--url", url, "run", "list", LONGRUN_OPERATOR_TOKEN="lrt_configured")
    # Then the first request carried no Authorization header, and only the second carried the token
    assert (without.returncode, with_token.returncode) == (0, 0), (without.stderr, with_token.stderr)
    assert [request.get("authorization") for request in seen] == [None, "Bearer lrt_configured"]
    # and against the live gateway the tokenless call is refused as unauthenticated
    refused = await longrunctl("--url", gateway, "run", "list")
    assert refused.returncode == 1 and refused.stderr.startswith("Error: 401 Unauthorized")


async def test_what_a_run_or_the_audit_log_holds_reaches_the_terminal_without_escape_sequences(
        clean, engine, gateway) -> None:
    # Given a run whose input a producer filled with escape sequences, paused with such a reason
    stored = await created(engine, goal={"repo": HOSTILE, "title": HOSTILE})
    run_id = stored.snapshot.run_id
    async with httpx.AsyncClient(base_url=gateway) as http:
        paused = await http.post(f"/runs/{run_id}/pause", json={"reason": HOSTILE},
                                 headers={"authorization": f"Bearer {OPERATOR_TOKEN}"})
    assert paused.status_code == 200, paused.text
    # When an operator shows the run and reads the audit log, in every output format
    for output in ("table", "json", "yaml"):
        shown = [await longrunctl("--url", gateway, "--token", OPERATOR_TOKEN, "--output", output, *command)
                 for command in (("run", "show", run_id), ("audit", "--target", run_id))]
        assert [done.returncode for done in shown] == [0, 0], [done.stderr for done in shown]
        printed = "".join(done.stdout for done in shown)
        # Then the text shows, and no control character a terminal would act on
        assert "red link" in printed, printed
        controls = [c for c in printed if (ord(c) < 32 and c not in "\t\n") or 0x7F <= ord(c) <= 0x9F]
        assert controls == [], (output, controls)
