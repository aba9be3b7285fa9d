"""The budget service downstream: a read_committed consumer of ``ad-metrics`` that keeps an
advertiser-facing view in an embedded database (SQLite by default), exactly once.

Exactly-once here means: the Kafka offsets live in the same database transaction as the rows
they produced, and the consumer resumes from them (never from Kafka's group offsets), so a crash
at any point neither loses nor re-applies an update. An update older (by ``(generation,
batch_id)``) than the row stored is ignored, so a replay's republished rows win and a stale one
never overwrites a newer one.
"""

from __future__ import annotations

import csv
import json
import logging
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.runtime.crash import crash_point
from app.runtime.errors import UserInputError
from schemas.ad_metrics import ATTRIBUTIONS, METRICS, PUBLISHED

if TYPE_CHECKING:
    from app.runtime.kafka_io import KafkaConnection

log = logging.getLogger("adattr.consume")

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS consumer_offsets (
        topic TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
        PRIMARY KEY (topic, partition))""",
    """CREATE TABLE IF NOT EXISTS ad_metrics (
        window_start TEXT NOT NULL, ad_id TEXT NOT NULL, window_end TEXT, campaign_id TEXT,
        advertiser_id TEXT, impressions INTEGER, clicks INTEGER, spend TEXT, conversions INTEGER,
        revenue TEXT, is_final INTEGER, generation INTEGER NOT NULL, batch_id INTEGER NOT NULL,
        record_id TEXT NOT NULL, PRIMARY KEY (window_start, ad_id))""",
    """CREATE TABLE IF NOT EXISTS attributions (
        conversion_id TEXT PRIMARY KEY, conversion_time TEXT, user_id TEXT, advertiser_id TEXT,
        revenue TEXT, click_id TEXT, click_time TEXT, ad_id TEXT, campaign_id TEXT, status TEXT,
        is_final INTEGER, generation INTEGER NOT NULL, batch_id INTEGER NOT NULL,
        record_id TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS budgets (
        campaign_id TEXT PRIMARY KEY, daily_budget TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS budget_alerts (
        campaign_id TEXT NOT NULL, day TEXT NOT NULL, spend TEXT NOT NULL,
        daily_budget TEXT NOT NULL, record_id TEXT NOT NULL, PRIMARY KEY (campaign_id, day))""",
)


@dataclass
class Stats:
    records: int = 0
    applied: int = 0
    ignored_older: int = 0
    alerts: list[str] = field(default_factory=list)


def _sql(value: Any) -> Any:
    """Decimals are stored as text, every digit kept."""
    return str(value) if isinstance(value, Decimal) else value


def sqlite_path(url: str) -> Path:
    """``sqlite:///relative/or/absolute.db`` -> path; anything else is a clear error."""
    if url.startswith("sqlite:///"):
        return Path(url.removeprefix("sqlite:///"))
    if url.startswith(("postgresql://", "postgres://")):
        raise UserInputError(
            f"{url.split('@')[-1]}: PostgreSQL is not wired in this build (the SQL is plain "
            "ANSI with ON CONFLICT upserts, so a psycopg connection is the only missing piece); "
            "use a sqlite:/// URL"
        )
    raise UserInputError(f"ADATTR_CONSUMER_DB={url!r}: expected sqlite:///path/to/file.db")


class BudgetStore:
    """The consumer's database: metrics, attributions, budgets, alerts and its Kafka offsets."""

    def __init__(self, url: str) -> None:
        path = sqlite_path(url)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None)  # transactions are explicit
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")  # a committed transaction survives a crash
        with self.transaction():
            for ddl in SCHEMA:
                self.db.execute(ddl)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def offsets(self, topic: str) -> dict[int, int]:
        rows = self.db.execute(
            "SELECT partition, next_offset FROM consumer_offsets WHERE topic = ?", (topic,)
        )
        return {int(p): int(o) for p, o in rows}

    def load_budgets(self, rows: list[tuple[str, Decimal]]) -> None:
        with self.transaction() as db:
            db.executemany(
                "INSERT INTO budgets (campaign_id, daily_budget) VALUES (?, ?) "
                "ON CONFLICT (campaign_id) DO UPDATE SET daily_budget = excluded.daily_budget",
                [(c, str(b)) for c, b in rows],
            )

    def apply(self, messages: Iterable[Any], stats: Stats, *, crash_at: str = "") -> None:
        """Applies a poll's messages and stores the offsets after them, in one transaction."""
        touched: set[tuple[str, str]] = set()
        with self.transaction() as db:
            for msg in messages:
                stats.records += 1
                doc = json.loads(msg.value(), parse_float=Decimal)  # money stays exact
                if self._upsert(db, doc):
                    stats.applied += 1
                    row = doc["row"]
                    if doc["table"] == METRICS and row.get("campaign_id"):
                        touched.add((row["campaign_id"], row["window_start"][:10]))
                else:
                    stats.ignored_older += 1
                db.execute(
                    "INSERT INTO consumer_offsets (topic, partition, next_offset) "
                    "VALUES (?, ?, ?) ON CONFLICT (topic, partition) "
                    "DO UPDATE SET next_offset = excluded.next_offset",
                    (msg.topic(), msg.partition(), msg.offset() + 1),
                )
                last_record = doc["record_id"]
            for campaign, day in sorted(touched):
                alert = self._check_budget(db, campaign, day, last_record)
                if alert:
                    stats.alerts.append(alert)
            crash_point(crash_at, "consume_before_db_commit")

    def _upsert(self, db: sqlite3.Connection, doc: dict[str, Any]) -> bool:
        table = doc["table"]
        name = {METRICS: "ad_metrics", ATTRIBUTIONS: "attributions"}.get(table)
        if name is None:
            log.warning("skipping a record of unknown table %r (%s)", table, doc.get("record_id"))
            return False
        keys, columns = PUBLISHED[table]
        row = doc["row"]
        names = (*keys, *columns, "generation", "batch_id", "record_id")
        values = [_sql(row.get(k)) for k in (*keys, *columns)]
        values += [doc["generation"], doc["batch_id"], doc["record_id"]]
        updates = ", ".join(f"{c} = excluded.{c}" for c in names if c not in keys)
        cursor = db.execute(
            f"INSERT INTO {name} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))}) "
            f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {updates} "
            # Only a newer (generation, batch) replaces what is stored.
            f"WHERE (excluded.generation, excluded.batch_id) "
            f"> ({name}.generation, {name}.batch_id)",
            values,
        )
        return cursor.rowcount > 0

    def _check_budget(
        self, db: sqlite3.Connection, campaign: str, day: str, record_id: str
    ) -> str | None:
        budget_row = db.execute(
            "SELECT daily_budget FROM budgets WHERE campaign_id = ?", (campaign,)
        ).fetchone()
        if budget_row is None:
            return None
        budget = Decimal(budget_row[0])
        spend = sum(
            (
                Decimal(s)
                for (s,) in db.execute(
                    "SELECT spend FROM ad_metrics "
                    "WHERE campaign_id = ? AND substr(window_start, 1, 10) = ?",
                    (campaign, day),
                )
            ),
            Decimal(0),
        )
        if spend < budget:
            return None
        inserted = db.execute(
            "INSERT INTO budget_alerts (campaign_id, day, spend, daily_budget, record_id) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (campaign_id, day) DO NOTHING",
            (campaign, day, str(spend), str(budget), record_id),
        ).rowcount
        if not inserted:
            return None
        return f"{campaign} {day}: spend {spend:.6f} reached the daily budget {budget:.2f}"

    def spend_per_campaign(self) -> list[tuple[str, Decimal, Decimal | None]]:
        totals: dict[str, Decimal] = {}
        for campaign, spend in self.db.execute("SELECT campaign_id, spend FROM ad_metrics"):
            totals[campaign] = totals.get(campaign, Decimal(0)) + Decimal(spend)
        budgets = {c: Decimal(b) for c, b in self.db.execute("SELECT * FROM budgets")}
        return [(c, totals[c], budgets.get(c)) for c in sorted(totals)]

    def alerts(self) -> list[tuple[str, str, Decimal, Decimal]]:
        rows = self.db.execute(
            "SELECT campaign_id, day, spend, daily_budget FROM budget_alerts ORDER BY 1, 2"
        )
        return [(c, d, Decimal(s), Decimal(b)) for c, d, s, b in rows]

    def metrics(self) -> dict[tuple[str, str], tuple[Any, ...]]:
        rows = self.db.execute(
            "SELECT window_start, ad_id, impressions, clicks, spend, conversions, revenue "
            "FROM ad_metrics"
        )
        return {(w, a): (i, c, Decimal(s), n, Decimal(r)) for w, a, i, c, s, n, r in rows}

    def close(self) -> None:
        self.db.close()


def read_budgets_csv(path: Path) -> list[tuple[str, Decimal]]:
    """``campaign_id,daily_budget`` with a header; every bad line is named."""
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames != ["campaign_id", "daily_budget"]:
                raise UserInputError(
                    f"{path}: header must be campaign_id,daily_budget (got {reader.fieldnames})"
                )
            rows, problems = [], []
            for line, rec in enumerate(reader, start=2):
                try:
                    budget = Decimal(rec["daily_budget"])
                    if not rec["campaign_id"] or budget < 0 or not budget.is_finite():
                        raise InvalidOperation
                    rows.append((rec["campaign_id"], budget))
                except (InvalidOperation, TypeError):
                    problems.append(f"line {line}: {rec}")
    except OSError as exc:
        raise UserInputError(f"cannot read budgets {path}: {exc}") from None
    if problems:
        raise UserInputError(
            f"{path}: bad rows (need a campaign and a budget >= 0): {problems[:5]}"
        )
    return rows


class BudgetMetrics:
    """What ``adattr consume`` exposes to Prometheus (``ADATTR_METRICS_PORT``)."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge

        from app.runtime.metrics import new_registry

        self.registry = r = new_registry()
        self.records = Counter(
            "adattr_budget_records",
            "Output records the budget service read, by result: applied, or ignored_older (a row "
            "newer by (generation, batch) is stored)",
            ["result"],
            registry=r,
        )
        self.alerts = Counter("adattr_budget_alerts", "Budget alerts raised", registry=r)
        self.lag = Gauge(
            "adattr_budget_offset_lag",
            "Records on the output topic past what the service has applied, per partition",
            ["topic", "partition"],
            registry=r,
        )
        self.last_applied = Gauge(
            "adattr_budget_last_applied_timestamp_seconds",
            "When the service last applied records (epoch seconds)",
            registry=r,
        )
        self._seen = Stats()

    def update(self, stats: Stats) -> None:
        applied = stats.applied - self._seen.applied
        self.records.labels("applied").inc(applied)
        self.records.labels("ignored_older").inc(stats.ignored_older - self._seen.ignored_older)
        self.alerts.inc(len(stats.alerts) - len(self._seen.alerts))
        if stats.records > self._seen.records:
            self.last_applied.set(time.time())
        self._seen = Stats(stats.records, stats.applied, stats.ignored_older, list(stats.alerts))


def consume(
    kafka: KafkaConnection,
    topic: str,
    store: BudgetStore,
    *,
    until_idle: bool,
    idle_seconds: float = 5.0,
    max_records: int | None = None,
    crash_at: str = "",
    metrics: BudgetMetrics | None = None,
) -> Stats:
    """Consumes ``topic`` from the offsets stored in ``store`` (the beginning if none)."""
    from confluent_kafka import (
        OFFSET_BEGINNING,
        Consumer,
        KafkaError,
        KafkaException,
        TopicPartition,
    )

    from app.runtime.kafka_io import BUDGET_GROUP, consumer_config

    consumer = Consumer(
        # read_committed, said explicitly: records of aborted transactions, and of transactions
        # still open, are never delivered; only what the job committed is billed on.
        consumer_config(kafka, BUDGET_GROUP, committed_only=True)
    )
    stats = Stats()
    try:
        meta = consumer.list_topics(topic, timeout=30).topics.get(topic)
        if meta is not None and meta.error is not None:
            if meta.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise KafkaException(meta.error)  # e.g. no ACL lets this user read it
        if meta is None or meta.error is not None:
            raise UserInputError(f"topic {topic} is missing")
        stored = store.offsets(topic)
        consumer.assign(
            [TopicPartition(topic, p, stored.get(p, OFFSET_BEGINNING)) for p in meta.partitions]
        )
        idle_since = time.monotonic()
        lag_measured = 0.0
        while max_records is None or stats.records < max_records:
            limit = 500 if max_records is None else min(500, max_records - stats.records)
            messages = consumer.consume(num_messages=limit, timeout=1.0)
            good = []
            for msg in messages:
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                good.append(msg)
            if good:
                alerts_before = len(stats.alerts)
                store.apply(good, stats, crash_at=crash_at)
                for alert in stats.alerts[alerts_before:]:
                    log.warning("budget alert: %s", alert)
                idle_since = time.monotonic()
            elif until_idle and time.monotonic() - idle_since >= idle_seconds:
                break
            if metrics is not None:
                metrics.update(stats)
                if time.monotonic() - lag_measured >= 1.0:
                    _measure_lag(consumer, topic, store.offsets(topic), meta.partitions, metrics)
                    lag_measured = time.monotonic()
    finally:
        consumer.close()
    return stats


def _measure_lag(
    consumer: Any,
    topic: str,
    stored: dict[int, int],
    partitions: Iterable[int],
    metrics: BudgetMetrics,
) -> None:
    """The high watermark minus the consumer's position: past the last record it applied (every
    record it was handed is applied before the next poll) and the transaction marker after it.
    Before its first record in a partition, the offset stored in the database (or the start)."""
    from confluent_kafka import TopicPartition

    positions = consumer.position([TopicPartition(topic, p) for p in partitions])
    for tp in positions:
        low, high = consumer.get_watermark_offsets(tp, timeout=5, cached=False)
        at = tp.offset if tp.offset >= 0 else stored.get(tp.partition, low)
        metrics.lag.labels(topic, str(tp.partition)).set(max(0, high - at))
