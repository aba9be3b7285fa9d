from __future__ import annotations

from pathlib import Path

import pytest

from app.runtime.settings import Settings, SettingsError
from app.runtime.spark import (
    LOCAL_FILE_SYSTEM_JAR,
    STATE_STORE_PROVIDERS,
    MissingJarsError,
    archive_path,
    spark_conf,
)

SPARK_JARS = (
    "spark-sql-kafka-0-10_2.13-4.2.0.jar",
    "delta-spark_4.2_2.13-4.4.0.jar",
    LOCAL_FILE_SYSTEM_JAR,
)


def _spark_jars(jars_dir: Path) -> Path:
    """Empty files named like the jars set-up puts in ``jars_dir``/spark."""
    spark = jars_dir / "spark"
    spark.mkdir(exist_ok=True)
    for name in SPARK_JARS:
        (spark / name).write_bytes(b"")
    return spark


def test_defaults_are_loopback_and_local() -> None:
    s = Settings.from_env({})
    assert s.bootstrap_servers == "127.0.0.1:9092"
    assert (s.warehouse, s.checkpoints) == ("warehouse", Path("checkpoints"))
    assert (s.input_topic, s.output_topic) == ("ad-events", "ad-metrics")
    assert s.watermark_delay_seconds == 600


def test_values_are_read_and_typed() -> None:
    s = Settings.from_env(
        {
            "ADATTR_BOOTSTRAP_SERVERS": "localhost:19092,localhost:19093",
            "ADATTR_WAREHOUSE": "/tmp/wh",
            "ADATTR_SHUFFLE_PARTITIONS": "8",
            "ADATTR_SPARK_UI": "yes",
            "ADATTR_STATE_STORE": "hdfs",
            "ADATTR_WATERMARK_DELAY": "2 hours",
            "ADATTR_PYTHON": "python3.11",  # read by infra/setup.sh only
            "OTHER": "ignored",
        }
    )
    assert s.warehouse == "/tmp/wh"
    assert s.shuffle_partitions == 8 and s.spark_ui is True
    assert s.watermark_delay_seconds == 7200
    assert s.table_path("dim_ads") == "/tmp/wh/dim_ads"


def test_a_warehouse_uri_is_kept_as_given_and_a_folder_made_absolute(tmp_path: Path) -> None:
    s3 = Settings.from_env({"ADATTR_WAREHOUSE": "s3a://adattr-prod/warehouse/"})
    assert s3.warehouse_uri == "s3a://adattr-prod/warehouse"  # Path would make it s3a:/...
    assert s3.table_path("silver_ad_events") == "s3a://adattr-prod/warehouse/silver_ad_events"
    assert s3.local_warehouse is None
    local = Settings.from_env({"ADATTR_WAREHOUSE": "wh"})
    assert local.warehouse_uri == str(Path("wh").resolve())
    assert local.local_warehouse == Path("wh").resolve()


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"ADATTR_WAREHOSE": "/x"}, "ADATTR_WAREHOSE"),
        ({"ADATTR_SHUFFLE_PARTITIONS": "four"}, "ADATTR_SHUFFLE_PARTITIONS"),
        ({"ADATTR_SHUFFLE_PARTITIONS": "0"}, "ADATTR_SHUFFLE_PARTITIONS"),
        ({"ADATTR_BOOTSTRAP_SERVERS": "nohost"}, "ADATTR_BOOTSTRAP_SERVERS"),
        ({"ADATTR_STATE_STORE": "memory"}, "ADATTR_STATE_STORE"),
        ({"ADATTR_WATERMARK_DELAY": "10m"}, "ADATTR_WATERMARK_DELAY"),
        ({"ADATTR_SPARK_UI": "maybe"}, "ADATTR_SPARK_UI"),
        ({"ADATTR_INPUT_TOPIC": "bad topic"}, "ADATTR_INPUT_TOPIC"),
        ({"ADATTR_WAREHOUSE": ""}, "ADATTR_WAREHOUSE"),
        ({"ADATTR_JVM_OPTIONS": "-Xmx1g TieredStopAtLevel=1"}, "ADATTR_JVM_OPTIONS"),
        ({"ADATTR_COMPACTION": "auto"}, "ADATTR_COMPACTION"),
        ({"ADATTR_COMPACT_FILES": "1"}, "ADATTR_COMPACT_FILES"),
        ({"ADATTR_AUTO_COMPACT": "false"}, "ADATTR_AUTO_COMPACT"),  # replaced by the two above
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match=named):
        Settings.from_env(env)


