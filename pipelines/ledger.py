"""The per-batch ledger row, written last: a row for (app id, batch id) means the batch is
complete in every table (but the three the passes write, ``pipelines.hourly_pass``, which a crash
leaves to the next run's first batch) and its Kafka transaction (if any) is committed.

It records what the batch read (offset ranges per partition), what became of it (counts per
outcome, which add up to ``read``, plus derived counts), the table versions that hold it, the
dimension version it used and the Kafka outcome: what ``adattr audit`` checks every table
against.
"""

from __future__ import annotations

import json

from pyspark.sql import functions as F

from pipelines import tables as t
from pipelines.delta_writes import Tables
from pipelines.record_writes import Ranges

SCHEMA = (
    "app_id string, generation int, batch_id long, dim_version long, "
    "offsets array<struct<kafka_topic:string,kafka_partition:int,from_offset:long,"
    "to_offset:long,records:long>>, counts map<string,long>, "
    "delta_versions map<string,long>, kafka_transactional_id string, kafka_outcome string"
)


def write_ledger(
    tables: Tables,
    batch_id: int,
    *,
    dim_version: int,
    ranges: Ranges,
    counts: dict[str, int],
    transactional_id: str | None,
    kafka_outcome: str,
    millis: dict[str, int],
    fresh: bool,
) -> None:
    """Inserts the batch's ledger row (``millis``: its timestamps, epoch ms, by column name),
    keyed by (app id, batch id): a re-executed batch's row is not inserted twice."""
    value = {
        "app_id": tables.app_id,
        "generation": tables.generation,
        "batch_id": batch_id,
        "dim_version": dim_version,
        "offsets": [
            {
                "kafka_topic": tp,
                "kafka_partition": p,
                "from_offset": lo,
                "to_offset": hi,
                "records": n,
            }
            for (tp, p), (lo, hi, n) in sorted(ranges.items())
        ],
        "counts": counts,
        "delta_versions": tables.versions,
        "kafka_transactional_id": transactional_id,
        "kafka_outcome": kafka_outcome,
    }
    # One row made in the JVM from a JSON literal: a DataFrame of Python rows is a Python RDD,
    # which would start Python workers for every batch's ledger write.
    row = (
        tables.spark.range(1)
        .select(F.from_json(F.lit(json.dumps(value)), SCHEMA, {"mode": "FAILFAST"}).alias("r"))
        .select("r.*")
        .withColumns({k: F.timestamp_millis(F.lit(v)) for k, v in millis.items()})
    )
    tables.insert_new(
        t.LEDGER,
        row.select(*t.columns(t.LEDGER)),
        "t.app_id = s.app_id AND t.batch_id = s.batch_id",
        batch_id,
        fresh=fresh,
    )
