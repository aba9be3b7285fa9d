"""The cluster path, on one cluster shared by the tests of this module (`adattr cluster up`): a
Spark standalone master with two one-core workers and three Kafka nodes (replication 3,
min.insync.replicas 2), all real processes on loopback. The job runs in the short versions of
the cluster drills as a user submits it (`spark-submit --master spark://...`, the code as
`infra/package.sh`'s zip), loses a worker and its executor in the middle of a batch, then the
Kafka node leading most of its input, carries on, and every table is then verified against the
truth, audited and reconciled from bronze (the drill's own checks). `down` leaves no process."""

from __future__ import annotations

import random
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from app.runtime.settings import Settings
from app.stack.broker import port_is_free
from app.stack.cluster import LocalCluster
from tests.builders import adattr_env, drill_passed, run_adattr

pytestmark = pytest.mark.integration


def _free_block(n: int = 10) -> int:
    """Ten ports free now, below the kernel's ephemeral range (32768-60999 on Linux): a port
    in that range found free can be taken by any outgoing connection before the broker binds it
    (CI of 79cf5c7: "Socket server failed to bind to 127.0.0.1:32830: Address already in use").
    And below the 12,000 under it that ``free_port`` picks from, which a test on the other
    xdist worker may take before the cluster's last listener binds."""
    for _ in range(100):
        base = random.randrange(10_000, 20_000 - n)
        if all(port_is_free("127.0.0.1", p) for p in range(base, base + n)):
            return base
    raise RuntimeError("no block of free ports")


def _alive(pid: int) -> bool:
    """Running (a zombie that nobody reaped yet counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _our_processes(root: Path) -> list[str]:
    done = subprocess.run(["pgrep", "-fa", str(root)], capture_output=True, text=True)
    return [line for line in done.stdout.splitlines() if "java" in line]


@pytest.fixture(scope="module")
def cluster_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    base = _free_block()
    data = (tmp_path_factory.mktemp("cluster") / "data").resolve()
    env = adattr_env(
        data_dir=str(data),
        cluster_port=str(base),
        bootstrap_servers=",".join(f"127.0.0.1:{base + n}" for n in range(3)),
        spark_master="local[2]",  # the drills' own checks; the job goes to the cluster
    )
    up = run_adattr(env, "cluster", "up")
    pids: list[int] = []
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        for n in (1, 2, 3):
            assert f"kafka node {n}: running" in up.stdout
        assert f"spark master: spark://127.0.0.1:{base + 6}" in up.stdout
        assert "2 worker(s) alive" in up.stdout
        status = run_adattr(env, "cluster", "status")
        pids = [int(p) for p in re.findall(r"running, pid (\d+)", status.stdout)]
        assert len(pids) == 6, status.stdout
        yield env
    finally:
        status = run_adattr(env, "cluster", "status")  # drills replace workers: new pids
        pids += [int(p) for p in re.findall(r"running, pid (\d+)", status.stdout)]
        down = run_adattr(env, "cluster", "down")
    assert down.returncode == 0, down.stderr
    assert "kafka node 3" in down.stdout and "spark master" in down.stdout
    assert [p for p in pids if _alive(p)] == []
    assert _our_processes(data) == []
    after = run_adattr(env, "cluster", "status")
    assert "kafka node 1: not running" in after.stdout
    assert "spark master: not running" in after.stdout


def _replicas(env: dict[str, str], topic: str) -> tuple[set[int], set[int]]:
    admin = AdminClient({"bootstrap.servers": env["ADATTR_BOOTSTRAP_SERVERS"]})
    found = admin.list_topics(timeout=10).topics[topic]
    parts = found.partitions.values()
    return {len(p.replicas) for p in parts}, {len(p.isrs) for p in parts}


def test_every_topic_is_replicated_three_times(cluster_env: dict[str, str]) -> None:
    assert _replicas(cluster_env, "ad-events") == ({3}, {3})
    admin = AdminClient({"bootstrap.servers": cluster_env["ADATTR_BOOTSTRAP_SERVERS"]})
    configs = admin.describe_configs([ConfigResource("topic", "ad-events")])
    assert next(iter(configs.values())).result()["min.insync.replicas"].value == "2"


def test_cluster_drill_loses_a_worker_then_a_kafka_node(cluster_env: dict[str, str]) -> None:
    """`drill cluster`: the worker drill's fault and the broker drill's, one after the other in
    one run of the job (`drill worker` and `drill broker --cluster` run one of the two)."""
    done = run_adattr(cluster_env, "drill", "cluster", "--events", "600", timeout=1200)
    out = drill_passed(done, "cluster")
    worker = re.search(r"worker-\d \(pid \d+\) and executor \d+ .* SIGKILLed while running", out)
    assert worker, out
    assert "no restart" in out and "the job has 2 cores again" in out
    assert "the job carried on:" in out
    node = re.search(r"kafka node \d \(pid \d+\), leader of \d of 4 input partitions", out)
    assert node, out
    assert worker.start() < node.start(), "the worker first, then the Kafka node"
    assert "the job carried on without a restart" in out
    assert re.search(r"kafka node \d restarted", out)
    # The master ran every run of the job on its workers, with both cores: one run, no restart.
    state = LocalCluster.of(Settings.from_env(cluster_env)).master_state()
    assert state is not None
    apps = [(a["name"], a["cores"], a["state"]) for a in state["completedapps"]]
    assert apps == [("adattr-attribution", 2, "FINISHED")], apps
    # The transaction state log the job's producer used is replicated three times, in sync
    # again after the node's return.
    assert _replicas(cluster_env, "__transaction_state")[0] == {3}