def test_spark_conf_local_and_submitted(tmp_path: Path) -> None:
    jars = _spark_jars(tmp_path)
    env = {"ADATTR_JARS_DIR": str(tmp_path), "ADATTR_STATE_STORE": "hdfs"}
    s = Settings.from_env(env)
    local = spark_conf(s)
    assert local["spark.master"] == "local[*]"
    assert local["spark.jars"].count(".jar") == 3
    assert local["spark.sql.streaming.stateStore.providerClass"] == STATE_STORE_PROVIDERS["hdfs"]
    assert local["spark.sql.session.timeZone"] == "UTC"
    submitted = spark_conf(s, submitted=True)
    assert "spark.master" not in submitted and "spark.jars" not in submitted
    # Interpreted by default (per-batch literals defeat the generated code's cache) ...
    for conf in (local, submitted):
        assert conf["spark.sql.codegen.wholeStage"] == "false"
        assert conf["spark.sql.codegen.factoryMode"] == "NO_CODEGEN"
    # ... and Spark's own default when asked for.
    compiled = spark_conf(Settings.from_env({**env, "ADATTR_SPARK_CODEGEN": "true"}))
    assert not any(k.startswith("spark.sql.codegen.") for k in compiled)
    # Small files are compacted: the job's record tables by the job, the others by Delta as
    # their table property says (the session does not override it) ...
    for conf in (local, submitted):
        assert "spark.databricks.delta.autoCompact.enabled" not in conf
        assert int(conf["spark.databricks.delta.autoCompact.maxFileSize"]) == 8 * 1024 * 1024
        assert conf["spark.databricks.delta.autoCompact.minNumFiles"] == "50"
        # (due by that count alone: test_compaction.py, a restarted job's table)
        assert conf["spark.databricks.delta.autoCompact.modifiedPartitionsOnly.enabled"] == "false"
        # (counting only the files a compaction takes: under half the maximum)
        assert int(conf["spark.databricks.delta.autoCompact.minFileSize"]) == 4 * 1024 * 1024
    # ... every table by Delta, in the writing thread, over any table's property ...
    delta = spark_conf(Settings.from_env({**env, "ADATTR_COMPACTION": "delta"}))
    assert delta["spark.databricks.delta.autoCompact.enabled"] == "true"
    fewer = Settings.from_env({**env, "ADATTR_COMPACTION": "delta", "ADATTR_COMPACT_FILES": "10"})
    assert spark_conf(fewer)["spark.databricks.delta.autoCompact.minNumFiles"] == "10"
    # ... or none, whatever the tables' property.
    piled = spark_conf(Settings.from_env({**env, "ADATTR_COMPACTION": "off"}))
    assert piled["spark.databricks.delta.autoCompact.enabled"] == "false"
    # A local JVM gets the java.nio local file system, its jar on the JVM's own class path ...
    assert local["spark.hadoop.fs.file.impl"] == "adattr.hadoop.NioLocalFileSystem"
    assert local["spark.hadoop.fs.AbstractFileSystem.file.impl"] == "adattr.hadoop.NioLocalFs"
    assert local["spark.driver.extraClassPath"] == str(jars / LOCAL_FILE_SYSTEM_JAR)
    # ... not under spark-submit or a cluster's master (executors elsewhere), not when off.
    for other in (
        submitted,
        spark_conf(Settings.from_env({**env, "ADATTR_SPARK_MASTER": "spark://h:7077"})),
        spark_conf(Settings.from_env({**env, "ADATTR_LOCAL_FILE_SYSTEM": "false"})),
    ):
        assert not any(k.startswith("spark.hadoop.fs.") for k in other)
        assert "spark.driver.extraClassPath" not in other


