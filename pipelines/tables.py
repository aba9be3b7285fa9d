"""The Delta tables of the job: names, schemas, layout. Every table lives at
``$ADATTR_WAREHOUSE/<name>``; they are created (empty) before the stream starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from schemas.ad_event import event_struct

DIM_ADS = "dim_ads"
BRONZE = "bronze_ad_events"
QUARANTINE = "quarantine_ad_events"
LATE = "late_ad_events"
SILVER = "silver_ad_events"
GOLD_1M = "gold_ad_metrics_1m"
ATTRIBUTIONS = "gold_attributions"
CTR_1H = "gold_campaign_ctr_1h"
SESSIONS = "gold_user_sessions"
LEDGER = "ledger"

_COORDS = "kafka_topic string, kafka_partition int, kafka_offset long, kafka_timestamp timestamp"
_PROVENANCE = "generation int, batch_id long"
# The event columns come from the contract (schemas/ad_event.v1.json), never restated here.
_EVENT = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in event_struct().fields)


# Tables the job only appends to and never reads while it runs: a Delta checkpoint (a ~1.4 s
# spike in the batch that writes it) every 100 commits instead of every 10. Readers (audit,
# verify, the start of a run) replay at most 100 small JSON commits.
_APPEND_ONLY = {"delta.checkpointInterval": "100"}
# The 1-minute table, whose rows a MERGE changes in place every batch: deletion vectors. A
# change then marks the old rows deleted and writes the new ones to a new file, instead of
# rewriting every file it touches with all their other rows. Without them it stayed one file
# that every batch copied whole (the soak: rows copied per MERGE grew from 990 to 63,990 in 30
# minutes, its execution from 1.7 to 2.9 s; with them 2.0 to 2.8 s, nothing copied). Not on the
# attributions and hourly tables: there they cost every batch more than they save in 30 minutes
# (MERGE execution, first sixth to last: hourly 1.1 -> 2.2 s without, 1.7 -> 2.8 s with;
# attributions 0.4 -> 1.0 s without, 0.9 -> 1.0 s with; bench --fixed-only: a 1,000-record batch
# 7.3-7.4 s with them on the 1-minute table only, 8.1-8.3 s on all three). Readers need Delta's
# deletionVectors table feature (Spark with Delta 2.3+, delta-rs, DuckDB, Trino).
_CHANGED_IN_PLACE = {"delta.enableDeletionVectors": "true"}
# Delta's auto compaction after a commit, when the session leaves it to the table
# (ADATTR_COMPACTION=job, app/runtime/spark.py): every table but those a batch appends its
# records to, which the job compacts itself (pipelines/compaction.py). These MERGE or are written
# once at a batch's end, so a compaction beside their writes would conflict with them.
_AUTO_COMPACTED = {"delta.autoOptimize.autoCompact": "true"}
# Statistics (min, max, null count per file) only on the columns the job's reads and MERGEs
# filter by: time, Kafka coordinates, the batch stamp. Delta collects them on every write, by
# default for the first 32 columns, and computes them row by row in the writing task (with the
# job's interpreted expressions, README "Interpreted expressions"): a 25,000-row append of
# silver's 20 columns took 2.55 s with them all, 1.12 s with four (median of six, alternating);
# the job's record phase halved (README "Performance"). Min and max of a random id or a
# free-text column skip no file; Delta keeps none for a boolean (it refuses one named here).
# Correctness never rests on them (a file without a column's statistics is read); the row
# count is always collected.
_PROVENANCE_STATS = ("generation", "batch_id")
_COORDS_STATS = ("kafka_topic", "kafka_partition", "kafka_offset")


def _stats_on(*columns: str) -> dict[str, str]:
    return {"delta.dataSkippingStatsColumns": ",".join(columns)}


@dataclass(frozen=True)
class Table:
    name: str
    ddl: str
    partitioned_by: tuple[str, ...] = ()
    properties: dict[str, str] = field(default_factory=dict)


TABLES = (
    Table(
        DIM_ADS,
        "ad_id string, campaign_id string, advertiser_id string, "
        "cpm decimal(12,6), cpc decimal(12,6)",
        properties=_AUTO_COMPACTED,
    ),
    # Exact bytes of every record read; partitioned by Kafka partition so the per-batch MERGE
    # reads only the files whose offset range overlaps the batch.
    Table(
        BRONZE,
        f"{_COORDS}, raw_key binary, raw_value binary, {_PROVENANCE}",
        ("kafka_partition",),
        _APPEND_ONLY | _stats_on("kafka_topic", "kafka_offset", *_PROVENANCE_STATS),
    ),
    Table(
        QUARANTINE,
        f"{_COORDS}, raw_value binary, raw_text string, reason string, {_PROVENANCE}",
        properties=_APPEND_ONLY | _stats_on(*_COORDS_STATS, *_PROVENANCE_STATS),
    ),
    Table(
        LATE,
        f"{_COORDS}, {_EVENT}, watermark timestamp, {_PROVENANCE}",
        properties=_APPEND_ONLY | _stats_on(*_COORDS_STATS, "event_time", *_PROVENANCE_STATS),
    ),
    Table(
        SILVER,
        f"{_EVENT}, campaign_id string, cpm decimal(12,6), cpc decimal(12,6), cost decimal(18,9), "
        f"dim_version long, {_COORDS}, {_PROVENANCE}",
        properties=_stats_on("event_time", *_COORDS_STATS, *_PROVENANCE_STATS),
    ),
    Table(
        GOLD_1M,
        "window_start timestamp, window_end timestamp, ad_id string, campaign_id string, "
        "advertiser_id string, impressions long, clicks long, spend decimal(24,9), "
        "conversions long, revenue decimal(24,6), is_final boolean, generation int, batch_id long",
        properties=_CHANGED_IN_PLACE
        | _AUTO_COMPACTED
        | _stats_on("window_start", "window_end", *_PROVENANCE_STATS),
    ),
    # One row per conversion; provisional (is_final false) until the watermark passes the
    # conversion time, after which no earlier click can be accepted and the row never changes.
    # Partitioned by is_final: a batch MERGEs into the provisional rows (the last watermark
    # delay's conversions) and those its watermark passed, which its MERGE moves to the final
    # partition in a file of their own; the final rows of earlier batches lie in files whose
    # conversion times end at or before the previous watermark, outside every later MERGE's time
    # bounds, so no batch reads or rewrites them again. Unpartitioned, the table was one file
    # holding every conversion of the run, read and rewritten by every batch (the hour-long
    # soak: the MERGE 1.22 -> 1.96 s; infra/bench/final_partition.py, a MERGE into 10,000 /
    # 100,000 conversions: 1.57 / 3.10 s unpartitioned, 1.27 / 1.29 s partitioned). A table
    # created unpartitioned by an earlier version keeps its layout (as correct, and slower).
    Table(
        ATTRIBUTIONS,
        "conversion_id string, conversion_time timestamp, user_id string, advertiser_id string, "
        "revenue decimal(18,6), click_id string, click_time timestamp, ad_id string, "
        "campaign_id string, status string, is_final boolean, generation int, batch_id long",
        ("is_final",),
        _AUTO_COMPACTED | _stats_on("conversion_time", *_PROVENANCE_STATS),
    ),
    Table(
        CTR_1H,
        "window_start timestamp, window_end timestamp, campaign_id string, impressions long, "
        "clicks long, ctr double, is_final boolean, generation int, batch_id long",
        properties=_AUTO_COMPACTED | _stats_on("window_start", "window_end", *_PROVENANCE_STATS),
    ),
    # Closed sessions only: a row is written once, when the watermark passes session_end.
    Table(
        SESSIONS,
        "session_start timestamp, session_end timestamp, user_id string, events long, "
        "impressions long, clicks long, conversions long, revenue decimal(24,6), "
        "generation int, batch_id long",
        properties=_AUTO_COMPACTED | _stats_on("session_start", "session_end", *_PROVENANCE_STATS),
    ),
    Table(
        LEDGER,
        "app_id string, generation int, batch_id long, batch_timestamp timestamp, "
        "watermark timestamp, dim_version long, "
        "offsets array<struct<kafka_topic:string,kafka_partition:int,from_offset:long,"
        "to_offset:long,records:long>>, "
        "counts map<string,long>, delta_versions map<string,long>, "
        "kafka_transactional_id string, kafka_outcome string, "
        "started_at timestamp, finished_at timestamp",
        properties=_APPEND_ONLY | _AUTO_COMPACTED,
    ),
)


# The tables whose rows are keyed by the Kafka record they came from: a batch appends its
# records to them in one phase (pipelines/record_writes.py).
RECORD_TABLES = (BRONZE, QUARANTINE, LATE, SILVER)


def table(name: str) -> Table:
    return next(t for t in TABLES if t.name == name)


def schema(name: str) -> StructType:
    return cast(StructType, StructType.fromDDL(table(name).ddl))


def columns(name: str) -> list[str]:
    return [f.name for f in schema(name).fields]


def create_tables(
    spark: SparkSession, warehouse: str, names: tuple[str, ...] | None = None
) -> None:
    """Creates the tables that do not exist yet, and gives existing ones the properties they
    lack (a warehouse made by an earlier version; idempotent: nothing is committed when every
    property is in place)."""
    from delta.tables import DeltaTable

    for t in TABLES:
        if names is not None and t.name not in names:
            continue
        path = f"{warehouse}/{t.name}"
        if DeltaTable.isDeltaTable(spark, path):
            held = latest_snapshot(spark, path).metadata().configuration()  # a Scala Map
            lacking = {k: v for k, v in t.properties.items() if _get(held, k) != v}
            if lacking:
                assignments = ", ".join(f"'{k}' = '{v}'" for k, v in sorted(lacking.items()))
                spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({assignments})")
            continue
        builder = (
            DeltaTable.createIfNotExists(spark)
            .location(f"{warehouse}/{t.name}")
            .addColumns(schema(t.name))
        )
        if t.partitioned_by:
            builder = builder.partitionedBy(*t.partitioned_by)
        for key, value in t.properties.items():
            builder = builder.property(key, value)
        builder.execute()


def _get(scala_map: Any, key: str) -> str | None:
    found = scala_map.get(key)  # a Scala Option
    return str(found.get()) if found.isDefined() else None


def data_files(spark: SparkSession, path: str) -> int | None:
    """The data files of the table's latest version, from the checksum file Delta writes after
    each commit (no Spark job); None when that version has none."""
    checksum = latest_snapshot(spark, path).checksumOpt()
    return int(checksum.get().numFiles()) if checksum.isDefined() else None


def small_files(spark: SparkSession, path: str, below: int) -> int | None:
    """The data files under ``below`` bytes in the table's latest version, from the file-size
    histogram of the checksum file Delta writes after each commit (no Spark job): exact when
    ``below`` is one of the histogram's bin boundaries (powers of two up to 4 MB, then steps
    of 4 MB and more), else also counting the bigger files of ``below``'s bin. Every file when
    the checksum has no histogram; None when that version has no checksum."""
    checksum = latest_snapshot(spark, path).checksumOpt()
    if not checksum.isDefined():
        return None
    histogram = checksum.get().fileSizeHistogram()
    if not histogram.isDefined():
        return int(checksum.get().numFiles())
    bins = histogram.get()
    # Each as one string: one py4j call, not one per bin (~95 of them).
    starts = str(bins.sortedBinBoundaries().mkString(",")).split(",")
    arrays = spark._jvm.java.util.Arrays  # type: ignore[union-attr]
    counts = str(arrays.toString(bins.fileCounts())).strip("[]").split(",")
    return sum(int(n) for start, n in zip(starts, counts, strict=True) if int(start) < below)


def latest_snapshot(spark: SparkSession, path: str) -> Any:
    """The table's latest Delta snapshot (a JVM object): lists its log, reads no data."""
    jvm = spark._jvm
    none = jvm.scala.Option.apply(None)  # type: ignore[union-attr]
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(  # type: ignore[union-attr]
        spark._jsparkSession, path
    )
    return log.update(False, none, none)
