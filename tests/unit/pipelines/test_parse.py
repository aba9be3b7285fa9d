"""parse_events: one reason per bad record, typed columns for good ones."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from pipelines.transforms import parse_events
from schemas import ad_event as c
from tests.builders import event, kafka_rows

CASES: list[tuple[object, str | None]] = [
    (event("e1"), None),
    (event("e2", "click", impression_id="i1"), None),
    (event("e3", "conversion", ad_id=None, revenue=12.5), None),
    (event("e3b", "conversion", ad_id=None, revenue="0.000001"), None),
    ("x" * 600, c.OVERSIZED),
    ("{not json", c.MALFORMED_JSON),
    ("[1, 2]", c.MALFORMED_JSON),
    (None, c.MALFORMED_JSON),
    (b"\xff\xfe{}", c.MALFORMED_JSON),
    ({k: v for k, v in event("e4").items() if k != "user_id"}, c.MISSING_FIELD),
    (event("e5", user_id=None), c.MISSING_FIELD),  # JSON null counts as missing
    (event("e6", ad_id=None), c.MISSING_FIELD),  # impression without ad_id
    (event("e7", "conversion", ad_id=None, revenue=None), c.MISSING_FIELD),
    (event(123), c.BAD_TYPE),  # type: ignore[arg-type]
    (event("e8", schema_version="1"), c.BAD_TYPE),
    (event("e9", "conversion", ad_id=None, revenue=True), c.BAD_TYPE),
    (event("e10", "view"), c.UNKNOWN_EVENT_TYPE),
    (event("e11", schema_version=2), c.UNSUPPORTED_SCHEMA_VERSION),
    (event("e12", "conversion", ad_id=None, impression_id="i"), c.UNEXPECTED_FIELD),
    (event("e13", revenue="1"), c.UNEXPECTED_FIELD),
    (event("x" * 65), c.INVALID_VALUE),
    (event(""), c.INVALID_VALUE),
    (event("e14", event_time="2026-11-20 10:00:00"), c.BAD_TIMESTAMP),
    (event("e15", event_time="2026-13-20T10:00:00.000Z"), c.BAD_TIMESTAMP),
    (event("e16", event_time="2026-11-20T10:00:00Z"), c.BAD_TIMESTAMP),
    (event("e17", "conversion", ad_id=None, revenue=-1), c.NEGATIVE_REVENUE),
    (event("e18", "conversion", ad_id=None, revenue="-0.5"), c.NEGATIVE_REVENUE),
    (event("e19", "conversion", ad_id=None, revenue="1.1234567"), c.INVALID_VALUE),
    (event("e20", "conversion", ad_id=None, revenue="abc"), c.INVALID_VALUE),
    (event("e21", event_time="2999-01-01T00:00:00.000Z"), c.QUALITY_EVENT_TIME_IN_FUTURE),
]


@pytest.fixture(scope="module")
def parsed(spark):  # type: ignore[no-untyped-def]
    df = kafka_rows(spark, [v for v, _ in CASES])  # type: ignore[misc]
    rows = df.transform(parse_events(max_bytes=512)).orderBy("kafka_offset", "kafka_partition")
    return rows.collect()


def test_each_record_gets_the_expected_reason(parsed) -> None:  # type: ignore[no-untyped-def]
    got = [r.reject_reason for r in parsed]
    assert got == [reason for _, reason in CASES]


def test_every_reason_code_is_covered() -> None:
    covered = {reason for _, reason in CASES} - {None}
    assert covered == set(c.REASONS) - {c.UNKNOWN_AD}  # unknown_ad needs the dimension


def test_valid_records_are_typed(parsed) -> None:  # type: ignore[no-untyped-def]
    impression, click, conversion, tiny = parsed[0], parsed[1], parsed[2], parsed[3]
    assert impression.event_id == "e1" and impression.ad_id == "ad-1"
    assert impression.event_time.isoformat() == "2026-11-20T10:00:00"
    assert impression.schema_version == 1
    assert click.impression_id == "i1"
    assert conversion.revenue == Decimal("12.500000") and conversion.ad_id is None
    assert tiny.revenue == Decimal("0.000001")


def test_rejected_records_keep_raw_value_and_no_typed_fields(parsed) -> None:  # type: ignore[no-untyped-def]
    bad = parsed[13]  # event_id is a number
    assert json.loads(bad.raw_value)["event_id"] == 123
    assert bad.event_id is None and bad.event_time is None
