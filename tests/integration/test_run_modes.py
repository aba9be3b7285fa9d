"""`adattr run` as a long-running job: graceful stop on SIGTERM, and dimension changes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from app.generator import GenConfig, plan_traffic, produce
from app.kafka_io import KafkaConnection, app_topics, ensure_topics
from app.settings import Settings
from app.spark import STATE_STORE_PROVIDERS
from app.verify import diff, observed
from pipelines import job
from pipelines import tables as t
from pipelines.dimension import upsert_dim_ads
from tests.builders import event, settings_env

pytestmark = pytest.mark.integration


def _ledger_read(spark: SparkSession, settings: Settings) -> int:
    path = f"{settings.warehouse.resolve()}/{t.LEDGER}"
    try:
        rows = spark.read.format("delta").load(path).select("counts").collect()
    except Exception:  # the job has not created its tables yet
        return 0
    return sum(r.counts["read"] for r in rows)


def test_sigterm_stops_between_batches_and_nothing_is_lost(spark, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    """The signal goes to the job's whole process group, as systemd, ``timeout`` and
    ``kill -- -PGID`` send it: the Spark JVM must not die under the driver mid-batch."""
    traffic = plan_traffic(GenConfig(events=2000, seed=5, users=50, ads=10, late_ratio=0))
    ensure_topics(KafkaConnection.of(settings), app_topics(settings))
    upsert_dim_ads(spark, str(settings.warehouse.resolve()), traffic.dim_rows)
    env = settings_env(settings, max_offsets_per_trigger="700")  # several batches
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("adattr")), "run"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a group of its own, which the signal below goes to
    )
    try:
        produce(traffic.main, KafkaConnection.of(settings), settings.input_topic, progress=False)
        deadline = time.monotonic() + 300
        while _ledger_read(spark, settings) < traffic.truth["records"]:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "the running job did not catch up in 300 s"
            time.sleep(1)  # polling the ledger for the condition, not standing in for it
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert "run: stopped" in out
    assert "Traceback" not in out and "Py4J" not in out, out[-3000:]
    assert diff(traffic.truth, observed(spark, str(settings.warehouse.resolve()))) == []
    ledger = spark.read.format("delta").load(f"{settings.warehouse.resolve()}/{t.LEDGER}")
    assert ledger.count() >= 3  # the cap really split the topic into batches


def test_dimension_change_is_picked_up_by_later_batches(spark, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    """Also runs on the HDFS-backed state store, the selectable alternative to RocksDB."""
    warehouse = str(settings.warehouse.resolve())
    provider = "spark.sql.streaming.stateStore.providerClass"
    default_provider = spark.conf.get(provider)
    spark.conf.set(provider, STATE_STORE_PROVIDERS["hdfs"])
    try:
        _dimension_change(spark, settings, warehouse)
    finally:
        spark.conf.set(provider, default_provider)
    state = job.current_generation(settings.checkpoints).checkpoint / "state"
    assert any(p.name.endswith(".delta") for p in state.rglob("*"))
    assert not any(p.name.endswith(".changelog") for p in state.rglob("*"))


def _dimension_change(spark: SparkSession, settings: Settings, warehouse: str) -> None:
    ensure_topics(KafkaConnection.of(settings), app_topics(settings))
    upsert_dim_ads(spark, warehouse, [("ad-1", "cmp-1", "adv-1", Decimal("2"), Decimal("1"))])

    def send(ids: list[str], minute: int) -> None:
        values = [
            (b"u1", json.dumps(event(i, event_time=f"2026-11-20T10:{minute:02d}:00.000Z")).encode())
            for i in ids
        ]
        produce(values, KafkaConnection.of(settings), settings.input_topic, progress=False)

    send(["a1", "a2"], 0)
    job.run(spark, settings, available_now=True)
    upsert_dim_ads(spark, warehouse, [("ad-1", "cmp-2", "adv-1", Decimal("4"), Decimal("1"))])
    send(["b1"], 1)
    job.run(spark, settings, available_now=True)

    silver = {
        r.event_id: r for r in spark.read.format("delta").load(f"{warehouse}/{t.SILVER}").collect()
    }
    assert silver["a1"].cpm == Decimal("2") and silver["b1"].cpm == Decimal("4")
    assert silver["b1"].campaign_id == "cmp-2"
    assert silver["b1"].dim_version > silver["a1"].dim_version
    gold = {
        r.window_start.minute: r
        for r in spark.read.format("delta").load(f"{warehouse}/{t.GOLD_1M}").collect()
    }
    assert gold[0].spend == Decimal("0.004") and gold[1].spend == Decimal("0.004")
    versions = spark.read.format("delta").load(f"{warehouse}/{t.LEDGER}").select("dim_version")
    assert {r.dim_version for r in versions.collect()} >= {
        silver["a1"].dim_version,
        silver["b1"].dim_version,
    }
