"""Start real service processes for tests, and end only those, by PID."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
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

    def wait_dead(self, timeout: float) -> int:
        """Wait for the process to end on its own (e.g. at an armed crash point); its return code."""
        return self.popen.wait(timeout=timeout)

    def crashed_at(self, point: str) -> bool:
        """Died by SIGKILL at the named crash point (``longrun.faults``), not of anything else."""
        return self.popen.poll() == -signal.SIGKILL and f"crash point {point} reached" in self.output()

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


SECRETS = {name: secrets.token_urlsafe(32)
           for name in ("LONGRUN_OPERATOR_TOKENS", "LONGRUN_WEBHOOK_SECRET", "LONGRUN_CONSOLE_SECRET")}
"""The gateway's secrets for this test session, drawn at random as a deployment's must be: the
gateway refuses to start with a missing, known or short one."""


class Services:
    def __init__(self, infra: Infra, logs: Path, *, partitions: int, delivery_limit: int) -> None:
        self.infra = infra
        self.logs = logs
        self.partitions = partitions
        self.delivery_limit = delivery_limit
        self.started: list[Process] = []

    def env(self, *, with_secrets: bool = True, **extra: str) -> dict[str, str]:
        """A service's environment; ``with_secrets=False`` leaves the gateway's secrets out, as the
        Kubernetes manifests give them to no other service."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("LONGRUN_")}
        if with_secrets:
            env.update(SECRETS)
        env.update({
            "LONGRUN_DATABASE_URL": self.infra.database_url,
            "LONGRUN_AMQP_URL": self.infra.amqp_url,
            "LONGRUN_RABBITMQ_MANAGEMENT_URL": self.infra.management_url,
            "LONGRUN_PARTITIONS": str(self.partitions),
            "LONGRUN_DELIVERY_LIMIT": str(self.delivery_limit),
            "LONGRUN_PARTITION_LEASE_TTL": "3",
            # A worker stopped with a call in hand lets it finish for 2 s, not 30: inside stop_all's wait.
            "LONGRUN_WORKER_STOP_GRACE": "2",
            # Workers publish their own rows (eager publish, off by default), and what they could not
            # goes out through the relay soon after.
            "LONGRUN_EAGER_PUBLISH_GRACE": "2",
            "LONGRUN_RELAY_POLL_INTERVAL": "0.5",
            "LONGRUN_LOG_LEVEL": "INFO",
            # The test's own store: a reconciler's orphan sweep must never reach another session's files.
            "LONGRUN_ARTIFACT_DIR": str(self.logs / "artifacts"),
            # The tree under test first (a copy of the repository, for mutation runs, included).
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "shared")]),
        })
        env.update(extra)
        return env

    def start(self, name: str, module: str, *, argv_extra: list[str] | None = None,
              clock_skew: float | None = None, with_secrets: bool = True, **env: str) -> Process:
        """Start ``python -m module`` as ``<name>-<n>``; ``clock_skew`` seconds shift its wall clock."""
        index = sum(1 for p in self.started if p.name.startswith(name))
        label = f"{name}-{index}"
        env.setdefault("LONGRUN_INSTANCE_ID", label)
        if clock_skew is not None:
            env["LONGRUN_CLOCK_SKEW"] = str(clock_skew)
        argv = [sys.executable, "-m", module, *(argv_extra or [])]
        proc = Process(label, argv, self.env(with_secrets=with_secrets, **env), self.logs / f"{label}.log")
        self.started.append(proc)
        return proc

    def stop_all(self, timeout: float = 10) -> None:
        """SIGTERM every process started here at once (after SIGCONT, for paused ones), wait for them
        together, SIGKILL what is still there after ``timeout``."""
        for proc in self.started:
            if proc.alive():
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                    os.kill(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for proc in self.started:
            try:
                proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
            proc.close()

    def dump(self) -> str:
        return "\n".join(f"===== {p.name} =====\n{p.output()[-4000:]}" for p in self.started)
