"""Exactly-once to Kafka and into the budget service: real broker, real Delta, real SQLite file.

One scenario, in order, on one topic set: the job is killed between its Delta commit and its
Kafka commit, then killed again inside an open Kafka transaction (which stalls read_committed
readers), a foreign transaction is aborted mid-run, the job is restarted and finishes, and the
consumer is killed mid-stream and restarted. At the end the consumer's view equals
gold_ad_metrics_1m and gold_attributions exactly, and the committed records of the output topic
hold no record id twice.
"""

from __future__ import annotations

import json
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from app.budget.consumer import BudgetStore, consume
from app.runtime.kafka_io import (
    KafkaConnection,
    app_topics,
    consumer_config,
    ensure_topics,
    producer_config,
)
from app.runtime.settings import Settings
from app.tools.generator import GenConfig, plan_traffic, produce
from pipelines import job
from pipelines import tables as t
from pipelines.dimension import upsert_dim_ads
from tests.builders import run_adattr, settings_env
from tests.conftest import isolated_settings

pytestmark = pytest.mark.integration
ISO = "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"


@pytest.fixture(scope="module")
def settings(base_settings: Settings, kafka_bootstrap: str, tmp_path_factory) -> Settings:  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("eo")
    return replace(
        isolated_settings(base_settings, kafka_bootstrap, root),
        data_dir=root / "data",
        watermark_delay="3 minutes",
        attribution_lookback="2 minutes",
        session_gap="5 minutes",
        max_offsets_per_trigger=500,
    )


def committed_records(kafka: KafkaConnection, topic: str) -> list[dict[str, Any]]:
    """Every committed record of the topic (read_committed), ordered by (partition, offset).

    A consumer interleaves partitions in whatever order their fetches return, so two reads of
    the same committed records only compare equal once put in that order."""
    consumer = Consumer(
        consumer_config(
            kafka, "eo-test-reader", committed_only=True, **{"enable.partition.eof": True}
        )
    )
    try:
        parts = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        pending, out = set(parts), []  # (partition, offset, record)
        while pending:
            msg = consumer.poll(30)
            assert msg is not None, f"no end of {topic} in sight (partitions {pending})"
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                pending.discard(msg.partition())
                continue
            out.append(
                (msg.partition(), msg.offset(), json.loads(msg.value(), parse_float=Decimal))
            )
        return [record for _, _, record in sorted(out, key=lambda x: (x[0], x[1]))]
    finally:
        consumer.close()


def gold_view(spark: SparkSession, settings: Settings) -> dict[tuple[str, str], tuple[Any, ...]]:
    rows = (
        spark.read.format("delta")
        .load(f"{settings.warehouse_uri}/{t.GOLD_1M}")
        .select(
            F.date_format("window_start", ISO).alias("w"),
            "ad_id",
            "impressions",
            "clicks",
            "spend",
            "conversions",
            "revenue",
        )
        .collect()
    )
    return {
        (r.w, r.ad_id): (r.impressions, r.clicks, r.spend, r.conversions, r.revenue) for r in rows
    }


def attributions_view(spark: SparkSession, settings: Settings) -> dict[str, str | None]:
    rows = spark.read.format("delta").load(f"{settings.warehouse_uri}/{t.ATTRIBUTIONS}")
    return {r.conversion_id: r.click_id for r in rows.collect()}


def consumer_attributions(db: Path) -> dict[str, str | None]:
    import sqlite3

    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT conversion_id, click_id FROM attributions"))


