from pyspark.sql import SparkSession

from app.runtime.spark import held_executions
from pipelines.published_rows import rows_of


def test_rows_of_reads_every_partition_and_leaves_no_job_behind(spark: SparkSession) -> None:
    # DataFrame.toLocalIterator kept one execution's jobs per call (Spark 4.2), and with them
    # every plan and Delta snapshot they reached: the job's heap grew by a batch's worth per
    # published batch until it ran out.
    before = held_executions(spark)
    frame = spark.range(0, 1000, 1, 4).selectExpr("id", "cast(id AS string) AS s")
    rows = list(rows_of(frame))
    assert sorted(r.id for r in rows) == list(range(1000))
    assert all(r.s == str(r.id) for r in rows)
    assert held_executions(spark) == before


def test_held_executions_sees_the_leak_rows_of_avoids(spark: SparkSession) -> None:
    # What the test above would see if rows_of used DataFrame.toLocalIterator (Spark 4.2; the
    # day Spark fixes it, this fails and rows_of can go back to it).
    before = held_executions(spark)
    rows = list(spark.range(0, 10, 1, 2).toLocalIterator())
    assert len(rows) == 10
    added = [e for e in held_executions(spark) if e not in before]
    assert len(added) == 1 and "toLocalIterator" in added[0], added
