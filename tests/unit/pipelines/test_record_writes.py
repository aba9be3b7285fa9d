"""Which record tables a classified batch writes, keyed how, and when it may append."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from pipelines import tables as t
from pipelines.delta_writes import Tables
from pipelines.high_water import NEVER, HighWater, read_high_water
from pipelines.ledger import write_ledger
from pipelines.record_writes import (
    PriorDecisions,
    accepted_span,
    batch_stats,
    coordinates_condition,
    ranges_and_counts,
    record_writes,
)
from pipelines.transforms import (
    ACCEPTED,
    DUPLICATE,
    LATE,
    classify,
    enrich,
    lateness,
    parse_events,
)
from schemas.ad_event import MALFORMED_JSON, UNKNOWN_AD
from tests.builders import event, kafka_rows

TOPIC = "ad-events"


def stat(
    outcome: str, partition: int, lo: int, hi: int, n: int, t_lo: int = 0, t_hi: int = 0
) -> Row:
    return Row(
        outcome=outcome,
        kafka_topic=TOPIC,
        kafka_partition=partition,
        n=n,
        lo=lo,
        hi=hi,
        t_lo=t_lo,
        t_hi=t_hi,
    )


STATS = [
    stat(ACCEPTED, 0, 10, 19, 8, t_lo=5_000, t_hi=9_000),
    stat(DUPLICATE, 0, 12, 12, 1),
    stat(MALFORMED_JSON, 0, 15, 15, 1),
    stat(ACCEPTED, 1, 40, 44, 5, t_lo=3_000, t_hi=7_000),
]


def test_ranges_and_counts_add_up_per_partition_and_outcome() -> None:
    ranges, counts = ranges_and_counts(STATS)
    assert ranges == {(TOPIC, 0): [10, 19, 10], (TOPIC, 1): [40, 44, 5]}
    assert counts == {ACCEPTED: 13, DUPLICATE: 1, MALFORMED_JSON: 1, "read": 15}
    assert accepted_span(STATS) == (3_000, 9_000)
    assert accepted_span([stat(MALFORMED_JSON, 0, 1, 1, 1)]) is None


def test_batch_stats_are_per_outcome_and_partition(spark: SparkSession) -> None:
    """What the sink collects from a classified batch, in the shape the functions above read;
    a quarantined record's null event time leaves its group's span null, not the batch's."""

    def at(ms: int) -> datetime:
        return datetime.fromtimestamp(ms / 1000, UTC)

    rows = spark.createDataFrame(
        [
            (ACCEPTED, TOPIC, 0, 10, at(5_000), at(50_000)),
            (ACCEPTED, TOPIC, 0, 19, at(9_000), at(40_000)),
            (DUPLICATE, TOPIC, 0, 12, at(7_000), at(45_000)),
            (MALFORMED_JSON, TOPIC, 0, 15, None, at(46_000)),
            (ACCEPTED, TOPIC, 1, 44, at(3_000), at(60_000)),
        ],
        "outcome string, kafka_topic string, kafka_partition int, kafka_offset long, "
        "event_time timestamp, kafka_timestamp timestamp",
    )
    stats = sorted(batch_stats(rows), key=lambda s: (s.kafka_partition, s.outcome))
    assert list(stats[0].asDict()) == [
        "outcome",
        "kafka_topic",
        "kafka_partition",
        "n",
        "lo",
        "hi",
        "t_lo",
        "t_hi",
        "k_hi",
    ]
    assert [tuple(s) for s in stats] == [
        (ACCEPTED, TOPIC, 0, 2, 10, 19, 5_000, 9_000, 50_000),
        (DUPLICATE, TOPIC, 0, 1, 12, 12, 7_000, 7_000, 45_000),
        (MALFORMED_JSON, TOPIC, 0, 1, 15, 15, None, None, 46_000),
        (ACCEPTED, TOPIC, 1, 1, 44, 44, 3_000, 3_000, 60_000),
    ]
    ranges, counts = ranges_and_counts(stats)
    assert ranges == {(TOPIC, 0): [10, 19, 4], (TOPIC, 1): [44, 44, 1]}
    assert counts == {ACCEPTED: 3, DUPLICATE: 1, MALFORMED_JSON: 1, "read": 5}
    assert accepted_span(stats) == (3_000, 9_000)


