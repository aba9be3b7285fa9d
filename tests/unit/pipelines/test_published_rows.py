from pyspark.sql import SparkSession

from pipelines.published_rows import rows_of
from tests.builders import kept_executions


def test_rows_of_reads_every_partition_and_leaves_no_job_behind(spark: SparkSession) -> None:
    # DataFrame.toLocalIterator kept one execution's jobs per call (Spark 4.2), and with them
    # every plan and Delta snapshot they reached: the job's heap grew by a batch's worth per
    # published batch until it ran out.
    before = kept_executions(spark)
    frame = spark.range(0, 1000, 1, 4).selectExpr("id", "cast(id AS string) AS s")
    rows = list(rows_of(frame))
    assert sorted(r.id for r in rows) == list(range(1000))
    assert all(r.s == str(r.id) for r in rows)
    assert kept_executions(spark) == before