def test_crashes_between_and_inside_commits_leave_an_exact_downstream_view(
    spark: SparkSession, settings: Settings, tmp_path: Path
) -> None:
    cfg = GenConfig.for_settings(
        settings, events=2000, seed=23, users=300, ads=20, late_ratio=0, step_ms=1000
    )
    traffic = plan_traffic(cfg)
    ensure_topics(KafkaConnection.of(settings), app_topics(settings))
    upsert_dim_ads(spark, settings.warehouse_uri, traffic.dim_rows)
    produce(traffic.main, KafkaConnection.of(settings), settings.input_topic, progress=False)
    db = tmp_path / "budget.db"
    budgets = tmp_path / "budgets.csv"
    campaigns = sorted(traffic.truth["campaigns"].items())
    budgets.write_text(
        "campaign_id,daily_budget\n"
        + "".join(f"{c},{Decimal(v['spend']) / 2:.2f}\n" for c, v in campaigns[:2])
    )

    def adattr(*args: str, crash_at: str = "") -> Any:
        env = settings_env(settings, consumer_db=f"sqlite:///{db}", crash_at=crash_at)
        return run_adattr(env, *args, timeout=600)

    # 1. Killed after the second batch's Delta commits, before its Kafka transaction.
    done = adattr("run", "--available-now", crash_at="after_delta_before_kafka:2")
    assert done.returncode == -9, done.stderr[-3000:]
    assert "crash point after_delta_before_kafka" in done.stderr
    first = committed_records(KafkaConnection.of(settings), settings.output_topic)
    assert first and {r["batch_id"] for r in first} == {0}

    # 2. Restarted, it re-executes that batch and is killed inside its open transaction.
    done = adattr("run", "--available-now", crash_at="in_kafka_transaction")
    assert done.returncode == -9, done.stderr[-3000:]
    assert committed_records(KafkaConnection.of(settings), settings.output_topic) == first

    # The consumer reads what is committed and stops at the open transaction; nothing else.
    partial = adattr("consume", "--until-idle", "--idle-seconds", "3", "--budgets", str(budgets))
    assert partial.returncode == 0, partial.stderr[-3000:]
    assert f"consume: {len(first):,} records" in partial.stdout

    # 3. Meanwhile another producer writes bogus metrics in a transaction and aborts it.
    bogus = Producer(
        producer_config(KafkaConnection.of(settings), **{"transactional.id": "eo-bogus"})
    )
    bogus.init_transactions(30)
    bogus.begin_transaction()
    key = next(iter(traffic.truth["windows"]))
    row = {"window_start": key["window_start"], "ad_id": key["ad_id"], "impressions": 10**9}
    poison = {"record_id": "bogus", "table": t.GOLD_1M, "generation": 10**6, "batch_id": 0}
    bogus.produce(settings.output_topic, value=json.dumps({**poison, "row": row}).encode())
    bogus.flush(30)
    bogus.abort_transaction(30)

    # 4. The restart fences the dead producer (aborting its open transaction) and finishes: in
    #    this process's session (the same job, no JVM start; the kills above need their own).
    job.run(spark, settings, available_now=True)
    records = committed_records(KafkaConnection.of(settings), settings.output_topic)
    ids = [r["record_id"] for r in records]
    assert len(ids) == len(set(ids)), "a record id was committed twice"
    assert "bogus" not in ids

    # 5. The consumer is killed mid-stream (its database transaction never commits), restarted.
    killed = adattr("consume", "--until-idle", crash_at="consume_before_db_commit:2")
    assert killed.returncode == -9, killed.stderr[-3000:]
    resumed = adattr("consume", "--until-idle", "--idle-seconds", "3", "--report")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "budget alerts: 2" in resumed.stdout, resumed.stdout

    # The downstream view is exactly the gold table, and nothing was applied twice.
    store = BudgetStore(f"sqlite:///{db}")
    try:
        assert store.metrics() == gold_view(spark, settings)
        assert consumer_attributions(db) == attributions_view(spark, settings)
        applied = sum(1 for _ in store.db.execute("SELECT 1 FROM ad_metrics"))
        assert applied == len(gold_view(spark, settings))
        assert 10**9 not in {m[0] for m in store.metrics().values()}
    finally:
        store.close()
    # Every batch is in the ledger once, with the outcome of its transaction.
    ledger = spark.read.format("delta").load(f"{settings.warehouse_uri}/{t.LEDGER}")
    outcomes = {r.batch_id: r.kafka_outcome for r in ledger.collect()}
    assert outcomes[1].startswith("committed:"), outcomes
    assert ledger.count() == len(outcomes) >= 4


def test_consume_with_nothing_left_is_a_no_op(settings: Settings, tmp_path: Path) -> None:
    """A consumer on a fresh database catches up from the beginning; run again, it applies
    nothing (its offsets are in the database, not in Kafka's group)."""
    db = tmp_path / "again.db"
    ensure_topics(KafkaConnection.of(settings), app_topics(settings))
    store = BudgetStore(f"sqlite:///{db}")
    try:
        first = consume(
            KafkaConnection.of(settings),
            settings.output_topic,
            store,
            until_idle=True,
            idle_seconds=2,
        )
        second = consume(
            KafkaConnection.of(settings),
            settings.output_topic,
            store,
            until_idle=True,
            idle_seconds=2,
        )
    finally:
        store.close()
    assert second.records == 0
    assert first.records == len(
        committed_records(KafkaConnection.of(settings), settings.output_topic)
    )
