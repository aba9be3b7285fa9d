"""The record tables' compaction by the job (pipelines/compaction.py), and the other tables'
by Delta as their property says, on real Delta tables."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from pipelines import tables as t
from pipelines.compaction import Compactor
from pipelines.delta_writes import Tables
from pipelines.ledger import write_ledger

T0 = datetime(2026, 11, 20, 10, 0)


def silver_rows(spark: SparkSession, batch: int, n: int = 5) -> DataFrame:
    schema = t.schema(t.SILVER)
    values = {
        "event_id": None,
        "event_type": "click",
        "event_time": None,
        "ad_id": "ad-1",
        "user_id": "u-1",
        "campaign_id": "c-1",
        "cost": Decimal("0.5"),
        "kafka_topic": "ad-events",
        "kafka_partition": 0,
        "generation": 1,
        "batch_id": batch,
    }
    data = []
    for i in range(n):
        row = {**values, "event_id": f"e-{batch}-{i}", "event_time": T0 + timedelta(seconds=i)}
        row["kafka_offset"] = batch * n + i
        data.append(tuple(row.get(c) for c in schema.names))
    return spark.createDataFrame(data, schema)


def append(frame: DataFrame, path: str, files: int = 1, by: str = "kafka_offset") -> None:
    """One commit of ``files`` files (one, as the job writes), split by ranges of ``by``."""
    frame.repartitionByRange(files, by).write.format("delta").mode("append").save(path)


def new_compactor(spark: SparkSession, warehouse: str, **kwargs: Any) -> Compactor:
    """A run's compactor, as the sink makes it (it makes a session of its own)."""
    tables = Tables(spark, warehouse, app_id="test-compaction", generation=1)
    return Compactor(tables, spark, **kwargs)


@contextmanager
def delta_due_at(spark: SparkSession, files: int) -> Iterator[None]:
    """Delta's auto compaction due at ``files`` small files (the job's 50, in a test)."""
    key = "spark.databricks.delta.autoCompact.minNumFiles"
    before = spark.conf.get(key)
    spark.conf.set(key, str(files))
    try:
        yield
    finally:
        spark.conf.set(key, before)  # type: ignore[arg-type]


def last_commit(path: str) -> dict[str, object]:
    newest = sorted((Path(path) / "_delta_log").glob("*.json"))[-1]
    lines = [json.loads(x) for x in newest.read_text().splitlines()]
    return next(x["commitInfo"] for x in lines if "commitInfo" in x)


def test_a_record_table_is_compacted_by_the_job_once_due_and_never_by_its_own_writes(
    spark: SparkSession, tmp_path: Path
) -> None:
    warehouse = str(tmp_path)
    t.create_tables(spark, warehouse, (t.SILVER, t.DIM_ADS))
    silver = f"{warehouse}/{t.SILVER}"
    compactor = new_compactor(spark, warehouse, min_files=4)
    # The first write two files: Delta's auto compaction, were it on for silver, would have
    # compacted them after it (due at two files here, as dim_ads below shows).
    with delta_due_at(spark, 2):
        append(silver_rows(spark, 0), silver, files=2)
    assert t.data_files(spark, silver) == 2
    assert compactor.after_writes([t.SILVER, t.DIM_ADS]) == {}  # under 4 files; dim_ads: Delta's
    for batch in range(1, 3):
        append(silver_rows(spark, batch), silver)
        assert compactor.after_writes([t.SILVER]) == {}  # written 2, 3 times
    append(silver_rows(spark, 3), silver)
    assert t.data_files(spark, silver) == 5
    before = sorted(DeltaTable.forPath(spark, silver).toDF().collect())

    took = compactor.after_writes([t.SILVER])  # the fourth write
    assert set(took) == {t.SILVER} and took[t.SILVER] > 0
    assert t.data_files(spark, silver) == 1
    assert sorted(DeltaTable.forPath(spark, silver).toDF().collect()) == before
    commit = last_commit(silver)
    assert commit["operation"] == "OPTIMIZE"
    assert commit["operationParameters"]["auto"] is False  # type: ignore[index]
    # Compiled, with auto compaction's sizes; the job's own session still runs interpreted.
    assert spark.conf.get("spark.sql.codegen.wholeStage") == "false"
    assert compactor.spark.conf.get("spark.sql.codegen.wholeStage") == "true"
    sizes = [f"spark.databricks.delta.optimize.{k}FileSize" for k in ("max", "min")]
    assert [int(str(compactor.spark.conf.get(k))) for k in sizes] == [8 << 20, 4 << 20]

    # Counted again from the compaction: three more writes are not due, a fourth is.
    for batch in range(4, 7):
        append(silver_rows(spark, batch), silver)
        assert compactor.after_writes([t.SILVER]) == {}
    append(silver_rows(spark, 7), silver)
    assert set(compactor.after_writes([t.SILVER])) == {t.SILVER}
    assert t.data_files(spark, silver) == 1
    assert DeltaTable.forPath(spark, silver).toDF().count() == 8 * 5  # eight batches

    # A table outside the record tables is compacted by Delta, as its property says: its first
    # write's two files (due at two) become one.
    dim = f"{warehouse}/{t.DIM_ADS}"
    frame = spark.createDataFrame(
        [(ad, "c-1", "adv-1", Decimal("1.5"), Decimal("0.2")) for ad in ("ad-1", "ad-2")],
        t.schema(t.DIM_ADS),
    )
    with delta_due_at(spark, 2):
        append(frame, dim, files=2, by="ad_id")
    assert t.data_files(spark, dim) == 1
    assert last_commit(dim)["operation"] == "OPTIMIZE"


