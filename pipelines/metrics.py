"""What ``adattr run`` exposes to Prometheus (``ADATTR_METRICS_PORT``): what an on-call engineer
watches. Updated from the sink's report after each batch's ledger row is written (so the record
counters add up to the ledger rows this process wrote) and from Spark's progress after each
batch (lag, watermark). Counters start at zero with each run, as Prometheus counters do."""

from __future__ import annotations

import json
import math
import time
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from app.runtime.metrics import new_registry
from pipelines.publish import Publisher, TransactionalPublisher
from pipelines.report import BatchReport

BATCH_BUCKETS = (0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 60.0, 120.0)


class JobMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or new_registry()
        r = self.registry
        self.records = Counter(
            "adattr_records",
            "Records the job read, by outcome: accepted, duplicate, late, or the quarantine reason",
            ["outcome"],
            registry=r,
        )
        self.batches = Counter("adattr_batches", "Micro-batches completed", registry=r)
        self.batch_seconds = Histogram(
            "adattr_batch_duration_seconds",
            "Wall time of a micro-batch in the sink (read, state, writes, Kafka, ledger)",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.phase_seconds = Gauge(
            "adattr_batch_phase_seconds",
            "The last batch's wall time per phase (dim, read+state+classify, records, gold, "
            "changed_rows, kafka, hourly, ledger)",
            ["phase"],
            registry=r,
        )
        self.last_batch = Gauge(
            "adattr_last_committed_batch",
            "Id of the last batch whose ledger row is written",
            registry=r,
        )
        self.last_batch_time = Gauge(
            "adattr_last_committed_batch_timestamp_seconds",
            "When the last batch's ledger row was written (epoch seconds)",
            registry=r,
        )
        age = Gauge(
            "adattr_last_committed_batch_age_seconds",
            "Seconds since the last batch's ledger row was written (NaN before the first)",
            registry=r,
        )
        age.set_function(self._age)
        self.transactions = Counter(
            "adattr_kafka_transactions",
            "Batches by Kafka outcome: committed, already-committed (a re-executed batch), "
            "nothing-to-publish, aborted (an attempt aborted and redone)",
            ["outcome"],
            registry=r,
        )
        self.open_transaction = Gauge(
            "adattr_kafka_open_transaction_age_seconds",
            "Age of the Kafka transaction the job holds open (0: none open)",
            registry=r,
        )
        self.lag_records = Gauge(
            "adattr_input_lag_records",
            "Records on the input topic not yet read, per partition (at the last trigger)",
            ["topic", "partition"],
            registry=r,
        )
        self.lag_seconds = Gauge(
            "adattr_input_lag_seconds",
            "How far behind the input the job is, per partition: 0 when caught up, else the age "
            "of the newest record it has processed (its Kafka timestamp)",
            ["topic", "partition"],
            registry=r,
        )
        self.watermark_delay = Gauge(
            "adattr_watermark_delay_seconds",
            "Wall clock minus the event-time watermark (how late an event may be and count)",
            registry=r,
        )
        self._finished_at = math.nan
        self._newest_ms: dict[tuple[str, int], int] = {}
        self._publisher: TransactionalPublisher | None = None
        self._aborted = 0
        self._phases: set[str] = set()

    def _age(self) -> float:
        return time.time() - self._finished_at

    def watch(self, publisher: Publisher) -> None:
        if isinstance(publisher, TransactionalPublisher):
            self.open_transaction.set_function(
                lambda: 0.0 if publisher.open_since is None else time.time() - publisher.open_since
            )
            self._publisher = publisher

    def batch_done(self, report: BatchReport) -> None:
        for outcome, n in report.outcomes.items():
            self.records.labels(outcome).inc(n)
        self.batches.inc()
        self.batch_seconds.observe(sum(report.steps.values()))
        # A phase this batch did not run (no Kafka transaction in a batch with nothing to
        # publish) reads 0, not an earlier batch's time: the phases add up to this batch.
        for phase in self._phases - report.steps.keys():
            self.phase_seconds.labels(phase).set(0.0)
        for phase, seconds in report.steps.items():
            self.phase_seconds.labels(phase).set(seconds)
        self._phases |= report.steps.keys()
        self.transactions.labels(report.kafka_outcome.split(":")[0]).inc()
        aborted = self._publisher.aborted if self._publisher is not None else 0
        if aborted > self._aborted:
            self.transactions.labels("aborted").inc(aborted - self._aborted)
            self._aborted = aborted
        self.last_batch.set(report.batch_id)
        self.last_batch_time.set(report.finished_at)
        self._finished_at = report.finished_at
        for key, (_, timestamp_ms) in report.newest.items():
            self._newest_ms[key] = max(self._newest_ms.get(key, 0), timestamp_ms)

    def progress(self, progress: Any) -> None:
        """From a StreamingQueryProgress (``query.lastProgress``): the input lag per partition
        (the newest offsets Kafka had at the trigger minus the batch's end) and the watermark."""
        now = time.time()
        for source in progress["sources"] or []:
            latest, end = _offsets(source["latestOffset"]), _offsets(source["endOffset"])
            for topic, partitions in latest.items():
                for partition, newest in partitions.items():
                    lag = max(0, int(newest) - int(end.get(topic, {}).get(partition, 0)))
                    labels = (topic, str(partition))
                    self.lag_records.labels(*labels).set(lag)
                    seen_ms = self._newest_ms.get((topic, int(partition)))
                    behind = 0.0 if lag == 0 or seen_ms is None else now - seen_ms / 1000
                    self.lag_seconds.labels(*labels).set(max(0.0, behind))
        watermark = (progress["eventTime"] or {}).get("watermark")
        if watermark:
            self.watermark_delay.set(now - datetime.fromisoformat(watermark).timestamp())


def _offsets(value: Any) -> dict[str, dict[str, int]]:
    """A source offset as Spark's progress gives it (JSON text or already parsed)."""
    if not value:
        return {}
    parsed = json.loads(value) if isinstance(value, str) else value
    return parsed if isinstance(parsed, dict) else {}
