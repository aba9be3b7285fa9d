"""Pure transforms of the attribution job: ``DataFrame -> DataFrame``, the same on a batch frame
and on a streaming one, with no I/O.

Parsing uses Spark's VARIANT functions (``try_parse_json``, ``schema_of_variant``) so that JSON
types are checked strictly (a number where a string belongs is ``bad_type``, not silently
converted) by native expressions, without a Python UDF on the hot path. Every record gets either
typed event columns or a ``reject_reason``; nothing is dropped here.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from schemas import ad_event as c

AD_EVENT_TYPES = ("impression", "click")
# Outcomes of a contract-valid record, beside the quarantine reasons.
LATE = "late"
DUPLICATE = "duplicate"
ACCEPTED = "accepted"

_INTEGER_TYPES = ("TINYINT", "SMALLINT", "INT", "BIGINT")


def with_kafka_coordinates(kafka: DataFrame) -> DataFrame:
    """Kafka source rows -> named coordinates plus the exact key and value bytes."""
    return kafka.select(
        F.col("topic").alias("kafka_topic"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        F.col("key").alias("raw_key"),
        F.col("value").alias("raw_value"),
    )


def _json_type(name: str) -> Column:
    """The VARIANT type of a top-level field: 'STRING', 'BIGINT', 'DECIMAL(2,1)', 'NULL' (absent),
    'VOID' (JSON null), ... (a column ``parse_events`` computes once per record)."""
    return F.col(f"_t_{name}")


def _present(name: str) -> Column:
    return ~_json_type(name).isin("NULL", "VOID") & _json_type(name).isNotNull()


def _type_allowed(json_types: tuple[str, ...], t: Column) -> Column:
    is_integer = t.isin(*_INTEGER_TYPES) | t.rlike(r"^DECIMAL\(\d+,0\)$")
    checks = {
        "string": t == "STRING",
        "integer": is_integer,
        "number": is_integer | (t == "DOUBLE") | t.startswith("DECIMAL"),
    }
    allowed = F.lit(False)
    for json_type in json_types:
        allowed = allowed | checks[json_type]
    return allowed


def _any(conditions: list[Column]) -> Column:
    result = F.lit(False)
    for cond in conditions:
        result = result | cond
    return result


def _text(name: str) -> Column:
    """A top-level field as text (a column ``parse_events`` computes once per record)."""
    return F.col(f"_s_{name}")


_TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSX"


def parse_events(
    *, max_bytes: int, quality_gate: bool = True, now: Column | None = None
) -> Callable[[DataFrame], DataFrame]:
    """Adds the typed ``ad_event.v1`` columns and ``reject_reason`` (null when valid).

    Checks run in a fixed order and the first failing one names the reason, so a record has
    exactly one reason and the counts per reason add up. An event time more than
    ``FUTURE_TOLERANCE_S`` ahead of ``now`` is refused: by default ``current_timestamp()``,
    which in a streaming query is the micro-batch's own timestamp (from the offset log), so a
    re-executed batch decides the same; a batch job deciding records a stream read long ago
    (``adattr reconcile``) gives each record its batch's timestamp.
    """
    contract = c.contract()
    fields = {f.name: f for f in contract.fields}
    revenue_pattern = fields["revenue"].pattern or ""
    time_pattern = fields["event_time"].pattern or ""
    event_type = _text("event_type")

    def required_missing(names: tuple[str, ...]) -> Column:
        return _any([~_present(n) for n in names])

    checks: list[tuple[str, Column]] = [
        (c.OVERSIZED, F.octet_length("raw_value") > max_bytes),
        (
            c.MALFORMED_JSON,
            F.col("_v").isNull() | ~F.col("_t").startswith("OBJECT"),
        ),
        (c.MISSING_FIELD, required_missing(contract.required)),
        (
            c.BAD_TYPE,
            _any(
                [
                    _present(f.name) & ~_type_allowed(f.json_types, _json_type(f.name))
                    for f in contract.fields
                ]
            ),
        ),
        (c.UNKNOWN_EVENT_TYPE, ~event_type.isin(*contract.event_types)),
        (
            c.UNSUPPORTED_SCHEMA_VERSION,
            F.expr("try_variant_get(_v, '$.schema_version', 'bigint')") != c.SCHEMA_VERSION,
        ),
        (
            c.MISSING_FIELD,
            _any(
                [
                    (event_type == t) & required_missing(names)
                    for t, names in contract.required_by_type.items()
                ]
            ),
        ),
        (
            c.UNEXPECTED_FIELD,
            _any(
                [
                    (event_type == t) & _any([_present(n) for n in names])
                    for t, names in contract.forbidden_by_type.items()
                ]
            ),
        ),
        (
            c.INVALID_VALUE,
            _any(
                [
                    _present(f.name)
                    & ~F.char_length(_text(f.name)).between(f.min_length or 0, f.max_length)
                    for f in contract.fields
                    if f.max_length is not None
                ]
            ),
        ),
        (
            c.BAD_TIMESTAMP,
            ~_text("event_time").rlike(time_pattern) | F.col("_ts").isNull(),
        ),
        (c.NEGATIVE_REVENUE, _present("revenue") & _text("revenue").startswith("-")),
        (
            c.QUALITY_EVENT_TIME_IN_FUTURE,
            F.col("_ts")
            > (F.current_timestamp() if now is None else now)
            + F.expr(f"INTERVAL {c.FUTURE_TOLERANCE_S} SECONDS"),
        ),
        (c.INVALID_VALUE, _present("revenue") & ~_text("revenue").rlike(revenue_pattern)),
    ]
    # Off for records the gate passed already (``refused_events``) and for measuring what it
    # costs (infra/bench/quality_gate.py).
    if not quality_gate:
        checks = [(code, cond) for code, cond in checks if code != c.QUALITY_EVENT_TIME_IN_FUTURE]
    reason = F.coalesce(*[F.when(cond, F.lit(code)) for code, cond in checks])

    def typed(name: str) -> Column:
        spark_type = fields[name].spark_type
        if spark_type == "timestamp":
            return (
                F.col("_ts")
                if name == "event_time"
                else F.try_to_timestamp(_text(name), F.lit(_TIMESTAMP_FORMAT))
            )
        if spark_type == "string":
            return _text(name)
        if spark_type.startswith("decimal"):
            return F.expr(f"try_cast(_s_{name} AS {spark_type})")
        return F.expr(f"try_variant_get(_v, '$.{name}', '{spark_type}')")

    names = [f.name for f in contract.fields]

    def transform(df: DataFrame) -> DataFrame:
        parsed = df.withColumn(
            "_v",
            F.when(
                F.expr("is_valid_utf8(raw_value)"),
                F.expr("try_parse_json(CAST(raw_value AS STRING))"),
            ),
        )
        # Each field's VARIANT type and text, and the event time, once per record, in a
        # projection of their own: the checks refer to each several times, inside conditional
        # branches where Spark's subexpression elimination does not reach, and computing them
        # there cost ~2 s of a 25,000-record batch, twice (README "Performance").
        fielded = parsed.select(
            "*",
            F.expr("schema_of_variant(_v)").alias("_t"),
            *[
                F.expr(f"schema_of_variant(variant_get(_v, '$.{n}'))").alias(f"_t_{n}")
                for n in names
            ],
            *[F.expr(f"try_variant_get(_v, '$.{n}', 'string')").alias(f"_s_{n}") for n in names],
        ).withColumn("_ts", F.try_to_timestamp(_text("event_time"), F.lit(_TIMESTAMP_FORMAT)))
        checked = fielded.withColumn("reject_reason", reason)
        valid = F.col("reject_reason").isNull()
        return checked.select(
            *df.columns,
            *[F.when(valid, typed(f.name)).alias(f.name) for f in contract.fields],
            "reject_reason",
        )

    return transform


def refused_events(quarantine: DataFrame) -> DataFrame:
    """The quarantine's ``unknown_ad`` rows with their ``event_id`` and ``event_time``: events
    the dedup state let through and the dimension then refused. Parsed again from their bytes
    by ``parse_events``, as the stream parsed them; they passed its checks then, so neither
    the size limit nor the quality gate (today's time) applies."""
    return quarantine.where(F.col("reason") == c.UNKNOWN_AD).transform(
        parse_events(max_bytes=2**31 - 1, quality_gate=False)
    )


def first_sightings(*, watermark_delay: str) -> Callable[[DataFrame], DataFrame]:
    """The stateful step: of the valid records, the first sighting of each ``event_id``.

    ``dropDuplicatesWithinWatermark`` keeps each id in the state store until the watermark passes
    its event time plus the delay, and drops records behind the watermark (which the sink
    classifies as late itself, so none is lost). Only coordinates come out: the sink joins them
    back to the full records.
    """

    def transform(parsed: DataFrame) -> DataFrame:
        return (
            parsed.where(F.col("reject_reason").isNull())
            .select("kafka_topic", "kafka_partition", "kafka_offset", "event_id", "event_time")
            .withWatermark("event_time", watermark_delay)
            .dropDuplicatesWithinWatermark(["event_id"])
            .select("kafka_topic", "kafka_partition", "kafka_offset")
        )

    return transform


def late_before(watermark_ms: int, settled_ms: int) -> int:
    """The watermark a batch decides the lateness of records no generation read before under:
    its own, or, while a replay's (from zero) is behind it, the latest watermark a batch of any
    generation was planned under (``pipelines.offset_log.latest_watermark``). Such a record is
    then late wherever a batch of the generation before would have made it late, so no window
    a batch has made final takes a new event; a plain restart's batches run at or past it
    anyway. The ledger keeps it as the batch's watermark: the records bronze keeps under the
    batch are those (a re-read record keeps its first reader's), which ``adattr reconcile``
    classifies under it."""
    return max(watermark_ms, settled_ms)


def lateness(watermark_ms: int, settled_ms: int, read_before: str | None) -> Column:
    """Per record, the watermark (epoch ms) its lateness is decided under: ``late_before`` for
    a record no generation read; none (null) for one an earlier generation read
    (``read_before``, a condition on its coordinates). Its first reader's decision stands: the
    accepted, late and quarantined ones are ``prior`` decisions, and a record with none was a
    duplicate then, which it stays however the replay's batches and watermark fall."""
    floor = F.lit(late_before(watermark_ms, settled_ms))
    if read_before is None:
        return floor
    return F.when(F.expr(read_before), F.lit(None).cast("long")).otherwise(floor)


def classify(
    parsed: DataFrame,
    firsts: DataFrame,
    *,
    watermark_ms: int | Column,
    prior: DataFrame | None = None,
    stored: DataFrame | None = None,
) -> DataFrame:
    """Adds ``outcome``: the quarantine reason, ``late``, ``duplicate`` or ``accepted``.

    A valid record is late when its event time is at or behind this batch's watermark (in a
    replay, per record, ``lateness``: at least the latest one planned for a record no
    generation read, none for one an earlier generation read, whose decision ``prior`` holds
    or which was a duplicate): the stateful operator drops only
    records behind a watermark at most this high, so every record it dropped for lateness is
    classified late here, and every other valid record it did not emit is a duplicate.

    ``prior`` (coordinates and ``prior_outcome``) holds the decisions an earlier checkpoint
    generation already made for records this batch reads again (a replay): they stand, so a
    record is never late in one generation and accepted in another, nor quarantined as
    ``unknown_ad`` in one and accepted in another whose dimension has the ad by then. A
    replay's watermark restarts from zero and its batches differ, so deciding afresh could
    disagree.

    ``stored`` (``event_id``, ``stored_at`` coordinates, ``stored_outcome``) lists events whose
    first copy was already decided: accepted, or quarantined as ``unknown_ad`` (the dimension
    check comes after the dedup state). A record of one of them read elsewhere is a duplicate
    even when the dedup state, which starts empty in a replay's new checkpoint, has never seen
    it; the record read there keeps its outcome even when the dedup state picks another copy
    this time (copies in two partitions reach it in any order).
    """
    keys = ["kafka_topic", "kafka_partition", "kafka_offset"]
    # One watermark for a micro-batch; a column (each row's batch's) when reconciling.
    watermark = F.timestamp_millis(
        watermark_ms if isinstance(watermark_ms, Column) else F.lit(watermark_ms)
    )
    marked = firsts.select(*keys, F.lit(True).alias("_first"))
    joined = parsed.join(marked, keys, "left")
    outcome = F.when(F.col("reject_reason").isNotNull(), F.col("reject_reason"))
    if prior is not None:
        joined = joined.join(prior.select(*keys, "prior_outcome"), keys, "left")
        outcome = outcome.when(F.col("prior_outcome").isNotNull(), F.col("prior_outcome"))
    outcome = outcome.when(F.col("event_time") <= watermark, F.lit(LATE))
    if stored is not None:
        here = F.struct(*keys)
        # One row per event id, the same in every attempt of a batch (the tables can hold an
        # event twice: in silver and in the quarantine, or at two offsets): the lowest
        # coordinates'.
        first_stored = stored.groupBy("event_id").agg(
            F.min(F.struct("stored_at", "stored_outcome")).alias("_stored")
        )
        joined = joined.join(
            first_stored.select("event_id", "_stored.stored_at", "_stored.stored_outcome"),
            "event_id",
            "left",
        )
        # The event was decided: as this very record (a re-executed batch's earlier attempt
        # decided it, whichever copy the dedup state picks this time) or as another.
        outcome = outcome.when(F.col("stored_at") == here, F.col("stored_outcome")).when(
            F.col("stored_at").isNotNull(), F.lit(DUPLICATE)
        )
    outcome = outcome.when(F.col("_first").isNull(), F.lit(DUPLICATE)).otherwise(F.lit(ACCEPTED))
    return joined.withColumn("outcome", outcome).drop(
        "_first", "prior_outcome", "stored_at", "stored_outcome"
    )


def enrich(classified: DataFrame, dim_ads: DataFrame) -> DataFrame:
    """Joins accepted impressions and clicks to ``dim_ads`` (campaign, advertiser, prices) and
    turns an accepted ad event whose ``ad_id`` is not in the dimension into ``unknown_ad``.

    ``cost`` is what the event is billed: cpm / 1000 for an impression, cpc for a click, in exact
    decimals (a multiplication by the literal 0.001 keeps every digit).
    """
    dim = dim_ads.select(
        "ad_id",
        F.col("campaign_id"),
        F.col("advertiser_id").alias("_dim_advertiser_id"),
        "cpm",
        "cpc",
        F.lit(True).alias("_known"),
    )
    is_ad_event = F.col("event_type").isin(*AD_EVENT_TYPES)
    joined = classified.join(F.broadcast(dim), "ad_id", "left")
    outcome = F.when(
        (F.col("outcome") == ACCEPTED) & is_ad_event & F.col("_known").isNull(),
        F.lit(c.UNKNOWN_AD),
    ).otherwise(F.col("outcome"))
    cost = (
        F.when(
            F.col("event_type") == "impression", F.col("cpm") * F.lit(0.001).cast("decimal(4,3)")
        )
        .when(F.col("event_type") == "click", F.col("cpc"))
        .cast("decimal(18,9)")
    )
    return (
        joined.withColumn("outcome", outcome)
        .withColumn("advertiser_id", F.coalesce("_dim_advertiser_id", "advertiser_id"))
        .withColumn("cost", cost)
        .drop("_dim_advertiser_id", "_known")
    )
