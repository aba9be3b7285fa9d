"""The sink's idempotent writes on real Delta tables: the insert, the ledger row, the closed
sessions and the changed rows a batch publishes."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from pipelines import tables as t
from pipelines.delta_writes import Tables, table_version
from pipelines.ledger import write_ledger
from pipelines.published_rows import changed_records
from pipelines.session_writes import close_sessions

T0 = datetime(2026, 11, 20, 10, 0)  # the session time zone is UTC
T0_MS = int((T0 - datetime(1970, 1, 1)).total_seconds() * 1000)


def warehouse(spark: SparkSession, tmp_path: Path, *names: str) -> str:
    t.create_tables(spark, str(tmp_path), names)
    return str(tmp_path)


def rows(spark: SparkSession, name: str, *values: dict[str, Any]) -> DataFrame:
    """Rows of the table's schema; columns not given are null."""
    schema = t.schema(name)
    return spark.createDataFrame([tuple(v.get(c) for c in schema.names) for v in values], schema)


def ledger_of(tables: Tables, batch_id: int, *, fresh: bool) -> None:
    write_ledger(
        tables,
        batch_id,
        dim_version=3,
        ranges={("ad-events", 0): [10, 19, 10], ("ad-events", 1): [2**40, 2**40 + 1, 2]},
        counts={"read": 12, "accepted": 12},
        transactional_id="tx-1",
        kafka_outcome="committed",
        millis={k: T0_MS for k in ("batch_timestamp", "watermark", "started_at", "finished_at")},
        fresh=fresh,
    )


def test_a_reexecuted_insert_is_skipped_by_delta_txn_ids_even_without_a_key(
    spark: SparkSession, tmp_path: Path
) -> None:
    wh = warehouse(spark, tmp_path, t.SESSIONS)
    tables = Tables(spark, wh, "app-a", 1)
    one = rows(spark, t.SESSIONS, {"user_id": "u1", "session_start": T0, "events": 1})
    for _ in range(2):  # a condition that never matches: only the txn ids stop the second
        tables.insert_new(t.SESSIONS, one, "false", 5, fresh=False)
    assert tables.load(t.SESSIONS).count() == 1
    assert (
        tables.versions
        == {t.SESSIONS: table_version(spark, tables.path(t.SESSIONS))}
        == {t.SESSIONS: 1}
    )
    # another generation's app id: Delta's txn ids do not stop it, the key does
    other = Tables(spark, wh, "app-b", 2)
    key = "t.user_id = s.user_id AND t.session_start = s.session_start"
    other.insert_new(t.SESSIONS, one, key, 5, fresh=False)
    assert other.load(t.SESSIONS).count() == 1
    # the at-least-once baseline appends whatever the table holds
    Tables(spark, wh, "app-c", 3, exactly_once=False).insert_new(
        t.SESSIONS, one, key, 5, fresh=False
    )
    assert tables.load(t.SESSIONS).count() == 2


def test_the_ledger_row_is_written_once_per_app_id_and_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    wh = warehouse(spark, tmp_path, t.LEDGER)
    tables = Tables(spark, wh, "app-a", 1)
    tables.versions = {t.SILVER: 4}
    ledger_of(tables, 0, fresh=True)
    ledger_of(tables, 0, fresh=False)  # the re-executed batch
    ledger_of(Tables(spark, wh, "app-b", 2), 0, fresh=False)  # a replay's batch 0
    got = tables.load(t.LEDGER).orderBy("app_id").collect()
    assert [(r.app_id, r.batch_id) for r in got] == [("app-a", 0), ("app-b", 0)]
    first = got[0].asDict()
    assert first == {
        "app_id": "app-a",
        "generation": 1,
        "batch_id": 0,
        "batch_timestamp": T0,
        "watermark": T0,
        "dim_version": 3,
        "offsets": first["offsets"],
        "counts": {"read": 12, "accepted": 12},
        "delta_versions": {t.SILVER: 4},
        "kafka_transactional_id": "tx-1",
        "kafka_outcome": "committed",
        "started_at": T0,
        "finished_at": T0,
    }
    assert [tuple(o) for o in first["offsets"]] == [
        ("ad-events", 0, 10, 19, 10),
        ("ad-events", 1, 2**40, 2**40 + 1, 2),
    ]


def test_a_session_is_closed_once_by_the_batch_whose_watermark_passes_its_end(
    spark: SparkSession, tmp_path: Path
) -> None:
    wh = warehouse(spark, tmp_path, t.SILVER, t.SESSIONS)
    tables = Tables(spark, wh, "app-a", 1)
    minute = timedelta(minutes=1)
    events = [
        ("e1", "impression", T0, "u1"),
        ("e2", "click", T0 + minute, "u1"),
        ("e3", "impression", T0 + 10 * minute, "u2"),  # still open at the watermark
    ]
    silver = rows(
        spark,
        t.SILVER,
        *[
            {"event_id": i, "event_type": k, "event_time": at, "user_id": u}
            for i, k, at, u in events
        ],
    )
    silver.write.format("delta").mode("append").save(tables.path(t.SILVER))
    gap_ms = 5 * 60_000
    w_cur = T0_MS + 8 * 60_000  # u1's session ends at T0 + 6 min; u2's at T0 + 15 min
    for fresh in (True, False):  # the batch, then its re-execution
        counts: dict[str, int] = {}
        close_sessions(
            tables,
            spark.newSession(),
            7,
            w_prev=T0_MS,
            w_cur=w_cur,
            gap_seconds=gap_ms // 1000,
            counts=counts,
            fresh=fresh,
        )
        assert counts == {"sessions_closed": 1}
    got = tables.load(t.SESSIONS).collect()
    assert [(r.user_id, r.session_start, r.session_end, r.events, r.clicks) for r in got] == [
        ("u1", T0, T0 + 6 * minute, 2, 1)
    ]
    assert (got[0].generation, got[0].batch_id) == (1, 7)


def test_changed_records_are_the_batchs_stamped_rows_with_deterministic_ids(
    spark: SparkSession, tmp_path: Path
) -> None:
    wh = warehouse(spark, tmp_path, t.ATTRIBUTIONS, t.GOLD_1M)
    tables = Tables(spark, wh, "app-a", 1)
    row = {
        "conversion_time": T0,
        "user_id": "u1",
        "advertiser_id": "adv-1",
        "revenue": Decimal("10.500000"),
        "status": "unattributed",
        "is_final": False,
        "generation": 1,
    }
    rows(
        spark,
        t.ATTRIBUTIONS,
        {**row, "conversion_id": "c1", "batch_id": 4},
        {**row, "conversion_id": "c2", "batch_id": 3},  # another batch's row
        {**row, "conversion_id": "c3", "batch_id": 4, "generation": 0},  # another generation's
    ).write.format("delta").mode("append").save(tables.path(t.ATTRIBUTIONS))
    got = changed_records(tables, 4).collect()
    assert [r.k for r in got] == ["gold_attributions|c1"]
    value = json.loads(got[0].v)
    digest = hashlib.sha256(b"gold_attributions|c1|app-a|4").hexdigest()
    assert (value["record_id"], value["app_id"], value["batch_id"]) == (digest, "app-a", 4)
    assert value["row"]["click_id"] is None  # present, as null
    assert value["row"]["conversion_time"] == "2026-11-20T10:00:00.000Z"
    assert value["row"]["revenue"] == 10.5