def test_a_run_compacts_at_its_first_write_what_earlier_runs_left(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Runs that each write fewer batches than the threshold leave no more small files than
    twice it: a run's first write compacts a table that already holds that many."""
    warehouse = str(tmp_path)
    t.create_tables(spark, warehouse, (t.SILVER,))
    silver = f"{warehouse}/{t.SILVER}"
    for batch in range(3):
        append(silver_rows(spark, batch), silver)
        assert new_compactor(spark, warehouse, min_files=4).after_writes([t.SILVER]) == {}  # a run
    append(silver_rows(spark, 3), silver)
    assert set(new_compactor(spark, warehouse, min_files=4).after_writes([t.SILVER])) == {t.SILVER}
    assert t.data_files(spark, silver) == 1


def test_a_failed_compaction_leaves_the_files_and_never_fails_the_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    """As Delta's own: logged, the table as it was, tried again after the next write. Here the
    job's lease is lost (its guard raises): nothing is committed."""
    warehouse = str(tmp_path)
    t.create_tables(spark, warehouse, (t.SILVER,))
    silver = f"{warehouse}/{t.SILVER}"
    lost = [True]

    def guard() -> None:
        if lost:
            raise RuntimeError("lease lost")

    compactor = new_compactor(spark, warehouse, min_files=2, guard=guard)
    append(silver_rows(spark, 0), silver, files=2)
    assert compactor.after_writes([t.SILVER]) == {}
    assert t.data_files(spark, silver) == 2 and last_commit(silver)["operation"] == "WRITE"
    lost.clear()
    append(silver_rows(spark, 1), silver)
    assert set(compactor.after_writes([t.SILVER])) == {t.SILVER}  # the next write: again
    assert t.data_files(spark, silver) == 1


def test_a_table_delta_compacts_is_compacted_once_due_not_after_every_commit_of_a_restarted_job(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The ledger (Delta's auto compaction, as its property says) holds files an earlier run
    wrote, which this JVM never counted. Its writes here are compacted once they made the
    threshold's number of small files, then again after as many more: not after every write,
    which Delta's default did once a compaction took more files than it had counted."""
    warehouse = str(tmp_path)
    t.create_tables(spark, warehouse, (t.LEDGER,))
    ledger = f"{warehouse}/{t.LEDGER}"
    tables = Tables(spark, warehouse, app_id="test-auto-compaction", generation=1)
    earlier_runs_ledger(spark, tables, 3)
    with delta_due_at(spark, 4):
        for batch in range(3, 11):
            ledger_row(tables, batch)
    ops = [
        r.operation
        for r in DeltaTable.forPath(spark, ledger).history().orderBy("version").collect()
    ]
    writes = ["WRITE"] * 4
    assert ops == ["CREATE TABLE", *(["WRITE"] * 3), *writes, "OPTIMIZE", *writes, "OPTIMIZE"]
    assert spark.read.format("delta").load(ledger).count() == 11  # every row, once


def test_delta_counts_only_the_small_files_a_compaction_can_take(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Files over half the maximum size are never rewritten by a compaction, so Delta's count
    of small files leaves them out: three big files and one small one are not due at four, four
    small ones are. Counting every file, Delta found a compaction due from the first small file
    on, and a long-lived job that had written the threshold's number of big files to a table
    had a compaction after every commit."""
    warehouse = str(tmp_path)
    t.create_tables(spark, warehouse, (t.DIM_ADS,))
    dim = f"{warehouse}/{t.DIM_ADS}"
    with delta_due_at(spark, 4):
        for seed in range(3):  # ~5 MB each
            append(random_rows(spark, t.DIM_ADS, "ad_id", 5000, 1000, seed), dim, by="ad_id")
        for seed in range(3, 7):
            append(random_rows(spark, t.DIM_ADS, "ad_id", 2, 8, seed), dim, by="ad_id")
    history = DeltaTable.forPath(spark, dim).history().orderBy("version").collect()
    assert [r.operation for r in history] == ["CREATE TABLE", *(["WRITE"] * 7), "OPTIMIZE"]
    assert history[-1].operationMetrics["numRemovedFiles"] == "4"  # the small ones
    assert t.data_files(spark, dim) == 4
    assert spark.read.format("delta").load(dim).count() == 3 * 5000 + 4 * 2


def random_rows(
    spark: SparkSession, table: str, column: str, n: int, length: int, seed: int
) -> DataFrame:
    """``n`` rows of ``table`` whose ``column`` is random text of ``length`` characters (the
    others null): Parquet compresses none of it, so 5,000 rows of 1,000 make a file of ~5 MB."""
    return spark.range(n).selectExpr(
        *(
            f"randstr({length}, {seed}) AS {f.name}"
            if f.name == column
            else f"CAST(NULL AS {f.dataType.simpleString()}) AS {f.name}"
            for f in t.schema(table)
        )
    )


def test_a_table_of_big_files_is_not_due_at_a_runs_first_write(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A run's first write counts what the table holds already, as Delta's count does: only the
    files a compaction would rewrite (from the checksum's file-size histogram). Two files of
    ~5 MB and a small one are not due at two; a second small one is."""
    warehouse = str(tmp_path)
    t.create_tables(spark, warehouse, (t.SILVER,))
    silver = f"{warehouse}/{t.SILVER}"
    for seed in range(2):
        append(random_rows(spark, t.SILVER, "user_id", 5000, 1000, seed), silver, by="user_id")
    append(silver_rows(spark, 0), silver)
    assert t.data_files(spark, silver) == 3 and t.small_files(spark, silver, 4 << 20) == 1
    assert new_compactor(spark, warehouse, min_files=2).after_writes([t.SILVER]) == {}
    append(silver_rows(spark, 1), silver)
    assert set(new_compactor(spark, warehouse, min_files=2).after_writes([t.SILVER])) == {t.SILVER}
    assert t.data_files(spark, silver) == 3  # the big two, and the small two as one
    assert t.small_files(spark, silver, 4 << 20) == 1


def test_a_run_compacts_at_its_first_batch_what_earlier_runs_left_in_the_tables_delta_compacts(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Delta counts only this JVM's files: the job's compactor takes what earlier runs left in
    the gold tables, the sessions and the ledger at a run's first batch, once, when a table
    holds ``min_files`` files."""
    warehouse = str(tmp_path)
    t.create_tables(spark, warehouse, (t.LEDGER, t.SESSIONS))
    ledger = f"{warehouse}/{t.LEDGER}"
    tables = Tables(spark, warehouse, app_id="test-auto-compaction", generation=1)
    earlier_runs_ledger(spark, tables, 4)
    assert t.data_files(spark, ledger) == 4
    compactor = new_compactor(spark, warehouse, min_files=4)
    assert set(compactor.after_writes([])) == {t.LEDGER}  # the run's first batch; sessions empty
    assert t.data_files(spark, ledger) == 1 and last_commit(ledger)["operation"] == "OPTIMIZE"
    assert spark.read.format("delta").load(ledger).count() == 4
    earlier_runs_ledger(spark, tables, 4, first=4)
    assert compactor.after_writes([]) == {}  # later batches: Delta's own count
    assert new_compactor(spark, warehouse, min_files=6).after_writes([]) == {}  # 5 files held


def ledger_row(tables: Tables, batch: int) -> None:
    """The batch's ledger row, as the job writes it."""
    write_ledger(
        tables,
        batch,
        dim_version=0,
        ranges={("ad-events", 0): (batch, batch + 1, 1)},
        counts={"accepted": 1},
        transactional_id=None,
        kafka_outcome="disabled",
        millis={"batch_timestamp": 0, "watermark": 0, "started_at": 0, "finished_at": 0},
        fresh=True,
    )


def earlier_runs_ledger(spark: SparkSession, tables: Tables, n: int, first: int = 0) -> None:
    """``n`` ledger rows written as by an earlier JVM: not in this one's counts of small files,
    which Delta's auto compaction decides by."""
    record = "spark.databricks.delta.autoCompact.recordPartitionStats.enabled"
    spark.conf.set(record, "false")
    try:
        for batch in range(first, first + n):
            ledger_row(tables, batch)
    finally:
        spark.conf.unset(record)
