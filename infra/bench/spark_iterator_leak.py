"""Spark 4.2's DataFrame.toLocalIterator inside foreachBatch keeps every call's jobs on the
driver: a reproduction for an upstream report (README "Performance": what filled the heap).

    .venv/bin/python infra/bench/spark_iterator_leak.py df    # DataFrame.toLocalIterator
    .venv/bin/python infra/bench/spark_iterator_leak.py rdd   # df.rdd.toLocalIterator (adattr's)

Plain PySpark, local[2], a ``rate`` source, no adattr code. Each batch iterates a 2-partition
frame; every 5th batch prints how many SQL executions the DAG scheduler still files finished
jobs under (``DAGScheduler.activeQueryToJobs``). Seen with pyspark 4.2.0: ``df`` grows by one
per batch (each kept with its jobs, stages, RDDs and through them the physical plan, broadcasts
and any Delta snapshot the plan reached) and still holds them after the query stops; ``rdd``
holds only the running batch's and none after the stop.

Why: the scheduler files a job under the SQL execution id it runs in and releases the entry when
that execution ends. ``Dataset.toPythonIterator`` ends its execution once the serving thread is
set up, and the partition jobs run later, as Python pulls, carrying the ended execution's id
(inside ``foreachBatch`` the micro-batch's execution is the parent): they are filed under an id
that is never cleaned up again. ``df.rdd.toLocalIterator()`` runs its jobs under the
micro-batch's own execution, which ends with the batch.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading

from pyspark.sql import DataFrame, SparkSession

BATCHES = 30


def main(mode: str) -> None:
    if mode not in ("df", "rdd"):
        raise SystemExit("usage: spark_iterator_leak.py df|rdd")
    spark = SparkSession.builder.master("local[2]").appName(f"iterator-leak-{mode}").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    scheduler = spark.sparkContext._jsc.sc().dagScheduler()
    seen: list[tuple[int, int]] = []
    enough = threading.Event()

    def each(batch: DataFrame, batch_id: int) -> None:
        frame = batch.selectExpr("value", "cast(value AS string) AS s").repartition(2)
        rows = frame.toLocalIterator() if mode == "df" else frame.rdd.toLocalIterator()
        sum(1 for _ in rows)
        if batch_id % 5 == 0:
            seen.append((batch_id, int(scheduler.activeQueryToJobs().size())))
        if batch_id >= BATCHES:
            enough.set()

    checkpoint = tempfile.mkdtemp(prefix="iterator-leak-")
    try:
        query = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", 100)
            .load()
            .writeStream.foreachBatch(each)
            .trigger(processingTime="200 milliseconds")
            .option("checkpointLocation", checkpoint)
            .start()
        )
        while not enough.is_set():
            if query.awaitTermination(1):  # raises if the query failed
                raise SystemExit("the query stopped before its batches")
        query.stop()
        for batch_id, kept in seen:
            print(f"{mode}: after batch {batch_id:>2}, executions holding jobs: {kept}")
        print(f"{mode}: after the stop: {scheduler.activeQueryToJobs().size()}")
    finally:
        spark.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
