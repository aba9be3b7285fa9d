"""Each user's latest click per advertiser at or before the watermark, carried from batch to
batch, so that attributing a conversion reads only silver's newest clicks instead of the whole
lookback (24 hours by default) behind it: a read that grew with the table's history, batch
after batch, until it spanned the lookback.

Why it is exact. Last-click attribution (``gold.attribute``) gives a conversion at time ``t``
the latest click of its user and advertiser in ``[t - lookback, t)``. Split the candidates at
any time ``C < t``: those after ``C`` are silver's clicks in ``(C, t)``; of those at or before
``C`` only the latest can win, and it qualifies exactly when it is within the lookback (then
no earlier one matters; if it is not, no earlier one is). So ``attribute`` over the latest
click per user and advertiser at or before ``C`` together with silver's clicks after ``C``
gives the answer it gives over all of silver's clicks.

Which ``C``. The data a batch carries holds the latest clicks at or before a watermark ``A``
(its *as of*: the batch's own watermark ``W_b`` when it folds, else the data's of the batch
before). When every event silver may hold later than ``W_b`` is this generation's own
(``HighWater.silver_unseen`` is false: silver held only its events when the run started, or
``W_b`` has passed every event it held then, as after a replay), every silver row later than
``W_b`` was accepted by one of its batches and is later than that batch's watermark, and no
other writer adds a row, so every click at or before ``W_b`` is in silver before batch ``b``
runs and none is added after. Hence a fold is the data before folded with silver's clicks in
``(A, W_b]``, a thin slice, and a click older than ``W_b - lookback`` is dropped (every
conversion a later batch attributes is later than ``W_b``: it cannot reach it). A batch folds
once its watermark is ``FOLD_AFTER_MS`` past ``A``, else it carries the data before on.

Batch ``b`` attributes with the data of ``b - 1`` (written by the batch before, so the
attribution waits for no fold), and only when every conversion it (re)attributes is later than
that data's ``A`` (at most ``W_{b-1}``). That holds for its new conversions (later than
``W_b``) and the pending ones it re-attributes (later than ``W_{b-1}``, ``gold_writes``), and is
also checked, at millisecond precision, on the batch's first accepted event (which none of them
precedes: a re-attributed conversion is later than one of the batch's clicks). Otherwise, or
when the batch before left no usable marker (``pipelines.carried_state``), it reads the whole
lookback from silver, as it always did; and without a usable marker, the fold rebuilds the data
from silver's last lookback once. While silver may hold later events this generation never saw
(a replay's or a restart's first minutes, until the watermark passes them), no state is kept:
each batch reads the lookback, and the first batch past them rebuilds the data (the batch
before it left no marker).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines import tables as t
from pipelines.carried_state import CarriedState, Marker
from pipelines.delta_writes import Tables
from pipelines.gold import CLICK_COLUMNS, latest_clicks
from pipelines.offset_log import BatchMeta

LATEST_CLICKS = "latest_clicks"
# A batch folds when its watermark is this far past the data's (a fold per batch cost an empty
# batch ~0.3 s); the attribution reads at most this much more of silver's newest clicks.
FOLD_AFTER_MS = 5 * 60_000
SCHEMA = (
    "event_id string, event_time timestamp, user_id string, advertiser_id string, "
    "ad_id string, campaign_id string"
)


def latest_click_state(spark: SparkSession, checkpoint: Path) -> CarriedState:
    return CarriedState(spark, checkpoint, LATEST_CLICKS, SCHEMA)


@dataclass(frozen=True)
class CarriedClicks:
    """What a batch attributes with: the latest click per user and advertiser at or before
    ``cutoff_ms`` (``rows``, silver-shaped; None: no such click), every later one being in
    silver."""

    rows: DataFrame | None
    cutoff_ms: int


class ClickState:
    """The latest clicks of one checkpoint generation: a batch ``start``s from the marker of
    the batch before (read once), attributes with what it ``carried``, and ``fold``s (beside
    the attribution chain, in a Spark session of its own) its own."""

    def __init__(
        self, tables: Tables, spark: SparkSession, checkpoint: Path, lookback_seconds: int
    ) -> None:
        self.tables = tables
        self.spark = spark
        self.store = latest_click_state(spark, checkpoint)
        self.lookback_seconds = lookback_seconds

    def start(self, batch_id: int, previous: BatchMeta | None) -> Marker | None:
        """The marker batch ``batch_id`` starts from (``pipelines.carried_state``): what it
        attributes with and folds into; None when the batch before left none usable."""
        return self.store.start(batch_id, previous, self.lookback_seconds)

    def carried(self, start: Marker | None) -> CarriedClicks | None:
        """What a batch that starts from ``start`` may attribute with: the data of the batch
        before it; None when there is no usable marker (the batch reads silver's lookback)."""
        if start is None:
            return None
        return CarriedClicks(self.store.rows(start), _as_of(start))

    def fold(self, batch_id: int, *, meta: BatchMeta, start: Marker | None) -> None:
        """Writes the batch's marker: the latest clicks at or before its watermark, or those of
        ``start`` while its watermark is less than ``FOLD_AFTER_MS`` past theirs; without a
        usable ``start``, rebuilt from silver's last lookback."""
        w_cur = meta.watermark_ms
        as_of = w_cur
        data: str | None
        if start is not None and w_cur - _as_of(start) < FOLD_AFTER_MS:
            data, as_of = start.data, _as_of(start)
        else:
            reach = w_cur - self.lookback_seconds * 1000  # no later conversion reaches before
            wanted = F.col("event_time") >= F.timestamp_millis(F.lit(reach))
            when = wanted & (F.col("event_time") <= F.timestamp_millis(F.lit(w_cur)))
            if start is not None:  # the clicks carried, and silver's after them
                when &= F.col("event_time") > F.timestamp_millis(F.lit(_as_of(start)))
            clicks = self._silver_clicks(when)
            carried = self.store.rows(start) if start is not None else None
            if carried is not None:
                clicks = carried.unionByName(clicks)
            data = self.store.write_data(latest_clicks(clicks).where(wanted))
        self.store.commit(
            Marker(
                batch_id,
                w_cur,
                meta.timestamp_ms,
                self.lookback_seconds,
                data,
                as_of if as_of != w_cur else None,
            )
        )

    def _silver_clicks(self, when: Column) -> DataFrame:
        silver = self.tables.load(t.SILVER, self.spark)
        return silver.where((F.col("event_type") == "click") & when).select(*CLICK_COLUMNS)


def _as_of(marker: Marker) -> int:
    return marker.as_of_ms if marker.as_of_ms is not None else marker.watermark_ms
