"""The one place a SparkSession is built.

Locally (plain ``python``/``adattr``) the session gets Delta's extensions, the Kafka connector and
Delta jars fetched by ``infra/fetch-jars.sh`` (explicit paths, so no network at run time), the
chosen state store, UTC (the session's and the JVM's) and a small number of shuffle partitions,
and its JVM starts from the class-data archive set-up made (``app.runtime.jvm_archive``) when
there is one. Under ``spark-submit`` the master, the jars and the JVM options come from the
command line and are left alone.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from app.runtime.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("adattr.spark")

STATE_STORE_PROVIDERS = {
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
}


class MissingJarsError(RuntimeError):
    pass


class SparkStartError(RuntimeError):
    """The driver's JVM ended before it answered; the message holds the end of its output."""


def under_spark_submit() -> bool:
    # spark-submit's PythonRunner hands the driver a ready gateway through this variable.
    return "PYSPARK_GATEWAY_PORT" in os.environ


def spark_jars(jars_dir: Path) -> list[str]:
    spark_dir = jars_dir / "spark"
    jars = sorted(str(p) for p in spark_dir.glob("*.jar"))
    names = " ".join(Path(j).name for j in jars)
    if any(n not in names for n in ("spark-sql-kafka", "delta-spark", LOCAL_FILE_SYSTEM_JAR)):
        raise MissingJarsError(
            f"the Kafka connector, Delta or adattr's own jar ({LOCAL_FILE_SYSTEM_JAR}) is not "
            f"in {spark_dir}; run `bash infra/setup.sh` first"
        )
    return jars


# The JVM's own notes about the class archive (e.g. "unable to use shared archive" after a JDK
# update): on any mismatch it starts without the archive, which costs time, never correctness.
QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def find_java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def archive_path(settings: Settings) -> Path | None:
    """Where the driver's class-data archive (``app.runtime.jvm_archive``) for this JVM, pyspark and
    jar set lives (None: no java found). The key in its name changes with any of them, so new
    jars or another JDK find no archive instead of one made for something else."""
    import pyspark

    java = find_java()
    if java is None:
        return None
    key = hashlib.sha256()
    stat = java.stat()
    key.update(f"{java}|{stat.st_size}|{stat.st_mtime_ns}|{pyspark.__version__}".encode())
    for jar in sorted((settings.jars_dir / "spark").glob("*.jar")):
        key.update(f"|{jar.name}:{jar.stat().st_size}".encode())
    return settings.jars_dir / "cds" / f"driver-{key.hexdigest()[:16]}.jsa"


# The driver's JVM runs in UTC whatever the machine's zone. Delta 4.4 verifies the file list it
# writes into each commit's ``.crc`` by reconstructing the new table version inside the commit
# whenever the session's, the JVM's default or ``user.timezone`` is not UTC
# (``Snapshot.allFilesInCrcVerificationForceEnabled``): on a machine in another zone every
# commit of every table paid a state reconstruction, even a write nothing reads back (bronze,
# quarantine, late, the ledger). The session's zone is set below; the JVM's is this option.
UTC_JVM = "-Duser.timezone=UTC"


# The driver's garbage collector unless ADATTR_JVM_OPTIONS names one. On two cores G1's
# concurrent threads took CPU from the batches' own (8% of a B3 run's CPU was GC, most of it
# G1's); Parallel GC runs no concurrent work and stops the JVM for short young collections
# instead: 6-21% less CPU per record in B3 and the latency soak unchanged (README "Performance").
PARALLEL_GC = "-XX:+UseParallelGC"
_COLLECTOR = re.compile(r"-XX:[+-]Use\w+GC")


def driver_base_options(settings: Settings) -> tuple[str, ...]:
    """The driver's JVM options under ``adattr run`` and spark-submit alike: UTC, Parallel GC
    (unless ``ADATTR_JVM_OPTIONS`` chooses a collector), ``ADATTR_JVM_OPTIONS``."""
    chosen = any(_COLLECTOR.fullmatch(o) for o in settings.java_options)
    return (UTC_JVM, *(() if chosen else (PARALLEL_GC,)), *settings.java_options)


def driver_java_options(settings: Settings) -> str:
    """The driver's JVM options: ``driver_base_options`` and those that start it from the
    archive, if there is one to use."""
    options = list(driver_base_options(settings))
    path = archive_path(settings) if settings.jvm_class_archive else None
    if path is not None and path.is_file():
        options.append(f"-XX:SharedArchiveFile={path} {QUIET_CDS}")
    return " ".join(options)


def time_zone_warning(default_zone: str, user_timezone: str | None) -> str | None:
    """What to tell a user whose driver JVM is not in UTC (under spark-submit its command line
    starts the JVM), as Delta decides it: every zone's name must contain "UTC"."""
    zones = (default_zone, "Etc/UTC" if user_timezone is None else user_timezone)
    if all("utc" in zone.lower() for zone in zones):
        return None
    return (
        f"the driver's JVM runs in time zone {default_zone} (user.timezone={user_timezone}), "
        "not UTC: Delta then reconstructs every new table version inside its commit, a cost "
        "on every write of every batch; start the driver with -Duser.timezone=UTC (spark-submit "
        "--driver-java-options=-Duser.timezone=UTC)"
    )


