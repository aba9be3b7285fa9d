"""The soak's slices (`adattr bench --soak`): what each slice of a run reports."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from app.tools.bench import heap_after_gc, print_soak, soak_slices

START = 1_000.0


def test_each_slice_reports_its_own_batches_latencies_and_the_files_at_its_end() -> None:
    latencies = [(START + 1, 2.0), (START + 2, 4.0), (START + 11, 9.0), (START + 12, 7.0)]
    batches = [
        (START + 0.5, 3.0, 100),
        (START + 4.0, 1.0, 0),  # no input: counted among batches, not in the batch time
        (START + 5.0, 5.0, 200),
        (START + 10.5, 8.0, 300),
    ]
    files = [(START + 10.2, {"silver": 7}), (START + 20.1, {"silver": 3})]
    heap = [(START + 1, 300.0), (START + 3, 500.0), (START + 9, 350.0), (START + 15, 420.0)]
    first, second = soak_slices(
        latencies, batches, files, heap, start=START, slice_seconds=10, count=2
    )
    assert (first["from_s"], first["to_s"], second["from_s"]) == (0, 10, 10)
    assert (first["batches"], first["data_batches"]) == (3, 2)
    assert first["batch_p50_s"] == 5.0 and first["any_batch_p50_s"] == 3.0
    assert (first["records"], first["latency_p50_s"], first["latency_p99_s"]) == (2, 4.0, 4.0)
    assert first["files"] == {"silver": 7}  # the first count at or after the slice's end
    assert (first["collections"], first["heap_after_gc_p50_mb"]) == (3, 350.0)
    assert first["heap_after_gc_min_mb"] == 300.0
    assert (second["collections"], second["heap_after_gc_min_mb"]) == (1, 420.0)
    assert (second["batches"], second["batch_p50_s"]) == (1, 8.0)
    assert (second["records"], second["latency_p50_s"]) == (2, 9.0)
    assert second["files"] == {"silver": 3}


def test_nothing_outside_the_slices_counts_and_an_idle_slice_is_still_reported() -> None:
    latencies = [(START - 1, 50.0), (START + 25, 1.0), (START + 31, 60.0)]
    batches = [(START - 2, 40.0, 10), (START + 35, 30.0, 10)]  # warm-up, then draining
    files = [(START + 5, {"ledger": 1})]
    heap = [(START - 3, 900.0), (START + 12, 400.0)]  # warm-up, then one collection
    slices = soak_slices(latencies, batches, files, heap, start=START, slice_seconds=10, count=3)
    assert [x["slice"] for x in slices] == [0, 1, 2]
    assert [x["records"] for x in slices] == [0, 0, 1]
    assert all(x["batches"] == 0 and x["batch_p50_s"] is None for x in slices)
    assert slices[0]["latency_p50_s"] is None and slices[2]["latency_p50_s"] == 1.0
    assert [x["heap_after_gc_p50_mb"] for x in slices] == [None, 400.0, None]
    assert [x["collections"] for x in slices] == [0, 1, 0]
    # No count after a slice's end: the last one taken.
    assert all(x["files"] == {"ledger": 1} for x in slices)


def test_the_heap_after_the_latest_collection_is_read_from_the_driver_jvm(
    spark: SparkSession,
) -> None:
    jvm = spark._jvm
    jvm.java.lang.System.gc()  # a full collection: the latest, whatever ran before
    full = heap_after_gc(spark)
    assert full is not None
    name, mb = full
    # The old generation's collector of the driver's default, Parallel GC (app/runtime/spark.py).
    assert name.startswith("PS MarkSweep #"), name
    # What survived a full collection: the session's own objects at least, within the heap.
    assert 0 < mb < jvm.java.lang.Runtime.getRuntime().maxMemory() / 2**20
    jvm.java.lang.System.gc()
    again = heap_after_gc(spark)
    assert again is not None and again[0] != name  # each collection is told apart


def test_the_soak_prints_each_slice_and_how_the_last_compares_with_the_first(
    capsys: pytest.CaptureFixture[str],
) -> None:
    batches = [(START + 1, 4.0, 10), (START + 11, 5.0, 10)]
    latencies = [(START + 1, 6.0), (START + 11, 9.0)]
    heap = [(START + 2, 300.0), (START + 3, 320.0), (START + 12, 450.0)]
    slices = soak_slices(
        latencies, batches, [(START + 30, {"silver": 2})], heap, start=START, slice_seconds=10,
        count=2,
    )  # fmt: skip
    print_soak(
        {"rate": 10, "minutes": 20 / 60, "slice_seconds": 10, "slices": slices, "records": 2,
         "p50": 6.0, "p99": 9.0, "held_executions_end": ["execution 7, 2 jobs: collect at x"]}
    )  # fmt: skip
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("    ")]
    # slice, minutes, data batches, batch p50, p95, latency p50, p99, heap median, least, files
    assert rows[0] == ["0", "0.0-0.2", "1", "4.00", "4.00", "6.00", "6.00", "320", "300", "2"]
    assert rows[1] == ["1", "0.2-0.3", "1", "5.00", "5.00", "9.00", "9.00", "450", "450", "2"]
    assert "last slice / first, batch p50: 1.25" in out
    assert "least heap after a collection, slices 1-1: 450-450 MB" in out
    assert "SQL executions holding finished jobs after the run: 1\n  execution 7, 2 jobs" in out
