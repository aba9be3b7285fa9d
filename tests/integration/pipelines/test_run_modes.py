"""`adattr run` as a long-running job: graceful stop on SIGTERM, its metrics endpoint, and
dimension changes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from app.runtime.kafka_io import KafkaConnection, app_topics, delete_topics, ensure_topics
from app.runtime.settings import Settings
from app.runtime.spark import STATE_STORE_PROVIDERS
from app.stack.broker import free_port
from app.tools.generator import GenConfig, plan_traffic, produce
from app.tools.verify import diff, observed
from pipelines import job
from pipelines import tables as t
from pipelines.dimension import upsert_dim_ads
from tests.builders import Samples, event, scrape, settings_env

pytestmark = pytest.mark.integration


def _ledger_read(spark: SparkSession, settings: Settings) -> int:
    path = f"{settings.warehouse_uri}/{t.LEDGER}"
    try:
        rows = spark.read.format("delta").load(path).select("counts").collect()
    except Exception:  # the job has not created its tables yet
        return 0
    return sum(r.counts["read"] for r in rows)


def _by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    return {dict(labels)[label]: v for (n, labels), v in samples.items() if n == name}


def _metrics_match_the_ledger(spark: SparkSession, settings: Settings, port: int) -> Samples:
    """Scrapes until the record counters equal the ledger's counts per outcome and no input is
    left unread (the counters move after the ledger row is written); returns that scrape."""
    ledger = spark.read.format("delta").load(f"{settings.warehouse_uri}/{t.LEDGER}")
    deadline = time.monotonic() + 60
    while True:
        samples = scrape(port)
        records = _by_label(samples, "adattr_records_total", "outcome")
        counts: dict[str, int] = {}
        for row in ledger.collect():
            for outcome in records:
                counts[outcome] = counts.get(outcome, 0) + row.counts.get(outcome, 0)
            counts["read"] = counts.get("read", 0) + row.counts["read"]
        lag = _by_label(samples, "adattr_input_lag_records", "partition")
        if sum(records.values()) == counts["read"] and lag and not any(lag.values()):
            assert records == {k: float(v) for k, v in counts.items() if k != "read"}
            return samples
        assert time.monotonic() < deadline, (records, counts, lag)
        time.sleep(0.5)  # polling the endpoint for the condition


def test_sigterm_stops_between_batches_and_nothing_is_lost(spark, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    """The signal goes to the job's whole process group, as systemd, ``timeout`` and
    ``kill -- -PGID`` send it: the Spark JVM must not die under the driver mid-batch. While it
    runs, its metrics endpoint is scraped: the counters add up to the ledger."""
    traffic = plan_traffic(GenConfig(events=2000, seed=5, users=50, ads=10, late_ratio=0))
    ensure_topics(KafkaConnection.of(settings), app_topics(settings))
    upsert_dim_ads(spark, settings.warehouse_uri, traffic.dim_rows)
    port = free_port()
    # several batches
    env = settings_env(settings, max_offsets_per_trigger="700", metrics_port=str(port))
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
        samples = _metrics_match_the_ledger(spark, settings, port)
        # A second job on the same checkpoint, from another process tree (its own session, as
        # from another shell or service), is refused before it writes anything: the lock is
        # taken before the query, its tables, its producer or its first batch exist, and
        # before its metrics endpoint, so the first job's port does not hide the reason.
        second = subprocess.run(
            [str(Path(sys.executable).with_name("adattr")), "run", "--available-now"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            start_new_session=True,
        )
        assert second.returncode == 1, second.stdout[-2000:] + second.stderr[-2000:]
        assert f"the job is already running on {settings.checkpoints}" in second.stderr
        assert f"(pid {proc.pid})" in second.stderr and "Traceback" not in second.stderr
        assert "publisher" not in second.stderr and "batch " not in second.stderr
        assert proc.poll() is None  # the first one carries on
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    # The command's time, with the Spark session's start (which it includes) apart.
    stop = re.search(r"run: stopped after ([\d.]+)s \(([\d.]+)s of it starting Spark\)", out)
    assert stop and 0 < float(stop[2]) < float(stop[1]), out[-3000:]
    assert "Traceback" not in out and "Py4J" not in out, out[-3000:]
    assert diff(traffic.truth, observed(spark, settings.warehouse_uri)) == []
    ledger = spark.read.format("delta").load(f"{settings.warehouse_uri}/{t.LEDGER}")
    assert ledger.count() >= 3  # the cap really split the topic into batches
    # What else an operator watches was there, and consistent with the ledger.
    records = _by_label(samples, "adattr_records_total", "outcome")
    assert records["accepted"] > 0 and records["duplicate"] > 0
    batches = samples[("adattr_batches_total", ())]
    assert samples[("adattr_batch_duration_seconds_count", ())] == batches >= 3
    data_batches = [r.batch_id for r in ledger.collect() if r.counts["read"]]
    assert samples[("adattr_last_committed_batch", ())] >= max(data_batches)
    assert 0 <= samples[("adattr_last_committed_batch_age_seconds", ())] < 120
    kafka = _by_label(samples, "adattr_kafka_transactions_total", "outcome")
    assert kafka["committed"] >= 1 and sum(kafka.values()) >= batches
    assert set(_by_label(samples, "adattr_input_lag_seconds", "partition").values()) == {0.0}
    assert set(_by_label(samples, "adattr_batch_phase_seconds", "phase")) >= {"gold", "ledger"}
    assert ("adattr_kafka_open_transaction_age_seconds", ()) in samples
    assert ("adattr_watermark_delay_seconds", ()) in samples


def _foreign_lease(settings: Settings, epoch: int, expires_in_s: float) -> Path:
    """A lease file as a job on another machine writes it (the only trace it leaves here)."""
    folder = settings.checkpoints / "attribution" / "lease"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{epoch:012d}.json"
    record = {"owner": "f" * 32, "host": "other-machine", "pid": 4242, "epoch": epoch}
    path.write_text(json.dumps({**record, "expires_ms": int((time.time() + expires_in_s) * 1000)}))
    return path


def test_a_job_on_another_machine_is_kept_out_by_the_lease(spark, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    """The flock cannot see a job on another machine (or through a mount that ignores locks);
    the lease next to the checkpoint can. A start while another machine's job holds it is
    refused before anything is written; a running job whose lease another machine took over
    (after a pause past its expiry) stops at its next batch, and a later run finishes exact."""
    traffic = plan_traffic(GenConfig(events=2000, seed=9, users=50, ads=10, late_ratio=0))
    ensure_topics(KafkaConnection.of(settings), app_topics(settings))
    upsert_dim_ads(spark, settings.warehouse_uri, traffic.dim_rows)
    produce(traffic.main, KafkaConnection.of(settings), settings.input_topic, progress=False)
    env = settings_env(settings, max_offsets_per_trigger="700")
    adattr = str(Path(sys.executable).with_name("adattr"))

    held = _foreign_lease(settings, 1, expires_in_s=600)
    refused = subprocess.run(
        [adattr, "run", "--available-now"], env=env, capture_output=True, text=True, timeout=300
    )
    assert refused.returncode == 1, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "a job on other-machine (pid 4242) holds the checkpoint's lease" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not list((settings.checkpoints / "attribution").glob("gen-*/offsets/*"))
    assert not (Path(settings.warehouse_uri) / t.LEDGER).exists()

    held.unlink()  # that job is gone (its lease released)
    proc = subprocess.Popen(
        [adattr, "run"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 300
        while _ledger_read(spark, settings) == 0:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "no batch committed in 300 s"
            time.sleep(1)  # polling the ledger for the condition, not standing in for it
        # Another machine's job takes the lease over, as after this one paused past its expiry.
        _foreign_lease(settings, 2, expires_in_s=600)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out[-3000:]
    assert (
        "fenced: this job's lease on the checkpoint (number 1) was taken over by a job on "
        "other-machine (pid 4242) (number 2)" in out
    ), out[-3000:]
    # Spark logs the query's failure with the Python side's traceback; the job's last word is
    # the one line an operator needs.
    assert out.strip().splitlines()[-1].startswith("adattr run: fenced: "), out[-3000:]
    assert _ledger_read(spark, settings) < traffic.truth["records"]  # it stopped early

    # The other machine's job is gone; a run here (in this process's session: the same job,
    # no JVM start) takes the lease and finishes exact.
    (settings.checkpoints / "attribution" / "lease" / f"{2:012d}.json").unlink()
    job.run(spark, replace(settings, max_offsets_per_trigger=700), available_now=True)
    assert diff(traffic.truth, observed(spark, settings.warehouse_uri)) == []


def test_dimension_change_is_picked_up_by_later_batches(spark, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    """Also runs on the HDFS-backed state store, the selectable alternative to RocksDB."""
    warehouse = settings.warehouse_uri
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
    # The job's start reads the version in force then (cmp-1) ahead of its first batch; a
    # version committed after the start is the one a batch after it uses.
    query = job.start(spark, settings, available_now=False)
    try:
        upsert_dim_ads(spark, warehouse, [("ad-1", "cmp-2", "adv-1", Decimal("4"), Decimal("1"))])
        send(["b1"], 1)
        query.processAllAvailable()
    finally:
        job.stop_between_batches(query)  # and the stop's pass: the table is read below
    assert query.exception() is None

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


def test_a_topic_recreated_under_its_checkpoint_is_named_in_one_message(
    spark, settings: Settings
) -> None:  # type: ignore[no-untyped-def]
    """A broker's data wiped while the checkpoint and the tables stay (what `adattr up` on a new
    broker beside an old `checkpoints/` does): Spark's Kafka source refuses to go on, and the
    job says what happened and what to do, not Spark's traceback with the query's plan. Nothing
    is written."""
    kafka = KafkaConnection.of(settings)
    ensure_topics(kafka, app_topics(settings))
    upsert_dim_ads(
        spark, settings.warehouse_uri, [("ad-1", "cmp-1", "adv-1", Decimal("2"), Decimal("1"))]
    )

    def send(ids: list[str]) -> None:
        values = [(b"u1", json.dumps(event(i)).encode()) for i in ids]  # one key: one partition
        produce(values, kafka, settings.input_topic, progress=False)

    send(["a1", "a2", "a3"])
    job.run(spark, settings, available_now=True)
    batches = spark.read.format("delta").load(f"{settings.warehouse_uri}/{t.LEDGER}").count()
    assert delete_topics(kafka, [settings.input_topic]) == []
    ensure_topics(kafka, app_topics(settings))
    send(["b1"])

    with pytest.raises(job.JobFailedError) as failed:
        job.run(spark, settings, available_now=True)
    said = str(failed.value)
    assert said.startswith(f"topic {settings.input_topic} ends before offsets"), said
    assert re.search(r"offset was changed from 3 to [01]\.", said), said
    assert str(settings.checkpoints) in said and "Logical Plan" not in said, said
    assert (
        spark.read.format("delta").load(f"{settings.warehouse_uri}/{t.LEDGER}").count() == batches
    )
