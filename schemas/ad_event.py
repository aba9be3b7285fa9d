"""The ``ad_event.v1`` contract, derived from ``ad_event.v1.json`` (the one source of truth).

The JSON Schema file is what producers validate against; this module reads it and derives what
the Spark job needs: the typed fields, the per-event-type required and forbidden fields, and the
Spark ``StructType`` of a validated event. Nothing here needs a SparkSession to import (the
StructType is built on demand).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

# Read as a package resource: the package may run from a zip (`spark-submit --py-files`).
SCHEMA_FILE = resources.files(__package__).joinpath("ad_event.v1.json")
SCHEMA_VERSION = 1

# Why a record was quarantined. The first failing check names the record's reason, in this order.
OVERSIZED = "oversized"
MALFORMED_JSON = "malformed_json"
MISSING_FIELD = "missing_field"
BAD_TYPE = "bad_type"
UNKNOWN_EVENT_TYPE = "unknown_event_type"
UNSUPPORTED_SCHEMA_VERSION = "unsupported_schema_version"
UNEXPECTED_FIELD = "unexpected_field"
INVALID_VALUE = "invalid_value"
BAD_TIMESTAMP = "bad_timestamp"
NEGATIVE_REVENUE = "negative_revenue"
UNKNOWN_AD = "unknown_ad"
# The in-pipeline data-quality gate (app/tools/quality.py has the same rule as a GX expectation on
# silver): an event time this far ahead of the batch's own time is refused before it can move
# the watermark (one such record would make every honest record after it late).
FUTURE_TOLERANCE_S = 3600
QUALITY_EVENT_TIME_IN_FUTURE = "quality_event_time_not_in_future"
REASONS = (
    OVERSIZED,
    MALFORMED_JSON,
    MISSING_FIELD,
    BAD_TYPE,
    UNKNOWN_EVENT_TYPE,
    UNSUPPORTED_SCHEMA_VERSION,
    UNEXPECTED_FIELD,
    INVALID_VALUE,
    BAD_TIMESTAMP,
    NEGATIVE_REVENUE,
    QUALITY_EVENT_TIME_IN_FUTURE,
    UNKNOWN_AD,
)


@dataclass(frozen=True)
class Field:
    name: str
    json_types: tuple[str, ...]
    spark_type: str
    min_length: int | None
    max_length: int | None
    pattern: str | None


@dataclass(frozen=True)
class Contract:
    fields: tuple[Field, ...]
    required: tuple[str, ...]
    event_types: tuple[str, ...]
    required_by_type: dict[str, tuple[str, ...]]
    forbidden_by_type: dict[str, tuple[str, ...]]
    raw: dict[str, Any]

    def field(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name)


@cache
def contract() -> Contract:
    raw = json.loads(SCHEMA_FILE.read_text())
    props = raw["properties"]
    fields = tuple(
        Field(
            name=name,
            json_types=tuple(spec["type"]) if isinstance(spec["type"], list) else (spec["type"],),
            spark_type=spec["x-spark-type"],
            min_length=spec.get("minLength"),
            max_length=spec.get("maxLength"),
            pattern=spec.get("pattern"),
        )
        for name, spec in props.items()
    )
    required_by_type: dict[str, tuple[str, ...]] = {}
    forbidden_by_type: dict[str, tuple[str, ...]] = {}
    for rule in raw["allOf"]:
        event_type = rule["if"]["properties"]["event_type"]["const"]
        required_by_type[event_type] = tuple(rule["then"].get("required", ()))
        forbidden_by_type[event_type] = tuple(
            name for name, spec in rule["then"].get("properties", {}).items() if spec is False
        )
    return Contract(
        fields=fields,
        required=tuple(raw["required"]),
        event_types=tuple(props["event_type"]["enum"]),
        required_by_type=required_by_type,
        forbidden_by_type=forbidden_by_type,
        raw=raw,
    )


def spark_type(name: str) -> DataType:
    """The Spark type for an ``x-spark-type`` name (a small, closed set: no session needed)."""
    from pyspark.sql import types as T

    simple: dict[str, DataType] = {
        "string": T.StringType(),
        "timestamp": T.TimestampType(),
        "int": T.IntegerType(),
        "long": T.LongType(),
    }
    if name in simple:
        return simple[name]
    match = re.fullmatch(r"decimal\((\d+),(\d+)\)", name)
    if match:
        return T.DecimalType(int(match.group(1)), int(match.group(2)))
    raise ValueError(f"unsupported x-spark-type {name!r} in {SCHEMA_FILE.name}")


def event_struct() -> StructType:
    """The Spark schema of a validated event (``ad_event.v1``), built from the JSON Schema."""
    from pyspark.sql.types import StructField, StructType

    required = set(contract().required)
    return StructType(
        [
            StructField(f.name, spark_type(f.spark_type), nullable=f.name not in required)
            for f in contract().fields
        ]
    )
