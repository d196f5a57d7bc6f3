"""longrunctl sends a bearer token only when one is configured: none is built in."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from longrun_client import ctl


@pytest.mark.parametrize(("token", "sent"), [(None, None), ("lrt_abc", "Bearer lrt_abc")])
def test_longrunctl_sends_an_authorization_header_only_with_a_configured_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, token: str | None, sent: str | None) -> None:
    monkeypatch.delenv("LONGRUN_OPERATOR_TOKEN", raising=False)
    ctx = click.Context(ctl.main, obj=ctl._settings(str(tmp_path / "absent.toml"), {"token": token}))
    with ctl._client(ctx) as client:
        assert client.headers.get("authorization") == sent
