"""``adattr audit``: the invariants of a generation's ledger, checked against the tables and Kafka.

Each check prints one line, OK or BREACH with the figures; any breach makes the command exit 1.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipelines import tables as t
from schemas import ad_event as c

if TYPE_CHECKING:
    from app.runtime.kafka_io import KafkaConnection

OUTCOMES = (*c.REASONS, "late", "duplicate", "accepted")


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def _committed_records_between(
    kafka: KafkaConnection, topic: str, partition: int, lo: int, hi: int
) -> int:
    """How many committed records Kafka holds at offsets lo..hi (read_committed)."""
    from confluent_kafka import Consumer, TopicPartition

    from app.runtime.kafka_io import consumer_config

    consumer = Consumer(
        consumer_config(
            kafka, "adattr-audit", committed_only=True, **{"enable.partition.eof": True}
        )
    )
    try:
        consumer.assign([TopicPartition(topic, partition, lo)])
        found = 0
        while True:
            msg = consumer.poll(10)
            offset = msg.offset() if msg is not None and msg.error() is None else None
            if offset is None or offset > hi:  # past the gap, at the end, or nothing there
                return found
            found += 1
    finally:
        consumer.close()


Span = tuple[int, int, int]  # from_offset, to_offset, batch_id


def _merged(spans: list[Span]) -> list[tuple[int, int]]:
    """Contiguous offset intervals covering the spans (gaps between them hold no record, which
    the gap check proves, so bridging them changes no count)."""
    out: list[list[int]] = []
    for lo, hi, _ in sorted(spans):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def _within(ranges: dict[tuple[str, int], list[Span]]) -> str:
    """SQL: the row's Kafka coordinates lie in one of the ranges."""
    parts = [
        f"(kafka_topic = '{topic}' AND kafka_partition = {p} "
        f"AND kafka_offset BETWEEN {lo} AND {hi})"
        for (topic, p), spans in sorted(ranges.items())
        for lo, hi in _merged(spans)
    ]
    return " OR ".join(parts) or "false"


def _generation_checks(
    label: str, ledger: list[Any], kafka: KafkaConnection | None
) -> tuple[list[Check], dict[str, int], dict[tuple[str, int], list[Span]]]:
    """The invariants of one generation's own ledger rows."""
    checks: list[Check] = []
    batch_ids = [r.batch_id for r in ledger]
    checks.append(
        Check(
            f"{label}: one ledger row per batch",
            len(batch_ids) == len(set(batch_ids)) and bool(batch_ids),
            f"{len(batch_ids)} rows, {len(set(batch_ids))} batch ids",
        )
    )
    # Offsets: every offset of every partition read once (ranges never overlap), gaps only
    # where Kafka holds no committed record (transaction markers, aborted records).
    ranges: dict[tuple[str, int], list[Span]] = defaultdict(list)
    for r in ledger:
        for o in r.offsets:
            ranges[(o.kafka_topic, o.kafka_partition)].append(
                (o.from_offset, o.to_offset, r.batch_id)
            )
    overlaps, gaps, bad_gaps = [], 0, []
    for (topic, partition), spans in sorted(ranges.items()):
        spans.sort()
        for (_, hi1, b1), (lo2, _, b2) in pairwise(spans):
            if lo2 <= hi1:
                overlaps.append(f"{topic}[{partition}] batches {b1},{b2} both read {lo2}..{hi1}")
            elif lo2 > hi1 + 1:
                gaps += 1
                if kafka:
                    n = _committed_records_between(kafka, topic, partition, hi1 + 1, lo2 - 1)
                    if n:
                        bad_gaps.append(f"{topic}[{partition}] {hi1 + 1}..{lo2 - 1}: {n} records")
    checks.append(
        Check(f"{label}: no offset read twice", not overlaps, "; ".join(overlaps[:3]) or "none")
    )
    checks.append(
        Check(
            f"{label}: gaps hold only transaction markers or aborted records",
            not bad_gaps,
            f"{gaps} gap(s)" + (f"; unread: {'; '.join(bad_gaps[:3])}" if bad_gaps else ""),
        )
    )
    totals: dict[str, int] = defaultdict(int)
    unbalanced = []
    for r in ledger:
        counts = dict(r.counts)
        outcomes = sum(counts.get(k, 0) for k in OUTCOMES)
        if counts.get("read", 0) != outcomes:
            unbalanced.append(f"batch {r.batch_id}: read {counts.get('read')} != {outcomes}")
        for k in (*OUTCOMES, "read"):
            totals[k] += counts.get(k, 0)
    quarantined = sum(totals[k] for k in c.REASONS)
    valid = totals["read"] - quarantined
    unique = valid - totals["duplicate"]
    checks.append(
        Check(
            f"{label}: read = valid + quarantined; valid = unique + duplicates; "
            "unique = windowed + late (every batch)",
            not unbalanced,
            "; ".join(unbalanced[:3])
            or f"{totals['read']:,} = {valid:,} + {quarantined:,}; {valid:,} = {unique:,} + "
            f"{totals['duplicate']:,}; {unique:,} = {totals['accepted']:,} + {totals['late']:,}",
        )
    )
    totals["quarantined"] = quarantined
    return checks, totals, ranges


