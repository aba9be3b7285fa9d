"""The README quick start's main command (`make demo` runs `adattr demo`), as a user runs it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import Producer

from app.runtime.kafka_io import (
    KafkaConnection,
    admin_client,
    app_topics,
    ensure_topics,
    producer_config,
)
from app.runtime.settings import Settings
from app.tools import demo
from tests.builders import adattr_env, run_adattr

pytestmark = pytest.mark.integration


def _env(kafka_bootstrap: str, tmp_path: Path, topic: str) -> dict[str, str]:
    return adattr_env(
        bootstrap_servers=kafka_bootstrap,
        warehouse=str(tmp_path / "warehouse"),
        checkpoints=str(tmp_path / "checkpoints"),
        data_dir=str(tmp_path / "data"),
        input_topic=topic,
        spark_master="local[2]",
    )


def test_demo_generates_runs_and_verifies(kafka_bootstrap: str, tmp_path: Path) -> None:
    env = _env(kafka_bootstrap, tmp_path, "quickstart-events")
    done = run_adattr(env, "demo", "--events", "3000")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "verify: OK" in done.stdout
    assert "cmp-000" in done.stdout  # the per-campaign summary
    # The budget service read the job's transactional output and raised the alerts it should.
    assert "consume: " in done.stdout and "budget alerts: " in done.stdout
    assert "budget alerts: 0" not in done.stdout
    # Spark's, the JVM's and librdkafka's own lines go to log files, not to the console.
    console = done.stdout + done.stderr
    for noise in (" WARN ", "WARNING: ", "log4j", "SPARK_LOCAL_IP", "rdkafka#"):
        assert noise not in console, f"{noise!r} on the console:\n{console[-3000:]}"
    assert " WARN " in (tmp_path / "data" / "logs" / "spark.log").read_text()


def test_a_second_demo_starts_from_nothing_the_first_left(
    settings: Settings, tmp_path: Path
) -> None:
    """What a second `adattr demo` does before it generates (the run after it is the first
    demo's, above): the warehouse it marked, its checkpoints, its three topics and the budget
    service's database go, and the topics, made again under the same names, start empty."""
    settings = replace(settings, consumer_db=f"sqlite:///{tmp_path / 'budget.db'}")
    kafka = KafkaConnection.of(settings)
    names = {spec.name for spec in app_topics(settings)}
    warehouse = settings.local_warehouse
    assert warehouse is not None
    (warehouse / "silver").mkdir(parents=True)
    (warehouse / "silver" / "part-0.parquet").write_bytes(b"left by the first demo")
    (warehouse / demo.MARKER).write_text("created by adattr demo\n")
    (settings.checkpoints / "attribution").mkdir(parents=True)
    db_files = (tmp_path / "budget.db", tmp_path / "budget.db-wal")
    for path in db_files:
        path.write_bytes(b"rows of the first demo")
    ensure_topics(kafka, app_topics(settings))
    producer = Producer(producer_config(kafka))
    for topic in (settings.input_topic, settings.output_topic):
        producer.produce(topic, key=b"k", value=b"first demo")
    assert producer.flush(30) == 0

    demo._reset(settings)

    assert [p.name for p in warehouse.iterdir()] == [demo.MARKER]
    assert not settings.checkpoints.exists()
    assert not any(path.exists() for path in db_files)
    assert not names & set(admin_client(kafka).list_topics(timeout=10).topics)
    # Made again (as the demo's `generate` does), the input topic holds none of the first's.
    assert set(ensure_topics(kafka, app_topics(settings))) == names
    assert not demo._topic_has_records(kafka, settings.input_topic)


def test_demo_refuses_to_wipe_data_it_did_not_create(kafka_bootstrap: str, tmp_path: Path) -> None:
    (tmp_path / "warehouse" / "precious").mkdir(parents=True)
    done = run_adattr(_env(kafka_bootstrap, tmp_path, "quickstart-refuse"), "demo", timeout=300)
    assert done.returncode == 1
    assert "data it did not create" in done.stderr
    assert (tmp_path / "warehouse" / "precious").exists()


def test_a_jvm_that_does_not_start_is_one_clear_line(tmp_path: Path) -> None:
    """A setting the JVM refuses: the command says so with the end of the JVM's log (which the
    console no longer shows), not with pyspark's stack trace."""
    csv = tmp_path / "dim.csv"
    csv.write_text("ad_id,campaign_id,advertiser_id,cpm,cpc\nad-1,cmp-1,adv-1,1.0,0.5\n")
    env = adattr_env(
        warehouse=str(tmp_path / "warehouse"),
        data_dir=str(tmp_path / "data"),
        spark_driver_memory="lots",
    )
    done = run_adattr(env, "dim", "load", str(csv), timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "adattr dim: the Spark JVM did not start" in done.stderr
    assert "Invalid maximum heap size: -Xmxlots" in done.stderr
    assert str(tmp_path / "data" / "logs" / "spark.log") in done.stderr
    assert "Traceback" not in done.stderr
