"""The expected gold tables, computed from the accepted events in plain Python.

This is the independent implementation the Spark job is checked against: it shares no code with
``pipelines/``, only the rules of the product (README, "What the tables mean"):

- last-click attribution: the latest click by the same user on an ad of the same advertiser with
  ``conversion - lookback <= click < conversion``, ties to the larger click id, else organic;
- 1-minute windows per ad: impressions, clicks, spend (cpm / 1000 per impression, cpc per
  click), attributed conversions and revenue in the window of the conversion time;
- sliding 1-hour CTR windows every 5 minutes per campaign;
- user sessions: an event more than ``gap`` after the previous one starts a new session (at
  exactly ``gap`` it extends it, as Spark's ``session_window`` does); a session ends ``gap``
  after its last event and is written only once the final watermark has reached its end.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from itertools import pairwise
from typing import Any

SPEND = Decimal("0.000000001")
MONEY = Decimal("0.000001")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SLIDE = timedelta(minutes=5)
HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class Accepted:
    """One event the job must accept into silver."""

    event_id: str
    event_type: str
    time: datetime
    user_id: str
    ad_id: str | None
    campaign_id: str | None
    advertiser_id: str | None
    cost: Decimal
    revenue: Decimal


def iso(t: datetime | None) -> str | None:
    if t is None:
        return None
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def _floor(t: datetime, step: timedelta) -> datetime:
    return EPOCH + (t - EPOCH) // step * step


def attributions(events: Iterable[Accepted], lookback: timedelta) -> list[dict[str, Any]]:
    events = list(events)
    clicks: dict[tuple[str, str | None], list[tuple[datetime, str, Accepted]]] = defaultdict(list)
    for e in events:
        if e.event_type == "click":
            clicks[(e.user_id, e.advertiser_id)].append((e.time, e.event_id, e))
    for candidates in clicks.values():
        candidates.sort(key=lambda c: (c[0], c[1]))
    out = []
    for conv in sorted(
        (e for e in events if e.event_type == "conversion"), key=lambda e: e.event_id
    ):
        candidates = clicks.get((conv.user_id, conv.advertiser_id), [])
        # The largest (time, id) with time < conversion time.
        i = bisect.bisect_left(candidates, conv.time, key=lambda c: c[0]) - 1
        click = candidates[i][2] if i >= 0 and candidates[i][0] >= conv.time - lookback else None
        out.append(
            {
                "conversion_id": conv.event_id,
                "conversion_time": iso(conv.time),
                "user_id": conv.user_id,
                "advertiser_id": conv.advertiser_id,
                "revenue": str(conv.revenue.quantize(MONEY)),
                "click_id": click.event_id if click else None,
                "click_time": iso(click.time) if click else None,
                "ad_id": click.ad_id if click else None,
                "campaign_id": click.campaign_id if click else None,
                "status": "attributed" if click else "unattributed",
            }
        )
    return out


def windows(events: Iterable[Accepted], attributed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    w: dict[tuple[str, str], list[Any]] = defaultdict(
        lambda: [0, 0, Decimal(0), 0, Decimal(0), None]
    )
    for e in events:
        if e.event_type in ("impression", "click") and e.ad_id is not None:
            row = w[(iso(_floor(e.time, timedelta(minutes=1))) or "", e.ad_id)]
            row[0 if e.event_type == "impression" else 1] += 1
            row[2] += e.cost
            row[5] = e.campaign_id
    for a in attributed:
        if a["status"] == "attributed":
            minute = _floor(datetime.fromisoformat(a["conversion_time"]), timedelta(minutes=1))
            row = w[(iso(minute) or "", a["ad_id"])]
            row[3] += 1
            row[4] += Decimal(a["revenue"])
            row[5] = a["campaign_id"]
    return [
        {
            "window_start": start,
            "ad_id": ad_id,
            "campaign_id": v[5],
            "impressions": v[0],
            "clicks": v[1],
            "spend": str(v[2].quantize(SPEND)),
            "conversions": v[3],
            "revenue": str(v[4].quantize(MONEY)),
        }
        for (start, ad_id), v in sorted(w.items())
    ]


def campaign_ctr(minute_windows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    hours: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for m in minute_windows:
        if m["impressions"] == 0 and m["clicks"] == 0:
            continue
        minute = datetime.fromisoformat(m["window_start"])
        start = _floor(minute, SLIDE)
        while start > minute - HOUR:  # the 12 windows [start, start + 1h) holding this minute
            h = hours[(iso(start) or "", m["campaign_id"])]
            h[0] += m["impressions"]
            h[1] += m["clicks"]
            start -= SLIDE
    return [
        {
            "window_start": start,
            "campaign_id": campaign,
            "impressions": imps,
            "clicks": clicks,
            "ctr": clicks / imps if imps else None,
        }
        for (start, campaign), (imps, clicks) in sorted(hours.items())
    ]


def sessions(
    events: Iterable[Accepted], gap: timedelta, final_watermark: datetime
) -> list[dict[str, Any]]:
    by_user: dict[str, list[Accepted]] = defaultdict(list)
    for e in events:
        by_user[e.user_id].append(e)
    out = []
    for user, evs in sorted(by_user.items()):
        evs.sort(key=lambda e: e.time)
        runs: list[list[Accepted]] = [[evs[0]]]
        for prev, e in pairwise(evs):
            if e.time - prev.time > gap:  # Spark: an event at the session end extends it
                runs.append([])
            runs[-1].append(e)
        for run in runs:
            end = run[-1].time + gap
            if end > final_watermark:
                continue  # still open when the job stopped: not written yet
            kinds = [x.event_type for x in run]
            out.append(
                {
                    "user_id": user,
                    "session_start": iso(run[0].time),
                    "session_end": iso(end),
                    "events": len(run),
                    "impressions": kinds.count("impression"),
                    "clicks": kinds.count("click"),
                    "conversions": kinds.count("conversion"),
                    "revenue": str(sum((x.revenue for x in run), Decimal(0)).quantize(MONEY)),
                }
            )
    return out


def campaigns(minute_windows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    totals: dict[str, list[Any]] = defaultdict(lambda: [0, 0, Decimal(0), 0, Decimal(0)])
    for m in minute_windows:
        t = totals[m["campaign_id"]]
        t[0] += m["impressions"]
        t[1] += m["clicks"]
        t[2] += Decimal(m["spend"])
        t[3] += m["conversions"]
        t[4] += Decimal(m["revenue"])
    return {
        k: {
            "impressions": v[0],
            "clicks": v[1],
            "spend": str(v[2].quantize(SPEND)),
            "conversions": v[3],
            "revenue": str(v[4].quantize(MONEY)),
        }
        for k, v in sorted(totals.items())
    }


def expected_results(
    events: list[Accepted], *, lookback: timedelta, gap: timedelta, final_watermark: datetime
) -> dict[str, Any]:
    attributed = attributions(events, lookback)
    minute_windows = windows(events, attributed)
    return {
        "final_watermark": iso(final_watermark),
        "attributions": attributed,
        "windows": minute_windows,
        "ctr_1h": campaign_ctr(minute_windows),
        "sessions": sessions(events, gap, final_watermark),
        "campaigns": campaigns(minute_windows),
    }
