"""The runtime is real: Kafka transactions, Spark's Kafka connector and Delta MERGE."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from app.runtime.kafka_io import (
    KafkaConnection,
    TopicSpec,
    consumer_config,
    ensure_topics,
    producer_config,
)
from app.runtime.settings import Settings
from pipelines.delta_writes import delta_txn
from tests.builders import adattr_env

pytestmark = pytest.mark.integration


def _drain(
    kafka: KafkaConnection, topic: str, partitions: int, *, committed_only: bool
) -> list[bytes]:
    """Every record of the topic visible at this isolation level, read until end of partition."""
    consumer = Consumer(
        consumer_config(
            kafka,
            f"drain-{topic}-{committed_only}",
            committed_only=committed_only,
            **{"enable.partition.eof": True},
        )
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    at_end: set[int] = set()
    values: list[bytes] = []
    try:
        while len(at_end) < partitions:
            msg = consumer.poll(10)
            assert msg is not None, "no answer from the broker within 10 s"
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                at_end.add(msg.partition())
                continue
            values.append(msg.value())
    finally:
        consumer.close()
    return values


@pytest.fixture
def txn_topic(settings: Settings) -> str:
    ensure_topics(KafkaConnection.of(settings), [TopicSpec(settings.input_topic, 2, {})])
    producer = Producer(
        producer_config(
            KafkaConnection.of(settings), **{"transactional.id": f"t-{settings.input_topic}"}
        )
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(
            settings.input_topic, key=b"k", value=f"committed-{i}".encode(), partition=i % 2
        )
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(2):
        producer.produce(
            settings.input_topic, key=b"k", value=f"aborted-{i}".encode(), partition=i % 2
        )
    producer.flush(30)  # the aborted records really reach the log before the abort
    producer.abort_transaction(30)
    return settings.input_topic


def test_read_committed_consumer_sees_only_committed_records(
    settings: Settings, txn_topic: str
) -> None:
    committed = _drain(KafkaConnection.of(settings), txn_topic, 2, committed_only=True)
    everything = _drain(KafkaConnection.of(settings), txn_topic, 2, committed_only=False)
    assert sorted(committed) == [b"committed-0", b"committed-1", b"committed-2"]
    assert sorted(everything) == sorted([*committed, b"aborted-0", b"aborted-1"])


def test_spark_kafka_batch_read_committed(spark, settings: Settings, txn_topic: str) -> None:  # type: ignore[no-untyped-def]
    def read(level: str) -> list[str]:
        rows = (
            spark.read.format("kafka")
            .options(**KafkaConnection.of(settings).spark_options())
            .option("subscribe", txn_topic)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
            .option("kafka.isolation.level", level)
            .load()
            .selectExpr("CAST(value AS STRING) AS v")
            .collect()
        )
        return sorted(r.v for r in rows)

    assert read("read_committed") == ["committed-0", "committed-1", "committed-2"]
    assert read("read_uncommitted") == [
        "aborted-0",
        "aborted-1",
        "committed-0",
        "committed-1",
        "committed-2",
    ]


def test_delta_merge_is_idempotent_under_txn_app_id(spark, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    from delta.tables import DeltaTable

    path = settings.table_path("merge_probe")
    spark.createDataFrame([("a", 1), ("b", 2)], "k string, n long").write.format("delta").save(path)
    table = DeltaTable.forPath(spark, path)

    def merge_increment(version: int) -> None:
        source = spark.createDataFrame([("a", 10), ("c", 5)], "k string, n long")
        with delta_txn(spark, "probe-app", version):
            (
                table.alias("t")
                .merge(source.alias("s"), "t.k = s.k")
                .whenMatchedUpdate(set={"n": "t.n + s.n"})
                .whenNotMatchedInsertAll()
                .execute()
            )

    def snapshot() -> dict[str, int]:
        return {r.k: r.n for r in spark.read.format("delta").load(path).collect()}

    merge_increment(0)
    after_first = snapshot()
    assert after_first == {"a": 11, "b": 2, "c": 5}
    versions_before = table.history().count()

    merge_increment(0)  # the same batch again: Delta must skip it
    assert snapshot() == after_first
    assert table.history().count() == versions_before

    merge_increment(1)  # the next batch is applied
    assert snapshot() == {"a": 21, "b": 2, "c": 10}
    # The settings never leak into later writes of the session.
    assert spark.conf.get("spark.databricks.delta.write.txnAppId", None) is None


def test_the_jaas_line_parses_in_kafka_and_is_redacted_from_plans(spark) -> None:  # type: ignore[no-untyped-def]
    """The Spark source's SASL login line, read by Kafka's own JAAS parser, gives back the exact
    user and password (a quote and a backslash in it); the source's plan shows it redacted."""
    password = 'pa"ss\\word-7f3a'
    kafka = KafkaConnection("127.0.0.1:1", "SASL_SSL", "SCRAM-SHA-512", "adattr-job", password)
    options = kafka.spark_options()
    parsed = spark._jvm.org.apache.kafka.common.security.JaasConfig(
        "KafkaClient", options["kafka.sasl.jaas.config"]
    ).getAppConfigurationEntry("KafkaClient")[0]
    assert parsed.getLoginModuleName().endswith(".ScramLoginModule")
    assert dict(parsed.getOptions()) == {"username": "adattr-job", "password": password}
    source = spark.readStream.format("kafka").options(**options).option("subscribe", "t").load()
    plan = source._jdf.queryExecution().toString()
    assert "kafka.sasl.jaas.config=*********(redacted)" in plan
    assert "7f3a" not in plan


# Starts the driver as the job does and prints the zones Delta reads (the JVM's default and
# user.timezone), then this Python's own.
ZONES = """
import os, time
from app.runtime.settings import Settings
from app.runtime.spark import build_spark
jvm = build_spark(Settings.from_env(os.environ), "adattr-zones").sparkContext._jvm
print(jvm.java.util.TimeZone.getDefault().getID())
print(jvm.java.lang.System.getProperty("user.timezone"))
print(time.tzname[0])
"""


def test_the_driver_jvm_runs_in_utc_on_a_machine_in_another_zone(tmp_path: Path) -> None:
    """In another zone Delta reconstructs every new table version inside its commit (README
    "Performance"): the driver's JVM must be in UTC whatever the machine's zone."""
    env = adattr_env(data_dir=str(tmp_path), spark_master="local[1]")
    env["TZ"] = "America/Los_Angeles"
    done = subprocess.run(
        [sys.executable, "-c", ZONES], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    default, user_timezone, python = done.stdout.splitlines()[-3:]
    assert python == "PST"  # the process itself is in Los Angeles ...
    assert (default, user_timezone) == ("UTC", "UTC")  # ... its driver JVM in UTC
    assert "not UTC" not in done.stderr
