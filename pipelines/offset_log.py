"""What Spark's offset log fixed for a micro-batch before running it.

The offset log entry (``offsets/<batchId>``: a version line, then the batch's metadata as JSON,
then the source's end offsets) is written before the batch runs and reused verbatim when it is
re-executed. Everything a batch decides that must not change on a re-execution (its watermark,
the dimension version at its timestamp, which offsets it reads) comes from here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BatchMeta:
    watermark_ms: int
    timestamp_ms: int


def _entry(checkpoint: Path, batch_id: int) -> list[str]:
    path = checkpoint / "offsets" / str(batch_id)
    lines = path.read_text().splitlines()
    if len(lines) < 2 or not lines[0].startswith("v"):
        raise RuntimeError(f"unexpected offset log format in {path}")
    return lines


def read_batch_meta(checkpoint: Path, batch_id: int) -> BatchMeta:
    """The watermark and timestamp Spark fixed for a batch before running it."""
    meta = json.loads(_entry(checkpoint, batch_id)[1])
    return BatchMeta(int(meta.get("batchWatermarkMs", 0)), int(meta["batchTimestampMs"]))


def source_offsets(checkpoint: Path, batch_id: int) -> dict[str, dict[str, int]]:
    """The end offsets (exclusive) of a batch per topic and partition."""
    lines = _entry(checkpoint, batch_id)
    return json.loads(lines[2]) if len(lines) > 2 else {}


def rereads(checkpoint: Path, batch_id: int, upto: dict[tuple[str, int], int]) -> bool:
    """Whether the batch can read an offset at or before ``upto`` (per topic, partition). Its
    range starts where the previous batch ended (the generation's start for batch 0, which a
    replay always rereads)."""
    if batch_id == 0:
        return True
    start = source_offsets(checkpoint, batch_id - 1)
    return any(
        start.get(topic, {}).get(str(partition), 0) <= last
        for (topic, partition), last in upto.items()
    )


def latest_watermark(root: Path) -> int | None:
    """The latest watermark a batch of any generation's checkpoint under ``root`` (the folders
    beside a generation's) was planned under, from each one's newest offset log entry (None: no
    batch): at or past every watermark a batch ran under, as the newest may not have run."""
    found = [
        read_batch_meta(offsets.parent, max(ids)).watermark_ms
        for offsets in root.glob("*/offsets")
        if (ids := [int(p.name) for p in offsets.iterdir() if p.name.isdigit()])
    ]
    return max(found, default=None)