# The largest file Delta's auto compaction writes (see spark_conf), and the size under which a
# compaction (Delta's or the job's) rewrites a file: a small file.
AUTO_COMPACT_FILE_BYTES = 8 * 1024 * 1024
SMALL_FILE_BYTES = AUTO_COMPACT_FILE_BYTES // 2
# Hadoop's local file system, answering through java.nio what it otherwise answers by starting
# a readlink or chmod process (without Hadoop's native library, which no Maven artifact ships):
# ~200 processes per micro-batch, every Delta commit and file the job writes
# (infra/jvm/src/adattr/hadoop, built by infra/setup.sh into the Spark jars).
LOCAL_FILE_SYSTEM_JAR = "adattr-hadoop-local.jar"


def local_file_system(jars_dir: Path) -> dict[str, str]:
    """The session confs that give a local-mode JVM that file system: its jar on the JVM's own
    class path (spark-submit's set-up reads files before ``spark.jars`` are loaded)."""
    return {
        "spark.driver.extraClassPath": str(jars_dir / "spark" / LOCAL_FILE_SYSTEM_JAR),
        "spark.hadoop.fs.file.impl": "adattr.hadoop.NioLocalFileSystem",
        "spark.hadoop.fs.AbstractFileSystem.file.impl": "adattr.hadoop.NioLocalFs",
    }


def spark_conf(settings: Settings, *, submitted: bool = False) -> dict[str, str]:
    """The session configuration, as plain data (unit-tested without a JVM)."""
    conf = {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        "spark.sql.streaming.stateStore.providerClass": STATE_STORE_PROVIDERS[settings.state_store],
        # Changelog checkpointing uploads only the changes of each batch instead of a RocksDB
        # snapshot, which keeps the per-batch commit cheap on small, frequent micro-batches.
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.ui.enabled": str(settings.spark_ui).lower(),
        "spark.ui.showConsoleProgress": "false",
        # The job is driven from Python; keep Delta's txn settings and MERGE on the driver path.
        "spark.databricks.delta.schema.autoMerge.enabled": "false",
        # Small local tables: more files than rows is the wrong trade on one machine.
        "spark.databricks.delta.optimizeWrite.enabled": "false",
        "spark.sql.adaptive.enabled": "true",
        # Delta rebuilds a table's snapshot state in this many partitions (default 50): on two
        # cores that alone made every MERGE take 4-8 s; sized like the shuffle it takes ~1 s.
        "spark.databricks.delta.snapshotPartitions": str(settings.shuffle_partitions),
    }
    if settings.compaction == "off":
        conf["spark.databricks.delta.autoCompact.enabled"] = "false"  # over the tables' property
    else:
        # Every batch adds files to every table it writes, and a table's snapshot state (rebuilt
        # for each new version the job reads or MERGEs into) grows with its number of files.
        # Delta's auto compaction runs after a commit, in the committing thread, once
        # ``compact_files`` files have piled up, and rewrites those under half the maximum size
        # into files of up to 8 MB (bigger files are never rewritten again, so a compaction's
        # cost stays bounded; Delta's default 128 MB would have a gold MERGE rewrite up to 64 MB
        # whenever it updates a row of the newest compacted file). Its commit changes no data
        # (dataChange=false) and, run by the job's own thread, never races a job write.
        # ``job``: the session leaves the choice to each table's property (pipelines/tables.py:
        # on except the record tables, which pipelines/compaction.py compacts); ``delta``: on
        # for every table, whatever its property says.
        if settings.compaction == "delta":
            conf["spark.databricks.delta.autoCompact.enabled"] = "true"
        conf["spark.databricks.delta.autoCompact.maxFileSize"] = str(AUTO_COMPACT_FILE_BYTES)
        conf["spark.databricks.delta.autoCompact.minNumFiles"] = str(settings.compact_files)
        # Due once a table's small files written by this JVM reach ``compact_files``, never
        # after every commit. Delta's default ("modified partitions only") also compacts a
        # partition this JVM has not compacted yet, and it forgets that it did once its count
        # of small files drops to zero or below, which a compaction of files it never counted
        # (written before a restart) does: from then on every commit was followed by a
        # compaction of two files (a restarted job's ledger append 1.2 s instead of 0.3 s).
        conf["spark.databricks.delta.autoCompact.modifiedPartitionsOnly.enabled"] = "false"
        # That count of small files takes only the files a compaction can rewrite (under half
        # the maximum, its own default). Unset, Delta counts every file a commit adds or
        # removes (its default there is no limit): once a long-lived job had written
        # ``compact_files`` files of 4-8 MB to a table (compactions' outputs, big MERGE
        # rewrites), a compaction was due after every commit, each rewriting the newest one or
        # two small files or finding nothing to take.
        conf["spark.databricks.delta.autoCompact.minFileSize"] = str(SMALL_FILE_BYTES)
    if not settings.spark_codegen:
        # Every micro-batch plans new queries whose literals (batch id, watermark, time bounds)
        # are inlined in the generated Java, so no compiled class is ever reused: each batch
        # generated, formatted and compiled them anew, in every task (profiled: a fifth of a
        # 1,000-record batch's CPU in Janino and the code formatter's regexes). Interpreted
        # evaluation of a few thousand rows costs less than that (README "Performance").
        conf["spark.sql.codegen.wholeStage"] = "false"
        conf["spark.sql.codegen.factoryMode"] = "NO_CODEGEN"
    if not submitted:
        if settings.local_file_system and settings.spark_master.startswith("local"):
            # One JVM that loads the jar before any file is touched; a cluster's executors
            # keep Hadoop's own (not measured there).
            conf.update(local_file_system(settings.jars_dir))
        conf["spark.master"] = settings.spark_master
        conf["spark.driver.memory"] = settings.spark_driver_memory
        conf["spark.jars"] = ",".join(spark_jars(settings.jars_dir))
        conf["spark.driver.extraJavaOptions"] = driver_java_options(settings)
    return conf


