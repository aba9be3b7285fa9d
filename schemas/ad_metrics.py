"""The contract of the output topic (``ad-metrics``), shared by the job that publishes it and the
budget service that reads it; no Spark import, so a downstream service can depend on it alone.

Each record's key is ``<table>|<key values>`` and its value is UTF-8 JSON::

    {"record_id": sha256 hex, "table": <table>, "app_id": <generation's app id>,
     "generation": int, "batch_id": int, "row": {<key columns>, <value columns>}}

Timestamps are ISO-8601 UTC with milliseconds, money is a JSON number with every decimal kept
(read it with ``json.loads(..., parse_float=Decimal)``), and a null value is present as null.
"""

from __future__ import annotations

METRICS = "gold_ad_metrics_1m"
ATTRIBUTIONS = "gold_attributions"

# table -> (key columns, value columns)
PUBLISHED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    METRICS: (
        ("window_start", "ad_id"),
        (
            "window_end",
            "campaign_id",
            "advertiser_id",
            "impressions",
            "clicks",
            "spend",
            "conversions",
            "revenue",
            "is_final",
        ),
    ),
    ATTRIBUTIONS: (
        ("conversion_id",),
        (
            "conversion_time",
            "user_id",
            "advertiser_id",
            "revenue",
            "click_id",
            "click_time",
            "ad_id",
            "campaign_id",
            "status",
            "is_final",
        ),
    ),
}
