"""The gold rows a batch changed, as the Kafka records that publish them.

A batch's rows are found by the stamp every written row carries (its generation and batch id),
so a re-executed batch finds the same rows whatever its own execution committed, and each gets a
deterministic record id: the same row of the same batch of the same generation is recognisably
the same record however often it is published. A batch that leaves the 1-minute table to a
pass publishes the windows it computed instead (``records_of`` of those rows, stamped alike:
``pipelines.gold_writes.GoldUpdate._publish_minutes``).
"""

from __future__ import annotations

from collections.abc import Iterator

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F

from pipelines.delta_writes import Tables
from schemas.ad_metrics import PUBLISHED

ISO = "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"


def changed_records(
    tables: Tables, batch_id: int, names: tuple[str, ...] = tuple(PUBLISHED)
) -> DataFrame:
    """Key ``k`` and JSON value ``v`` of every row of the published tables ``names`` stamped
    with the batch."""
    mine = stamped_by(tables, batch_id)
    frames = [records_of(tables, name, tables.load(name).where(mine), batch_id) for name in names]
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out


def stamped_by(tables: Tables, batch_id: int) -> Column:
    """Whether a gold row carries the stamp of batch ``batch_id`` of this generation."""
    return (F.col("generation") == tables.generation) & (F.col("batch_id") == batch_id)


def records_of(
    tables: Tables, name: str, rows: DataFrame, batch_id: int, extra: tuple[str, ...] = ()
) -> DataFrame:
    """Key ``k`` and JSON value ``v`` of ``rows``: rows of the published table ``name`` (its
    columns, with the stamp of batch ``batch_id``), as that batch publishes them; and the
    ``extra`` columns of ``rows`` beside them."""
    keys, columns = PUBLISHED[name]
    key = F.concat_ws(
        "|",
        F.lit(name),
        *[F.date_format(k, ISO) if "time" in k or "window" in k else F.col(k) for k in keys],
    )
    record_id = F.sha2(
        F.concat_ws("|", key, F.lit(tables.app_id), F.lit(batch_id).cast("string")), 256
    )
    value = F.to_json(
        F.struct(
            record_id.alias("record_id"),
            F.lit(name).alias("table"),
            F.lit(tables.app_id).alias("app_id"),
            F.col("generation"),
            F.col("batch_id"),
            F.struct(*keys, *columns).alias("row"),
        ),
        # Nulls stay (an unattributed conversion has click_id null, not absent).
        {"timestampFormat": ISO, "ignoreNullFields": "false"},
    )
    return rows.select(key.alias("k"), value.alias("v"), *extra)


def rows_of(frame: DataFrame) -> Iterator[Row]:
    """``frame``'s rows, one partition in memory at a time.

    Not ``DataFrame.toLocalIterator``: in Spark 4.2 it runs its query in an SQL execution that
    ends before the jobs that serve the partitions start (they run as Python pulls), so the
    DAG scheduler files those jobs under an execution already cleaned up and never lets them go
    (``activeQueryToJobs``): each call kept its plan, its Delta snapshots and broadcasts on the
    driver's heap, and a job that published every batch ran out of heap within the hour
    (README "Performance"). The RDD's iterator runs the same jobs under the caller's execution
    (the micro-batch's, cleaned up when it ends; none outside a stream)."""
    return frame.rdd.toLocalIterator()
