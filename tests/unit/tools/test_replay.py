"""Where a replay starts: the operator's input checked against what Kafka holds."""

from __future__ import annotations

import pytest

from app.runtime.errors import UserInputError
from app.tools.replay import EARLIEST, Partition, parse_offsets, parse_timestamp, plan, rereads

PARTS = {0: Partition(0, 5000), 1: Partition(100, 4000), 2: Partition(0, 0), 3: Partition(0, 10)}


def test_named_partitions_start_where_told_others_resume_after_the_ledger() -> None:
    chosen = parse_offsets('{"ad-events": {"0": 1200, "3": 0}}', "ad-events", PARTS)
    assert chosen == {0: 1200, 3: 0}
    start = plan(topic="ad-events", partitions=PARTS, chosen=chosen, read_upto={0: 4999, 1: 3999})
    # 1 resumes after its last read offset; 2 was never read, so from the earliest.
    assert start == {0: 1200, 1: 4000, 2: EARLIEST, 3: 0}
    assert rereads(start, PARTS, {0: 4999, 1: 3999, 3: 9}) == 3800 + 0 + 10


def test_from_earliest_is_every_partition() -> None:
    start = plan(topic="t", partitions=PARTS, chosen=None, read_upto={0: 10})
    assert set(start.values()) == {EARLIEST} and set(start) == set(PARTS)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{", "not JSON"),
        ('{"other": {"0": 1}}', "input topic only"),
        ('{"ad-events": {"9": 1}}', "no partition '9'"),
        ('{"ad-events": {"0": -1}}', "is not >= 0"),
        ('{"ad-events": {"0": "12"}}', "is not >= 0"),
        ('{"ad-events": {"1": 50}}', "deleted by retention; the earliest still held is 100"),
        ('{"ad-events": {"0": 5001}}', "beyond the end (5000)"),
        ('{"ad-events": {}}', "names no partition"),
    ],
)
def test_bad_offsets_are_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(UserInputError, match=why.replace("(", r"\(").replace(")", r"\)")):
        parse_offsets(text, "ad-events", PARTS)


def test_timestamps_need_a_zone() -> None:
    assert parse_timestamp("2026-11-20T10:00:00Z") == 1795168800000
    assert parse_timestamp("2026-11-20T11:00:00+01:00") == 1795168800000
    with pytest.raises(UserInputError, match="no time zone"):
        parse_timestamp("2026-11-20T10:00:00")
    with pytest.raises(UserInputError, match="not an ISO-8601"):
        parse_timestamp("yesterday")
