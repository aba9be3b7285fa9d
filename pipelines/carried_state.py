"""State carried from one micro-batch to the next beside the checkpoint: a cache of something
silver determines, kept so a batch need not read silver's history back (the open user
sessions, ``pipelines.session_writes``; each user's latest clicks, ``pipelines.click_state``).

Layout under ``<checkpoint>/<name>``: folders of Parquet data written by Spark (rows, never
changed once written) and one small JSON *marker* per batch, written atomically after its data:
``{"batch_id", "watermark_ms", "timestamp_ms", "setting_seconds", "data", "as_of_ms", "schema"}``
(``schema``: the rows' Spark DDL, so data written with other columns is never read as this). A
batch that changes nothing writes only a marker that points at the data before it (and the
watermark that data is as of, when it is not the batch's own). A batch reads the
marker of the batch before it, and trusts it only when its watermark and timestamp are those
Spark's offset log holds for that batch, with the setting the data depends on (the session gap,
the attribution lookback) the one in force: a marker of a batch that ran differently (a
checkpoint whose logs were edited by hand) or under another setting (a restart that changed it)
is not used.

The data is the state of one checkpoint generation: it lives in that generation's checkpoint
folder and is only a cache. A batch that finds no usable marker (missing, not whole, of another
setting, history or schema) rebuilds the state from silver. Like the checkpoint, the folder must be
one path that the driver and every executor see (executors write the Parquet, the driver the
markers). A change made to silver outside the job (a DELETE, a RESTORE) is not seen by the state
already carried: delete the folders and the next batch rebuilds them.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from pipelines.offset_log import BatchMeta

log = logging.getLogger("adattr.sink")
# Markers kept: the batch before the last (which its re-execution reads) and the last.
KEPT = 2


@dataclass(frozen=True)
class Marker:
    batch_id: int
    watermark_ms: int
    timestamp_ms: int
    setting_seconds: int  # the setting the data depends on
    data: str | None  # a folder under the root; None: no row
    # The watermark the data is as of, when it is an earlier batch's (None: this batch's).
    as_of_ms: int | None = None


class CarriedState:
    """The state called ``name`` of the checkpoint generation at ``checkpoint``; its rows have
    the Spark DDL ``schema``."""

    def __init__(self, spark: SparkSession, checkpoint: Path, name: str, schema: str) -> None:
        self.spark = spark
        self.root = checkpoint / name
        self.name = name
        self.schema = schema

    def start(
        self, batch_id: int, previous: BatchMeta | None, setting_seconds: int
    ) -> Marker | None:
        """The marker batch ``batch_id`` starts from: the batch before's (``previous``: its
        entry in the offset log), None when that is not usable; before a generation's first
        batch, an empty state at watermark 0."""
        if previous is None:
            return Marker(-1, 0, 0, setting_seconds, None)
        return self.marker(batch_id - 1, previous, setting_seconds)

    def marker(self, batch_id: int, meta: BatchMeta, setting_seconds: int) -> Marker | None:
        """The marker of ``batch_id`` if it was written by the batch the offset log describes
        (``meta``) with this setting (a restart may change it) and its data is whole, else
        None (and the caller rebuilds the state from silver)."""
        path = self.root / f"{batch_id}.json"
        raw = _read(path)
        if (
            raw is None
            or not isinstance(raw.get("data"), str | None)
            or not isinstance(raw.get("as_of_ms"), int | None)
        ):
            log.info("%s: no usable marker %s, rebuilding from silver", self.name, path)
            return None
        data, as_of = raw.get("data"), raw.get("as_of_ms")
        wanted = Marker(
            batch_id, meta.watermark_ms, meta.timestamp_ms, setting_seconds, data, as_of
        )
        if raw != self._json(wanted):
            log.info("%s: %s is %s, not %s: rebuilding from silver", self.name, path, raw, wanted)
            return None
        # Spark writes _SUCCESS once every file of the folder is in place.
        if data is not None and not (self.root / data / "_SUCCESS").is_file():
            log.info("%s: %s has no _SUCCESS: rebuilding from silver", self.name, data)
            return None
        return wanted

    def rows(self, marker: Marker) -> DataFrame | None:
        """The rows of ``marker``'s data; None when it has none."""
        if marker.data is None:
            return None
        return self.spark.read.schema(self.schema).parquet(str(self.root / marker.data))

    def write_data(self, rows: DataFrame) -> str:
        """Writes rows to a new folder and returns its name. A folder is never rewritten: a
        re-executed batch writes a new one, and the marker says which is current."""
        name = f"data-{uuid.uuid4().hex}"
        rows.write.parquet(str(self.root / name))
        return name

    def commit(self, marker: Marker) -> None:
        """Writes ``marker`` atomically, then drops markers and data no longer needed."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f"{marker.batch_id}.json"
        tmp = path.with_suffix(".tmp")
        with tmp.open("w") as f:
            json.dump(self._json(marker), f)
            f.flush()
            os.fsync(f.fileno())  # whole on disk before it can replace the last marker
        os.replace(tmp, path)
        self._clean(marker.batch_id)

    def _json(self, marker: Marker) -> dict[str, Any]:
        return {**asdict(marker), "schema": self.schema}

    def _clean(self, batch_id: int) -> None:
        """Keeps the markers of ``batch_id`` and the batch before it and the data they point at.
        Any other marker is an older batch's or one of a history the checkpoint no longer
        has (a marker above ``batch_id``), and other data belongs to no marker kept."""
        keep = {batch_id - i for i in range(KEPT)}
        used: set[str] = set()
        for path in [*self.root.glob("*.json"), *self.root.glob("*.tmp")]:
            raw = _read(path) if path.suffix == ".json" and path.stem.isdigit() else None
            if raw is not None and int(path.stem) in keep:
                used.add(raw.get("data") or "")
            else:
                path.unlink(missing_ok=True)
        for folder in self.root.glob("data-*"):
            if folder.name not in used:
                shutil.rmtree(folder, ignore_errors=True)


def _read(path: Path) -> dict[str, Any] | None:
    """A marker's JSON, or None when it is missing or not whole (a disk that lost a write)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None
