"""``adattr demo``: the README's one command, end to end on the embedded stack.

Starts the local broker if it is not running, generates traffic (main segment), loads the
matching dimension, runs the job until the topic is drained, sends the late tail and runs again,
then prints the per-campaign summary and verifies every table against the truth file. It stops
the broker again only if it started it.

The demo needs an empty topic and empty tables to compare with its truth file: it resets them
only when they came from an earlier demo (a marker file in the warehouse) and refuses otherwise,
so it never deletes data it did not create.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import KafkaError

from app.runtime.errors import UserInputError
from app.runtime.kafka_io import KafkaConnection, consumer_config, delete_topics
from app.runtime.settings import Settings

MARKER = ".adattr-demo"
_LEADERSHIP = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
)


def _topic_has_records(kafka: KafkaConnection, topic: str) -> bool:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer(consumer_config(kafka, "adattr-demo-probe", committed_only=True))
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if metadata is None or metadata.error is not None:
            return False
        deadline = time.monotonic() + 30
        for p in metadata.partitions:
            while True:
                try:
                    low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                    break
                except KafkaException as exc:
                    # Right after a broker or topic starts, leadership can lag the metadata.
                    transient = exc.args[0].retriable() or exc.args[0].code() in _LEADERSHIP
                    if not transient or time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            if high > low:
                return True
        return False
    finally:
        consumer.close()


def _reset(settings: Settings) -> None:
    warehouse, checkpoints = settings.local_warehouse, settings.checkpoints
    if warehouse is None:
        raise UserInputError(
            f"the demo resets its warehouse, so it runs on this machine's disk only, not on "
            f"{settings.warehouse}: point ADATTR_WAREHOUSE at a local folder"
        )
    has_tables = warehouse.exists() and any(warehouse.iterdir())
    ours = (warehouse / MARKER).exists()
    if (
        has_tables or _topic_has_records(KafkaConnection.of(settings), settings.input_topic)
    ) and not ours:
        raise UserInputError(
            f"the demo needs an empty {warehouse} and topic {settings.input_topic}, and these hold "
            "data it did not create; point ADATTR_WAREHOUSE, ADATTR_CHECKPOINTS and "
            "ADATTR_INPUT_TOPIC elsewhere (or remove them yourself)"
        )
    shutil.rmtree(warehouse, ignore_errors=True)
    shutil.rmtree(checkpoints, ignore_errors=True)
    mine = [settings.input_topic, settings.output_topic, settings.control_topic]
    left = delete_topics(KafkaConnection.of(settings), mine)
    if left:
        raise UserInputError(f"topics {left} were not deleted within 30 s")
    if settings.consumer_db_url.startswith("sqlite:///"):
        db = Path(settings.consumer_db_url.removeprefix("sqlite:///"))
        for path in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
            path.unlink(missing_ok=True)
    warehouse.mkdir(parents=True, exist_ok=True)
    (warehouse / MARKER).write_text(
        "created by adattr demo; `adattr demo` may delete this folder\n"
    )


def run_demo(
    settings: Settings, *, events: int, seed: int, command: Callable[[list[str]], int]
) -> int:
    """The demo: ``command`` (the CLI's entry point, passed down by it) runs each step as the
    user would type it."""
    from app.stack.broker import local_broker

    def step(text: str) -> None:
        print(f"\n== {text}", flush=True)

    broker = local_broker(settings)
    started_broker = not broker.status().running
    step("Kafka (KRaft) on " + settings.bootstrap_servers)
    if command(["up"]) != 0:
        return 1
    try:
        _reset(settings)
        work = settings.data_dir / "demo"
        work.mkdir(parents=True, exist_ok=True)
        truth, dim_csv = work / "truth.json", work / "dim_ads.csv"
        budgets = work / "budgets.csv"
        # 5,000 users over ~67 minutes of event time: most users pause long enough for
        # sessions to close, and conversions arrive both before and after their clicks.
        common = ["--events", str(events), "--seed", str(seed), "--users", "5000"]
        common += ["--truth", str(truth)]
        step(f"generate {events:,} events (duplicates, bad records) and the dimension")
        first = ["--dim-csv", str(dim_csv), "--budgets-csv", str(budgets), "--segment", "main"]
        if command(["generate", *common, *first]) != 0:
            return 1
        step("load dim_ads")
        if command(["dim", "load", str(dim_csv)]) != 0:
            return 1
        step("run the attribution job until the topic is drained")
        if command(["run", "--available-now"]) != 0:
            return 1
        step("send the late tail (older than the watermark) and run again")
        if command(["generate", *common, "--segment", "tail"]) != 0:
            return 1
        if command(["run", "--available-now"]) != 0:
            return 1
        step("verify every table against the truth file")
        expected = json.loads(truth.read_text())
        print(
            f"truth: {expected['records']:,} records, {len(expected['windows']):,} windows, "
            f"{len(expected['attributions']):,} conversions, {len(expected['sessions']):,} "
            "closed sessions"
        )
        if command(["verify", "--truth", str(truth)]) != 0:
            return 1
        step("the budget service downstream: ad-metrics (read_committed) into SQLite")
        report = ["--until-idle", "--idle-seconds", "3", "--report", "--budgets", str(budgets)]
        return command(["consume", *report])
    finally:
        if started_broker and broker.stop():
            print("\nkafka: stopped (the demo started it)", file=sys.stderr)