def test_coordinates_condition_is_scoped_to_the_batch_offsets() -> None:
    ranges, _ = ranges_and_counts(STATS)
    condition = coordinates_condition(ranges)
    assert "t.kafka_offset = s.kafka_offset" in condition
    assert "(t.kafka_partition = 0 AND t.kafka_offset BETWEEN 10 AND 19)" in condition
    assert "(t.kafka_partition = 1 AND t.kafka_offset BETWEEN 40 AND 44)" in condition
    assert "BETWEEN" not in coordinates_condition({})


def classified_frame(spark: SparkSession):  # type: ignore[no-untyped-def]
    """An empty frame with every column the sink's classified rows carry (as strings: only the
    column names matter to which writes are planned)."""
    added = {"reason", "raw_text", "watermark", "dim_version"}
    names = {"outcome"}
    for name in (t.BRONZE, t.QUARANTINE, t.LATE, t.SILVER):
        names |= {c for c in t.columns(name) if c not in added}
    schema = StructType([StructField(n, StringType()) for n in sorted(names)])
    return spark.createDataFrame([], schema)


def marks(silver_exclusive: bool = True) -> HighWater:
    return HighWater(
        offsets={(TOPIC, 0): 9, (TOPIC, 1): 39},
        ledger_batch=3,
        session_end_ms=0,
        silver_exclusive=silver_exclusive,
        silver_until_ms=10_000,
    )


def test_each_outcome_present_gets_its_table_with_the_table_columns(spark: SparkSession) -> None:
    rows = classified_frame(spark)
    ranges, counts = ranges_and_counts(STATS)
    writes = record_writes(
        rows,
        ranges,
        counts,
        accepted_span(STATS),
        watermark_ms=1,
        late_at=F.lit(1),
        dim_version=2,
        high_water=marks(),
    )
    assert [w.name for w in writes] == [t.BRONZE, t.QUARANTINE, t.SILVER]  # no late record
    for w in writes:
        assert w.rows.columns == t.columns(w.name)
        assert w.fresh  # every offset above the marks
    silver = writes[-1]
    assert "t.event_id = s.event_id" in silver.condition
    assert "timestamp_millis(3000) AND timestamp_millis(9000)" in silver.condition


def test_a_batch_overlapping_the_marks_merges(spark: SparkSession) -> None:
    rows = classified_frame(spark)
    stats = [stat(LATE, 0, 5, 12, 8), stat(ACCEPTED, 1, 40, 44, 5, t_lo=1, t_hi=2)]
    ranges, counts = ranges_and_counts(stats)
    writes = record_writes(
        rows,
        ranges,
        counts,
        accepted_span(stats),
        watermark_ms=1,
        late_at=F.lit(1),
        dim_version=2,
        high_water=marks(silver_exclusive=False),
    )
    assert [(w.name, w.fresh) for w in writes] == [
        (t.BRONZE, False),
        (t.LATE, False),
        (t.SILVER, False),
    ]


def test_silver_holding_other_events_appends_from_a_watermark_past_them(
    spark: SparkSession,
) -> None:
    """Silver held events this app id's dedup state never saw (a replay, a rewound checkpoint),
    the latest at 10,000: a fresh batch MERGEs them until its watermark reaches that time."""
    rows = classified_frame(spark)
    ranges, counts = ranges_and_counts(STATS)

    def silver_fresh(watermark_ms: int) -> bool:
        writes = record_writes(
            rows,
            ranges,
            counts,
            accepted_span(STATS),
            watermark_ms=watermark_ms,
            late_at=F.lit(watermark_ms),
            dim_version=2,
            high_water=marks(silver_exclusive=False),
        )
        assert [w.fresh for w in writes[:-1]] == [True, True]  # bronze, quarantine: above marks
        assert writes[-1].name == t.SILVER
        return writes[-1].fresh

    assert not silver_fresh(9_999)
    assert silver_fresh(10_000)


