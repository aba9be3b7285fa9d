"""Idempotent Delta writes.

Delta records, per table, the highest ``txnVersion`` committed for each ``txnAppId`` (a
``SetTransaction`` action in the same commit as the data), and skips a write whose version is not
above it. For MERGE only the *session* settings carry the pair (writer options are for appends),
so they are set around the one write and cleared at once: a second write in the same session must
never inherit them. The app id must change whenever batch ids restart (a new checkpoint), or
Delta would silently skip real writes; callers derive it from the checkpoint generation.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"


@contextmanager
def delta_txn(spark: SparkSession, app_id: str, version: int) -> Iterator[None]:
    """Within the block, Delta writes of this session carry (app_id, version)."""
    spark.conf.set(TXN_APP_ID, app_id)
    spark.conf.set(TXN_VERSION, str(version))
    try:
        yield
    finally:
        spark.conf.unset(TXN_APP_ID)
        spark.conf.unset(TXN_VERSION)
