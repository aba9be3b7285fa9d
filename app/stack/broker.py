"""A real single-node Apache Kafka broker (KRaft, broker + controller in one JVM), run from the
jars that ``infra/fetch-jars.sh`` fetched from Maven Central.

``start`` formats the storage on first use, launches ``kafka.Kafka`` in its own process group,
and returns only once the broker answers a metadata request; ``stop`` asks it to shut down
(SIGTERM: a controlled shutdown) and escalates to SIGKILL only if it does not. Everything lives
under one data folder (config, logs, data, pid file), so a test can run its own broker in a
temporary folder on free ports beside the one ``adattr up`` runs.
"""

from __future__ import annotations

import base64
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING, Any

from app.runtime.processes import pid_alive
from app.runtime.settings import REPO_ROOT

if TYPE_CHECKING:
    from app.runtime.settings import Settings
    from app.stack.secure_kafka import SecureKafka

INFRA = REPO_ROOT / "infra" / "kafka"


class BrokerError(RuntimeError):
    pass


@dataclass(frozen=True)
class ClusterNode:
    node_id: int
    voters: str  # controller.quorum.voters: "1@host:port,2@host:port,3@host:port"
    id_file: Path  # the cluster id every node is formatted with, made by the first to need it

    def cluster_id(self) -> str:
        if not self.id_file.exists():
            self.id_file.parent.mkdir(parents=True, exist_ok=True)
            self.id_file.write_text(new_cluster_id())
        return self.id_file.read_text().strip()


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


# The ports free_port gave out in this process: two calls in a row (a broker's client and
# controller ports) must not get the same one before either listener binds it.
_GIVEN: set[int] = set()
# And those any process on this machine chose lately, a file each: two processes choosing at
# once (two pytest-xdist workers, a test and the `adattr` command it runs) must not both get a
# port before either listener binds it. A claim older than a minute is stale: its listener is
# up by then (or never came), and the port's own bind check decides.
_CLAIMS = Path(tempfile.gettempdir()) / "adattr-ports"
_CLAIM_S = 60.0


