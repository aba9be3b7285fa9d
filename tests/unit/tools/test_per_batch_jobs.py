"""`infra/bench/cpu_by_call.py --per-batch`: the jobs each micro-batch ran, read from a Spark
event log as a user runs the script (a log written here, in Spark's own event shapes)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

SCRIPT = Path(__file__).parents[3] / "infra" / "bench" / "cpu_by_call.py"
T0 = 1_796_500_000_000  # epoch ms of the first trigger


def _progress(batch: int, at_ms: int, wall_ms: int, rows: int) -> dict[str, object]:
    # As Spark writes it: UTC, milliseconds, a Z.
    stamp = datetime.fromtimestamp(at_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    return {
        "Event": "org.apache.spark.sql.streaming.StreamingQueryListener$QueryProgressEvent",
        "progress": {
            "batchId": batch,
            "timestamp": stamp,
            "durationMs": {"triggerExecution": wall_ms},
            "sources": [{"numInputRows": rows}],
        },
    }


def _job(job: int, at_ms: int, stages: list[int], desc: str) -> dict[str, object]:
    return {
        "Event": "SparkListenerJobStart",
        "Job ID": job,
        "Submission Time": at_ms,
        "Stage IDs": stages,
        "Properties": {"spark.job.description": desc},
    }


def _task(stage: int) -> dict[str, object]:
    return {"Event": "SparkListenerTaskEnd", "Stage ID": stage, "Task Metrics": {}}


def test_each_batch_gets_the_jobs_submitted_during_its_trigger(tmp_path: Path) -> None:
    events: list[dict[str, object]] = []
    # Batches 0 and 1 (the cold start, left out of the means), then one with rows, one without.
    for batch, rows in enumerate((10, 0, 1000, 0)):
        start = T0 + batch * 10_000
        events.append(_progress(batch, start, 4_000, rows))
    # Batch 2: a MERGE's two jobs (one stage skipped: it sends no task), then a write's job.
    events += [_job(1, T0 + 20_100, [1, 2], "Delta: MERGE scan 7"), _task(2), _task(2)]
    events += [_job(2, T0 + 20_400, [3], "Delta: MERGE scan 8"), _task(3)]
    events += [_job(3, T0 + 21_000, [4], "append to /tmp/w/bronze"), _task(4)]
    # Batch 3: one UPDATE job; and a job between triggers, which no batch ran.
    events += [_job(4, T0 + 30_500, [5], "UPDATE"), _task(5), _task(5), _task(5)]
    events += [_job(5, T0 + 35_000, [6], "between batches"), _task(6)]
    log = tmp_path / "eventlog"
    log.write_text("".join(json.dumps(e) + "\n" for e in events))

    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(log), "--per-batch"],
        capture_output=True,
        text=True,
        check=True,
    )

    lines = done.stdout.splitlines()
    rows = {int(line.split()[0]): line.split()[1:] for line in lines[1:5]}
    # batch: rows, wall s, jobs, stages that ran, tasks
    assert rows[2] == ["1,000", "4.00", "3", "3", "4"], rows
    assert rows[3] == ["0", "4.00", "1", "1", "3"], rows
    assert rows[0][2:] == ["0", "0", "0"], rows
    # Per description, digits and paths folded (the two MERGE jobs are one kind), the most
    # wall time first: from the job (or the trigger's start) before each, 600 ms for the
    # append, 100 + 300 ms for the MERGE's.
    with_rows = lines[lines.index(next(x for x in lines if "with rows" in x)) + 1 :]
    assert with_rows[0].split() == ["1.0", "1.0", "600", "append", "to", "<path>"]
    assert with_rows[1].split() == ["2.0", "3.0", "400", "Delta:", "MERGE", "scan", "N"]
    without = lines[lines.index(next(x for x in lines if "without rows" in x)) + 1 :]
    assert without[0].split() == ["1.0", "3.0", "500", "UPDATE"]
    assert "between batches" not in done.stdout
