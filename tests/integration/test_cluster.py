"""`adattr cluster up|status|down` and the job submitted unchanged to it: a Spark standalone
master with two one-core workers and three Kafka nodes (replication 3, min.insync.replicas 2),
all real processes on loopback. The job runs under `spark-submit --master spark://...` with the
code shipped as `infra/package.sh`'s zip, its tasks on the workers' executors; the tables it
writes are then audited and reconciled from bronze, exactly as after a local run."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from app.audit import audit
from app.broker import port_is_free
from app.cluster import LocalCluster
from app.dim_csv import read_dim_csv
from app.kafka_io import KafkaConnection
from app.reconcile import reconcile
from app.settings import Settings
from pipelines.dimension import upsert_dim_ads
from tests.builders import adattr_env, run_adattr

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _free_block(n: int = 10) -> int:
    for _ in range(100):
        base = random.randrange(20_000, 40_000)
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


def test_the_job_runs_unchanged_on_a_standalone_cluster_and_a_replicated_kafka(
    spark,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    base = _free_block()
    data = tmp_path / "data"
    shared = data.resolve() / "cluster" / "shared"
    bootstrap = ",".join(f"127.0.0.1:{base + n}" for n in range(3))
    env = adattr_env(
        data_dir=str(data),
        cluster_port=str(base),
        bootstrap_servers=bootstrap,
        warehouse=str(shared / "warehouse"),
        checkpoints=str(shared / "checkpoints"),
        shuffle_partitions="2",
        watermark_delay="3 minutes",
        attribution_lookback="2 minutes",
        session_gap="5 minutes",
    )
    up = run_adattr(env, "cluster", "up")
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        for n in (1, 2, 3):
            assert f"kafka node {n}: running" in up.stdout
        assert f"spark master: spark://127.0.0.1:{base + 6}" in up.stdout
        assert "2 worker(s) alive" in up.stdout

        admin = AdminClient({"bootstrap.servers": bootstrap})
        topic = admin.list_topics(timeout=10).topics["ad-events"]
        assert {len(p.replicas) for p in topic.partitions.values()} == {3}
        assert {len(p.isrs) for p in topic.partitions.values()} == {3}
        configs = admin.describe_configs([ConfigResource("topic", "ad-events")])
        assert next(iter(configs.values())).result()["min.insync.replicas"].value == "2"

        gen = run_adattr(
            env, "generate", "--events", "500", "--dim-csv", str(tmp_path / "dim.csv"),
            "--segment", "all",
        )  # fmt: skip
        assert gen.returncode == 0, gen.stderr[-2000:]
        upsert_dim_ads(spark, str(shared / "warehouse"), read_dim_csv(tmp_path / "dim.csv"))

        subprocess.run(["bash", str(REPO / "infra" / "package.sh")], cwd=REPO, check=True)
        jars = subprocess.run(
            ["bash", str(REPO / "infra" / "spark-jars.sh")], capture_output=True, text=True
        ).stdout.strip()
        python = sys.executable
        submit = subprocess.run(
            [
                str(Path(python).with_name("spark-submit")),
                *("--master", f"spark://127.0.0.1:{base + 6}"),
                *("--jars", jars, "--py-files", str(REPO / ".adattr" / "dist" / "adattr.zip")),
                *("--conf", "spark.executor.memory=1g"),
                str(REPO / "app" / "submit.py"),
                *("run", "--available-now"),
            ],
            env={**env, "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert submit.returncode == 0, f"{submit.stdout[-3000:]}\n{submit.stderr[-3000:]}"
        assert "batch 0: accepted=" in submit.stdout + submit.stderr

        # The master ran it on its workers: one finished application, with both cores.
        state = LocalCluster.of(Settings.from_env(env)).master_state()
        assert state is not None
        apps = [(a["name"], a["cores"], a["state"]) for a in state["completedapps"]]
        assert apps == [("adattr-attribution", 2, "FINISHED")], apps

        # The transaction state log the job's producer created is replicated three times too.
        txn = admin.list_topics(timeout=10).topics["__transaction_state"]
        assert {len(p.replicas) for p in txn.partitions.values()} == {3}

        settings = Settings.from_env(env)
        warehouse = str(shared / "warehouse")
        checks = audit(spark, warehouse, KafkaConnection.of(settings))
        assert all(c.ok for c in checks), [c for c in checks if not c.ok]
        diffs = reconcile(
            spark,
            warehouse,
            max_bytes=settings.max_record_bytes,
            lookback_seconds=settings.attribution_lookback_seconds,
            session_gap_seconds=settings.session_gap_seconds,
        )
        assert all(d.ok for d in diffs), [d for d in diffs if not d.ok]

        status = run_adattr(env, "cluster", "status")
        assert "2 worker(s) alive" in status.stdout
        pids = [int(p) for p in re.findall(r"running, pid (\d+)", status.stdout)]
        assert len(pids) == 6, status.stdout
    finally:
        down = run_adattr(env, "cluster", "down")
    assert down.returncode == 0, down.stderr
    assert "kafka node 3" in down.stdout and "spark master" in down.stdout
    assert [p for p in pids if _alive(p)] == []
    assert _our_processes(data.resolve()) == []
    after = run_adattr(env, "cluster", "status")
    assert "kafka node 1: not running" in after.stdout
    assert "spark master: not running" in after.stdout
