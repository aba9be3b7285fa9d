"""Realistic ad traffic with a truth file computed independently of Spark.

``plan_traffic`` is pure and deterministic (same config and seed, same bytes): impressions from
many users over many ads, clicks on a few percent of impressions (each pointing at an earlier
impression of the same user), conversions on a share of clicks (later in time) and a few organic
ones, producer-retry duplicates (the same bytes again, soon after), records that break the
contract in every way the job must quarantine, and late events. Clicks and conversions are sent
up to a minute after their event time, so a conversion sometimes arrives before its click.

The truth (``truth.py``) is computed from the accepted events in plain Python, sharing no code
with the Spark job.

Lateness depends on the job's watermark, which only moves between micro-batches, so late events
form a separate *tail* segment: each is older than the main segment's newest event minus the
watermark delay and a margin. Produced after the job has processed the main segment (what
``adattr demo`` and the tests do), they are late whatever the batch boundaries were.
"""

from __future__ import annotations

import heapq
import json
import random
import sys
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from app.runtime.settings import Settings
from app.tools.truth import Accepted, expected_results
from schemas import ad_event as c

if TYPE_CHECKING:
    from app.runtime.kafka_io import KafkaConnection

BASE_TIME = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
CLICK_RATE = 0.04
CONVERSION_RATE = 0.15
ORGANIC_RATE = 0.002
JITTER_MS = 20_000
SEND_DELAY_MS = 60_000
LATE_MARGIN = timedelta(minutes=2)
BAD_KINDS = (
    c.MALFORMED_JSON,
    c.MISSING_FIELD,
    c.BAD_TYPE,
    c.UNKNOWN_EVENT_TYPE,
    c.BAD_TIMESTAMP,
    c.NEGATIVE_REVENUE,
    c.UNKNOWN_AD,
    c.OVERSIZED,
    c.INVALID_VALUE,
    c.UNEXPECTED_FIELD,
    c.UNSUPPORTED_SCHEMA_VERSION,
    c.QUALITY_EVENT_TIME_IN_FUTURE,
)


@dataclass(frozen=True)
class GenConfig:
    events: int = 10_000
    seed: int = 7
    users: int = 500
    ads: int = 50
    duplicate_ratio: float = 0.02
    late_ratio: float = 0.001
    malformed_ratio: float = 0.01
    step_ms: int = 200  # event time advances this much per record: 20k records ~ 67 minutes
    watermark_delay_s: int = 600
    max_record_bytes: int = 16384
    lookback_s: int = 86_400
    session_gap_s: int = 1800

    @classmethod
    def for_settings(cls, settings: Settings, **traffic: Any) -> GenConfig:
        """The traffic shape given, with the job's own windows and limits from ``settings``, so
        the truth file expects what that job computes."""
        return cls(
            watermark_delay_s=settings.watermark_delay_seconds,
            max_record_bytes=settings.max_record_bytes,
            lookback_s=settings.attribution_lookback_seconds,
            session_gap_s=settings.session_gap_seconds,
            **traffic,
        )

    def validate(self) -> None:
        if self.events < 1 or self.users < 1 or self.ads < 1 or self.step_ms < 1:
            raise ValueError("--events, --users, --ads and --step-ms must be at least 1")
        for name in ("duplicate_ratio", "late_ratio", "malformed_ratio"):
            if not 0 <= getattr(self, name) < 0.5:
                raise ValueError(f"--{name.replace('_', '-')} must be in [0, 0.5)")


@dataclass
class Traffic:
    main: list[tuple[bytes, bytes]] = field(default_factory=list)
    tail: list[tuple[bytes, bytes]] = field(default_factory=list)
    dim_rows: list[tuple[str, str, str, Decimal, Decimal]] = field(default_factory=list)
    truth: dict[str, Any] = field(default_factory=dict)
    # Per main record, the event time it moves the job's watermark with (None: it moves none).
    times: list[datetime | None] = field(default_factory=list)
    watermark_delay: timedelta = timedelta(0)

    def live_slices(self, start: int) -> list[list[tuple[bytes, bytes]]]:
        """``main[start:]`` in consecutive slices that no reading order makes late, for a job
        that runs while they are produced: each slice's oldest event is newer than the newest
        event up to the slice's end minus the watermark delay. Produced one at a time, each
        once the job has taken the one before, no record is late even when the job reads one
        partition's records well before another's (a Kafka node down: the partitions it
        followed take acks later), which a single send of the whole segment cannot promise:
        the truth orders lateness by send order, the watermark by what the job read.
        """
        newest = max((t for t in self.times[:start] if t is not None), default=None)
        slices: list[list[tuple[bytes, bytes]]] = [[]]
        oldest: datetime | None = None  # the current slice's
        for record, t in zip(self.main[start:], self.times[start:], strict=True):
            if t is not None:
                newest = t if newest is None else max(newest, t)
                if oldest is not None and oldest <= newest - self.watermark_delay:
                    slices.append([])  # t would let a reading order pass the slice's oldest
                    oldest = None
                oldest = t if oldest is None else min(oldest, t)
            slices[-1].append(record)
        return [chunk for chunk in slices if chunk]