def build_spark(settings: Settings, app_name: str = "adattr") -> SparkSession:
    # Spark's Python workers must use this interpreter (the venv), not whatever is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    conf = spark_conf(settings, submitted=under_spark_submit())
    if not under_spark_submit():
        _launch_jvm_in_own_session(
            conf, log=None if settings.verbose else settings.data_dir / "logs" / "spark.log"
        )
    builder = SparkSession.builder.appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    zone = jvm.java.util.TimeZone.getDefault().getID()
    warning = time_zone_warning(zone, jvm.java.lang.System.getProperty("user.timezone"))
    if warning:
        log.warning("%s", warning)
    return spark


def held_executions(spark: SparkSession) -> list[str]:
    """The SQL executions whose finished jobs the driver's DAG scheduler still holds (with their
    stages, plans, Delta snapshots and broadcasts), each as its id, the jobs it holds and its
    description: none once every execution that ran a job has ended. A job filed under an
    execution that had already ended stays for the life of the driver (Spark 4.2's
    ``DataFrame.toLocalIterator`` did that once per call: README "Performance")."""
    held = spark.sparkContext._jsc.sc().dagScheduler().activeQueryToJobs()
    store = spark._jsparkSession.sharedState().statusStore()
    details = []
    for entry in held.entrySet().toArray():
        key = int(entry.getKey())
        execution = store.execution(key)
        said = execution.get().description()[:300] if execution.isDefined() else "(not in the UI)"
        details.append(f"execution {key}, {entry.getValue().size()} jobs: {said}")
    return details


def _launch_jvm_in_own_session(conf: dict[str, str], *, log: Path | None) -> None:
    """Starts the driver's JVM as pyspark would (``spark-submit ... pyspark-shell`` with the
    session's confs), but in a session of its own, so that a signal to the Python process's
    group (systemd's stop, ``timeout``, ``kill -- -PGID``) reaches only Python, which stops the
    query between batches (``pipelines.job``); in the same group the JVM exited at once and the
    driver died with a py4j error mid-batch. The JVM still ends with Python: pyspark's gateway
    exits when the pipe to its stdin closes. Its stderr (the JVM's and log4j's warnings) is
    appended to ``log`` when one is given. No-op once a gateway exists."""
    from pyspark import SparkConf, SparkContext
    from pyspark.errors import PySparkRuntimeError
    from pyspark.java_gateway import launch_gateway

    with SparkContext._lock:
        if SparkContext._gateway is not None:
            return
        out = None if log is None else _open_log(log)
        try:
            gateway = launch_gateway(
                SparkConf(loadDefaults=False).setAll(list(conf.items())),
                popen_kwargs={"start_new_session": True, **({"stderr": out} if out else {})},
            )
        except PySparkRuntimeError as exc:
            where = f"; the end of its output ({log}):\n{_tail(log)}" if log else ""
            raise SparkStartError(f"the Spark JVM did not start ({exc}){where}") from exc
        finally:
            if out is not None:
                out.close()  # the JVM has its own copy
        SparkContext._gateway = gateway
        SparkContext._jvm = gateway.jvm


def _open_log(path: Path) -> BinaryIO:
    """The JVM's log, opened for appending, under a line that says which command this is."""
    path.parent.mkdir(parents=True, exist_ok=True)
    out = path.open("ab")
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    out.write(f"--- {started} pid {os.getpid()}: {' '.join(sys.argv)}\n".encode())
    out.flush()
    return out


def _tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
