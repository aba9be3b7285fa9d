"""The job's tables: layout and properties, on real Delta tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from pipelines import tables as t

pytestmark = pytest.mark.integration


def _properties(spark: SparkSession, path: str) -> dict[str, str]:
    detail = DeltaTable.forPath(spark, path).detail().first()
    assert detail is not None
    return dict(detail.properties)


def _version(spark: SparkSession, path: str) -> int:
    last = DeltaTable.forPath(spark, path).history(1).first()
    assert last is not None
    return int(last.version)


def _created(spark: SparkSession, tmp_path: Path, key: str) -> tuple[str, dict[str, str | None]]:
    """A warehouse with every table, and each table's value of one property."""
    warehouse = str(tmp_path / "warehouse")
    t.create_tables(spark, warehouse)
    return warehouse, {
        table.name: _properties(spark, f"{warehouse}/{table.name}").get(key) for table in t.TABLES
    }


def test_a_table_made_by_an_earlier_version_gets_the_properties_it_lacks(
    spark: SparkSession, tmp_path: Path
) -> None:
    warehouse = str(tmp_path / "warehouse")
    path = f"{warehouse}/{t.GOLD_1M}"
    # As create_tables made it before gold tables had deletion vectors.
    DeltaTable.createIfNotExists(spark).location(path).addColumns(t.schema(t.GOLD_1M)).execute()
    assert "delta.enableDeletionVectors" not in _properties(spark, path)
    t.create_tables(spark, warehouse, (t.GOLD_1M, t.BRONZE))
    assert _properties(spark, path)["delta.enableDeletionVectors"] == "true"
    # Every property in place: a second call commits nothing, to either table.
    versions = {n: _version(spark, f"{warehouse}/{n}") for n in (t.GOLD_1M, t.BRONZE)}
    t.create_tables(spark, warehouse, (t.GOLD_1M, t.BRONZE))
    for n, v in versions.items():
        assert _version(spark, f"{warehouse}/{n}") == v, n
    assert _properties(spark, f"{warehouse}/{t.BRONZE}")["delta.checkpointInterval"] == "100"
    # Deletion vectors on the 1-minute table only: the other gold tables are cheaper without.
    t.create_tables(spark, warehouse, (t.ATTRIBUTIONS, t.CTR_1H))
    for n in (t.ATTRIBUTIONS, t.CTR_1H):
        assert "delta.enableDeletionVectors" not in _properties(spark, f"{warehouse}/{n}"), n


def test_delta_compacts_every_table_but_those_the_job_compacts_itself(
    spark: SparkSession, tmp_path: Path
) -> None:
    _, auto = _created(spark, tmp_path, "delta.autoOptimize.autoCompact")
    for table in t.TABLES:
        assert auto[table.name] == (None if table.name in t.RECORD_TABLES else "true"), table.name


def test_delta_keeps_statistics_only_on_the_columns_reads_filter_by(
    spark: SparkSession, tmp_path: Path
) -> None:
    warehouse, stats_columns = _created(spark, tmp_path, "delta.dataSkippingStatsColumns")
    for table in t.TABLES:
        named = stats_columns[table.name]
        if table.name in (t.DIM_ADS, t.LEDGER):  # tiny: Delta's default
            assert named is None, table.name
            continue
        assert named is not None, table.name
        columns = named.split(",")
        assert set(columns) <= set(t.columns(table.name)), table.name
        assert not set(columns) & set(table.partitioned_by), table.name
        assert {"generation", "batch_id"} <= set(columns), table.name
    # A silver append: its file's statistics cover those columns and no other.
    path = f"{warehouse}/{t.SILVER}"
    row = spark.sql(
        "SELECT 'e1' event_id, 'click' event_type, TIMESTAMP'2026-12-02 10:00:00' event_time, "
        "'u1' user_id, 'a1' ad_id, CAST(NULL AS STRING) impression_id, 'adv1' advertiser_id, "
        "CAST(NULL AS DECIMAL(18,6)) revenue, 1 schema_version, 'c1' campaign_id, "
        "CAST(1 AS DECIMAL(12,6)) cpm, CAST(1 AS DECIMAL(12,6)) cpc, "
        "CAST(1 AS DECIMAL(18,9)) cost, 0L dim_version, 'ad-events' kafka_topic, "
        "0 kafka_partition, 7L kafka_offset, TIMESTAMP'2026-12-02 10:00:01' kafka_timestamp, "
        "1 generation, 0L batch_id"
    )
    row.select(*t.columns(t.SILVER)).write.format("delta").mode("append").save(path)
    stats = [
        json.loads(r.stats)
        for r in spark.read.json(f"{path}/_delta_log/*.json")
        .where("add IS NOT NULL")
        .select("add.stats")
        .collect()
    ]
    assert len(stats) == 1 and stats[0]["numRecords"] == 1
    assert set(stats[0]["minValues"]) == set(str(stats_columns[t.SILVER]).split(","))