def iso_millis(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def dim_for(cfg: GenConfig) -> list[tuple[str, str, str, Decimal, Decimal]]:
    rng = random.Random(cfg.seed * 7919 + 1)
    rows = []
    for i in range(cfg.ads):
        campaign = i // 10
        rows.append(
            (
                f"ad-{i:04d}",
                f"cmp-{campaign:03d}",
                f"adv-{campaign // 5:03d}",
                Decimal(rng.randint(50, 5000)) / 100,  # cpm 0.50 .. 50.00
                Decimal(rng.randint(5, 300)) / 100,  # cpc 0.05 .. 3.00
            )
        )
    return rows


def plan_traffic(cfg: GenConfig) -> Traffic:
    cfg.validate()
    rng = random.Random(cfg.seed)
    watermark_delay = timedelta(seconds=cfg.watermark_delay_s)
    traffic = Traffic(dim_rows=dim_for(cfg), watermark_delay=watermark_delay)
    ads = {row[0]: row for row in traffic.dim_rows}
    ad_ids = list(ads)
    users = [f"user-{i:05d}" for i in range(cfg.users)]
    scheduled: list[tuple[datetime, int, dict[str, Any]]] = []  # clicks, conversions
    recent: deque[tuple[tuple[bytes, bytes], datetime]] = deque(maxlen=200)  # and event times
    quarantine: dict[str, int] = defaultdict(int)
    counters = {"duplicates": 0, "seq": 0}
    accepted: list[Accepted] = []
    max_time = BASE_TIME  # the newest event time the job's watermark sees
    org_rng = random.Random(cfg.seed * 31 + 5)
    advertisers = sorted({row[2] for row in traffic.dim_rows})

    def next_id(prefix: str) -> str:
        counters["seq"] += 1
        return f"{prefix}-{cfg.seed}-{counters['seq']:09d}"

    def emit(evt: dict[str, Any]) -> None:
        nonlocal max_time
        value = json.dumps(evt, separators=(",", ":")).encode()
        record = (evt["user_id"].encode(), value)
        t = datetime.strptime(evt["event_time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
        traffic.main.append(record)
        traffic.times.append(t)
        recent.append((record, t))
        max_time = max(max_time, t)
        ad = ads.get(evt.get("ad_id", ""))
        accepted.append(
            Accepted(
                event_id=evt["event_id"],
                event_type=evt["event_type"],
                time=t,
                user_id=evt["user_id"],
                ad_id=ad[0] if ad else None,
                campaign_id=ad[1] if ad else None,
                advertiser_id=ad[2] if ad else evt["advertiser_id"],
                cost=(ad[3] / 1000 if evt["event_type"] == "impression" else ad[4])
                if ad
                else Decimal(0),
                revenue=Decimal(str(evt["revenue"])) if "revenue" in evt else Decimal(0),
            )
        )

    def base_event(kind: str, at: datetime, user: str) -> dict[str, Any]:
        return {
            "event_id": next_id(kind[:3]),
            "event_type": kind,
            "event_time": iso_millis(at),
            "user_id": user,
            "schema_version": 1,
        }

    def bad_record(reason: str, at: datetime) -> bytes:
        e = base_event("impression", at, rng.choice(users))
        e["ad_id"] = rng.choice(ad_ids)
        if reason == c.MALFORMED_JSON:
            return json.dumps(e).encode()[:-7]
        if reason == c.MISSING_FIELD:
            del e["user_id"]
        elif reason == c.BAD_TYPE:
            e["schema_version"] = "1"
        elif reason == c.UNKNOWN_EVENT_TYPE:
            e["event_type"] = "hover"
        elif reason == c.BAD_TIMESTAMP:
            e["event_time"] = at.strftime("%d/%m/%Y %H:%M")
        elif reason == c.NEGATIVE_REVENUE:
            e.update(event_type="conversion", advertiser_id="adv-000", revenue="-3.50")
            del e["ad_id"]
        elif reason == c.UNKNOWN_AD:
            e["ad_id"] = f"ad-unknown-{rng.randint(0, 99)}"
        elif reason == c.OVERSIZED:
            e["padding"] = "x" * cfg.max_record_bytes
        elif reason == c.INVALID_VALUE:
            e["user_id"] = "u" * 65
        elif reason == c.UNEXPECTED_FIELD:
            e["revenue"] = 1
        elif reason == c.UNSUPPORTED_SCHEMA_VERSION:
            e["schema_version"] = 2
        elif reason == c.QUALITY_EVENT_TIME_IN_FUTURE:
            e["event_time"] = iso_millis(at.replace(year=2999))  # fixed: the bytes stay the same
        return json.dumps(e, separators=(",", ":")).encode()

    bad_index = 0
    position = 0
    while len(traffic.main) < cfg.events:
        now = BASE_TIME + timedelta(milliseconds=position * cfg.step_ms)
        position += 1
        while scheduled and scheduled[0][0] <= now and len(traffic.main) < cfg.events:
            emit(heapq.heappop(scheduled)[2])
        if len(traffic.main) >= cfg.events:
            break
        if org_rng.random() < ORGANIC_RATE:  # a conversion no click led to (or so it seems)
            organic = base_event("conversion", now, org_rng.choice(users))
            organic.update(
                advertiser_id=org_rng.choice(advertisers),
                revenue=str(Decimal(org_rng.randint(100, 20_000)) / 100),
            )
            emit(organic)
            continue
        r = rng.random()
        if r < cfg.malformed_ratio:
            reason = BAD_KINDS[bad_index % len(BAD_KINDS)]
            bad_index += 1
            traffic.main.append((b"bad", bad_record(reason, now)))
            quarantine[reason] += 1
            if reason == c.UNKNOWN_AD:
                max_time = max(max_time, now)  # valid JSON: it moves the watermark
            traffic.times.append(now if reason == c.UNKNOWN_AD else None)
            continue
        # A producer retry (the very same bytes) of a record no watermark can have passed yet,
        # whatever the batch boundaries: in sparse traffic, 200 records span more than the
        # watermark delay, and a retry of the oldest would be late in some runs, not in others.
        if r < cfg.malformed_ratio + cfg.duplicate_ratio and recent:
            retryable = [(rec, t) for rec, t in recent if t > max_time - watermark_delay]
            if retryable:
                record, t = rng.choice(retryable)
                traffic.main.append(record)
                traffic.times.append(t)
                counters["duplicates"] += 1
                continue
        at = now - timedelta(milliseconds=rng.randint(0, JITTER_MS))
        user = rng.choice(users)
        impression = base_event("impression", at, user)
        impression["ad_id"] = rng.choice(ad_ids)
        emit(impression)
        if rng.random() < CLICK_RATE:
            click_at = at + timedelta(milliseconds=rng.randint(500, 20_000))
            click = base_event("click", click_at, user)
            click.update(ad_id=impression["ad_id"], impression_id=impression["event_id"])
            send_at = click_at + timedelta(milliseconds=rng.randint(0, SEND_DELAY_MS))
            heapq.heappush(scheduled, (send_at, counters["seq"], click))
            if rng.random() < CONVERSION_RATE:
                # Half convert within half a minute, which the send delay often reorders.
                quick = rng.random() < 0.5
                conv_at = click_at + timedelta(seconds=rng.randint(1, 30 if quick else 300))
                conv = base_event("conversion", conv_at, user)
                revenue = Decimal(rng.randint(100, 50_000)) / 100
                conv.update(
                    advertiser_id=ads[impression["ad_id"]][2],
                    # Both encodings the contract allows: a JSON number and a decimal string.
                    revenue=float(revenue) if rng.random() < 0.5 else str(revenue),
                )
                send_at = conv_at + timedelta(milliseconds=rng.randint(0, SEND_DELAY_MS))
                heapq.heappush(scheduled, (send_at, counters["seq"], conv))

    late_count = round(cfg.events * cfg.late_ratio)
    if cfg.late_ratio > 0:
        late_count = max(late_count, 1)
    newest_allowed = max_time - timedelta(seconds=cfg.watermark_delay_s) - LATE_MARGIN
    for _ in range(late_count):
        at = newest_allowed - timedelta(milliseconds=rng.randint(0, 300_000))
        e = base_event("impression", at, rng.choice(users))
        e["ad_id"] = rng.choice(ad_ids)
        traffic.tail.append((e["user_id"].encode(), json.dumps(e, separators=(",", ":")).encode()))

    traffic.truth = {
        "contract": "ad_event.v1",
        "config": cfg.__dict__,
        "records": len(traffic.main) + len(traffic.tail),
        "segments": {"main": len(traffic.main), "tail": len(traffic.tail)},
        "quarantine": dict(sorted(quarantine.items())),
        "duplicates": counters["duplicates"],
        "late": len(traffic.tail),
        "accepted": len(accepted),
        **expected_results(
            accepted,
            lookback=timedelta(seconds=cfg.lookback_s),
            gap=timedelta(seconds=cfg.session_gap_s),
            final_watermark=max_time - timedelta(seconds=cfg.watermark_delay_s),
        ),
    }
    return traffic


def produce(
    records: list[tuple[bytes, bytes]],
    kafka: KafkaConnection,
    topic: str,
    *,
    rate: float | None = None,
    progress: bool = True,
) -> None:
    """Sends records in order with an idempotent producer; raises if any send failed."""
    from confluent_kafka import KafkaException, Producer

    from app.runtime.kafka_io import producer_config

    producer = Producer(producer_config(kafka))
    failures: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    started = time.monotonic()
    step = max(1, len(records) // 10)
    for i, (key, value) in enumerate(records, 1):
        while True:
            try:
                producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)  # the local queue is full: let deliveries drain it
        if rate:
            ahead = i / rate - (time.monotonic() - started)
            if ahead > 0:
                producer.poll(ahead)  # pacing to the requested rate
        if progress and i % step == 0:
            print(f"  produced {i:,}/{len(records):,}", file=sys.stderr, flush=True)
        if failures:
            break
    remaining = producer.flush(60)
    if failures or remaining:
        raise KafkaException(
            f"{len(failures)} record(s) failed and {remaining} undelivered: {failures[:3]}"
        )
