"""A class-data archive (JDK CDS) for the driver JVM: every adattr command starts faster.

A cold driver JVM loads and verifies some 20,000 classes of Spark, Delta and Scala before the
first batch runs: 7 s to a session, 17-20 s to the first Delta query on this 2-core machine.
Set-up makes, once, a dynamic archive of the classes a short training run loads (Spark SQL,
Delta's writes, MERGE, streaming, the RocksDB state store); a JVM started from it maps them
ready-parsed and reaches the same point 5-7 s sooner (README "Performance").

The archive is only valid for the JVM build and the jars it was made with. Its file name carries
a key over both, so new jars or another JDK simply find no archive (and set-up makes a new one);
the JVM checks the rest itself and, on any mismatch, starts without it (silently: its warnings
are switched off). A truncated archive would crash the JVM, so one is only ever moved into
place whole, after a JVM has started from it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from app.runtime.settings import Settings
from app.runtime.spark import QUIET_CDS, archive_path, find_java, spark_conf


def build(settings: Settings) -> int:
    """Makes the archive unless it exists: a training run in a child process whose JVM writes
    the archive when it exits, then a check that a JVM starts from it, then the move."""
    path = archive_path(settings)
    if path is None:
        print("jvm archive: no java on PATH; skipped", flush=True)
        return 0
    if path.is_file():
        print(f"jvm archive: up to date ({path.name})", flush=True)
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob("driver-*.jsa"):
        stale.unlink()
    print("jvm archive: training run to make the driver's class archive (once)...", flush=True)
    with tempfile.TemporaryDirectory(prefix="adattr-cds-") as tmp:
        made = Path(tmp) / "driver.jsa"
        env = {**os.environ, "ADATTR_JVM_CLASS_ARCHIVE": "false"}
        log = Path(tmp) / "train.log"
        with log.open("wb") as out:
            rc = subprocess.run(
                [sys.executable, "-m", "app.runtime.jvm_archive", "--train", str(made), tmp],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                check=False,
            ).returncode
        java = find_java()
        assert java is not None
        ok = (
            rc == 0
            and made.is_file()
            and subprocess.run(
                [str(java), f"-XX:SharedArchiveFile={made}", "-version"],
                capture_output=True,
                check=False,
            ).returncode
            == 0
        )
        if not ok:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-10:])
            print(f"jvm archive: not made (rc={rc}); JVMs start without it:\n{tail}", flush=True)
            return 0  # an optimisation: its absence costs time, never correctness
        tmp_target = path.with_suffix(".tmp")
        shutil.copyfile(made, tmp_target)
        tmp_target.replace(path)
    print(f"jvm archive: made {path.name} ({path.stat().st_size / 1e6:.0f} MB)", flush=True)
    return 0


def _train(out: Path, scratch: Path) -> None:
    """Loads what the job loads: Delta tables created, appended to, MERGEd with txn ids, read
    back with filters, aggregates, windows and joins, and a stream with watermarked dedup in
    the RocksDB state store through foreachBatch (Kafka needs a broker: its classes are left)."""
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F

    settings = Settings.from_env(os.environ)
    builder = SparkSession.builder.appName("adattr-jvm-archive")
    conf = spark_conf(settings)
    conf["spark.driver.extraJavaOptions"] = f"-XX:ArchiveClassesAtExit={out} {QUIET_CDS}"
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from delta.tables import DeltaTable

    events = spark.range(2000).select(
        F.concat(F.lit("e"), (F.col("id") % 1500).cast("string")).alias("event_id"),
        (F.col("id") % 50).alias("ad_id"),
        F.timestamp_millis(F.lit(1_700_000_000_000) + F.col("id") * 1000).alias("event_time"),
        (F.col("id") * 0.5).cast("decimal(18,6)").alias("revenue"),
    )
    source = str(scratch / "source")
    events.write.format("delta").save(source)
    table = str(scratch / "target")
    (
        DeltaTable.createIfNotExists(spark)
        .addColumns(events.schema)
        .location(table)
        .property("delta.appendOnly", "false")
        .execute()
    )
    events.limit(10).write.format("delta").mode("append").save(table)

    def merge(batch: DataFrame, batch_id: int) -> None:
        counts = (
            batch.groupBy(F.window("event_time", "1 minute"), "ad_id")
            .agg(F.count("*").alias("n"), F.sum("revenue").alias("revenue"))
            .join(batch.select("ad_id").distinct(), "ad_id", "left_semi")
        )
        counts.agg(F.max("n")).collect()
        spark.conf.set("spark.databricks.delta.write.txnAppId", "train")
        spark.conf.set("spark.databricks.delta.write.txnVersion", str(batch_id))
        (
            DeltaTable.forPath(spark, table)
            .alias("t")
            .merge(batch.alias("s"), "t.event_id = s.event_id")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )
        spark.conf.unset("spark.databricks.delta.write.txnAppId")
        spark.conf.unset("spark.databricks.delta.write.txnVersion")
        batch.write.format("delta").mode("append").option("txnAppId", "train").option(
            "txnVersion", batch_id
        ).save(str(scratch / "appended"))

    (
        spark.readStream.format("delta")
        .option("maxFilesPerTrigger", 1)
        .load(source)
        .withWatermark("event_time", "10 minutes")
        .dropDuplicatesWithinWatermark(["event_id"])
        .writeStream.foreachBatch(merge)
        .option("checkpointLocation", str(scratch / "checkpoint"))
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )
    spark.read.format("delta").load(table).where("ad_id < 10").orderBy("event_time").collect()
    DeltaTable.forPath(spark, table).history().collect()
    # The JVM writes the archive as it exits, which it does when its stdin closes: wait for it,
    # or the parent would look for the file while it is still being written.
    jvm = spark.sparkContext._gateway.proc  # type: ignore[union-attr]
    spark.stop()
    jvm.stdin.close()
    if jvm.wait(timeout=300) != 0:
        raise SystemExit(f"the training JVM exited with {jvm.returncode}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--train":
        _train(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(build(Settings.from_env(os.environ)))
