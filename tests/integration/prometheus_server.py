"""A real Prometheus server (Debian's package, ``make tools``) for a test: scraping the given targets
every second, evaluating the given rules every second, queried over its HTTP API; stopped by PID."""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.fixtures import eventually
from tests.ports import free_port


class PrometheusServer:
    def __init__(self, tmp: Path, targets: dict[str, list[int]], rules: dict[str, Any]) -> None:
        """``targets``: service label -> the health ports of its processes on 127.0.0.1."""
        binary = shutil.which("prometheus")
        assert binary is not None, ("prometheus is missing: `make tools` (infra/local/ensure-tools.sh) installs "
                                    "Debian's prometheus package")
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "rules.yml").write_text(yaml.safe_dump(rules))
        (tmp / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(tmp / "rules.yml")],
            "scrape_configs": [{"job_name": "longrun", "static_configs": [
                {"targets": [f"127.0.0.1:{port}" for port in ports], "labels": {"service": service}}
                for service, ports in targets.items()]}]}))
        self.url = f"http://127.0.0.1:{free_port()}"
        self._log = (tmp / "prometheus.log").open("wb")
        self.popen = subprocess.Popen(
            [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address={self.url.removeprefix('http://')}"],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self.log_path = tmp / "prometheus.log"

    async def ready(self) -> None:
        async def answers() -> bool:
            assert self.popen.poll() is None, self.log_path.read_text()
            try:
                async with httpx.AsyncClient(timeout=1) as http:
                    return (await http.get(f"{self.url}/-/ready")).status_code == 200
            except httpx.HTTPError:
                return False

        await eventually(answers, timeout=30, what="prometheus ready")

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar, as one sample) ``expr`` gives now; a query error fails."""
        async with httpx.AsyncClient(timeout=10) as http:
            answer = (await http.get(f"{self.url}/api/v1/query", params={"query": expr})).json()
        assert answer["status"] == "success", (expr, answer)
        data = answer["data"]
        return data["result"] if data["resultType"] == "vector" else [{"metric": {}, "value": data["result"]}]

    async def alerts(self) -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=10) as http:
            return (await http.get(f"{self.url}/api/v1/alerts")).json()["data"]["alerts"]  # type: ignore[no-any-return]

    async def targets_up(self) -> bool:
        async with httpx.AsyncClient(timeout=10) as http:
            active = (await http.get(f"{self.url}/api/v1/targets")).json()["data"]["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        self._log.close()
