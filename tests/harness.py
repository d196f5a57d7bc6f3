"""Start real service processes for tests, and end only those, by PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.infra import Infra

ROOT = Path(__file__).resolve().parent.parent


class Process:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log_path = log
        self._log = log.open("ab")
        self.popen = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup, exactly like a crashed pod."""
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
        self.popen.wait(timeout=30)

    def terminate(self, timeout: float = 20) -> None:
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        self._log.close()


class Services:
    def __init__(self, infra: Infra, logs: Path, *, partitions: int, delivery_limit: int) -> None:
        self.infra = infra
        self.logs = logs
        self.partitions = partitions
        self.delivery_limit = delivery_limit
        self.started: list[Process] = []

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LONGRUN_")}
        env.update({
            "LONGRUN_DATABASE_URL": self.infra.database_url,
            "LONGRUN_AMQP_URL": self.infra.amqp_url,
            "LONGRUN_PARTITIONS": str(self.partitions),
            "LONGRUN_DELIVERY_LIMIT": str(self.delivery_limit),
            "LONGRUN_PARTITION_LEASE_TTL": "3",
            "LONGRUN_RELAY_POLL_INTERVAL": "0.5",
            "LONGRUN_LOG_LEVEL": "INFO",
            "PYTHONPATH": str(ROOT),
        })
        env.update(extra)
        return env

    def start(self, name: str, module: str, *, argv_extra: list[str] | None = None, **env: str) -> Process:
        index = sum(1 for p in self.started if p.name.startswith(name))
        label = f"{name}-{index}"
        env.setdefault("LONGRUN_INSTANCE_ID", label)
        argv = [sys.executable, "-m", module, *(argv_extra or [])]
        proc = Process(label, argv, self.env(**env), self.logs / f"{label}.log")
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.started:
            if proc.alive():
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            proc.terminate(timeout=10)
            proc.close()

    def dump(self) -> str:
        return "\n".join(f"===== {p.name} =====\n{p.output()[-4000:]}" for p in self.started)
