"""The sink's idempotent writes on real Delta tables: the insert, the ledger row, the closed
sessions and the changed rows a batch publishes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines import tables as t
from pipelines.carried_state import CarriedState
from pipelines.click_state import SCHEMA, CarriedClicks, ClickState
from pipelines.delta_writes import (
    COMMIT_NOTE,
    JOB_DESCRIPTION,
    Tables,
    described,
    run_concurrently,
    table_version,
)
from pipelines.gold import merged
from pipelines.gold_writes import GoldUpdate
from pipelines.hourly_pass import HourlyPass
from pipelines.ledger import write_ledger
from pipelines.offset_log import BatchMeta
from pipelines.pending_rows import PendingRows
from pipelines.published_rows import changed_records
from pipelines.session_writes import SessionCloser, open_session_state
from pipelines.timing import StepTimer
from pipelines.transforms import ACCEPTED

T0 = datetime(2026, 11, 20, 10, 0)  # the session time zone is UTC
T0_MS = int((T0 - datetime(1970, 1, 1)).total_seconds() * 1000)


def warehouse(spark: SparkSession, tmp_path: Path, *names: str) -> str:
    t.create_tables(spark, str(tmp_path), names)
    return str(tmp_path)


def rows(spark: SparkSession, name: str, *values: dict[str, Any]) -> DataFrame:
    """Rows of the table's schema; columns not given are null."""
    schema = t.schema(name)
    return spark.createDataFrame([tuple(v.get(c) for c in schema.names) for v in values], schema)


def conversion(i: str, m: float) -> dict[str, Any]:
    """A conversion of user u1 (advertiser x) ``m`` minutes after T0, as a silver row."""
    return {
        "event_id": i,
        "event_type": "conversion",
        "event_time": T0 + m * MINUTE,
        "user_id": "u1",
        "advertiser_id": "x",
        "revenue": Decimal("5.000000"),
    }


def attribution_source(
    update: GoldUpdate, rows: DataFrame | None, span: tuple[int, int] | None, column: str
) -> dict[str, Any]:
    """Conversion id -> ``column`` of the rows of the batch's attributions MERGE source, the
    same whether a MERGE runs them (a pass with nothing kept) or the batch keeps them (its rows
    read back from their JSON as kept, typed as the table's; the same re-attributed span and
    windows left)."""
    columns = t.columns(t.ATTRIBUTIONS)
    merge, _, span_run, left_run = update._attribution_source(rows, span, keep=False)
    assert merge is not None
    run = {r.conversion_id: r for r in merge.source.select(*columns).collect()}
    merge.source.unpersist()
    none, kept, span_kept, left_kept = update._attribution_source(rows, span, keep=True)
    assert none is None and span_kept == span_run and left_kept == left_run
    held = PendingRows(t.ATTRIBUTIONS)
    held.add([(r.conversion_id, r._at, r._json) for r in kept])
    assert len(kept) == len(run)
    assert {r.conversion_id: r for r in held.frame(update.spark).select(*columns).collect()} == run
    return {key: r[column] for key, r in run.items()}


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


MINUTE = timedelta(minutes=1)
GAP_S = 5 * 60


def silver_events(spark: SparkSession, *events: tuple[str, str, datetime, str]) -> DataFrame:
    return rows(
        spark,
        t.SILVER,
        *[
            {"event_id": i, "event_type": k, "event_time": at, "user_id": u}
            for i, k, at, u in events
        ],
    )


def session_closer(spark: SparkSession, tmp_path: Path) -> SessionCloser:
    wh = warehouse(spark, tmp_path / "wh", t.SILVER, t.SESSIONS)
    side = spark.newSession()
    return SessionCloser(
        Tables(spark, wh, "app-a", 1), side, open_session_state(side, tmp_path / "cp"), GAP_S
    )