def _claim(port: int) -> bool:
    """Whether no other process on this machine chose ``port`` within the last minute; if so,
    the port is now this process's claim."""
    path = _CLAIMS / str(port)
    try:
        _CLAIMS.mkdir(exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        return True
    except FileExistsError:
        try:
            if time.time() - path.stat().st_mtime < _CLAIM_S:
                return False
            os.utime(path)  # stale: renewed as this process's claim
        except OSError:
            pass
        return True
    except OSError:  # a temp folder this user may not write to: the bind check alone
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now and no process here chose within the last minute (``_claim``),
    for a listener started next, chosen below the kernel's ephemeral range: a port the kernel handed
    out (``bind(host, 0)``) could be handed out again, to any client's outgoing connection, between
    this call and the listener's own bind, and the broker or Spark master would then fail to start.
    Below the range only another explicit listener can take it."""
    low, _ = _ephemeral_ports()
    first = max(1024, low - 12_000)
    if low - first < 1000:  # a machine whose range starts near 1024: only the kernel's choice
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])
    for port in random.sample(range(first, low), 200):
        # Not one chosen earlier here or by another process (its listener maybe not up yet).
        if port not in _GIVEN and port_is_free(host, port) and _claim(port):
            _GIVEN.add(port)
            return port
    raise RuntimeError(f"no free port in {first}-{low - 1} on {host} after 200 tries")


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for outgoing connections' ports (Linux; elsewhere its usual default)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def read_pid(path: Path) -> int | None:
    """The pid a pid file names, if that process is alive."""
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) else None


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    bootstrap: str
    data_dir: Path
    secure: bool = False

    def describe(self) -> str:
        name = "kafka (SASL_SSL, ACLs)" if self.secure else "kafka"
        if self.running:
            return (
                f"{name}: running, pid {self.pid}, bootstrap {self.bootstrap}, "
                f"data and logs in {self.data_dir}"
            )
        return f"{name}: not running (data folder {self.data_dir})"


@dataclass(frozen=True)
class LocalBroker:
    data_dir: Path
    jars_dir: Path
    host: str = "127.0.0.1"
    port: int = 9092
    controller_port: int = 9093
    heap: str = "768m"
    java_options: tuple[str, ...] = ()  # ADATTR_JVM_OPTIONS
    secure: SecureKafka | None = None  # `adattr up --secure`: SASL_SSL, SCRAM users, ACLs
    # One node of `adattr cluster` (app/stack/cluster.py): its id, the quorum's voters and the
    # cluster id every node is formatted with; None: a single node on its own.
    node: ClusterNode | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "kafka.pid"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "logs" / "server.log"

    def _pid(self) -> int | None:
        return read_pid(self.pid_file)

    def status(self) -> BrokerStatus:
        pid = self._pid()
        return BrokerStatus(
            pid is not None, pid, self.bootstrap, self.data_dir.resolve(), self.secure is not None
        )

    def _java(self, main: str, *args: str) -> list[str]:
        kafka_jars = self.jars_dir / "kafka"
        if not any(kafka_jars.glob("kafka_2.13-*.jar")):
            raise BrokerError(
                f"no Kafka broker jars in {kafka_jars}; run `bash infra/setup.sh` first"
            )
        return [
            "java",
            *self.java_options,
            f"-Xmx{self.heap}",
            "-Xms256m",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={INFRA / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.log_file.parent}",
            "-cp",
            f"{kafka_jars}/*",
            main,
            *args,
        ]

    def _write_config(self) -> Path:
        values = {
            "host": self.host,
            "port": str(self.port),
            "controller_port": str(self.controller_port),
            "log_dirs": str(self.data_dir.resolve() / "data"),
        }
        text = Template((INFRA / "server.properties").read_text()).substitute(values)
        if self.secure is not None:
            values |= self.secure.broker_values()
            overlay = Template((INFRA / "server-secure.properties").read_text()).substitute(values)
            text = _overlay(text, overlay)
        if self.node is not None:
            values |= {"node_id": str(self.node.node_id), "voters": self.node.voters}
            overlay = Template((INFRA / "server-cluster.properties").read_text()).substitute(values)
            text = _overlay(text, overlay)
        config = self.data_dir / "server.properties"
        # 0600 from the start: the secure broker's file holds its own password.
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return config

    def _admin_config(self) -> dict[str, Any]:
        if self.secure is None:
            return {"bootstrap.servers": self.bootstrap}
        return self.secure.connection(self.bootstrap).librdkafka()

    def _format_once(self, config: Path) -> None:
        if (self.data_dir / "data" / "meta.properties").exists():
            return
        cluster_id = self.node.cluster_id() if self.node is not None else new_cluster_id()
        args = ["format", "-t", cluster_id, "-c", str(config)]
        if self.secure is not None:  # the broker's own user must exist before it starts
            args += ["--add-scram", self.secure.format_scram_argument()]
        done = subprocess.run(
            self._java("kafka.tools.StorageTool", *args),
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise BrokerError(f"formatting Kafka storage failed:\n{done.stdout}{done.stderr}")

    def start(self, timeout: float = 90.0) -> BrokerStatus:
        current = self.status()
        if current.running:
            wait_until_ready(self.bootstrap, timeout, conf=self._admin_config())
            return current
        proc = self.launch()
        self.wait_until_ready(proc, timeout)
        return self.status()

    def launch(self) -> subprocess.Popen[bytes]:
        """Starts the broker's JVM (formatting its storage the first time) without waiting for
        it to answer: the nodes of a cluster must all be up before any answers."""
        for port in (self.port, self.controller_port):
            if not port_is_free(self.host, port):
                raise BrokerError(
                    f"port {self.host}:{port} is already taken by another process; stop it, or "
                    "point ADATTR_BOOTSTRAP_SERVERS / ADATTR_KAFKA_CONTROLLER_PORT at free ports"
                )
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        config = self._write_config()
        self._format_once(config)
        console = open(self.data_dir / "logs" / "console.out", "ab")
        with console:
            proc = subprocess.Popen(
                self._java("kafka.Kafka", str(config)),
                stdout=console,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pid_file.write_text(str(proc.pid))
        return proc

    def wait_until_ready(self, proc: subprocess.Popen[bytes], timeout: float) -> None:
        """Returns once the launched broker answers; stops it and explains otherwise."""
        try:
            wait_until_ready(
                self.bootstrap,
                timeout,
                alive=lambda: proc.poll() is None,
                conf=self._admin_config(),
            )
        except BrokerError as exc:
            self.stop()
            raise BrokerError(f"{exc}; last lines of {self.log_file}:\n{self.tail_log()}") from None

    def stop(self, timeout: float = 60.0) -> bool:
        """Stops the broker; True if one was running."""
        pid = self._pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        stop_group(pid, timeout)
        self.pid_file.unlink(missing_ok=True)
        return True

    def tail_log(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no broker log yet)"


def stop_group(pid: int, timeout: float) -> None:
    """SIGTERM to the process group led by ``pid`` (a JVM's controlled shutdown), SIGKILL if it
    is still there after ``timeout`` seconds; returns once it is gone."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.1)
    if pid_alive(pid):
        os.killpg(pid, signal.SIGKILL)
        while pid_alive(pid):
            _reap(pid)
            time.sleep(0.05)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def wait_until_ready(
    bootstrap: str,
    timeout: float,
    alive: Callable[[], bool] = lambda: True,
    conf: dict[str, Any] | None = None,
) -> None:
    """Returns once the broker answers a metadata request; raises BrokerError otherwise."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, **(conf or {})})
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if not alive():
            raise BrokerError(f"the Kafka broker at {bootstrap} exited while starting")
        try:
            metadata = admin.list_topics(timeout=2)
            if metadata.brokers:
                return
        except Exception as exc:
            last_error = exc
        time.sleep(0.2)
    raise BrokerError(
        f"the Kafka broker at {bootstrap} did not answer within {timeout:.0f}s: {last_error}"
    )


def _overlay(base: str, overlay: str) -> str:
    """``base`` with each key of ``overlay`` replaced (in place) or added (at the end)."""

    def key(line: str) -> str | None:
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or "=" not in stripped:
            return None
        return stripped.split("=", 1)[0]

    replacing = {key(line): line for line in overlay.splitlines() if key(line)}
    lines = [
        replacing.pop(k) if (k := key(line)) in replacing else line for line in base.splitlines()
    ]
    return (
        "\n".join(lines + [line for line in overlay.splitlines() if key(line) in replacing]) + "\n"
    )


def new_cluster_id() -> str:
    """A random UUID in URL-safe base64 without padding, as Kafka's ``Uuid.randomUuid`` makes
    it: never starting with '-', which the storage tool's argument parser takes for an option
    (one id in 64 did, and formatting failed: "argument --cluster-id/-t: expected one
    argument")."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def local_broker(settings: Settings, *, secure: bool = False) -> LocalBroker:
    """The local broker the settings point at: PLAINTEXT (`adattr up`, the drills, the demo) or
    SASL_SSL with SCRAM users and ACLs (`adattr up --secure`), each in its own data folder."""
    protocol = settings.kafka_security_protocol
    if protocol not in ("PLAINTEXT", "SASL_SSL" if secure else "PLAINTEXT"):
        raise BrokerError(
            f"ADATTR_KAFKA_SECURITY_PROTOCOL={protocol}: "
            + (
                "`adattr up --secure` starts the local SASL_SSL broker; the drills and the demo "
                "run on the PLAINTEXT one"
                if protocol == "SASL_SSL"
                else "the local broker listens on PLAINTEXT, or SASL_SSL with `adattr up --secure`"
            )
        )
    return broker_at(settings, secure=secure)


def broker_at(settings: Settings, *, secure: bool) -> LocalBroker:
    from app.stack.secure_kafka import SecureKafka

    first = settings.bootstrap_servers.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise BrokerError(
            f"ADATTR_BOOTSTRAP_SERVERS={settings.bootstrap_servers} is not a loopback address; "
            "`adattr up` only starts a local broker (use your cluster's own tooling for others)"
        )
    data_dir = settings.data_dir / ("kafka-secure" if secure else "kafka")
    return LocalBroker(
        data_dir=data_dir,
        jars_dir=settings.jars_dir,
        host="127.0.0.1" if host == "localhost" else host,
        port=int(port),
        controller_port=settings.kafka_controller_port,
        java_options=settings.java_options,
        secure=SecureKafka(data_dir) if secure else None,
    )
