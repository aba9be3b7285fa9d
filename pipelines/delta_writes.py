"""Idempotent Delta writes.

Delta records, per table, the highest ``txnVersion`` committed for each ``txnAppId`` (a
``SetTransaction`` action in the same commit as the data), and skips a write whose version is not
above it. For MERGE only the *session* settings carry the pair (writer options are for appends),
so they are set around the one write and cleared at once: a second write in the same session must
never inherit them. The app id must change whenever batch ids restart (a new checkpoint), or
Delta would silently skip real writes; callers derive it from the checkpoint generation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines import tables as t

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
# A commit's free-text note (commitInfo.userMetadata; DESCRIBE HISTORY shows it).
COMMIT_NOTE = "spark.databricks.delta.commitInfo.userMetadata"


@contextmanager
def delta_txn(spark: SparkSession, app_id: str, version: int) -> Iterator[None]:
    """Within the block, Delta writes of this session carry (app_id, version)."""
    spark.conf.set(TXN_APP_ID, app_id)
    spark.conf.set(TXN_VERSION, str(version))
    try:
        yield
    finally:
        spark.conf.unset(TXN_APP_ID)
        spark.conf.unset(TXN_VERSION)


@contextmanager
def noted(spark: SparkSession, app_id: str, batch_id: int) -> Iterator[None]:
    """Within the block, Delta commits of this session note which batch made them (JSON
    ``{"app_id", "batch_id"}``): for a write that carries no txn ids, what says whose it is."""
    spark.conf.set(COMMIT_NOTE, json.dumps({"app_id": app_id, "batch_id": batch_id}))
    try:
        yield
    finally:
        spark.conf.unset(COMMIT_NOTE)


class Tables:
    """The warehouse's tables as the job's batches write them: where each lives, the stamp every
    written row carries, the idempotent insert, and the version each write of the current batch
    left (``versions``, recorded in the ledger; the caller clears it per batch).

    ``exactly_once`` is False only for the benchmark's at-least-once baseline: no Delta txn,
    plain appends."""

    def __init__(
        self,
        spark: SparkSession,
        warehouse: str,
        app_id: str,
        generation: int,
        *,
        exactly_once: bool = True,
    ) -> None:
        self.spark = spark
        self.warehouse = warehouse
        self.app_id = app_id
        self.generation = generation
        self.exactly_once = exactly_once
        self.versions: dict[str, int] = {}

    def path(self, name: str) -> str:
        return f"{self.warehouse}/{name}"

    def load(self, name: str, spark: SparkSession | None = None) -> DataFrame:
        return (spark or self.spark).read.format("delta").load(self.path(name))

    def stamped(self, df: DataFrame, batch_id: int) -> DataFrame:
        """Every row a batch writes or changes carries its (generation, batch_id): how the
        publisher finds a batch's gold rows again."""
        return df.withColumns(self.stamp(batch_id))

    def stamp(self, batch_id: int) -> dict[str, Column]:
        return {"generation": F.lit(self.generation), "batch_id": F.lit(batch_id).cast("long")}

    def txn(self, batch_id: int, spark: SparkSession | None = None) -> AbstractContextManager[None]:
        """Delta's idempotent-write marker around one write (none in the at-least-once mode)."""
        if not self.exactly_once:
            return nullcontext()
        return delta_txn(spark or self.spark, self.app_id, batch_id)

    def insert_new(
        self,
        name: str,
        source: DataFrame,
        condition: str,
        batch_id: int,
        *,
        fresh: bool,
        spark: SparkSession | None = None,
    ) -> None:
        """Inserts the source's rows that the table does not hold yet: a plain append when no
        row with their keys can exist (``fresh``, see ``pipelines.high_water``; and always in the
        at-least-once baseline), otherwise a MERGE keyed by ``condition`` with Delta's txn ids
        (set in ``spark``'s confs: a thread writing beside others passes its own session)."""
        from delta.tables import DeltaTable

        if fresh or not self.exactly_once:
            # An append does not cast to the table's types as a MERGE does. One task writes it:
            # a file per table per batch (per Kafka partition in bronze) instead of one per
            # task and table partition (bronze took 16 files a batch), so fewer files to commit,
            # to list in every snapshot after, and to compact.
            typed = source.select(*[F.col(f.name).cast(f.dataType) for f in t.schema(name).fields])
            typed.coalesce(1).write.format("delta").mode("append").save(self.path(name))
            self.committed(name)
            return
        spark = spark or self.spark
        with delta_txn(spark, self.app_id, batch_id):
            (
                DeltaTable.forPath(spark, self.path(name))
                .alias("t")
                .merge(source.alias("s"), condition)
                .whenNotMatchedInsertAll()
                .execute()
            )
        self.committed(name)

    def committed(self, name: str) -> None:
        """Notes the table's version after this batch's write (the version that holds it; the
        same as before when Delta skipped an already committed batch)."""
        self.versions[name] = table_version(self.spark, self.path(name))


def table_version(spark: SparkSession, path: str) -> int:
    """The table's latest version, from the Delta log this process already holds in memory
    (a few ms; ``DeltaTable.history(1)`` runs a Spark job, ~0.3 s per table per batch)."""
    log = spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(  # type: ignore[union-attr]
        spark._jsparkSession, path
    )
    return int(log.unsafeVolatileSnapshot().version())


JOB_DESCRIPTION = "spark.job.description"


def described(spark: SparkSession, name: str, write: Callable[[], object]) -> Callable[[], None]:
    """``write`` with the Spark jobs it starts described as ``adattr <name>`` (the description
    Spark's UI and event log show, and Delta puts before its own jobs' descriptions), the
    thread's previous description back after it. Without it the jobs of the sink's write
    threads have none (a thread does not inherit the batch thread's), and a profile cannot
    tell one table's write from another's."""
    sc = spark.sparkContext

    def run() -> None:
        before = sc.getLocalProperty(JOB_DESCRIPTION)
        sc.setJobDescription(f"adattr {name}")
        try:
            write()
        finally:
            sc.setLocalProperty(JOB_DESCRIPTION, before)  # type: ignore[arg-type]

    return run


def run_concurrently(writes: Sequence[Callable[[], object]], *, together: bool) -> None:
    """Runs independent writes at once (Spark's scheduler is thread-safe, and a Delta commit's
    fixed cost is mostly waiting), or one by one; the first failure is raised. Writes at once
    must not share a session whose confs carry Delta txn ids or a commit note (``noted``)."""
    if not together or len(writes) < 2:
        for write in writes:
            write()
        return
    with ThreadPoolExecutor(len(writes), thread_name_prefix="adattr-write") as pool:
        for future in [pool.submit(write) for write in writes]:
            future.result()
