"""What every phase shares: knobs, percentiles, child processes by PID, /proc sampling."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    return float(raw) if raw else default


@dataclass(frozen=True)
class Knobs:
    """Sizes of every phase; ``BENCH_QUICK=1`` shrinks them to a ~3-minute smoke run."""

    quick: bool
    steps: int
    """K: tool steps per run (every peer runs the same K)."""
    inflight: int
    """N: runs/workflows in flight (longrun: the tenant's slots)."""
    runs: int
    """M: runs per saturation measurement."""
    lone: int
    """Sequential lone runs whose latency is reported."""
    workers: int
    """Worker replicas of the ensemble phase (lone, saturation, half load)."""
    replicas: tuple[int, ...]
    """Worker replica counts of the scale phase."""
    half_load_seconds: float
    timers: int
    parked: int
    idle_seconds: float
    """How long the worker is watched with the runs parked."""
    limit_seconds: float
    """Duration of each limit measurement."""
    pg_clients: tuple[int, ...]
    limited_calls: int
    """Rate-limited calls timed one after the other, and as many again at once (``bench.rate_limited``)."""
    partitions: int
    lease_ttl: float
    worker_concurrency: int
    log_level: str
    phases: tuple[str, ...]

    @classmethod
    def from_env(cls) -> Knobs:
        quick = os.environ.get("BENCH_QUICK", "") not in ("", "0", "false", "no")
        phases = tuple(p.strip() for p in os.environ.get("BENCH_PHASES", "").split(",") if p.strip()) or ALL_PHASES
        unknown = set(phases) - set(ALL_PHASES) - set(ON_DEMAND_PHASES)
        if unknown:
            raise SystemExit(f"BENCH_PHASES: unknown {sorted(unknown)}; known: "
                             f"{', '.join(ALL_PHASES + ON_DEMAND_PHASES)}")
        replicas = tuple(int(r) for r in os.environ.get("BENCH_REPLICAS", "1,2,4").split(",") if r.strip())
        return cls(
            quick=quick,
            steps=_env_int("BENCH_STEPS", 3),
            inflight=_env_int("BENCH_INFLIGHT", 64),
            runs=_env_int("BENCH_RUNS", 200 if quick else 1000),
            lone=_env_int("BENCH_LONE", 10 if quick else 30),
            workers=_env_int("BENCH_WORKERS", 2),
            replicas=replicas,
            half_load_seconds=_env_float("BENCH_HALF_LOAD_SECONDS", 5 if quick else 20),
            timers=_env_int("BENCH_TIMERS", 2_000 if quick else 10_000),
            parked=_env_int("BENCH_PARKED", 2_000 if quick else 10_000),
            idle_seconds=_env_float("BENCH_IDLE_SECONDS", 5 if quick else 20),
            limit_seconds=_env_float("BENCH_LIMIT_SECONDS", 2 if quick else 6),
            pg_clients=tuple(int(c) for c in os.environ.get(
                "BENCH_PG_CLIENTS", "16" if quick else "16,64").split(",") if c.strip()),
            limited_calls=_env_int("BENCH_LIMITED_CALLS", 300 if quick else 1000),
            partitions=_env_int("BENCH_PARTITIONS", 8),
            lease_ttl=_env_float("BENCH_LEASE_TTL", 5),
            worker_concurrency=_env_int("BENCH_WORKER_CONCURRENCY", 64),
            log_level=os.environ.get("BENCH_LOG_LEVEL", "WARNING"),
            phases=phases,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


ALL_PHASES = ("limits", "ensemble", "bare_after", "retention", "code_first", "dbos", "temporal", "restate", "scale",
              "timers", "recovery", "waiting")
ON_DEMAND_PHASES = ("million", "timeline")
"""Run only when named: ``million`` (``make bench-scale``), as a million parked runs take a quarter of an
hour to load; ``timeline`` (``bench.timeline``), an investigation of the lone run's way."""


def percentiles(values: Sequence[float], qs: Iterable[float] = (50, 95, 99)) -> dict[str, float | None]:
    """Nearest-rank percentiles (and max, count); None when there is nothing to rank."""
    ordered = sorted(values)
    out: dict[str, float | None] = {}
    for q in qs:
        if not ordered:
            out[f"p{q:g}"] = None
            continue
        rank = max(1, min(len(ordered), int(round(q / 100 * len(ordered) + 0.4999))))
        out[f"p{q:g}"] = ordered[rank - 1]
    out["max"] = ordered[-1] if ordered else None
    out["n"] = len(ordered)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def loadavg() -> float:
    return os.getloadavg()[0]


# -- child processes, stopped by PID ---------------------------------------------------------

class Proc:
    """A child process in its own session; stopped by its PID (and its own process group)."""

    def __init__(self, name: str, argv: list[str], *, env: dict[str, str], log: Path,
                 cwd: Path = ROOT) -> None:
        self.name = name
        self.log_path = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = log.open("ab")
        self.popen = subprocess.Popen(argv, env=env, cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        self.pid = self.popen.pid
        REGISTRY.append(self)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL, like a crashed pod."""
        if self.alive():
            _signal_group(self.pid, signal.SIGKILL)
        self.popen.wait(timeout=30)
        self._close()

    def terminate(self, timeout: float = 15) -> None:
        if self.alive():
            _signal_group(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.pid, signal.SIGKILL)
                self.popen.wait(timeout=30)
        self._close()

    def tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _close(self) -> None:
        if not self._log.closed:
            self._log.close()
        if self in REGISTRY:
            REGISTRY.remove(self)


REGISTRY: list[Proc] = []


def _signal_group(pid: int, sig: int) -> None:
    """The child leads its own session (start_new_session), so its group id is its pid."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(pid, sig)


def stop_all() -> None:
    """Every process this bench started and has not stopped yet: SIGTERM, then SIGKILL."""
    for proc in list(REGISTRY):
        try:
            proc.terminate(timeout=10)
        except Exception as e:  # keep going: the others must stop too
            print(f"bench: could not stop {proc.name} (pid {proc.pid}): {e!r}", file=sys.stderr)


# -- /proc sampling ------------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float | None:
    """utime + stime of one process, in seconds."""
    try:
        fields_ = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields_[11]) + int(fields_[12])) / CLK_TCK


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def pids_named(*names: str) -> list[int]:
    """PIDs whose command name is one of ``names`` (e.g. the PostgreSQL backends, beam.smp)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text().strip()
            except OSError:
                continue
            if comm in names:
                found.append(int(entry.name))
    return found


def machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine since boot."""
    parts = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = parts[3] + parts[4]
    return float(sum(parts) - idle), float(sum(parts))


def _stat_fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


_postmaster: int | None = None


def postmaster_pid() -> int | None:
    """The PostgreSQL process whose parent is not PostgreSQL; remembered while it lives."""
    global _postmaster
    if (_postmaster is not None and _comm(_postmaster) == "postgres"
            and (f := _stat_fields(_postmaster)) is not None and _comm(int(f[1])) != "postgres"):
        return _postmaster
    named = set(pids_named("postgres"))
    _postmaster = next((pid for pid in named if (f := _stat_fields(pid)) is not None and int(f[1]) not in named),
                       None)
    return _postmaster


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def _children(pid: int) -> list[int]:
    """The live children of a single-threaded process: from the kernel's list when it keeps one
    (a handful of reads per sample), else by walking /proc (a few ms, which the bench's
    sampling would take from the services it measures)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return [c for c in pids_named("postgres") if (f := _stat_fields(c)) is not None and int(f[1]) == pid]


def postgres_cpu_seconds() -> float:
    """All of PostgreSQL: the postmaster, its live children, and the children it already reaped.

    Backends come and go with connections, so counting the pids alive at one instant would
    miss them; the postmaster's cutime/cstime keeps the CPU of every backend that exited.
    (Includes other databases' backends on this server.)
    """
    root = postmaster_pid()
    if root is None:
        return 0.0
    fields_ = _stat_fields(root) or ["0"] * 20
    total = sum(int(fields_[i]) for i in (11, 12, 13, 14))
    for pid in _children(root):
        f = _stat_fields(pid)
        if f is not None and int(f[1]) == root:
            total += int(f[11]) + int(f[12])
    return total / CLK_TCK


class _Pids:
    """Cumulative CPU of a set of pids; a pid that exited keeps its last seen value."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.seen: dict[int, float] = {}

    def __call__(self) -> float:
        for pid in self.pids:
            value = cpu_seconds(pid)
            if value is not None:
                self.seen[pid] = value
        return sum(self.seen.values())


@dataclass
class CpuWatch:
    """CPU used by groups of processes between ``start`` and ``stop``, as % of one core.

    A group is a list of pids or a function returning cumulative CPU seconds. Call
    ``sample`` now and then so pids that exit before ``stop`` keep their last value.
    """

    groups: dict[str, Any] = field(default_factory=dict)
    _meters: dict[str, Any] = field(default_factory=dict)
    _before: dict[str, float] = field(default_factory=dict)
    _machine: tuple[float, float] = (0.0, 0.0)
    _t: float = 0.0
    result: dict[str, float] = field(default_factory=dict)

    def start(self) -> None:
        self._meters = {name: (_Pids(g) if isinstance(g, list) else g) for name, g in self.groups.items()}
        self._t = time.monotonic()
        self._machine = machine_cpu()
        self._before = {name: meter() for name, meter in self._meters.items()}

    def sample(self) -> None:
        for meter in self._meters.values():
            meter()

    def stop(self) -> dict[str, float]:
        elapsed = max(time.monotonic() - self._t, 1e-6)
        busy, total = machine_cpu()
        cores = os.cpu_count() or 1
        out: dict[str, float] = {}
        for name, meter in self._meters.items():
            out[name] = round(100 * (meter() - self._before[name]) / elapsed, 1)
        d_total = total - self._machine[1]
        out["machine"] = round(100 * cores * (busy - self._machine[0]) / d_total, 1) if d_total else 0.0
        self.result = out
        return out


def postgres_and_broker_pids() -> dict[str, Any]:
    return {"postgres": postgres_cpu_seconds, "rabbitmq": pids_named("beam.smp")}


def bottleneck(cpu: dict[str, float], *, cores: int | None = None, outside: float = 0.0) -> str:
    """Name what limits a measurement from where the CPU went (machine %, of ``cores`` cores).

    ``outside`` is the machine CPU% used by processes the bench did not start (other work
    on the machine): when the machine is saturated and that share is large, it says so.
    """
    cores = cores or os.cpu_count() or 1
    groups = {k: v for k, v in cpu.items() if k != "machine"}
    if not groups:
        return "unknown"
    top = max(groups, key=lambda k: groups[k])
    kind = {"postgres": "database", "rabbitmq": "broker"}.get(top.split(":")[0], "CPU")
    share = ", ".join(f"{k} {v:.0f}%" for k, v in sorted(groups.items(), key=lambda kv: -kv[1])[:4])
    if cpu.get("machine", 0.0) >= 85 * cores:
        foreign = f"; {outside:.0f}% taken by processes outside the bench" if outside >= 10 else ""
        return (f"CPU: machine saturated ({cpu['machine']:.0f}% of {cores * 100}%{foreign}); "
                f"largest: {top} -> {kind} ({share})")
    if kind == "CPU" and groups[top] >= 90:
        return f"CPU of one Python process ({top} at {groups[top]:.0f}% of a core; {share})"
    return f"{kind} ({share}; machine {cpu.get('machine', 0):.0f}% of {cores * 100}%)"


def now() -> float:
    return time.time()
