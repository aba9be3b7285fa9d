"""The job's metrics from a batch report and a Spark progress, without Spark or Kafka."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from prometheus_client import generate_latest

from app.runtime.settings import Settings, SettingsError
from pipelines.metrics import JobMetrics
from pipelines.report import BatchReport


def _value(metrics: JobMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels or None)


def test_a_batch_report_moves_the_counters_and_the_last_batch() -> None:
    metrics = JobMetrics()
    now_ms = int(time.time() * 1000)
    report = BatchReport(
        7,
        {"accepted": 90, "duplicate": 6, "malformed_json": 4},
        {"read+state+classify": 0.5, "gold": 1.0, "ledger": 0.25},
        "committed:12",
        {("in", 0): (41, now_ms - 30_000), ("in", 1): (9, now_ms - 5_000)},
        time.time(),
    )

    metrics.batch_done(report)
    metrics.batch_done(replace(report, batch_id=8, outcomes={"accepted": 10}, kafka_outcome="x"))

    assert _value(metrics, "adattr_records_total", outcome="accepted") == 100
    assert _value(metrics, "adattr_records_total", outcome="malformed_json") == 4
    assert _value(metrics, "adattr_batches_total") == 2
    assert _value(metrics, "adattr_batch_duration_seconds_sum") == pytest.approx(3.5)
    assert _value(metrics, "adattr_batch_phase_seconds", phase="gold") == 1.0
    assert _value(metrics, "adattr_last_committed_batch") == 8
    assert _value(metrics, "adattr_kafka_transactions_total", outcome="committed") == 1
    assert 0 <= (_value(metrics, "adattr_last_committed_batch_age_seconds") or -1) < 5
    assert b"_created" not in generate_latest(metrics.registry)

    # A batch that runs fewer phases: those it did not run read 0, not the last batch's time.
    metrics.batch_done(replace(report, batch_id=9, steps={"read+state+classify": 0.75}))
    assert _value(metrics, "adattr_batch_phase_seconds", phase="read+state+classify") == 0.75
    assert _value(metrics, "adattr_batch_phase_seconds", phase="gold") == 0.0
    assert _value(metrics, "adattr_batch_phase_seconds", phase="ledger") == 0.0


def test_lag_comes_from_the_progress_offsets_and_the_newest_record_seen() -> None:
    metrics = JobMetrics()
    now_ms = int(time.time() * 1000)
    metrics.batch_done(
        BatchReport(
            0, {"accepted": 1}, {}, "nothing-to-publish", {("in", 0): (41, now_ms - 30_000)}
        )
    )
    progress = {
        "sources": [
            {
                # As Spark posts them: JSON text, the next offset to read per partition.
                "endOffset": json.dumps({"in": {"0": 42, "1": 10}}),
                "latestOffset": json.dumps({"in": {"0": 142, "1": 10}}),
            }
        ],
        "eventTime": {"watermark": "2026-11-20T10:00:00.000Z"},
    }

    metrics.progress(progress)

    assert _value(metrics, "adattr_input_lag_records", topic="in", partition="0") == 100
    assert _value(metrics, "adattr_input_lag_records", topic="in", partition="1") == 0
    behind = _value(metrics, "adattr_input_lag_seconds", topic="in", partition="0") or 0
    assert 30 <= behind < 35
    assert _value(metrics, "adattr_input_lag_seconds", topic="in", partition="1") == 0
    watermark = datetime(2026, 11, 20, 10, tzinfo=UTC).timestamp()
    delay = _value(metrics, "adattr_watermark_delay_seconds") or 0
    assert delay == pytest.approx(time.time() - watermark, abs=5)


def test_the_endpoint_settings_are_checked() -> None:
    assert Settings.from_env({}).metrics_port == 0  # off by default
    assert Settings.from_env({}).metrics_host == "127.0.0.1"
    with pytest.raises(SettingsError, match="ADATTR_METRICS_PORT=70000: must be a port number"):
        Settings.from_env({"ADATTR_METRICS_PORT": "70000"})
