"""A replicated PostgreSQL for the failover rows: a primary and a synchronous streaming standby.

Both run from this machine's PostgreSQL binaries as their own servers, on free ports and under a
test's directory; the machine's own cluster is not touched. The primary commits only once the
standby has applied the commit (``synchronous_commit = remote_apply``), which is the production
setting ``docs/deployment.md`` names: a promoted standby has every commit a client saw.

Servers are started and stopped with ``pg_ctl`` as the ``postgres`` user (it refuses root); a kill
is a SIGKILL of the postmaster by its PID, which leaves a System V shared-memory segment behind
that ``stop`` removes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.ports import free_port

from sqlalchemy.engine import URL

STANDBY_NAME = "standby1"


def _bin(name: str) -> str:
    for version in sorted(os.listdir("/usr/lib/postgresql"), reverse=True):
        path = Path("/usr/lib/postgresql", version, "bin", name)
        if path.exists():
            return str(path)
    raise RuntimeError(f"no PostgreSQL {name} under /usr/lib/postgresql")


def available() -> str | None:
    """Why a pair cannot be started here, or None."""
    if not Path("/usr/lib/postgresql").is_dir():
        return "needs PostgreSQL's server binaries (/usr/lib/postgresql/<version>/bin)"
    if shutil.which("runuser") is None or subprocess.run(["id", "postgres"], capture_output=True).returncode:
        return "needs runuser and a postgres user to run the servers as"
    return None


def _as_postgres(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", "postgres", "--", *args], capture_output=True, text=True, check=True,
                          timeout=120)


class PgPair:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.primary = root / "primary"
        self.standby = root / "standby"
        self.primary_port = free_port()
        self.standby_port = free_port()

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        shutil.chown(self.root, "postgres", "postgres")
        _as_postgres(_bin("initdb"), "-D", str(self.primary), "-U", "postgres", "-A", "trust", "--no-sync")
        self._configure(self.primary, self.primary_port,
                        f"synchronous_standby_names = 'FIRST 1 ({STANDBY_NAME})'\nsynchronous_commit = remote_apply\n")
        self._pg_ctl(self.primary, "start")
        _as_postgres(_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.primary_port), "-U", "postgres",
                     "-D", str(self.standby), "-R", "-X", "stream", "-C", "-S", "standby1_slot")
        # The standby, once promoted, must not wait for a standby of its own on every commit.
        self._configure(self.standby, self.standby_port,
                        f"cluster_name = '{STANDBY_NAME}'\nsynchronous_standby_names = ''\n")
        self._pg_ctl(self.standby, "start")
        self._wait_synchronous()

    def url(self, database: str = "postgres", *, both: bool = True) -> str:
        """The SQLAlchemy URL of the pair (``both``), or of the primary alone."""
        hosts = [f"127.0.0.1:{self.primary_port}"] + ([f"127.0.0.1:{self.standby_port}"] if both else [])
        return URL.create("postgresql+psycopg", username="postgres", database=database, query={
            "host": hosts, "target_session_attrs": "read-write", "connect_timeout": "2"}
        ).render_as_string(hide_password=False)

    def kill_primary(self) -> None:
        pid = int((self.primary / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)

    def promote(self) -> None:
        self._pg_ctl(self.standby, "promote")

    def stop(self) -> None:
        for data in (self.standby, self.primary):
            if (data / "postmaster.pid").exists():
                subprocess.run(["runuser", "-u", "postgres", "--", _bin("pg_ctl"), "-D", str(data), "-m",
                                "immediate", "-w", "stop"], capture_output=True, timeout=60)
            self._remove_shared_memory(data)
        shutil.rmtree(self.root, ignore_errors=True)

    def _configure(self, data: Path, port: int, extra: str) -> None:
        with open(data / "postgresql.conf", "a") as conf:
            conf.write(f"port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.root}'\n"
                       f"fsync = off\nmax_connections = 200\n{extra}")

    def _pg_ctl(self, data: Path, action: str) -> None:
        _as_postgres(_bin("pg_ctl"), "-D", str(data), "-l", str(data.with_suffix(".log")), "-w", action)

    def _wait_synchronous(self, timeout: float = 30) -> None:
        """The standby reads ``async`` for about a second after it connects; a commit then is not yet safe."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = _as_postgres(_bin("psql"), "-h", "127.0.0.1", "-p", str(self.primary_port), "-U", "postgres",
                                 "-Atc", "SELECT sync_state FROM pg_stat_replication").stdout.strip()
            if state == "sync":
                return
            time.sleep(0.2)
        raise RuntimeError(f"the standby did not become synchronous in {timeout} s")

    @staticmethod
    def _remove_shared_memory(data: Path) -> None:
        """A SIGKILLed postmaster leaves its segment, keyed by its data directory's inode."""
        if not data.exists():
            return
        key = f"0x{data.stat().st_ino:08x}"
        listing = subprocess.run(["ipcs", "-m"], capture_output=True, text=True).stdout
        if any(line.split()[:1] == [key] for line in listing.splitlines()):
            subprocess.run(["ipcrm", "-M", key], capture_output=True)
