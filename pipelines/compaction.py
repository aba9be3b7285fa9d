"""The record tables' small files, compacted by the job itself (``ADATTR_COMPACTION=job``), and
what earlier runs left in the other tables it writes.

A batch appends one or more files to bronze, quarantine, late and silver; Delta's auto
compaction rewrites them, once ``compact_files`` have piled up, inside the commit of the write
that crossed the line, in the batch's own session, which runs interpreted (cheaper for the
batches' few thousand rows, app/runtime/spark.py). A compaction rewrites every row of those
files, and interpreted evaluation made it about 4x dearer: 50 silver-shaped files, 112 MB, 44.0
and 36.2 s interpreted against 10.4 and 9.8 s compiled; the soak's worst batches (16-24 s) were
silver's. Here the same rewrite (files under half of 8 MB into files of up to 8 MB, OPTIMIZE's
bin packing) runs right after the batch's record writes, in a Spark session of its own with
compiled code.

It runs in the batch's thread, not beside the gold writes: on two cores a compaction beside
them only stretched them by as long as it took (the soak, README "Performance").

The other tables the job writes (the gold tables, the sessions, the ledger) are compacted by
Delta's auto compaction, which counts the small files this JVM wrote to each
(app/runtime/spark.py): what earlier runs left is not in that count, so those tables too are
compacted here at a run's first batch when they already hold ``compact_files`` files (right
after the record writes, before the batch writes to any of them).

Why it never conflicts. A compaction commits files removed and added with ``dataChange=false``,
between the batch's record writes and its gold writes, which only read silver: nothing writes
to these tables meanwhile, as with Delta's auto compaction in the writing thread. A compaction
that fails is logged and leaves the files as they were, to be tried again after the next write:
as Delta's own, it never fails the batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from pyspark.sql import SparkSession

from app.runtime.spark import AUTO_COMPACT_FILE_BYTES, SMALL_FILE_BYTES
from pipelines import tables as t
from pipelines.delta_writes import Tables

log = logging.getLogger("adattr.compaction")

# What the session compacts with: compiled code (the job's own session runs interpreted) and
# auto compaction's sizes for OPTIMIZE (its defaults: every file under 1 GB, into 1 GB files).
SESSION_CONF = {
    "spark.sql.codegen.wholeStage": "true",
    "spark.sql.codegen.factoryMode": "FALLBACK",
    "spark.databricks.delta.optimize.maxFileSize": str(AUTO_COMPACT_FILE_BYTES),
    "spark.databricks.delta.optimize.minFileSize": str(SMALL_FILE_BYTES),
}


# Written by the job, compacted by Delta as their property says (pipelines/tables.py); dim_ads,
# written by `adattr dim load`, is left to Delta alone. Derived, so a table given the property
# later is covered by the run's first-batch check without anyone listing it here.
DELTA_COMPACTED = tuple(
    table.name
    for table in t.TABLES
    if table.properties.get("delta.autoOptimize.autoCompact") == "true" and table.name != t.DIM_ADS
)


class Compactor:
    """Compacts a record table once the job has written to it ``min_files`` times since its
    last compaction in this run: a write adds at most one file per table partition (one per
    Kafka partition in bronze), so, as Delta's own rule, no partition holds more than
    ``min_files`` new small files. A run's first write to a table also compacts it when the
    table already holds ``min_files`` small files (counted from the checksum file of its latest
    version, no Spark job; none there: not due): runs that each write a few batches and stop
    leave fewer than twice that many small files per partition, however many follow. Files a
    compaction would not rewrite are not counted: a table of many big files is not due."""

    def __init__(
        self,
        tables: Tables,
        spark: SparkSession,
        min_files: int,
        guard: Callable[[], None] | None = None,
    ) -> None:
        self.tables = tables
        self.spark = spark.newSession()  # its own confs, not the job's
        for key, value in SESSION_CONF.items():
            self.spark.conf.set(key, value)
        self.min_files = min_files
        self.guard = guard  # raises when the job must not write (its lease is lost)
        self.writes: dict[str, int] = {}  # a table's writes since its last compaction (this run)
        self.started = False  # the run's first batch has looked at DELTA_COMPACTED

    def due(self, written: Iterable[str]) -> list[str]:
        """Notes a write to each of the ``written`` tables; returns the record tables among
        them that are due, and at the run's first batch the DELTA_COMPACTED tables that hold
        ``min_files`` files already."""
        names = []
        for name in written:
            if name not in t.RECORD_TABLES:
                continue
            if name in self.writes:
                self.writes[name] += 1
                due = self.writes[name] >= self.min_files
            else:  # the run's first write: what the table holds already
                self.writes[name] = 1
                due = self._holds_enough(name)
            if due:
                names.append(name)
        if not self.started:
            self.started = True
            names += [name for name in DELTA_COMPACTED if self._holds_enough(name)]
        return names

    def _holds_enough(self, name: str) -> bool:
        held = t.small_files(self.spark, self.tables.path(name), SMALL_FILE_BYTES)
        return held is not None and held >= self.min_files

    def after_writes(self, written: Iterable[str]) -> dict[str, float]:
        """After a batch's writes to the ``written`` tables: compacts those due, one after the
        other; returns how long each took (a table whose compaction failed is left out)."""
        try:
            names = self.due(written)
        except Exception:  # the Delta log unreadable: the write before would have failed too
            log.warning("could not tell whether the record tables are due", exc_info=True)
            return {}
        return {name: took for name in names if (took := self._compact(name)) is not None}

    def _compact(self, name: str) -> float | None:
        from delta.tables import DeltaTable

        started = time.monotonic()
        try:
            if self.guard is not None:
                self.guard()
            metrics = (
                DeltaTable.forPath(self.spark, self.tables.path(name))
                .optimize()
                .executeCompaction()
                .select("metrics.numFilesRemoved", "metrics.numFilesAdded")
                .first()
            )
        except Exception:  # the files stay as they were; tried again after the next write
            log.warning("compaction of %s failed", name, exc_info=True)
            return None
        self.writes[name] = 0
        took = time.monotonic() - started
        log.info(
            "compacted %s: %s files into %s, %.2fs",
            name,
            metrics.numFilesRemoved if metrics else "?",
            metrics.numFilesAdded if metrics else "?",
            took,
        )
        return took