def closed_sessions(closer: SessionCloser) -> list[tuple[Any, ...]]:
    got = closer.tables.load(t.SESSIONS).orderBy("user_id", "session_start").collect()
    return [(r.user_id, r.session_start, r.session_end, r.events, r.batch_id) for r in got]


def test_a_session_is_closed_once_by_the_batch_whose_watermark_passes_its_end(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Recomputed from silver (the open sessions not carried over): once, on any execution."""
    closer = session_closer(spark, tmp_path)
    silver_events(
        spark,
        ("e1", "impression", T0, "u1"),
        ("e2", "click", T0 + MINUTE, "u1"),
        ("e3", "impression", T0 + 10 * MINUTE, "u2"),  # still open at the watermark
    ).write.format("delta").mode("append").save(closer.tables.path(t.SILVER))
    w_cur = T0_MS + 8 * 60_000  # u1's session ends at T0 + 6 min; u2's at T0 + 15 min
    for fresh in (True, False):  # the batch, then its re-execution
        counts: dict[str, int] = {}
        closer(
            7,
            meta=BatchMeta(w_cur, T0_MS),
            previous=BatchMeta(T0_MS, T0_MS),
            events=None,
            carried=False,
            counts=counts,
            fresh=fresh,
        )
        assert counts == {"sessions_closed": 1}
    assert closed_sessions(closer) == [("u1", T0, T0 + 6 * MINUTE, 2, 7)]
    assert not (tmp_path / "cp").exists()  # nothing carried


def test_open_sessions_are_carried_from_batch_to_batch_and_rebuilt_when_unusable(
    spark: SparkSession, tmp_path: Path
) -> None:
    closer = session_closer(spark, tmp_path)
    store = closer.store
    events = {
        0: silver_events(
            spark,
            ("e1", "impression", T0, "u1"),
            ("e2", "impression", T0 + 10 * MINUTE, "u2"),
        ),
        1: silver_events(spark, ("e3", "click", T0 + MINUTE, "u1")),
        4: silver_events(spark, ("e4", "impression", T0 + 20 * MINUTE, "u3")),
    }
    watermarks = [0, 0, 8, 16, 16, 30]  # minutes after T0 (batch 0: none yet)
    metas = [BatchMeta(T0_MS + m * 60_000 if i else 0, T0_MS + i) for i, m in enumerate(watermarks)]

    def batch(batch_id: int, *, fresh: bool = True) -> dict[str, int]:
        rows = events.get(batch_id)
        if rows is not None and fresh:  # what the sink's silver write did before
            rows.write.format("delta").mode("append").save(closer.tables.path(t.SILVER))
        counts: dict[str, int] = {}
        closer(
            batch_id,
            meta=metas[batch_id],
            previous=metas[batch_id - 1] if batch_id else None,
            events=rows,
            carried=True,
            counts=counts,
            fresh=fresh,
        )
        return counts

    assert batch(0) == {}  # the watermark did not move
    assert batch(1) == {"sessions_closed": 0}
    assert batch(1, fresh=False) == {"sessions_closed": 0}  # a re-execution folds e3 once
    assert batch(2) == {"sessions_closed": 1}
    assert batch(2, fresh=False) == {"sessions_closed": 1}  # a re-execution
    assert sorted(p.name for p in store.root.glob("*.json")) == ["1.json", "2.json"]
    assert len(list(store.root.glob("data-*"))) == 1  # batch 2 added no event: 1's data
    # Batch 3 carries batch 2's sessions (the same data), less those batch 2 closed.
    assert batch(3) == {"sessions_closed": 1}
    # Markers not used: of another history (the offset log says batch 3 ran otherwise), of
    # another session gap, not whole, or whose data is not whole (then batch 4 rebuilds the open
    # sessions from silver, which already holds its event: it is not folded in twice).
    assert store.marker(3, BatchMeta(metas[3].watermark_ms, 99), GAP_S) is None
    assert store.marker(3, metas[3], GAP_S + 1) is None
    kept = store.marker(3, metas[3], GAP_S)
    assert kept is not None and kept.data is not None
    (store.root / kept.data / "_SUCCESS").unlink()
    assert store.marker(3, metas[3], GAP_S) is None
    assert batch(4) == {}
    assert batch(5) == {"sessions_closed": 1}
    assert closed_sessions(closer) == [
        ("u1", T0, T0 + 6 * MINUTE, 2, 2),
        ("u2", T0 + 10 * MINUTE, T0 + 15 * MINUTE, 1, 3),
        ("u3", T0 + 20 * MINUTE, T0 + 25 * MINUTE, 1, 5),
    ]
    (store.root / "5.json").write_text('{"batch_id": 5, "watermark')  # a write the disk lost
    assert store.marker(5, metas[5], GAP_S) is None


def test_latest_clicks_are_folded_batch_by_batch_and_rebuilt_from_silver_when_unusable(
    spark: SparkSession, tmp_path: Path
) -> None:
    """After every batch, the carried data is the latest click per user and advertiser at or
    before its watermark and within the lookback of it, as silver says; a re-executed batch
    folds its slice once; a marker of another history, of another lookback, or whose data is
    lost is refused and the data rebuilt from silver."""
    lookback_s = 20 * 60
    wh = warehouse(spark, tmp_path / "wh", t.SILVER)
    tables = Tables(spark, wh, "app-a", 1)
    state = ClickState(tables, spark.newSession(), tmp_path / "cp", lookback_s)
    store = state.store

    def clicks(*events: tuple[str, float, str, str]) -> DataFrame:
        return rows(
            spark,
            t.SILVER,
            *[
                {
                    "event_id": i,
                    "event_type": "click",
                    "event_time": T0 + m * MINUTE,
                    "user_id": u,
                    "advertiser_id": a,
                    "ad_id": f"ad-{i}",
                    "campaign_id": "cmp-1",
                }
                for i, m, u, a in events
            ],
        )

    # Each batch's clicks are later than its watermark, as the sink accepts them.
    accepted = {
        0: clicks(("a", 5, "u1", "x"), ("b", 8, "u1", "x"), ("c", 9, "u2", "x")),
        1: clicks(
            ("d", 12, "u1", "x"),
            ("e", 20, "u2", "y"),
            ("f", 11, "u1", "x"),
            ("j", 25, "u4", "x"),  # exactly at batch 4's watermark
        ),
        4: clicks(("g", 30, "u3", "x"), ("h", 26, "u2", "x")),
        5: clicks(("i", 55, "u1", "x")),
    }
    # Minutes after T0 (batch 0: none yet). Batch 3 moves it 4 minutes: less than a fold's.
    watermarks = [0, 10, 10, 14, 25, 50, 60]
    metas = [BatchMeta(T0_MS + m * 60_000 if i else 0, T0_MS + i) for i, m in enumerate(watermarks)]

    def batch(batch_id: int, *, fresh: bool = True) -> tuple[int, list[str]]:
        """Runs the batch (its clicks into silver first, as the sink does); the minute the data
        is as of, and the ids it holds."""
        if batch_id in accepted and fresh:
            accepted[batch_id].write.format("delta").mode("append").save(tables.path(t.SILVER))
        meta = metas[batch_id]
        state.fold(
            batch_id,
            meta=meta,
            start=state.start(batch_id, metas[batch_id - 1] if batch_id else None),
        )
        carried = state.carried(state.start(batch_id + 1, meta))  # what the next batch has
        assert carried is not None
        got = sorted(r.event_id for r in carried.rows.collect()) if carried.rows else []
        # What silver says: the latest click per user and advertiser in [A - lookback, A].
        as_of = F.timestamp_millis(F.lit(carried.cutoff_ms))
        window = tables.load(t.SILVER).where(
            (F.col("event_time") <= as_of)
            & (F.col("event_time") >= as_of - F.expr("INTERVAL 20 MINUTES"))
        )
        want = sorted(
            r.c.event_id
            for r in window.groupBy("user_id", "advertiser_id")
            .agg(F.max(F.struct("event_time", "event_id")).alias("c"))
            .collect()
        )
        assert got == want
        return (carried.cutoff_ms - T0_MS) // 60_000 if batch_id else 0, got

    assert batch(0) == (0, [])  # nothing at or before the first batch's watermark
    assert batch(1) == (10, ["b", "c"])
    assert batch(1, fresh=False) == (10, ["b", "c"])  # a re-execution
    assert batch(2) == (10, ["b", "c"])  # the watermark did not move: the same data
    assert batch(3) == (10, ["b", "c"])  # 4 minutes on: carried, not folded
    assert len(list(store.root.glob("data-*"))) == 1
    assert batch(4) == (25, ["c", "d", "e", "j"])  # a, b: superseded; f: earlier than d
    assert sorted(p.name for p in store.root.glob("*.json")) == ["3.json", "4.json"]
    assert state.carried(state.start(5, metas[4])) is not None
    assert store.marker(4, BatchMeta(metas[4].watermark_ms, 99), lookback_s) is None
    assert store.marker(4, metas[4], lookback_s + 1) is None
    # Data written with other columns (an older or newer SCHEMA) is never read as this.
    other = CarriedState(spark, store.root.parent, store.name, SCHEMA + ", extra string")
    assert other.marker(4, metas[4], lookback_s) is None
    kept = store.marker(4, metas[4], lookback_s)
    assert kept is not None and kept.data is not None
    (store.root / kept.data / "_SUCCESS").unlink()
    assert state.start(5, metas[4]) is None  # the batch reads silver's lookback instead
    assert state.carried(None) is None
    # Rebuilt from silver: what is in [30, 50] (not c, d, e, h at 26 or j at 25).
    assert batch(5) == (50, ["g"])
    assert batch(6) == (60, ["i"])


def test_a_batch_attributes_with_carried_clicks_as_with_silvers_whole_lookback(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The attributions MERGE's source of a batch given the latest clicks as of A (folded two
    batches before, carried on by the batch before) is the one it gets reading silver's whole
    lookback: with a click exactly at A (tied with another: the larger id wins), one after A
    and at or before the previous watermark, one after that, one out of the lookback, a
    conversion exactly a lookback after its click. Given clicks as of a time not before every
    conversion, it reads the lookback instead."""
    lookback_s = 20 * 60
    wh = warehouse(spark, tmp_path / "wh", t.SILVER, t.ATTRIBUTIONS)
    tables = Tables(spark, wh, "app-a", 1)
    state = ClickState(tables, spark.newSession(), tmp_path / "cp", lookback_s)

    def event(i: str, kind: str, m: float, user: str, adv: str) -> dict[str, Any]:
        return {
            "event_id": i,
            "event_type": kind,
            "event_time": T0 + m * MINUTE,
            "user_id": user,
            "advertiser_id": adv,
            "ad_id": f"ad-{i}" if kind == "click" else None,
            "campaign_id": "cmp-1" if kind == "click" else None,
            "revenue": Decimal("5.000000") if kind == "conversion" else None,
        }

    silver = [
        event("k1", "click", 3, "u1", "x"),
        event("k2", "click", 9, "u1", "x"),
        event("k3", "click", 12, "u1", "x"),  # after A (10), at or before W_2 (14)
        event("t1", "click", 10, "u2", "x"),  # exactly at A, tied
        event("t2", "click", 10, "u2", "x"),
        event("old", "click", 2, "u3", "x"),  # out of every conversion's lookback
        event("m", "click", 16, "u4", "y"),  # after W_2
    ]
    rows(spark, t.SILVER, *silver).write.format("delta").mode("append").save(tables.path(t.SILVER))
    metas = [
        BatchMeta(T0_MS + m * 60_000 if i else 0, T0_MS + i) for i, m in enumerate([0, 10, 14])
    ]
    for b in range(3):  # batch 1 folds as of 10; batch 2 (4 minutes on) carries that on
        state.fold(b, meta=metas[b], start=state.start(b, metas[b - 1] if b else None))
    carried = state.carried(state.start(3, metas[2]))
    assert carried is not None and carried.cutoff_ms == metas[1].watermark_ms
    conversions = [
        event("c1", "conversion", 21, "u1", "x"),
        event("c2", "conversion", 22, "u2", "x"),
        event("c3", "conversion", 25, "u3", "x"),
        event("c4", "conversion", 24, "u4", "y"),
        event("c5", "conversion", 30, "u2", "x"),  # t2 exactly a lookback before it
        event("c6", "conversion", 30.5, "u2", "x"),
    ]
    batch_rows = rows(spark, t.SILVER, *conversions).withColumn("outcome", F.lit(ACCEPTED))
    w_prev, w_cur = metas[2].watermark_ms, T0_MS + 20 * 60_000
    span = (T0_MS + 21 * 60_000, T0_MS + 30 * 60_000 + 30_000)  # the accepted events'

    def attributed(clicks: CarriedClicks | None) -> dict[str, str | None]:
        update = GoldUpdate(
            tables,
            StepTimer(),
            3,
            w_prev=w_prev,
            watermark_ms=w_cur,
            counts={},
            lookback_seconds=lookback_s,
            carried_clicks=clicks,
        )
        return attribution_source(update, batch_rows, span, "click_id")

    want = {"c1": "k3", "c2": "t2", "c3": None, "c4": "m", "c5": "t2", "c6": None}
    assert attributed(None) == want  # silver's whole lookback
    assert attributed(carried) == want
    # Clicks "as of" 25 minutes, not before every conversion: the lookback is read instead (used,
    # they would hide every click at or before 25 but m).
    assert attributed(CarriedClicks(None, T0_MS + 25 * 60_000)) == want


def test_a_runs_first_pass_writes_final_what_a_batch_before_it_may_have_published_final(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A replay's first pass (its watermark from zero) re-attributes the conversions the table
    may lack: kept by batches between passes of a run that died. One at or before the latest
    watermark a batch of any generation ran under (``settled_ms``) that batch may have
    published final, and is written final; one after it is not (no batch before it: neither)."""
    wh = warehouse(spark, tmp_path / "wh", t.SILVER, t.ATTRIBUTIONS)
    tables = Tables(spark, wh, "app-r", 2)
    silver = [conversion(i, m) for i, m in (("c1", 3), ("c2", 8))]
    rows(spark, t.SILVER, *silver).write.format("delta").mode("append").save(tables.path(t.SILVER))

    def final(plan: HourlyPass) -> dict[str, bool]:
        update = GoldUpdate(
            tables,
            StepTimer(),
            0,
            w_prev=0,
            watermark_ms=0,
            counts={},
            lookback_seconds=600,
            hourly=plan,
        )
        return attribution_source(update, None, None, "is_final")

    behind = (T0_MS + 3 * 60_000, T0_MS + 8 * 60_000)
    settled = T0_MS + 5 * 60_000
    assert final(HourlyPass(0, None, behind, settled)) == {"c1": True, "c2": False}
    assert final(HourlyPass(0, None, behind)) == {"c1": False, "c2": False}


def merge_removed(path: str) -> set[str]:
    """The file names the table's latest MERGE commit removed (read from its Delta log)."""
    for commit in sorted(Path(path, "_delta_log").glob("*.json"), reverse=True):
        actions = [json.loads(line) for line in commit.read_text().splitlines()]
        info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
        if info["operation"] == "MERGE":
            return {Path(a["remove"]["path"]).name for a in actions if "remove" in a}
    raise AssertionError(f"no MERGE in {path}")


def test_a_batchs_attributions_merge_never_rewrites_the_files_of_earlier_final_rows(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Three batches of conversions, each watermark passing some: the third batch's MERGE
    finalises the second's pending conversions and adds its own, and removes none of the files
    holding the rows earlier batches finalised (the table's layout keeps those apart: a MERGE
    whose file held every row of the run rewrote them all, every batch). Every row is as the
    batch that last changed it left it. A fourth batch, a replay's (its watermark from zero),
    brings a final conversion again, which the MERGE leaves as it is.

    The table as each MERGE leaves it, computed beside the MERGE from its source
    (``pipelines.gold.merged``, what the 1-minute windows are recomputed from while it runs), is
    the table after it, whether read before its commit or after."""
    wh = warehouse(spark, tmp_path / "wh", t.SILVER, t.ATTRIBUTIONS)
    tables = Tables(spark, wh, "app-a", 1)
    path = tables.path(t.ATTRIBUTIONS)

    def batch(b: int, w_prev_m: int, w_cur_m: int, *new: tuple[str, float]) -> None:
        batch_rows = rows(spark, t.SILVER, *(conversion(i, m) for i, m in new)).withColumn(
            "outcome", F.lit(ACCEPTED)
        )
        times = [T0_MS + int(m * 60_000) for _, m in new]
        update = GoldUpdate(
            tables,
            StepTimer(),
            b,
            w_prev=T0_MS + w_prev_m * 60_000 if w_prev_m else 0,
            watermark_ms=T0_MS + w_cur_m * 60_000,
            counts={},
            lookback_seconds=20 * 60,
        )
        merge, _, _ = update._attributions(batch_rows, (min(times), max(times)), keep=False)
        assert merge is not None

        def as_merged() -> list[Any]:
            table = tables.load(t.ATTRIBUTIONS)
            return sorted(merged(table, merge.source, keys=merge.keys).collect())

        before = as_merged()
        try:
            update._merge(merge)
            after = as_merged()
        finally:
            merge.source.unpersist()
        assert before == sorted(tables.load(t.ATTRIBUTIONS).collect()) == after, b

    def final_files() -> set[str]:
        held = tables.load(t.ATTRIBUTIONS).where("is_final").select("_metadata.file_name")
        return {r.file_name for r in held.distinct().collect()}

    batch(0, 0, 5, ("c1", 6), ("c2", 8), ("c3", 12))
    batch(1, 5, 7, ("c4", 9))  # c1 final
    earlier_final = final_files()
    assert earlier_final
    batch(2, 7, 10, ("c5", 13))  # c2, c4 final
    assert not merge_removed(path) & earlier_final
    got = {
        r.conversion_id: (r.is_final, r.batch_id)
        for r in tables.load(t.ATTRIBUTIONS)
        .select("conversion_id", "is_final", "batch_id")
        .collect()
    }
    assert got == {
        "c1": (True, 1),
        "c2": (True, 2),
        "c3": (False, 0),
        "c4": (True, 2),
        "c5": (False, 2),
    }
    batch(3, 0, 12, ("c1", 6), ("c6", 14))  # a replay's batch: c1 final already, c3 due
    finals = tables.load(t.ATTRIBUTIONS).where("is_final").select("conversion_id", "batch_id")
    assert sorted(finals.collect()) == [("c1", 1), ("c2", 2), ("c3", 3), ("c4", 2)]


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


def test_a_batch_of_none_finalises_the_rows_its_watermark_passed_once_and_commits_nothing_else(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The finalising UPDATE carries no Delta txn ids: it selects the rows it changes by their
    not being final, so a re-executed batch changes nothing and commits nothing, and neither
    does a batch with no row due."""
    wh = warehouse(spark, tmp_path, t.GOLD_1M)
    tables = Tables(spark, wh, "app-a", 2)
    minute = timedelta(minutes=1)
    zero = {"impressions": 1, "clicks": 0, "spend": Decimal(1), "conversions": 0}
    rows(
        spark,
        t.GOLD_1M,
        *[
            {
                **zero,
                "window_start": T0 + i * minute,
                "window_end": T0 + (i + 1) * minute,
                "ad_id": ad,
                "revenue": Decimal(0),
                "is_final": final,
                "generation": 1,
                "batch_id": 0,
            }
            # windows ending at minutes 1..4; the one ending at 1 is final already; the one of
            # ad "c" ending at 1 is not, and is not due either (the previous batch's watermark
            # had reached its end: not this batch's to finalise); the one of ad "d" ending at 2
            # is due but final already (an earlier generation's: a replay's watermark restarts)
            for i, ad, final in [
                (0, "a", True),
                (0, "c", False),
                (1, "a", False),
                (1, "d", True),
                (2, "b", False),
                (3, "a", False),
            ]
        ],
    ).write.format("delta").mode("append").save(tables.path(t.GOLD_1M))
    before = table_version(spark, tables.path(t.GOLD_1M))

    def update(
        batch_id: int, w_prev: datetime, watermark: datetime, counts: dict[str, int]
    ) -> GoldUpdate:
        return GoldUpdate(
            tables,
            StepTimer(),
            batch_id,
            w_prev=int((w_prev - datetime(1970, 1, 1)).total_seconds() * 1000),
            watermark_ms=int((watermark - datetime(1970, 1, 1)).total_seconds() * 1000),
            counts=counts,
            lookback_seconds=600,
        )

    def batch(batch_id: int, w_prev: datetime, watermark: datetime) -> dict[str, int]:
        tables.versions.clear()
        counts: dict[str, int] = {}
        update(batch_id, w_prev, watermark, counts)._finalise(t.GOLD_1M, "window_end")
        return counts

    def table() -> list[tuple[int, bool, int, int]]:
        return sorted(
            (int(r.window_end.minute), r.is_final, r.generation, r.batch_id)
            for r in tables.load(t.GOLD_1M).collect()
        )

    # The watermark moved from minute 1 to minute 3: the windows ending at 2 and 3 are due.
    assert batch(7, T0 + minute, T0 + 3 * minute) == {f"{t.GOLD_1M}_rows": 2}
    assert len(changed_records(tables, 7, (t.GOLD_1M,)).collect()) == 2
    assert tables.versions == {t.GOLD_1M: before + 1}
    after = [
        (1, False, 1, 0),
        (1, True, 1, 0),
        (2, True, 1, 0),
        (2, True, 2, 7),
        (3, True, 2, 7),
        (4, False, 1, 0),
    ]
    assert table() == after
    # Its commit says which batch made it (the note, as there is no txn), and the note stays
    # off the session's later writes.
    history = spark.sql(f"DESCRIBE HISTORY delta.`{tables.path(t.GOLD_1M)}` LIMIT 1").first()
    assert history is not None and history.operation == "UPDATE"
    assert json.loads(history.userMetadata) == {"app_id": "app-a", "batch_id": 7}
    assert spark.conf.get(COMMIT_NOTE, None) is None
    # The same batch re-executed: they are final now, so nothing changes and nothing commits.
    assert batch(7, T0 + minute, T0 + 3 * minute) == {}
    assert tables.versions == {} and table_version(spark, tables.path(t.GOLD_1M)) == before + 1
    assert table() == after
    # A batch whose watermark passed no row's end: no commit either.
    assert batch(8, T0 + 3 * minute, T0 + 3 * minute + timedelta(seconds=30)) == {}
    assert table_version(spark, tables.path(t.GOLD_1M)) == before + 1


def test_a_batch_of_none_finalises_the_three_gold_tables_at_once_each_commit_noted(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The three UPDATEs run at once, each in its own session: each commit notes the batch and
    carries no txn, and no session keeps the note."""
    names = (t.ATTRIBUTIONS, t.GOLD_1M, t.CTR_1H)
    wh = warehouse(spark, tmp_path, *names)
    tables = Tables(spark, wh, "app-b", 3)
    minute, hour = timedelta(minutes=1), timedelta(hours=1)
    stamp = {"generation": 1, "batch_id": 0}
    conversion = {"user_id": "u", "advertiser_id": "v", "revenue": Decimal(1), **stamp}
    window = {"impressions": 1, "clicks": 0, **stamp}
    one_minute = {**window, "ad_id": "a", "spend": Decimal(1), "conversions": 0}
    sources = {
        t.ATTRIBUTIONS: [
            {**conversion, "conversion_id": "due", "conversion_time": T0 + 2 * minute},
            {**conversion, "conversion_id": "later", "conversion_time": T0 + 9 * minute},
        ],
        t.GOLD_1M: [
            {**one_minute, "window_start": T0 + i * minute, "window_end": T0 + (i + 1) * minute}
            for i in (1, 8)
        ],
        t.CTR_1H: [
            {**window, "campaign_id": "c", "window_start": T0 + s - hour, "window_end": T0 + s}
            for s in (2 * minute, 10 * minute)
        ],
    }
    for name, values in sources.items():
        rows(
            spark,
            name,
            *[{**v, "is_final": False, "revenue": v.get("revenue", Decimal(0))} for v in values],
        ).write.format("delta").mode("append").save(tables.path(name))
    sessions = (spark.newSession(), spark.newSession())
    counts: dict[str, int] = {}
    GoldUpdate(
        tables,
        StepTimer(),
        5,
        w_prev=T0_MS,
        watermark_ms=T0_MS + 5 * 60_000,
        counts=counts,
        lookback_seconds=600,
        sessions=sessions,
        hourly=HourlyPass(T0_MS),  # the batch passes over the sliding hours
    ).run(None, None)
    assert counts == {f"{n}_rows": 1 for n in names}
    assert set(tables.versions) == set(names)
    for name in names:
        commit = Path(tables.path(name)) / "_delta_log" / f"{tables.versions[name]:020d}.json"
        actions = [json.loads(line) for line in commit.read_text().splitlines()]
        info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
        assert info["operation"] == "UPDATE", name
        assert json.loads(info["userMetadata"]) == {"app_id": "app-b", "batch_id": 5}, name
        assert not any("txn" in a for a in actions), name
        final = {r.is_final: (r.generation, r.batch_id) for r in tables.load(name).collect()}
        assert final == {True: (3, 5), False: (1, 0)}, name
    assert all(s.conf.get(COMMIT_NOTE, None) is None for s in (spark, *sessions))


def test_a_write_describes_its_spark_jobs_and_gives_the_thread_its_description_back(
    spark: SparkSession,
) -> None:
    sc = spark.sparkContext
    seen: dict[str, str | None] = {}

    def write(name: str) -> Callable[[], None]:
        def run() -> None:
            seen[name] = sc.getLocalProperty(JOB_DESCRIPTION)
            if name == "failing":
                raise RuntimeError("the write failed")

        return run

    sc.setJobDescription("the stream's batch")
    try:
        # one by one on the batch thread, then at once in threads of their own, as the sink does
        described(spark, "silver_ad_events", write("silver_ad_events"))()
        assert sc.getLocalProperty(JOB_DESCRIPTION) == "the stream's batch"
        run_concurrently(
            [described(spark, name, write(name)) for name in ("bronze", "late")], together=True
        )
        failing = described(spark, "failing", write("failing"))
        with pytest.raises(RuntimeError):
            failing()
        assert sc.getLocalProperty(JOB_DESCRIPTION) == "the stream's batch"
    finally:
        sc.setLocalProperty(JOB_DESCRIPTION, None)  # type: ignore[arg-type]
    assert seen == {
        "silver_ad_events": "adattr silver_ad_events",
        "bronze": "adattr bronze",
        "late": "adattr late",
        "failing": "adattr failing",
    }
