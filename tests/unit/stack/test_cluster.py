"""`adattr cluster`'s layout and each Kafka node's configuration, without starting a JVM."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from app.runtime.settings import Settings
from app.stack.cluster import ClusterError, LocalCluster, Ports

REPO = Path(__file__).resolve().parents[3]


def _cluster(tmp_path: Path, base: int = 23400) -> LocalCluster:
    return LocalCluster(tmp_path / "cluster", tmp_path / "jars", Ports(base))


def _properties(text: str) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def test_ten_distinct_ports_from_the_first() -> None:
    ports = Ports(23400)
    assert [ports.kafka(n) for n in (1, 2, 3)] == [23400, 23401, 23402]
    assert [ports.controller(n) for n in (1, 2, 3)] == [23403, 23404, 23405]
    assert (ports.master, ports.master_ui, ports.worker_ui(1), ports.worker_ui(2)) == (
        23406,
        23407,
        23408,
        23409,
    )
    assert ports.all() == list(range(23400, 23410))


def test_each_node_has_its_id_the_three_voters_and_replication_three(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    configs = []
    for n in (1, 2, 3):
        broker = cluster.broker(n)
        broker.data_dir.mkdir(parents=True)
        configs.append(_properties(broker._write_config().read_text()))
    voters = "1@127.0.0.1:23403,2@127.0.0.1:23404,3@127.0.0.1:23405"
    for n, config in enumerate(configs, start=1):
        # Every key once: the cluster overlay replaced the single node's values in place.
        assert all(len(v) == 1 for v in config.values()), config
        single = {k: v[0] for k, v in config.items()}
        assert single["node.id"] == str(n)
        assert single["controller.quorum.voters"] == voters
        assert (
            single["listeners"]
            == f"PLAINTEXT://127.0.0.1:{23399 + n},CONTROLLER://127.0.0.1:{23402 + n}"
        )
        assert single["default.replication.factor"] == "3"
        assert single["min.insync.replicas"] == "2"
        assert single["offsets.topic.replication.factor"] == "3"
        assert single["transaction.state.log.replication.factor"] == "3"
        assert single["transaction.state.log.min.isr"] == "2"
        assert single["log.dirs"] == str((tmp_path / "cluster" / f"kafka-{n}" / "data").resolve())
    # One cluster id for the three, made once and kept.
    ids = {cluster.broker(n).node.cluster_id() for n in (1, 2, 3)}  # type: ignore[union-attr]
    assert len(ids) == 1 and ids == {(tmp_path / "cluster" / "kafka-cluster-id").read_text()}


def test_a_taken_port_is_named_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        cluster = _cluster(tmp_path, base=taken - 7)  # the master UI's port
        # Other ports of the range may be some other process's ephemeral ports by chance (one
        # was, in a CI run): the message names every taken port, ours among them.
        with pytest.raises(ClusterError, match=rf"port\(s\) ([0-9]+, )*{taken}(, [0-9]+)* on "):
            cluster.up(timeout=5)
    assert not (tmp_path / "cluster" / "kafka-1" / "kafka.pid").exists()
    assert not (tmp_path / "cluster" / "spark").exists()


def test_a_cluster_drill_submits_the_job_as_a_user_does(tmp_path: Path) -> None:
    from app.tools.drills import Stack

    settings = Settings.from_env({"ADATTR_DATA_DIR": str(tmp_path), "ADATTR_CLUSTER_PORT": "23400"})
    cluster = LocalCluster.of(settings)
    s = Stack(settings, "worker", events=100, seed=1, batch=50, cluster=cluster)
    s.package = tmp_path / "adattr.zip"
    command = s._command(("run", "--available-now"))
    assert Path(command[0]).name == "spark-submit"
    assert command[command.index("--master") + 1] == "spark://127.0.0.1:23406"
    assert command[command.index("--py-files") + 1] == str(tmp_path / "adattr.zip")
    assert "delta-spark" in command[command.index("--jars") + 1]
    assert command[-3:] == [str(REPO / "app" / "submit.py"), "run", "--available-now"]
    # Its folder is on the storage every worker sees; its job talks to the three nodes.
    assert s.dir.is_relative_to(cluster.shared)
    assert s.settings.bootstrap_servers == "127.0.0.1:23400,127.0.0.1:23401,127.0.0.1:23402"
    # A crash point's SIGKILL reaches the drill as spark-submit's exit status, 128 + 9.
    assert s.killed(137) and not s.killed(1) and not s.killed(-9)


def test_the_cluster_drills_parse() -> None:
    from app.cli import build_parser

    parser = build_parser()
    worker = parser.parse_args(["drill", "worker", "--events", "600", "--seed", "3"])
    assert (worker.drill, worker.events, worker.seed) == ("worker", 600, 3)
    assert parser.parse_args(["drill", "broker", "--cluster"]).cluster
    assert not parser.parse_args(["drill", "broker"]).cluster
    assert parser.parse_args(["drill", "crash", "--cluster", "--kills", "1"]).cluster
    with pytest.raises(SystemExit):
        parser.parse_args(["drill", "replay", "--cluster"])
