"""Builders for test events and Kafka-shaped rows, shared by every test."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession

KAFKA_ROW_SCHEMA = (
    "kafka_topic string, kafka_partition int, kafka_offset long, kafka_timestamp timestamp, "
    "raw_key binary, raw_value binary"
)


def event(
    event_id: str,
    event_type: str = "impression",
    event_time: str = "2026-11-20T10:00:00.000Z",
    *,
    user_id: str = "u1",
    ad_id: str | None = "ad-1",
    **extra: Any,
) -> dict[str, Any]:
    e: dict[str, Any] = {
        "event_id": event_id,
        "event_type": event_type,
        "event_time": event_time,
        "user_id": user_id,
        "schema_version": 1,
    }
    if event_type in ("impression", "click") and ad_id is not None:
        e["ad_id"] = ad_id
    if event_type == "conversion":
        e.setdefault("advertiser_id", "adv-1")
        e.setdefault("revenue", "10.50")
    e.update(extra)
    return e


def kafka_rows(
    spark: SparkSession, values: list[dict[str, Any] | str | bytes | None], *, partitions: int = 2
) -> DataFrame:
    """Kafka-shaped rows, values round-robin over partitions with increasing offsets."""
    rows = []
    for i, value in enumerate(values):
        if isinstance(value, dict):
            raw: bytes | None = json.dumps(value).encode()
        elif isinstance(value, str):
            raw = value.encode()
        else:
            raw = value
        rows.append(("t", i % partitions, i // partitions, datetime(2026, 11, 20, 10), b"k", raw))
    return spark.createDataFrame(rows, KAFKA_ROW_SCHEMA)


# The JVMs of a test live for seconds to a few minutes, and the suite keeps both cores busy
# (measured: a drill alone left them idle 10% of its time). Their C2 compiler threads spent a
# third of that CPU on code a short run never profits from: C1 only, the replay drill took 119 s
# instead of 137 s on 163 instead of 248 core-seconds. A long job wants C2 (bench --fixed-only,
# C1 only: a 1,000-record batch 9.4-10.1 s instead of 7.9 s), so this is the tests' setting,
# not a default. C1 only also shrinks the JVM's default code cache from 240 MB to 48 MB, which
# Spark and Delta's code filled in a one-minute job run ("CodeCache is full. Compiler has been
# disabled", then an InternalError: out of space for a method handle intrinsic, the JVM gone):
# the code cache is given its usual size back.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"


def adattr_env(**settings: str) -> dict[str, str]:
    """This process's environment without any ADATTR_* variable, plus the tests' JVM options
    and the given settings (``warehouse="/x"`` becomes ``ADATTR_WAREHOUSE=/x``)."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("ADATTR_")}
    env["ADATTR_JVM_OPTIONS"] = TEST_JVM_OPTIONS
    env.update({f"ADATTR_{k.upper()}": v for k, v in settings.items()})
    return env


def run_adattr(env: dict[str, str], *args: str, timeout: float = 600):  # type: ignore[no-untyped-def]
    """Runs the installed ``adattr`` console script as a user would."""
    import subprocess
    import sys
    from pathlib import Path

    return subprocess.run(
        [str(Path(sys.executable).with_name("adattr")), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def settings_env(settings: Any, **extra: str) -> dict[str, str]:
    """The environment that gives an ``adattr`` subprocess the same settings as ``settings``
    (warehouse, checkpoints, topics, windows), plus ``extra``."""
    values = dict(
        bootstrap_servers=settings.bootstrap_servers,
        warehouse=str(settings.warehouse),
        checkpoints=str(settings.checkpoints),
        data_dir=str(settings.data_dir),
        input_topic=settings.input_topic,
        output_topic=settings.output_topic,
        control_topic=settings.control_topic,
        watermark_delay=settings.watermark_delay,
        attribution_lookback=settings.attribution_lookback,
        session_gap=settings.session_gap,
        max_offsets_per_trigger=str(settings.max_offsets_per_trigger),
        spark_master="local[2]",
        shuffle_partitions=str(settings.shuffle_partitions),
    )
    security = (
        "kafka_security_protocol",
        "kafka_sasl_mechanism",
        "kafka_sasl_username",
        "kafka_sasl_password_file",
        "kafka_ssl_ca_file",
    )
    values |= {name: getattr(settings, name) for name in security if getattr(settings, name)}
    return adattr_env(**{**values, **extra})


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """A Prometheus endpoint on this machine, parsed: (name, sorted labels) -> value."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def drill_passed(done, name: str) -> str:  # type: ignore[no-untyped-def]
    """The output of an ``adattr drill`` that passed with every check OK."""
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-3000:]}"
    assert f"drill {name}: PASSED" in done.stdout
    assert "DISCREPANCY" not in done.stdout
    for check in ("verify: OK", "audit: OK", "reconcile: OK"):
        assert check in done.stdout, check
    return str(done.stdout)
