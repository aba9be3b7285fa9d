"""Delta's own split of a write's time (`adattr bench --fixed-only`), read from commit files."""

from __future__ import annotations

import json
from pathlib import Path

from app.tools.bench import commit_versions, delta_write_split


def _commit(warehouse: Path, table: str, version: int, operation: str, **metrics: int) -> None:
    log = warehouse / table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    info = {"operation": operation, "operationMetrics": {k: str(v) for k, v in metrics.items()}}
    actions = [{"commitInfo": info}, {"add": {"path": f"part-{version}.parquet"}}]
    (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in actions))


def test_only_writes_after_the_given_versions_count_each_by_table_and_operation(
    tmp_path: Path,
) -> None:
    _commit(tmp_path, "gold_ad_metrics_1m", 0, "CREATE TABLE")
    _commit(tmp_path, "gold_ad_metrics_1m", 1, "MERGE", executionTimeMs=9000, scanTimeMs=1)
    warm = commit_versions(tmp_path)
    assert warm["gold_ad_metrics_1m"] == 1 and warm["silver_ad_events"] == -1
    for version, ms in ((2, 3000), (3, 1000), (4, 2000)):
        _commit(
            tmp_path,
            "gold_ad_metrics_1m",
            version,
            "MERGE",
            executionTimeMs=ms,
            materializeSourceTimeMs=ms // 2,
            scanTimeMs=100,
            rewriteTimeMs=200,
            numSourceRows=5,
        )
    _commit(tmp_path, "gold_ad_metrics_1m", 5, "UPDATE", executionTimeMs=700, scanTimeMs=300)
    _commit(tmp_path, "silver_ad_events", 0, "WRITE", numOutputRows=1000)  # an append: no times
    split = delta_write_split(tmp_path, warm)
    assert split == {
        "gold_ad_metrics_1m MERGE": {
            "n": 3,
            "execution": 2000,
            "copying the source": 1000,
            "scan": 100,
            "rewrite": 200,
        },
        "gold_ad_metrics_1m UPDATE": {"n": 1, "execution": 700, "scan": 300},
    }


def test_a_table_never_written_reports_nothing(tmp_path: Path) -> None:
    assert delta_write_split(tmp_path, {}) == {}
    assert set(commit_versions(tmp_path).values()) == {-1}