def test_driver_starts_from_the_class_archive_only_when_there_is_one(tmp_path: Path) -> None:
    jars = _spark_jars(tmp_path)
    env = {"ADATTR_JARS_DIR": str(tmp_path)}
    s = Settings.from_env(env)
    none_yet = spark_conf(s)["spark.driver.extraJavaOptions"]
    assert none_yet == "-Duser.timezone=UTC -XX:+UseParallelGC"  # no archive made yet
    archive = archive_path(s)
    assert archive is not None and archive.parent == tmp_path / "cds"
    archive.parent.mkdir()
    archive.write_bytes(b"made by set-up")
    options = spark_conf(s)["spark.driver.extraJavaOptions"]
    assert f"-XX:SharedArchiveFile={archive}" in options and "-Xlog:cds=off" in options
    # Not under spark-submit (its command line owns the JVM), not when switched off ...
    assert "spark.driver.extraJavaOptions" not in spark_conf(s, submitted=True)
    off = Settings.from_env({**env, "ADATTR_JVM_CLASS_ARCHIVE": "false"})
    assert "SharedArchiveFile" not in spark_conf(off)["spark.driver.extraJavaOptions"]
    # ... and an archive made for other jars is never used: the key in its name moves.
    (jars / "extra-1.0.jar").write_bytes(b"")
    assert archive_path(s) != archive
    assert "SharedArchiveFile" not in spark_conf(s)["spark.driver.extraJavaOptions"]


def test_missing_jars_say_how_to_fetch_them(tmp_path: Path) -> None:
    s = Settings.from_env({"ADATTR_JARS_DIR": str(tmp_path)})
    with pytest.raises(MissingJarsError, match=r"infra/setup\.sh"):
        spark_conf(s)


def test_jvm_options_reach_every_jvm_adattr_starts(tmp_path: Path) -> None:
    from app.stack.broker import LocalBroker
    from app.stack.cluster import LocalCluster
    from app.tools.drills import submit_java_options

    kafka = tmp_path / "kafka"
    kafka.mkdir()
    (kafka / "kafka_2.13-4.2.0.jar").write_bytes(b"")
    _spark_jars(tmp_path)
    s = Settings.from_env(
        {"ADATTR_JARS_DIR": str(tmp_path), "ADATTR_JVM_OPTIONS": " -XX:TieredStopAtLevel=1  -Xss2m"}
    )
    assert s.java_options == ("-XX:TieredStopAtLevel=1", "-Xss2m")
    assert (
        spark_conf(s)["spark.driver.extraJavaOptions"]
        == "-Duser.timezone=UTC -XX:+UseParallelGC -XX:TieredStopAtLevel=1 -Xss2m"
    )
    node = LocalCluster.of(s).broker(1)
    command = node._java("kafka.Kafka", "server.properties")
    assert command[:3] == ["java", "-XX:TieredStopAtLevel=1", "-Xss2m"]
    assert LocalBroker(tmp_path, tmp_path)._java("kafka.Kafka")[1].startswith("-Xmx")  # none
    submit = submit_java_options(s)  # the same string as the local driver's
    driver = submit[submit.index("--driver-java-options") + 1]
    assert driver == "-Duser.timezone=UTC -XX:+UseParallelGC -XX:TieredStopAtLevel=1 -Xss2m"
    assert "spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1 -Xss2m" in submit
    # The driver runs in UTC whatever else it is given (app/runtime/spark.py, UTC_JVM).
    assert submit_java_options(Settings.from_env({})) == [
        "--driver-java-options",
        "-Duser.timezone=UTC -XX:+UseParallelGC",
    ]
    # Parallel GC unless the options choose a collector: then theirs alone, both ways.
    g1 = Settings.from_env({"ADATTR_JARS_DIR": str(tmp_path), "ADATTR_JVM_OPTIONS": "-XX:+UseG1GC"})
    assert spark_conf(g1)["spark.driver.extraJavaOptions"] == "-Duser.timezone=UTC -XX:+UseG1GC"
    assert submit_java_options(g1)[1] == "-Duser.timezone=UTC -XX:+UseG1GC"


def test_a_driver_jvm_outside_utc_is_told_what_it_costs() -> None:
    from app.runtime.spark import time_zone_warning

    # Delta's own rule: every zone's name contains "UTC"; user.timezone unset counts as UTC.
    for default, user in (("UTC", "UTC"), ("Etc/UTC", None)):
        assert time_zone_warning(default, user) is None
    for default, user in (("Europe/Berlin", "Europe/Berlin"), ("UTC", "GMT"), ("GMT", "UTC")):
        said = time_zone_warning(default, user)
        assert said is not None and "-Duser.timezone=UTC" in said and default in said