def audit(spark: SparkSession, warehouse: str, kafka: KafkaConnection | None) -> list[Check]:
    """Every generation's ledger against itself, the tables and Kafka. A replay's generation
    reads offsets an earlier one read too: each generation's counts must then match the rows the
    tables hold *for its own offset ranges* (decisions agree across generations), and the
    tables must hold nothing no generation read."""

    def load(name: str) -> Any:
        return spark.read.format("delta").load(f"{warehouse}/{name}")

    checks: list[Check] = []
    rows = load(t.LEDGER).collect()
    generations: dict[tuple[int, str], list[Any]] = defaultdict(list)
    for r in rows:
        generations[(r.generation, r.app_id)].append(r)
    if not generations:
        return [Check("the ledger has rows", False, "no batch was ever recorded")]
    everything: dict[tuple[str, int], list[Span]] = defaultdict(list)
    for (number, app_id), ledger in sorted(generations.items()):
        label = f"generation {number} ({app_id})" if len(generations) > 1 else "ledger"
        own, totals, ranges = _generation_checks(label, ledger, kafka)
        checks.extend(own)
        for key, spans in ranges.items():
            everything[key].extend(spans)
        scope = _within(ranges)
        expected = {
            t.BRONZE: ("bronze holds every record read", totals["read"]),
            t.QUARANTINE: ("quarantine holds every quarantined record", totals["quarantined"]),
            t.LATE: ("late_ad_events holds every late record", totals["late"]),
            t.SILVER: ("silver holds every accepted record", totals["accepted"]),
        }
        for name, (what, in_ledger) in expected.items():
            in_table = load(name).where(scope).count()
            checks.append(
                Check(
                    f"{label}: {what}",
                    in_table == in_ledger,
                    f"table {in_table:,}, ledger {in_ledger:,} (in its offset ranges)",
                )
            )
    bronze = load(t.BRONZE)
    keys = ["kafka_topic", "kafka_partition", "kafka_offset"]
    total, distinct = bronze.count(), bronze.select(*keys).distinct().count()
    outside = bronze.where(f"NOT ({_within(everything)})").count()
    checks.append(
        Check(
            "bronze: each record once, none that no batch read",
            total == distinct and outside == 0,
            f"{total:,} rows, {distinct:,} distinct coordinates, {outside:,} outside the ledger",
        )
    )
    silver = load(t.SILVER)
    ids = silver.select("event_id").distinct().count()
    sums = silver.agg(
        F.count("*").alias("rows"),
        F.count(F.when(F.col("event_type") == "impression", 1)).alias("impressions"),
        F.count(F.when(F.col("event_type") == "click", 1)).alias("clicks"),
        F.coalesce(F.sum("cost"), F.lit(0)).cast("decimal(38,9)").alias("spend"),
    ).collect()[0]
    checks.append(
        Check("silver: each event once", ids == sums["rows"], f"{sums['rows']:,} rows, {ids:,} ids")
    )
    gold = (
        load(t.GOLD_1M)
        .agg(
            F.coalesce(F.sum("impressions"), F.lit(0)).alias("impressions"),
            F.coalesce(F.sum("clicks"), F.lit(0)).alias("clicks"),
            F.coalesce(F.sum("spend"), F.lit(0)).cast("decimal(38,9)").alias("spend"),
        )
        .collect()[0]
    )
    for measure in ("impressions", "clicks", "spend"):
        checks.append(
            Check(
                f"gold {measure} = silver",
                gold[measure] == sums[measure],
                f"gold {gold[measure]}, silver {sums[measure]}",
            )
        )
    return checks
