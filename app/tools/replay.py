"""Where a replay starts: `adattr replay --from-offsets/--from-timestamp/--from-earliest`.

A replay is a new checkpoint generation whose Spark ``startingOffsets`` are fixed here, as
concrete offsets for every partition of the input topic, before Spark starts: the plan is
printed, recorded in the generation's marker, and checked against what Kafka still holds
(retention may have deleted the start), so a typo fails here with the reason, not inside the
stream. Partitions an operator does not name are not replayed: they resume where the earlier
generations' ledger ends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from app.runtime.errors import UserInputError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from app.runtime.kafka_io import KafkaConnection

EARLIEST = -2  # Spark's startingOffsets code for "the earliest offset still held"


@dataclass(frozen=True)
class Partition:
    low: int  # the earliest offset Kafka still holds
    high: int  # the next offset to be written (the end)


def parse_timestamp(text: str) -> int:
    """ISO-8601 (``2026-11-20T10:00:00Z``, or with an offset) -> epoch milliseconds."""
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UserInputError(
            f"--from-timestamp {text!r} is not an ISO-8601 time (e.g. 2026-11-20T10:00:00Z)"
        ) from None
    if when.tzinfo is None:
        raise UserInputError(f"--from-timestamp {text!r} has no time zone; add Z for UTC")
    return int(when.astimezone(UTC).timestamp() * 1000)


def parse_offsets(text: str, topic: str, partitions: dict[int, Partition]) -> dict[int, int]:
    """``{"<topic>": {"<partition>": offset, ...}}`` -> {partition: offset}, checked."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UserInputError(f"--from-offsets is not JSON: {exc}") from None
    if not isinstance(data, dict) or set(data) != {topic} or not isinstance(data[topic], dict):
        raise UserInputError(
            f'--from-offsets must name the input topic only: {{"{topic}": {{"0": 1200}}}}'
        )
    chosen: dict[int, int] = {}
    for key, offset in data[topic].items():
        if not str(key).isdigit() or int(key) not in partitions:
            raise UserInputError(
                f"--from-offsets: {topic} has no partition {key!r} "
                f"(partitions: {', '.join(map(str, sorted(partitions)))})"
            )
        p = partitions[int(key)]
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise UserInputError(
                f"--from-offsets: offset {offset!r} of partition {key} is not >= 0"
            )
        if offset < p.low:
            raise UserInputError(
                f"--from-offsets: {topic}[{key}] offset {offset} was deleted by retention; "
                f"the earliest still held is {p.low}"
            )
        if offset > p.high:
            raise UserInputError(
                f"--from-offsets: {topic}[{key}] offset {offset} is beyond the end ({p.high})"
            )
        chosen[int(key)] = offset
    if not chosen:
        raise UserInputError("--from-offsets names no partition")
    return chosen


def describe_topic(kafka: KafkaConnection, topic: str) -> dict[int, Partition]:
    from confluent_kafka import Consumer, TopicPartition

    from app.runtime.kafka_io import consumer_config

    consumer = Consumer(consumer_config(kafka, "adattr-replay", committed_only=True))
    try:
        meta = consumer.list_topics(topic, timeout=15)
        found = meta.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            raise UserInputError(f"topic {topic} does not exist on {kafka.bootstrap}")
        out = {}
        for p in sorted(found.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)
            out[p] = Partition(low, high)
        return out
    finally:
        consumer.close()


def offsets_at(
    kafka: KafkaConnection, topic: str, partitions: dict[int, Partition], ms: int
) -> dict[int, int]:
    """Per partition, the first offset whose Kafka timestamp is at or after ``ms`` (the end
    when there is none)."""
    from confluent_kafka import Consumer, TopicPartition

    from app.runtime.kafka_io import consumer_config

    consumer = Consumer(consumer_config(kafka, "adattr-replay", committed_only=True))
    try:
        found = consumer.offsets_for_times(
            [TopicPartition(topic, p, ms) for p in partitions], timeout=15
        )
        return {
            tp.partition: tp.offset if tp.offset >= 0 else partitions[tp.partition].high
            for tp in found
        }
    finally:
        consumer.close()


def plan(
    *,
    topic: str,
    partitions: dict[int, Partition],
    chosen: dict[int, int] | None,
    read_upto: dict[int, int],
) -> dict[int, int]:
    """Starting offsets for every partition: the chosen ones (None: all from the earliest);
    the others resume after the last offset earlier generations read (``read_upto``), or from
    the earliest if none did."""
    if chosen is None:
        return dict.fromkeys(partitions, EARLIEST)
    return {
        p: chosen[p] if p in chosen else (read_upto[p] + 1 if p in read_upto else EARLIEST)
        for p in partitions
    }


def spark_starting_offsets(topic: str, start: dict[int, int]) -> str:
    return json.dumps({topic: {str(p): o for p, o in sorted(start.items())}})


def rereads(
    start: dict[int, int], partitions: dict[int, Partition], read_upto: dict[int, int]
) -> int:
    """How many offsets the replay reads again (markers included): an upper bound on records."""
    total = 0
    for p, offset in start.items():
        first = partitions[p].low if offset == EARLIEST else offset
        total += max(0, read_upto.get(p, -1) + 1 - first)
    return total


def ledger_read_upto(spark: SparkSession, warehouse: str, topic: str) -> dict[int, int]:
    """The last offset of each partition any generation's ledger says was read."""
    from pyspark.sql import functions as F

    from pipelines import tables as t

    rows = (
        spark.read.format("delta")
        .load(f"{warehouse}/{t.LEDGER}")
        .select(F.explode("offsets").alias("o"))
        .where(F.col("o.kafka_topic") == topic)
        .groupBy("o.kafka_partition")
        .agg(F.max("o.to_offset").alias("upto"))
        .collect()
    )
    return {int(r.kafka_partition): int(r.upto) for r in rows}
