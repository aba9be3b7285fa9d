"""The record tables: bronze, quarantine, late and silver, one row per Kafka record (silver:
per accepted ``event_id``), as the batch classified them.

Each row is keyed by where it was read (topic, partition, offset), silver also by its event id.
A batch appends when the high-water marks prove no row with its keys can exist yet
(``pipelines.high_water``), else MERGEs on those keys within the batch's slice of offsets (or
its event-time span, for silver), with Delta's txn ids. On a replay (offsets an earlier
generation read again) the earlier generation's decisions are read back so each record keeps
the outcome it had (``PriorDecisions``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F

from pipelines import tables as t
from pipelines.delta_writes import Tables
from pipelines.high_water import HighWater
from pipelines.offset_log import rereads
from pipelines.transforms import ACCEPTED, LATE, refused_events
from schemas import ad_event as c

# (topic, partition) -> [lowest offset, highest offset, records] of one batch.
Ranges = dict[tuple[str, int], list[int]]


@dataclass(frozen=True)
class RecordWrite:
    """One record table's insert: its rows, the MERGE key and whether it may simply append."""

    name: str
    rows: DataFrame
    condition: str
    fresh: bool


def batch_stats(rows: DataFrame) -> list[Row]:
    """A classified batch's statistics, one row per outcome and Kafka partition: ``n`` records,
    their offsets ``lo``..``hi``, event times ``t_lo``..``t_hi`` and newest Kafka timestamp
    ``k_hi`` (epoch ms). The batch's first action: it runs the read and the stateful operator."""
    return (
        rows.groupBy("outcome", "kafka_topic", "kafka_partition")
        .agg(
            F.count("*").alias("n"),
            F.min("kafka_offset").alias("lo"),
            F.max("kafka_offset").alias("hi"),
            F.expr("unix_millis(min(event_time))").alias("t_lo"),
            F.expr("unix_millis(max(event_time))").alias("t_hi"),
            F.expr("unix_millis(max(kafka_timestamp))").alias("k_hi"),
        )
        .collect()
    )


def ranges_and_counts(stats: list[Row]) -> tuple[Ranges, dict[str, int]]:
    """Per partition, the offsets the batch read; per outcome, how many records had it (and
    ``read``, their sum). ``stats`` rows: outcome, kafka_topic, kafka_partition, n, lo, hi."""
    ranges: Ranges = {}
    counts: dict[str, int] = {}
    for s in stats:
        r = ranges.setdefault((s.kafka_topic, s.kafka_partition), [s.lo, s.hi, 0])
        r[0], r[1], r[2] = min(r[0], s.lo), max(r[1], s.hi), r[2] + s.n
        counts[s.outcome] = counts.get(s.outcome, 0) + s.n
    # Outcomes add up to what was read; derived counts are added to the dict later.
    counts["read"] = sum(counts.values())
    return ranges, counts


def coordinates_condition(ranges: Ranges) -> str:
    """MERGE condition on a record's Kafka coordinates, scoped to the batch's offset ranges (so
    Delta reads only the files that can hold them)."""
    key = (
        "t.kafka_topic = s.kafka_topic AND t.kafka_partition = s.kafka_partition "
        "AND t.kafka_offset = s.kafka_offset"
    )
    if not ranges:
        return key
    scope = " OR ".join(
        f"(t.kafka_partition = {p} AND t.kafka_offset BETWEEN {lo} AND {hi})"
        for (_, p), (lo, hi, _) in sorted(ranges.items())
    )
    return f"{key} AND ({scope})"


def accepted_span(stats: list[Row]) -> tuple[int, int] | None:
    """The event-time span (epoch ms) of the batch's accepted events; None without any."""
    accepted = [s for s in stats if s.outcome == ACCEPTED]
    if not accepted:
        return None
    return min(s.t_lo for s in accepted), max(s.t_hi for s in accepted)


def record_writes(
    rows: DataFrame,
    ranges: Ranges,
    counts: dict[str, int],
    span: tuple[int, int] | None,
    *,
    watermark_ms: int,
    late_at: Column,
    dim_version: int,
    high_water: HighWater,
) -> list[RecordWrite]:
    """The record tables' inserts for a classified batch (``rows``: one per record read, with
    its ``outcome``); a table none of whose outcomes occurred gets none (inserting nothing is
    the same result). A late row keeps ``late_at`` (epoch ms), the watermark it was late behind
    (``pipelines.transforms.lateness``)."""
    by_coordinates = coordinates_condition(ranges)
    fresh = high_water.records_fresh(ranges)
    writes: list[RecordWrite] = []
    if counts["read"]:
        writes.append(RecordWrite(t.BRONZE, rows, by_coordinates, fresh))
    if any(reason in counts for reason in c.REASONS):
        quarantined = rows.where(F.col("outcome").isin(*c.REASONS)).withColumns(
            {
                "reason": F.col("outcome"),
                "raw_text": F.expr("make_valid_utf8(CAST(raw_value AS STRING))"),
            }
        )
        writes.append(RecordWrite(t.QUARANTINE, quarantined, by_coordinates, fresh))
    if LATE in counts:
        late = rows.where(F.col("outcome") == LATE).withColumn(
            "watermark", F.timestamp_millis(late_at)
        )
        writes.append(RecordWrite(t.LATE, late, by_coordinates, fresh))
    if span is not None:
        silver = rows.where(F.col("outcome") == ACCEPTED).withColumn(
            "dim_version", F.lit(dim_version)
        )
        # One row per event_id. A re-sent event carries its original event_time, so the match
        # is scoped to the batch's event-time span, which lets Delta skip older files.
        writes.append(
            RecordWrite(
                t.SILVER,
                silver,
                "t.event_id = s.event_id AND t.event_time BETWEEN "
                f"timestamp_millis({span[0]}) AND timestamp_millis({span[1]})",
                high_water.silver_fresh(ranges, watermark_ms),
            )
        )
    return [replace(w, rows=w.rows.select(*t.columns(w.name))) for w in writes]