def test_offsets_read_before_are_each_generations_own_range_and_decide_under_no_cut(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A replay (the current app id) after two generations: the first read offsets 0-9 of
    partition 0, the second started past its end, at 20 (offsets 10-19 no generation read).
    Offsets a generation read keep their decision (no lateness cut: their first reader's
    stands); the others are cut at the floor, the latest watermark planned (1,000)."""
    warehouse = str(tmp_path / "warehouse")
    t.create_tables(spark, warehouse)
    for app, batches in (("gen-1", ((0, 4), (5, 9))), ("gen-2", ((20, 29),))):
        tables = Tables(spark, warehouse, app, 1)
        for batch_id, (lo, hi) in enumerate(batches):
            write_ledger(
                tables,
                batch_id,
                dim_version=0,
                ranges={(TOPIC, 0): (lo, hi, hi - lo + 1)},
                counts={"read": hi - lo + 1},
                transactional_id=None,
                kafka_outcome="nothing-to-publish",
                millis={"batch_timestamp": 0, "watermark": 0, "started_at": 0, "finished_at": 0},
                fresh=True,
            )
    decisions = PriorDecisions(Tables(spark, warehouse, "gen-3", 3), tmp_path / "gen-3")
    seen = decisions.read_before(0)  # a generation's first batch rereads
    assert seen is not None
    offsets = spark.range(32).select(
        F.lit(TOPIC).alias("kafka_topic"),
        F.lit(0).alias("kafka_partition"),
        F.col("id").alias("kafka_offset"),
    )
    cut = offsets.select("kafka_offset", lateness(500, 1_000, seen).alias("cut")).collect()
    assert {r.kafka_offset for r in cut if r.cut is None} == {*range(10), *range(20, 30)}
    assert {r.cut for r in cut if r.kafka_offset in (10, 19, 30, 31)} == {1_000}
    # No earlier generation: the batch's own watermark.
    assert offsets.select(lateness(500, NEVER, None).alias("c")).first().c == 500


def test_a_replay_keeps_what_an_earlier_generation_quarantined_and_knows_its_refused_events(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Generation 1 read two records: one malformed, and an impression whose ad its dimension
    lacked (``unknown_ad``: the dedup state let it through, the dimension refused it). A replay
    (generation 3) reads them again once the dimension has the ad, and a copy of the refused
    event at an offset no generation read, which its fresh dedup state picks first: both
    records keep their reasons and the copy is a duplicate, as generation 1's state would have
    made it, while the run's marks say such an event may be unseen. The same once tables a
    replay without this fix left (generation 2 accepted the refused record beside its
    quarantine row) hold the record twice: its first reader's decision stands, once."""
    warehouse = str(tmp_path / "warehouse")
    t.create_tables(spark, warehouse)
    at_ms = int(datetime(2026, 11, 20, 10, 30, tzinfo=UTC).timestamp() * 1000)
    refused = event("refused", event_time="2026-11-20T10:30:00.000Z", ad_id="ad-9")
    keys = ["kafka_topic", "kafka_partition", "kafka_offset"]
    none_known = spark.createDataFrame([], t.table(t.DIM_ADS).ddl)
    known = spark.createDataFrame(
        [("ad-9", "cmp-9", "adv-9", Decimal(1), Decimal(1))], t.table(t.DIM_ADS).ddl
    )

    gen1 = Tables(spark, warehouse, "gen-1", 1)
    parsed = kafka_rows(spark, [refused, "{broken"], partitions=1).transform(
        parse_events(max_bytes=4096)
    )
    firsts = parsed.where(F.col("reject_reason").isNull()).select(*keys)
    rows = gen1.stamped(enrich(classify(parsed, firsts, watermark_ms=0), none_known), 0)
    stats = batch_stats(rows)
    ranges, counts = ranges_and_counts(stats)
    assert counts == {UNKNOWN_AD: 1, MALFORMED_JSON: 1, "read": 2}
    empty = HighWater({}, -1, NEVER, silver_exclusive=True, silver_until_ms=NEVER)
    for w in record_writes(
        rows,
        ranges,
        counts,
        None,
        watermark_ms=0,
        late_at=F.lit(0),
        dim_version=0,
        high_water=empty,
    ):
        w.rows.write.format("delta").mode("append").save(gen1.path(w.name))
    write_ledger(
        gen1,
        0,
        dim_version=0,
        ranges={tp: (lo, hi, n) for tp, (lo, hi, n) in ranges.items()},
        counts=counts,
        transactional_id=None,
        kafka_outcome="nothing-to-publish",
        millis={"batch_timestamp": 0, "watermark": 0, "started_at": 0, "finished_at": 0},
        fresh=True,
    )

    # Generation 1's own dedup state saw the event: its restarts do not look it up.
    assert read_high_water(spark, warehouse, "gen-1", 1).unknown_until_ms == NEVER

    # Generation 3's dedup state never saw the event.
    marks = read_high_water(spark, warehouse, "gen-3", 3)
    assert marks.unknown_until_ms == at_ms
    assert marks.ids_unseen(at_ms - 1) and not marks.ids_unseen(at_ms)
    decisions = PriorDecisions(Tables(spark, warehouse, "gen-3", 3), tmp_path / "gen-3")
    seen = decisions.read_before(0)
    again = kafka_rows(spark, [refused, "{broken", refused], partitions=1).transform(
        parse_events(max_bytes=4096)
    )

    def prior() -> list[tuple[int, str]]:
        found = decisions.prior(seen)
        assert found is not None
        return sorted((r.kafka_offset, r.prior_outcome) for r in found.collect())

    def stored() -> list[tuple[str, int, str]]:
        rows = decisions.stored_ids(0).collect()
        return sorted((r.event_id, r.stored_at.kafka_offset, r.stored_outcome) for r in rows)

    def replayed() -> dict[int, str]:
        """Generation 3's first batch: offsets 0-1 again and the copy at 2, which its fresh
        dedup state picks first, under a dimension that has the ad now."""
        outcomes = classify(
            again,
            again.where("kafka_offset = 2").select(*keys),
            watermark_ms=lateness(0, NEVER, seen),
            prior=decisions.prior(seen),
            stored=decisions.stored_ids(0),
        )
        return {r.kafka_offset: r.outcome for r in enrich(outcomes, known).collect()}

    assert prior() == [(0, UNKNOWN_AD), (1, MALFORMED_JSON)]
    assert stored() == [("refused", 0, UNKNOWN_AD)]
    assert decisions.stored_ids(at_ms).count() == 0  # at or behind the watermark: late anyway
    assert replayed() == {0: UNKNOWN_AD, 1: MALFORMED_JSON, 2: DUPLICATE}

    # Tables a replay without this fix left (generation 2 accepted the refused record once its
    # ad was known, beside its quarantine row): its first reader's decision stands, once.
    gen2 = Tables(spark, warehouse, "gen-2", 2)
    accepted = gen2.stamped(
        enrich(classify(parsed, firsts, watermark_ms=0), known).where("kafka_offset = 0"), 0
    )
    (silver,) = record_writes(
        accepted,
        {("t", 0): [0, 0, 1]},
        {ACCEPTED: 1, "read": 1},
        (at_ms, at_ms),
        watermark_ms=0,
        late_at=F.lit(0),
        dim_version=1,
        high_water=empty,
    )[1:]
    typed = [F.col(f.name).cast(f.dataType) for f in t.schema(t.SILVER).fields]
    silver.rows.select(typed).write.format("delta").mode("append").save(gen2.path(t.SILVER))
    assert prior() == [(0, UNKNOWN_AD), (1, MALFORMED_JSON)]
    assert stored() == [("refused", 0, ACCEPTED), ("refused", 0, UNKNOWN_AD)]
    assert replayed() == {0: UNKNOWN_AD, 1: MALFORMED_JSON, 2: DUPLICATE}
