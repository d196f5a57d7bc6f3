"""A three-node RabbitMQ cluster of the test's own, beside the machine's broker.

Each node has its own name, AMQP and distribution ports, data and log directories and Erlang
cookie (under a test directory); the machine's own node (``rabbit@localhost``) is not touched,
only its epmd is shared. ``pause_minority`` and a 10 s net tick make a cut-off node pause within
about 10-13 s, as production clusters should be configured (``docs/deployment.md``).

Nodes are started with ``rabbitmq-server`` from ``/usr/lib/rabbitmq/bin`` (the ``/usr/sbin``
wrappers switch to the rabbitmq user and ignore our environment); a kill is a SIGKILL of the
node's BEAM by the PID it wrote, and so is the teardown.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.ports import free_port

BIN = Path("/usr/lib/rabbitmq/bin")


def available() -> str | None:
    """Why a cluster cannot be started here, or None."""
    if not (BIN / "rabbitmq-server").exists():
        return "needs RabbitMQ's server scripts under /usr/lib/rabbitmq/bin"
    return None


@dataclass
class Node:
    name: str
    letter: str
    amqp_port: int
    dist_port: int
    base: Path
    source_ip: str
    """The address this node's own outgoing distribution connections leave from, so a cut can
    drop them (they use ephemeral ports) without touching the machine's other traffic."""
    management_port: int
    """The management API's (the scheduler sets the ingress queue's bound through it)."""

    @property
    def pid(self) -> int:
        return int((self.base / "pid").read_text().strip())


class RabbitCluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        tag = uuid.uuid4().hex[:6]
        self.nodes = [Node(f"lrha{tag}{letter}@localhost", letter, free_port(), free_port(), root / letter,
                           f"127.0.0.{index + 2}", free_port()) for index, letter in enumerate("abc")]
        self.cookie = secrets.token_hex(16)
        self._launchers: dict[str, subprocess.Popen[bytes]] = {}
        self._cut = False

    # -- the cluster --------------------------------------------------------------------------------
    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(self.cookie)
        cookie.chmod(0o400)
        for node in self.nodes:
            self._write_config(node)
        for node in self.nodes:
            self.start_node(node)
        for node in self.nodes:
            self.wait_node(node)
        first = self.nodes[0]
        for node in self.nodes[1:]:
            self.ctl(node, "stop_app")
            self.ctl(node, "join_cluster", first.name)
            self.ctl(node, "start_app")

    def url(self, vhost: str = "/", *, nodes: list[Node] | None = None) -> str:
        """The services' address: every node (or ``nodes``), in one URL."""
        hosts = ",".join(f"127.0.0.1:{n.amqp_port}" for n in (nodes or self.nodes))
        quoted = vhost.replace("/", "%2F")
        return f"amqp://guest:guest@{hosts}/{quoted}"

    def management_url(self) -> str:
        """The management API of every node, in one URL."""
        return "http://guest:guest@" + ",".join(f"127.0.0.1:{n.management_port}" for n in self.nodes) + "/"

    def add_vhost(self, vhost: str) -> None:
        self.ctl(self.nodes[0], "add_vhost", vhost)
        self.ctl(self.nodes[0], "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")

    def leaders(self, vhost: str) -> dict[str, str]:
        """Queue -> the node leading it (quorum queues)."""
        out = self.ctl(self._running(), "list_queues", "-q", "-p", vhost, "name", "type", "leader").stdout
        leaders = {}
        for line in out.splitlines():
            parts = line.split("\t")
            if len(parts) == 3 and parts[1] == "quorum":
                leaders[parts[0]] = parts[2]
        return leaders

    def members(self, vhost: str, queue: str) -> list[str]:
        out = self.ctl(self._running(), "list_queues", "-q", "-p", vhost, "name", "members").stdout
        for line in out.splitlines():
            name, _, members = line.partition("\t")
            if name == queue:
                return [m.strip(" []'\"") for m in members.strip("[]").split(",") if m.strip()]
        return []

    # -- faults ---------------------------------------------------------------------------------------
    def kill(self, node: Node) -> None:
        os.kill(node.pid, signal.SIGKILL)

    def cut_off(self, node: Node) -> None:
        """Refuse the node's distribution traffic both ways (its port, and what it opened itself).

        Refused with a reset rather than dropped: a connection attempt begun during the cut then
        fails at once instead of retrying a dropped SYN with a backoff that outlasts the heal, so
        the healed node reconnects as soon as it asks again."""
        chain = self._chain
        self._cut = True
        _iptables("-N", chain)
        _iptables("-I", "OUTPUT", "-j", chain)
        for rule in (["--dport", str(node.dist_port)], ["--sport", str(node.dist_port)],
                     ["-s", node.source_ip], ["-d", node.source_ip]):
            _iptables("-A", chain, "-p", "tcp", *rule, "-j", "REJECT", "--reject-with", "tcp-reset")

    def heal(self) -> None:
        if not self._cut:
            return
        self._cut = False
        chain = self._chain
        _iptables("-D", "OUTPUT", "-j", chain, check=False)
        _iptables("-F", chain, check=False)
        _iptables("-X", chain, check=False)

    @property
    def _chain(self) -> str:
        return f"LRHA{self.nodes[0].name[4:10].upper()}"

    # -- nodes ----------------------------------------------------------------------------------------
    def start_node(self, node: Node) -> None:
        log = open(node.base / "console.log", "ab")
        self._launchers[node.letter] = subprocess.Popen(
            [str(BIN / "rabbitmq-server")], env=self._env(node), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def wait_node(self, node: Node, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not (node.base / "pid").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node.name} wrote no pid file in {timeout} s")
            time.sleep(0.2)
        self.ctl(node, "wait", str(node.base / "pid"), "--timeout", str(int(timeout)))

    def node_running(self, node: Node) -> bool:
        try:
            return self.ctl(node, "-q", "status", check=False, timeout=15).returncode == 0
        except subprocess.TimeoutExpired:  # a node still rejoining may not answer yet
            return False

    def log_tail(self, node: Node, lines: int = 30) -> str:
        """The end of the node's own log: what a failed wait for it shows."""
        log = node.base / "log" / f"{node.name}.log"
        if not log.exists():
            return f"{node.name} wrote no log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])

    def restart(self, node: Node) -> None:
        """SIGKILL the node and start it again (what a liveness probe does with a node that hangs)."""
        try:
            self.kill(node)
        except (FileNotFoundError, ValueError, ProcessLookupError):
            pass  # it is not running
        launcher = self._launchers.get(node.letter)
        if launcher is not None:
            launcher.wait(timeout=30)
        (node.base / "pid").unlink(missing_ok=True)
        self.start_node(node)
        self.wait_node(node)

    def stop(self) -> None:
        """Tear the cluster down: its nodes are killed, not stopped. It is thrown away with its files,
        and a graceful ``rabbitmqctl stop`` of the last nodes of a ``pause_minority`` cluster can
        outlast the test's timeout on a slow machine."""
        self.heal()
        for node in self.nodes:
            try:
                os.kill(node.pid, signal.SIGKILL)
            except (FileNotFoundError, ValueError, ProcessLookupError):  # never started, or gone already
                pass
        for launcher in self._launchers.values():
            try:
                os.killpg(launcher.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            launcher.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)

    def ctl(self, node: Node, *args: str, check: bool = True, timeout: float = 120
            ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(BIN / "rabbitmqctl"), "-n", node.name, *args], env=self._env(node),
                                capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise RuntimeError(f"rabbitmqctl -n {node.name} {' '.join(args)}: {result.stdout} {result.stderr}")
        return result

    def _running(self) -> Node:
        for node in self.nodes:
            if self.node_running(node):
                return node
        raise RuntimeError("no node of the cluster is running")

    def _env(self, node: Node) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RABBITMQ_")}
        env.update({
            "HOME": str(self.home), "PATH": f"{BIN}:{env.get('PATH', '')}",
            "RABBITMQ_NODENAME": node.name, "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(node.amqp_port), "RABBITMQ_DIST_PORT": str(node.dist_port),
            "RABBITMQ_CONF_ENV_FILE": str(node.base / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(node.base / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(node.base / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(node.base / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(node.base / "mnesia"), "RABBITMQ_LOG_BASE": str(node.base / "log"),
            "RABBITMQ_PID_FILE": str(node.base / "pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": (
                "-kernel inet_dist_use_interface {127,0,0,1} "
                f"-kernel inet_dist_connect_options [{{ip,{{{node.source_ip.replace('.', ',')}}}}}]"),
        })
        return env

    def _write_config(self, node: Node) -> None:
        node.base.mkdir(parents=True, exist_ok=True)
        (node.base / "rabbitmq-env.conf").write_text("")
        (node.base / "rabbitmq.conf").write_text(
            "cluster_partition_handling = pause_minority\nloopback_users = none\n"
            f"management.tcp.ip = 127.0.0.1\nmanagement.tcp.port = {node.management_port}\n")
        (node.base / "advanced.config").write_text("[{kernel, [{net_ticktime, 10}]}].\n")
        (node.base / "enabled_plugins").write_text("[rabbitmq_management].\n")


def _iptables(*args: str, check: bool = True) -> None:
    result = subprocess.run(["iptables", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"iptables {' '.join(args)}: {result.stderr}")
