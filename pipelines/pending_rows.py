"""The gold rows the batches since the last pass set, kept on the driver until a pass MERGEs them
(``pipelines.hourly_pass``): the attribution rows into ``gold_attributions``, the 1-minute
windows into ``gold_ad_metrics_1m``.

A batch between passes computes the rows a MERGE would set (the attributions: its new
conversions, the pending ones a new click reopens, those its watermark finalises; the 1-minute
windows: those of its events and of its watermark's move, ``GoldUpdate._publish_minutes``),
publishes them, and keeps them here instead of MERGEing them: the attributions MERGE cost a
1,000-record batch at least 1 s, the 1-minute MERGE a pass ~3-4 s recomputing every minute
changed since the last pass (README "Performance"). Every read of the attributions table in the
run reads it through the rows kept (``pipelines.gold.merged``: the table as the MERGE of them
would leave it), so each batch sees what a MERGE in every batch would have left; a batch reads
the 1-minute table only for windows no batch since the last pass changed. The pass writes the
rows kept, with the stamps of the batches that set them, so the tables then hold what those
MERGEs would have left, row for row: a later batch's row for a key replaces an earlier one's.

Held as each row's JSON (timestamps as epoch microseconds, decimals as text: no precision or
time zone lost on the way) and made a DataFrame from one JSON literal, in the JVM: a DataFrame of
Python rows is a Python RDD, which starts Python workers, and nothing here depends on an
executor that may be lost (a cached source is recomputed from its lineage then).

Kept in memory only: a run that dies between passes loses them, and its next run's first batch,
which passes, re-attributes every conversion of silver the table may lack
(``HighWater.conversions_behind``) and recomputes every minute of silver's events the 1-minute
table may lack (``HighWater.minutes_behind``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DecimalType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pipelines import tables as t


def _portable_type(field: StructField) -> StructField:
    if isinstance(field.dataType, TimestampType):
        return StructField(field.name, LongType())
    if isinstance(field.dataType, DecimalType):
        return StructField(field.name, StringType())
    return field


def _fields(name: str) -> list[StructField]:
    return t.schema(name).fields  # parsed by Spark: once a session exists


def _portable(field: StructField) -> Column:
    if isinstance(field.dataType, TimestampType):
        return F.expr(f"unix_micros(`{field.name}`)").alias(field.name)
    return F.col(field.name).cast(_portable_type(field).dataType).alias(field.name)


def _typed(field: StructField) -> Column:
    column = F.col(field.name)
    if isinstance(field.dataType, TimestampType):
        return F.timestamp_micros(column).alias(field.name)
    return column.cast(field.dataType).alias(field.name)


def portable_json(name: str) -> Column:
    """A row of the gold table ``name`` (its columns) as the JSON kept here."""
    return F.to_json(F.struct(*[_portable(f) for f in _fields(name)]))


class PendingRows:
    """The rows of the gold table ``name`` kept, one per key: a batch adds its own to a copy
    (``copy``), which the run takes once the batch is done (``HourlyPasses.done``); a pass
    writes and clears them."""

    def __init__(self, name: str) -> None:
        self.name = name
        # key -> (the row's time in epoch ms, truncated: a conversion's, a window's start; the
        # row's JSON)
        self.rows: dict[Hashable, tuple[int, str]] = {}

    def __bool__(self) -> bool:
        return bool(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, found: Iterable[tuple[Hashable, int, str]]) -> None:
        """Rows a batch set, as (key, time in epoch ms, the row's JSON: ``portable_json``):
        each replaces the row of its key kept before (a later batch's)."""
        for key, at_ms, value in found:
            self.rows[key] = (at_ms, value)

    def clear(self) -> None:
        self.rows = {}

    def copy(self) -> PendingRows:
        """The rows kept so far, to add a batch's to without changing these (the run's change
        only once the batch is done: ``HourlyPasses.done``)."""
        other = PendingRows(self.name)
        other.rows = dict(self.rows)
        return other

    def bounds_ms(self) -> tuple[int, int]:
        """Epoch ms at or before the earliest row's time kept and after the latest."""
        assert self.rows, "rows kept"
        times = [at_ms for at_ms, _ in self.rows.values()]
        return min(times), max(times) + 1

    def frame(self, spark: SparkSession) -> DataFrame:
        """The rows kept, typed as the table's, from one JSON literal."""
        fields = _fields(self.name)
        text = "[" + ",".join(value for _, value in self.rows.values()) + "]"
        portable = ArrayType(StructType([_portable_type(f) for f in fields]))
        array = F.from_json(F.lit(text), portable, {"mode": "FAILFAST"})
        return spark.range(1).select(F.inline(array)).select(*[_typed(f) for f in fields])
