"""Delta's own split of a write's time (`adattr bench --fixed-only`), read from commit files."""

from __future__ import annotations

import json
from pathlib import Path

from app.tools.bench import delta_write_split

APP = "adattr-app"


def _commit(
    warehouse: Path,
    table: str,
    version: int,
    operation: str,
    batch: tuple[str, int] | None = None,
    note: str | None = None,
    **metrics: int,
) -> Path:
    log = warehouse / table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    info: dict[str, object] = {
        "operation": operation,
        "operationMetrics": {k: str(v) for k, v in metrics.items()},
    }
    if note is not None:
        info["userMetadata"] = note
    actions: list[dict[str, object]] = [{"commitInfo": info}]
    if batch is not None:
        actions.append({"txn": {"appId": batch[0], "version": batch[1]}})
    actions.append({"add": {"path": f"part-{version}.parquet"}})
    path = log / f"{version:020d}.json"
    path.write_text("\n".join(json.dumps(a) for a in actions))
    return log


def test_only_the_given_batches_writes_count_each_by_table_and_operation(tmp_path: Path) -> None:
    one = "gold_ad_metrics_1m"
    _commit(tmp_path, one, 0, "CREATE TABLE")
    _commit(tmp_path, one, 1, "MERGE", (APP, 1), executionTimeMs=9000)  # warm-up: not counted
    for version, ms in ((2, 3000), (3, 1000), (4, 2000)):
        _commit(
            tmp_path,
            one,
            version,
            "MERGE",
            (APP, version),
            executionTimeMs=ms,
            materializeSourceTimeMs=ms // 2,
            scanTimeMs=100,
            rewriteTimeMs=200,
            numSourceRows=5,
        )
    # The finalising UPDATEs carry no txn: their commits note the batch instead.
    noted = json.dumps({"app_id": APP, "batch_id": 5})
    _commit(tmp_path, one, 5, "UPDATE", note=noted, executionTimeMs=700, scanTimeMs=300)
    other = json.dumps({"app_id": "another-app", "batch_id": 5})
    _commit(tmp_path, one, 9, "UPDATE", note=other, executionTimeMs=9000, scanTimeMs=9000)
    _commit(tmp_path, one, 10, "UPDATE", note="someone's own note", executionTimeMs=9000)
    warm_up = json.dumps({"app_id": APP, "batch_id": 1})  # a noted batch not counted
    _commit(tmp_path, one, 11, "UPDATE", note=warm_up, executionTimeMs=9000)
    odd = json.dumps({"app_id": [APP], "batch_id": "5"})  # a note of another shape
    _commit(tmp_path, one, 12, "UPDATE", note=odd, executionTimeMs=9000)
    # A txn says whose a commit is, whatever its note says.
    _commit(tmp_path, one, 13, "UPDATE", ("another-app", 5), noted, executionTimeMs=9000)
    _commit(tmp_path, one, 6, "MERGE", ("another-app", 3), executionTimeMs=8000)
    _commit(tmp_path, one, 7, "MERGE", (APP, 6), executionTimeMs=8000)  # stopped: no progress
    _commit(tmp_path, one, 8, "OPTIMIZE", None, numAddedFiles=1)  # no txn, no times
    log = _commit(tmp_path, "silver_ad_events", 0, "WRITE", (APP, 2), numOutputRows=1000)
    # What else a Delta log holds is not a commit.
    (log / "00000000000000000000.crc").write_text("{}")
    (log / "00000000000000000000.checkpoint.parquet").write_bytes(b"PAR1")
    (log / "00000000000000000000.00000000000000000000.compacted.json").write_text("not json")
    split = delta_write_split(tmp_path, APP, {2, 3, 4, 5})
    assert split == {
        f"{one} MERGE": {
            "n": 3,
            "execution": 2000,
            "copying the source": 1000,
            "scan": 100,
            "rewrite": 200,
        },
        f"{one} UPDATE": {"n": 1, "execution": 700, "scan": 300},
    }


def test_a_table_never_written_reports_nothing(tmp_path: Path) -> None:
    assert delta_write_split(tmp_path, APP, {1, 2}) == {}
