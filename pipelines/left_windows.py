"""The 1-minute windows a batch's re-attributed conversions leave, kept beside the checkpoint
until the batch is done.

A conversion a new click re-attributes moves to another ad, and the window it was counted in may
be emptied: it must then be published as zero and set to zero in ``gold_ad_metrics_1m``
(``pipelines.gold_writes.GoldUpdate._publish_minutes``). Which window that is, only the
attributions table says, and only until the batch's attributions MERGE overwrites the
conversion's ad. A batch that dies after that MERGE and before the zero is written is re-executed
(its MERGE then skipped by its Delta txn ids) with the new ad in the table; the old one is
kept here, written before the MERGE, so the re-execution still knows the window.

Between passes the table is not written at all (``pipelines.pending_rows``): the old ad
is then in the rows the run keeps, and a run that dies loses them. So a batch between passes
also keeps here the windows of every attribution it publishes (``counted``), until a pass has
written them; the next run's first batch, which re-attributes what the table lacks, takes them
as candidates (below): a window the topic counted a conversion in that now holds nothing is
published and written as zero.

A batch that died there may also never be re-executed: a replay (a new generation) or a
rewound checkpoint starts instead. So a run's first batch, which passes, takes the windows every
generation's folder still names (``everywhere``) as candidates too: a window one names that
holds nothing now is zero whichever batch emptied it, and one that holds something is
recomputed; a candidate outside what the pass recomputes is not used.

Layout: ``<checkpoint>/left_windows/<batch id>.json``, a list of ``[conversion time (epoch ms),
advertiser, ad, campaign]``, written atomically; the files of the batches since the last pass
and of the latest batch are kept (only a run's first batch can be a re-execution, of the last
batch an earlier run began: ``forget_before``, once a batch is done). A missing file means the
batch neither re-attributed an attributed conversion nor, between passes, published an
attributed one (most batches of none), or that what it precedes did not commit either. Unlike
the carried state, not only a cache: until the batch's windows are published and written, it is
the one record of the ad a conversion was counted on; deleting a generation's folder before a
run's first batch has passed loses it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

Left = tuple[int, str, str, str]  # conversion time (epoch ms), advertiser, ad, campaign


class LeftWindows:
    def __init__(self, checkpoint: Path) -> None:
        self.root = checkpoint / "left_windows"

    def remember(
        self,
        batch_id: int,
        left: list[Left],
        *,
        counted: list[Left] | None = None,
    ) -> list[Left]:
        """``left`` and whatever an earlier execution of ``batch_id`` kept, now kept together
        (on disk before this returns). ``counted``: the windows the attributions the batch
        publishes without writing them are counted in (``pipelines.pending_rows``),
        kept beside (not returned) until ``forget_before`` drops them."""
        path = self.root / f"{batch_id}.json"
        kept = _read(path)
        both = sorted(set(kept) | set(left) | set(counted or []))
        if both and (both != sorted(set(kept)) or not path.exists()):  # none: no file
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            with tmp.open("w") as f:
                json.dump(both, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        return sorted(set(kept) | set(left))

    def forget_before(self, batch_id: int) -> None:
        """Drops the files of the batches before ``batch_id``."""
        for old in self.root.glob("*.json"):
            if old.stem.isdigit() and int(old.stem) < batch_id:
                old.unlink(missing_ok=True)

    def everywhere(self) -> list[Left]:
        """The windows the files of every generation's checkpoint name (the folders beside
        this one's)."""
        found: set[Left] = set()
        for path in self.root.parent.parent.glob("*/left_windows/*.json"):
            found |= set(_read(path))
        return sorted(found)


def _read(path: Path) -> list[Left]:
    """A file's windows; none when it is missing or not whole (a crash while it was written:
    the MERGE it precedes never committed)."""
    try:
        return [
            (int(a), _text(b), _text(c), _text(d)) for a, b, c, d in json.loads(path.read_text())
        ]
    except (OSError, ValueError, TypeError):
        return []


def _text(value: object) -> str:
    return "" if value is None else str(value)
