"""The generator is deterministic and its records honour (or break) the JSON Schema contract."""

from __future__ import annotations

import json
from collections import Counter

import jsonschema
import pytest

from app.tools.generator import GenConfig, plan_traffic
from schemas import ad_event as c


@pytest.fixture(scope="module")
def traffic():  # type: ignore[no-untyped-def]
    return plan_traffic(
        GenConfig(events=4000, seed=3, users=500, ads=20, malformed_ratio=0.03, step_ms=1000)
    )


def test_same_seed_same_bytes(traffic) -> None:  # type: ignore[no-untyped-def]
    again = plan_traffic(
        GenConfig(events=4000, seed=3, users=500, ads=20, malformed_ratio=0.03, step_ms=1000)
    )
    assert again.main == traffic.main and again.tail == traffic.tail
    assert again.truth == traffic.truth
    other = plan_traffic(GenConfig(events=4000, seed=4, users=50, ads=20, malformed_ratio=0.03))
    assert other.main != traffic.main


def test_good_records_validate_and_bad_ones_do_not(traffic) -> None:  # type: ignore[no-untyped-def]
    validator = jsonschema.Draft202012Validator(c.contract().raw)
    known_ads = {row[0] for row in traffic.dim_rows}
    valid = invalid = unknown_ad = future = 0
    for key, value in traffic.main + traffic.tail:
        try:
            doc = json.loads(value)
        except ValueError:
            invalid += 1
            continue
        if validator.is_valid(doc) and len(value) <= 16384:
            valid += 1
            if doc["event_time"] > "2100":  # the quality gate's: too far in the future
                future += 1
            elif doc.get("ad_id", "ad-0000") not in known_ads:
                unknown_ad += 1
            else:
                assert key == doc["user_id"].encode()
        else:
            invalid += 1
    quarantine = traffic.truth["quarantine"]
    gated = quarantine[c.UNKNOWN_AD] + quarantine[c.QUALITY_EVENT_TIME_IN_FUTURE]
    assert invalid == sum(quarantine.values()) - gated
    assert unknown_ad == quarantine[c.UNKNOWN_AD]
    assert future == quarantine[c.QUALITY_EVENT_TIME_IN_FUTURE]


def test_truth_adds_up(traffic) -> None:  # type: ignore[no-untyped-def]
    truth = traffic.truth
    assert truth["records"] == len(traffic.main) + len(traffic.tail)
    assert truth["records"] == (
        truth["accepted"] + truth["duplicates"] + truth["late"] + sum(truth["quarantine"].values())
    )
    # Good records (bad ones go out with key b"bad"), one per event_id once re-sends collapse.
    good = {json.loads(v)["event_id"]: json.loads(v) for k, v in traffic.main if k != b"bad"}
    assert len(good) == truth["accepted"]
    types = Counter(e["event_type"] for e in good.values())
    assert types["click"] > 0 and types["conversion"] > 0
    assert types["click"] < types["impression"] * 0.1  # a few percent click through
    windows = truth["windows"]
    assert sum(w["impressions"] for w in windows) == types["impression"]
    assert sum(w["clicks"] for w in windows) == types["click"]


def test_rejects_bad_config() -> None:
    with pytest.raises(ValueError, match="--duplicate-ratio"):
        GenConfig(duplicate_ratio=0.9).validate()


def test_truth_exercises_attribution_ctr_and_sessions(traffic) -> None:  # type: ignore[no-untyped-def]
    truth = traffic.truth
    sent = [json.loads(v) for k, v in traffic.main if k != b"bad"]
    position = {e["event_id"]: i for i, e in reversed(list(enumerate(sent)))}
    conversions = truth["attributions"]
    assert len(conversions) == len({e["event_id"] for e in sent if e["event_type"] == "conversion"})
    statuses = Counter(a["status"] for a in conversions)
    assert statuses["attributed"] > 0 and statuses["unattributed"] > 0
    # Some conversions are sent before the click they are attributed to.
    assert any(
        position[a["conversion_id"]] < position[a["click_id"]] for a in conversions if a["click_id"]
    )
    for a in conversions:
        if a["click_id"]:
            assert a["click_time"] < a["conversion_time"]
    windows = truth["windows"]
    assert sum(w["conversions"] for w in windows) == statuses["attributed"]
    # Every minute lies in 12 sliding hours.
    ctr = truth["ctr_1h"]
    assert sum(h["impressions"] for h in ctr) == 12 * sum(w["impressions"] for w in windows)
    assert all(h["ctr"] is None or 0 <= h["ctr"] <= 1 for h in ctr)
    sessions = truth["sessions"]
    assert sessions and all(s["session_end"] <= truth["final_watermark"] for s in sessions)
    assert sum(s["events"] for s in sessions) < truth["accepted"]  # the newest are still open


@pytest.mark.parametrize("step_ms", [200, 1200])
def test_a_retry_is_never_behind_any_watermark(step_ms: int) -> None:
    """Whatever the batch boundaries, a batch's watermark is at most the newest event time
    before it minus the delay: a duplicate newer than that is never late, so the truth's
    duplicate and late counts hold for any batching (sparse drills: 600 events over 12 min)."""
    from datetime import UTC, datetime, timedelta

    cfg = GenConfig(events=600, seed=5, users=300, ads=20, step_ms=step_ms, watermark_delay_s=180)
    traffic = plan_traffic(cfg)
    seen: set[bytes] = set()
    newest = None
    retries = 0
    for _, value in traffic.main:
        try:
            t = datetime.strptime(json.loads(value)["event_time"], "%Y-%m-%dT%H:%M:%S.%fZ")
        except (ValueError, KeyError, TypeError):
            continue  # a bad record
        t = t.replace(tzinfo=UTC)
        if value in seen:
            retries += 1
            assert newest is not None and t > newest - timedelta(seconds=180)
        seen.add(value)
        newest = t if newest is None else max(newest, t)
    assert retries == traffic.truth["duplicates"] > 0


def test_live_slices_leave_no_reading_order_that_makes_a_record_late() -> None:
    """A running job may read one partition's share of a send well before another's (a Kafka
    node down delays the partitions it followed): the second half of a drill's traffic spans
    more than the watermark delay, so one send could make its oldest records late; each live
    slice's oldest event is newer than the newest up to its end minus the delay."""
    from datetime import UTC, datetime, timedelta

    delay = timedelta(seconds=180)
    cfg = GenConfig(events=600, seed=5, users=300, ads=20, step_ms=1200, watermark_delay_s=180)
    traffic = plan_traffic(cfg)
    assert len(traffic.times) == len(traffic.main)
    for (_, value), t in zip(traffic.main, traffic.times, strict=True):
        if t is not None:  # the time the generator says moves the watermark is the record's own
            when = datetime.strptime(json.loads(value)["event_time"], "%Y-%m-%dT%H:%M:%S.%fZ")
            assert t == when.replace(tzinfo=UTC)

    def safe(start: int, end: int) -> bool:
        times = [t for t in traffic.times[start:end] if t is not None]
        newest = max(t for t in traffic.times[:end] if t is not None)
        return min(times) > newest - delay

    half = len(traffic.main) // 2
    assert not safe(half, len(traffic.main))  # one send of the second half is not
    slices = traffic.live_slices(half)
    assert [r for chunk in slices for r in chunk] == traffic.main[half:]
    start = half
    for chunk in slices:
        assert chunk and safe(start, start + len(chunk))
        start += len(chunk)
    assert len(slices) < len(traffic.main[half:]) // 10  # slices, not single records
