"""Reading what Spark's offset log fixed for a batch: watermark, timestamp, source offsets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.offset_log import BatchMeta, read_batch_meta, rereads, source_offsets

TOPIC = "ad-events"


def entry(checkpoint: Path, batch_id: int, ends: dict[int, int], watermark: int = 0) -> None:
    """An offset log entry as Spark 4 writes it: version, batch metadata, source offsets."""
    folder = checkpoint / "offsets"
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": watermark, "batchTimestampMs": 1_000 + batch_id, "conf": {}}
    offsets = {TOPIC: {str(p): o for p, o in ends.items()}}
    (folder / str(batch_id)).write_text(f"v1\n{json.dumps(meta)}\n{json.dumps(offsets)}")


def test_meta_and_offsets_are_read_as_spark_wrote_them(tmp_path: Path) -> None:
    entry(tmp_path, 3, {0: 120, 1: 80}, watermark=60_000)
    assert read_batch_meta(tmp_path, 3) == BatchMeta(watermark_ms=60_000, timestamp_ms=1_003)
    assert source_offsets(tmp_path, 3) == {TOPIC: {"0": 120, "1": 80}}


def test_a_batch_rereads_offsets_only_below_the_previous_batch_end(tmp_path: Path) -> None:
    entry(tmp_path, 4, {0: 120, 1: 80})  # batch 5 reads from 120 and 80 on
    assert not rereads(tmp_path, 5, {(TOPIC, 0): 119, (TOPIC, 1): 79})
    assert rereads(tmp_path, 5, {(TOPIC, 0): 120})
    assert rereads(tmp_path, 5, {(TOPIC, 2): 0})  # a partition the previous batch never read
    assert rereads(tmp_path, 0, {(TOPIC, 0): 0})  # a generation's first batch: always


def test_a_damaged_entry_is_named(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "7").write_text("not an offset log\n")
    with pytest.raises(RuntimeError, match=r"unexpected offset log format in .*offsets/7"):
        read_batch_meta(tmp_path, 7)