class PriorDecisions:
    """What earlier checkpoint generations decided about offsets a batch reads again (a replay),
    so a re-read record keeps its outcome; read from the ledger once per run."""

    def __init__(self, tables: Tables, checkpoint: Path) -> None:
        self.tables = tables
        self.checkpoint = checkpoint
        self._read: list[tuple[str, int, int, int]] | None = None

    def read_before(self, batch_id: int) -> str | None:
        """A condition true of the records at offsets an earlier generation read, when this
        batch can read such offsets; None when it cannot (the normal case: no cost at all).
        Each generation read every record from its first offset to its last in a partition
        (only transaction markers lie between its batches' ranges); offsets no generation read
        (a replay may start past the end of the one before) are not among them."""
        if self._read is None:
            ledger = self.tables.load(t.LEDGER).where(F.col("app_id") != self.tables.app_id)
            self._read = [
                (r.kafka_topic, int(r.kafka_partition), int(r.lo), int(r.hi))
                for r in ledger.select("app_id", F.explode("offsets").alias("o"))
                .groupBy("app_id", "o.kafka_topic", "o.kafka_partition")
                .agg(F.min("o.from_offset").alias("lo"), F.max("o.to_offset").alias("hi"))
                .collect()
            ]
        upto: dict[tuple[str, int], int] = {}
        for topic, p, _lo, hi in self._read:
            upto[(topic, p)] = max(hi, upto.get((topic, p), -1))
        if not upto or not rereads(self.checkpoint, batch_id, upto):
            return None
        return " OR ".join(
            f"(kafka_topic = '{topic}' AND kafka_partition = {p} "
            f"AND kafka_offset BETWEEN {lo} AND {hi})"
            for topic, p, lo, hi in sorted(self._read)
        )

    def prior(self, seen: str | None) -> DataFrame | None:
        """The earlier generations' accepted, late and quarantined records among those ``seen``
        (``read_before``), or None when the batch reads none an earlier generation read."""
        if seen is None:
            return None
        keys = ["kafka_topic", "kafka_partition", "kafka_offset"]

        def decided(name: str, outcome: Column) -> DataFrame:
            first = F.struct("generation", "batch_id").alias("_first")
            return self.tables.load(name).where(seen).select(*keys, first, outcome)

        # Every reason stands, as every other decision does (a parser fixed since does not
        # re-decide it either); two follow from more than the record's bytes, and a replay's
        # batch would decide them differently: ``unknown_ad`` from the dimension as of its
        # batch, ``quality_event_time_not_in_future`` from the batch's time.
        outcomes = (
            decided(t.SILVER, F.lit(ACCEPTED).alias("prior_outcome"))
            .unionByName(decided(t.LATE, F.lit(LATE).alias("prior_outcome")))
            .unionByName(decided(t.QUARANTINE, F.col("reason").alias("prior_outcome")))
        )
        # One per record: its first reader's (tables an earlier replay left holding a record
        # twice, accepted beside its quarantine row, must not make it two records here).
        return outcomes.groupBy(*keys).agg(
            F.min_by("prior_outcome", "_first").alias("prior_outcome")
        )

    def stored_ids(self, watermark_ms: int) -> DataFrame:
        """Event ids whose first copy was decided, later than the batch's watermark (a record
        at or behind it is late whatever was decided), with where they were read and their
        outcome: accepted (silver's) or ``unknown_ad`` (the quarantine's: the dimension check
        follows the dedup state). A replay's fresh dedup state does not remember events an
        earlier generation decided; the tables do."""
        after = F.col("event_time") > F.timestamp_millis(F.lit(watermark_ms))
        where = F.struct("kafka_topic", "kafka_partition", "kafka_offset").alias("stored_at")
        accepted = (
            self.tables.load(t.SILVER)
            .where(after)
            .select("event_id", where, F.lit(ACCEPTED).alias("stored_outcome"))
        )
        unknown = (
            refused_events(self.tables.load(t.QUARANTINE))
            .where(after)
            .select("event_id", where, F.col("reason").alias("stored_outcome"))
        )
        return accepted.unionByName(unknown)
