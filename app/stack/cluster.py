"""``adattr cluster up|down|status``: a Spark standalone cluster and a three-node Kafka cluster on
loopback, from what set-up already installed (pyspark's own ``spark-class``, the Kafka jars).

- Kafka: three combined broker+controller KRaft nodes (one static quorum of three voters), every
  topic with three replicas and ``min.insync.replicas=2``, the offsets and transaction state
  topics too (``infra/kafka/server-cluster.properties`` over ``server.properties``). One node may
  die without losing an acknowledged record or stopping a transactional producer.
- Spark: a standalone master and two workers of one core each, each a JVM of its own.

Everything lives under ``<data_dir>/cluster/`` (each node's data and logs, the workers' work
folders, ``cluster.json`` with what was started where), which is also the storage every worker
sees: warehouse and checkpoints of a job submitted to this cluster go there. Ports are
``ADATTR_CLUSTER_PORT`` and the nine after it. Every process runs in a process group of its own,
so ``down`` (or a drill) can stop or kill one without touching the others.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.runtime.settings import Settings
from app.stack.broker import (
    BrokerError,
    ClusterNode,
    LocalBroker,
    port_is_free,
    read_pid,
    stop_group,
)

NODES = 3
WORKERS = 2
HOST = "127.0.0.1"


class ClusterError(RuntimeError):
    pass


@dataclass(frozen=True)
class Ports:
    """The ten ports of a cluster from its first one."""

    base: int

    def kafka(self, node: int) -> int:  # node 1..3
        return self.base + node - 1

    def controller(self, node: int) -> int:
        return self.base + NODES + node - 1

    @property
    def master(self) -> int:
        return self.base + 2 * NODES

    @property
    def master_ui(self) -> int:
        return self.master + 1

    def worker_ui(self, worker: int) -> int:  # worker 1..2
        return self.master + 1 + worker

    def all(self) -> list[int]:
        return list(range(self.base, self.worker_ui(WORKERS) + 1))


@dataclass(frozen=True)
class LocalCluster:
    root: Path  # <data_dir>/cluster
    jars_dir: Path
    ports: Ports
    worker_memory: str = "3g"
    java_options: tuple[str, ...] = ()  # ADATTR_JVM_OPTIONS: the Kafka nodes and Spark daemons

    @classmethod
    def of(cls, settings: Settings) -> LocalCluster:
        return cls(
            settings.data_dir.resolve() / "cluster",
            settings.jars_dir,
            Ports(settings.cluster_port),
            java_options=settings.java_options,
        )

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{HOST}:{self.ports.kafka(n)}" for n in range(1, NODES + 1))

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.ports.master}"

    @property
    def shared(self) -> Path:
        """The folder every worker sees: a submitted job's warehouse and checkpoints."""
        return self.root / "shared"

    def broker(self, node: int) -> LocalBroker:
        voters = ",".join(f"{n}@{HOST}:{self.ports.controller(n)}" for n in range(1, NODES + 1))
        return LocalBroker(
            data_dir=self.root / f"kafka-{node}",
            jars_dir=self.jars_dir,
            host=HOST,
            port=self.ports.kafka(node),
            controller_port=self.ports.controller(node),
            heap="512m",
            java_options=self.java_options,
            # The id all three nodes are formatted with: made once, kept under the root.
            node=ClusterNode(node, voters, self.root / "kafka-cluster-id"),
        )

    # -- Spark standalone ------------------------------------------------------------------------
    def _spark_class(self, name: str, *args: str) -> list[str]:
        import pyspark

        spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
        return [str(spark_class), name, *args]

    def _spark_pid_file(self, name: str) -> Path:
        return self.root / "spark" / f"{name}.pid"

    def _spark_pid(self, name: str) -> int | None:
        return read_pid(self._spark_pid_file(name))

    def worker_pid(self, worker: int) -> int | None:
        return self._spark_pid(f"worker-{worker}")

    def _start_spark(self, name: str, command: list[str]) -> None:
        if self._spark_pid(name) is not None:
            return
        logs = self.root / "spark"
        logs.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "SPARK_LOG_DIR": str(logs),
            "SPARK_WORKER_DIR": str(logs / "work"),
            # The daemons' own heap; executors get the worker's --memory.
            "SPARK_DAEMON_MEMORY": "512m",
            "SPARK_DAEMON_JAVA_OPTS": " ".join(self.java_options),
        }
        with (logs / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen(
                command,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._spark_pid_file(name).write_text(str(proc.pid))

    def start_worker(self, worker: int) -> None:
        """Starts worker 1 or 2 (one core), registered with the master (a drill's replacement
        worker comes this way too)."""
        self._start_spark(
            f"worker-{worker}",
            self._spark_class(
                "org.apache.spark.deploy.worker.Worker",
                *("--host", HOST, "--cores", "1", "--memory", self.worker_memory),
                *("--webui-port", str(self.ports.worker_ui(worker))),
                *("--work-dir", str(self.root / "spark" / f"work-{worker}")),
                self.master_url,
            ),
        )

    def master_state(self, timeout: float = 2.0) -> dict[str, Any] | None:
        """The master's own JSON view (its web UI's /json), None when it does not answer."""
        return get_json(f"http://{HOST}:{self.ports.master_ui}/json/", timeout)

    def worker_executors(self, worker: int) -> list[dict[str, Any]]:
        """The executors worker 1 or 2 runs (``id``, ``appid``: from its web UI's /json)."""
        state = get_json(f"http://{HOST}:{self.ports.worker_ui(worker)}/json/")
        executors: list[dict[str, Any]] = (state or {}).get("executors", [])
        return executors

    def alive_workers(self) -> int:
        state = self.master_state()
        if state is None:
            return 0
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def app_cores(self, name: str) -> int | None:
        """The cores the master has granted the running application ``name`` (None: none
        runs)."""
        state = self.master_state()
        apps = [a for a in (state or {}).get("activeapps", []) if a.get("name") == name]
        return sum(int(a.get("cores", 0)) for a in apps) if apps else None

    # -- the whole cluster -----------------------------------------------------------------------
    def up(self, timeout: float = 120.0) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.shared.mkdir(exist_ok=True)
        brokers = [self.broker(n) for n in range(1, NODES + 1)]
        ours = {p for b in brokers if b.status().running for p in (b.port, b.controller_port)}
        if self._spark_pid("master") is not None:
            ours |= {self.ports.master, self.ports.master_ui}
        ours |= {
            self.ports.worker_ui(w)
            for w in range(1, WORKERS + 1)
            if self._spark_pid(f"worker-{w}") is not None
        }
        taken = [p for p in self.ports.all() if p not in ours and not port_is_free(HOST, p)]
        if taken:
            raise ClusterError(
                f"port(s) {', '.join(map(str, taken))} on {HOST} are taken by another process; "
                f"stop it or set ADATTR_CLUSTER_PORT (the cluster uses it and the "
                f"{len(self.ports.all()) - 1} after it)"
            )
        # All three nodes must run before any can answer: a quorum needs two voters.
        launched = [(b, b.launch()) for b in brokers if not b.status().running]
        self._start_spark(
            "master",
            self._spark_class(
                "org.apache.spark.deploy.master.Master",
                *("--host", HOST, "--port", str(self.ports.master)),
                *("--webui-port", str(self.ports.master_ui)),
            ),
        )
        for w in range(1, WORKERS + 1):
            self.start_worker(w)
        try:
            for broker, proc in launched:
                broker.wait_until_ready(proc, timeout)
            self.wait_for_workers(WORKERS, timeout)
        except (BrokerError, ClusterError):
            self.down()
            raise
        self._write_state()

    def wait_for_workers(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._spark_pid("master") is None:
                raise ClusterError(
                    f"the Spark master exited while starting; see {self.root / 'spark'}/master.log"
                )
            if self.alive_workers() >= n:
                return
            time.sleep(0.3)
        raise ClusterError(
            f"{self.alive_workers()} of {n} Spark workers registered with {self.master_url} "
            f"within {timeout:.0f}s; see the logs in {self.root / 'spark'}"
        )

    def _write_state(self) -> None:
        (self.root / "cluster.json").write_text(
            json.dumps(
                {
                    "bootstrap_servers": self.bootstrap,
                    "spark_master": self.master_url,
                    "spark_master_ui": f"http://{HOST}:{self.ports.master_ui}",
                    "shared": str(self.shared),
                },
                indent=1,
            )
        )

    def down(self) -> list[str]:
        """Stops whatever of the cluster runs (workers first); returns what it stopped."""
        stopped = []
        for name in [f"worker-{w}" for w in range(WORKERS, 0, -1)] + ["master"]:
            pid = self._spark_pid(name)
            if pid is not None:
                stop_group(pid, 30)
                stopped.append(f"spark {name}")
            self._spark_pid_file(name).unlink(missing_ok=True)
        nodes = [LocalBroker(self.root / f"kafka-{n}", self.jars_dir) for n in range(1, NODES + 1)]
        # SIGTERM to all three at once: one by one, the last node's controlled shutdown waits
        # for a quorum the first two took with them (seen: a minute, then the SIGKILL).
        running = {n: pid for n, b in enumerate(nodes, start=1) if (pid := b.status().pid)}
        for pid in running.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        for broker in nodes:
            broker.stop(timeout=30)  # waits for it (SIGKILL after 30 s), clears its pid file
        return stopped + [f"kafka node {n}" for n in running]

    def describe(self) -> list[str]:
        lines = []
        for n in range(1, NODES + 1):
            b = self.broker(n)
            st = b.status()
            lines.append(
                f"kafka node {n}: "
                + (f"running, pid {st.pid}, {b.bootstrap}" if st.running else "not running")
            )
        for name in ["master"] + [f"worker-{w}" for w in range(1, WORKERS + 1)]:
            pid = self._spark_pid(name)
            lines.append(f"spark {name}: " + (f"running, pid {pid}" if pid else "not running"))
        workers = self.alive_workers()
        lines.append(f"bootstrap servers: {self.bootstrap}")
        lines.append(
            f"spark master: {self.master_url} (UI http://{HOST}:{self.ports.master_ui}), "
            f"{workers} worker(s) alive"
        )
        lines.append(f"shared storage (warehouse, checkpoints): {self.shared}")
        return lines


def get_json(url: str, timeout: float = 2.0) -> Any:
    """A web UI's JSON (Spark's master, workers, a driver's REST API); None when it does not
    answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None
