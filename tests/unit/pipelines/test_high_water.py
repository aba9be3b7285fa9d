"""When a batch may append instead of MERGE: the high-water marks a run reads at its start."""

from __future__ import annotations

from pipelines.high_water import NEVER, HighWater

TOPIC = "ad-events"


def marks(**kw: object) -> HighWater:
    base: dict[str, object] = {
        "offsets": {(TOPIC, 0): 99, (TOPIC, 1): 49},
        "ledger_batch": 7,
        "session_end_ms": 5_000,
        "silver_exclusive": True,
        "silver_until_ms": 9_000,
    }
    return HighWater(**{**base, **kw})  # type: ignore[arg-type]


def test_records_append_only_above_every_partition_mark() -> None:
    hw = marks()
    assert hw.records_fresh({(TOPIC, 0): [100, 180, 81], (TOPIC, 1): [50, 60, 11]})
    assert hw.records_fresh({(TOPIC, 2): [0, 10, 11]})  # a partition no table holds yet
    # the first offset of the batch already held somewhere: a re-execution or a replay
    assert not hw.records_fresh({(TOPIC, 0): [99, 180, 82]})
    assert not hw.records_fresh({(TOPIC, 0): [100, 180, 81], (TOPIC, 1): [0, 60, 61]})
    assert hw.records_fresh({})  # a batch of no records writes no record


def test_silver_appends_while_it_holds_this_app_ids_events_alone() -> None:
    fresh = {(TOPIC, 0): [100, 180, 81]}
    assert marks().silver_fresh(fresh, watermark_ms=0)
    assert not marks().silver_fresh({(TOPIC, 0): [10, 180, 171]}, watermark_ms=0)


def test_silver_held_other_events_appends_once_the_watermark_reaches_them() -> None:
    """After a replay or a rewound checkpoint: keyed until the batch's watermark reaches the
    latest event time silver held at the start (an accepted event is later than it)."""
    fresh = {(TOPIC, 0): [100, 180, 81]}
    shared = marks(silver_exclusive=False)
    assert not shared.silver_fresh(fresh, watermark_ms=8_999)
    assert shared.silver_fresh(fresh, watermark_ms=9_000)
    assert not shared.silver_fresh({(TOPIC, 0): [10, 180, 171]}, watermark_ms=10_000)


def test_a_batch_looks_up_silver_while_it_may_hold_events_the_state_never_saw() -> None:
    """The batches silver MERGEs into also classify with silver's event ids: a re-send of an
    event the dedup state never saw is a duplicate, not an accepted record the MERGE drops."""
    assert not marks().silver_unseen(watermark_ms=0)  # this generation's state saw them all
    shared = marks(silver_exclusive=False)
    assert shared.silver_unseen(watermark_ms=8_999)
    assert not shared.silver_unseen(watermark_ms=9_000)  # anything it holds is late now
    assert not marks(silver_exclusive=False, silver_until_ms=NEVER).silver_unseen(watermark_ms=0)


def test_ledger_and_sessions_marks() -> None:
    hw = marks()
    assert hw.ledger_fresh(8) and not hw.ledger_fresh(7) and not hw.ledger_fresh(0)
    assert hw.sessions_fresh(5_000) and not hw.sessions_fresh(4_999)
    assert marks(session_end_ms=NEVER).sessions_fresh(0)


def test_a_batch_looks_up_events_quarantined_as_unknown_ad_the_state_never_saw() -> None:
    """Events the dimension refused after the dedup state let them through: another copy is
    a duplicate, so a batch looks them up until its watermark passes the latest of them."""
    assert not marks().ids_unseen(watermark_ms=0)
    refused = marks(unknown_until_ms=12_000)  # silver: this generation's alone
    assert refused.ids_unseen(watermark_ms=11_999)
    assert not refused.ids_unseen(watermark_ms=12_000)
    assert marks(silver_exclusive=False).ids_unseen(watermark_ms=8_999)  # silver's, as before
