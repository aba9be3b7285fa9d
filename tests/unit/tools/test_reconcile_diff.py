"""Reconcile's diff of a recomputed table with the stream's: a multiset difference both ways,
as ``exceptAll`` gives, so a lost row, a doubled row and a foreign row each count."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from app.tools.reconcile import table_diff


def test_lost_copies_doubled_and_foreign_rows_count_and_null_equals_null(spark: Any) -> None:
    schema = "ad_id string, clicks long, spend decimal(24,9)"
    a, b, c = ("a", 1, Decimal(2)), ("b", 0, Decimal(0)), ("c", 5, Decimal(1))
    want = spark.createDataFrame([a, a, a, b, (None, 3, None)], schema)
    got = spark.createDataFrame([a, b, b, c, (None, 3, None)], schema)
    d = table_diff("t", want, got)
    assert (d.table, d.rows, d.missing, d.unexpected) == ("t", 5, 2, 2)
    assert sorted(d.examples) == [
        "missing {'ad_id': 'a', 'clicks': 1, 'spend': Decimal('2.000000000')}",
        "unexpected {'ad_id': 'b', 'clicks': 0, 'spend': Decimal('0E-9')}",
        "unexpected {'ad_id': 'c', 'clicks': 5, 'spend': Decimal('1.000000000')}",
    ]
    same = table_diff("t", want, want)
    assert (same.ok, same.rows, same.examples) == (True, 5, [])


def test_examples_show_each_kind_of_difference_two_at_most(spark: Any) -> None:
    schema = "ad_id string, clicks long"
    want = spark.createDataFrame([("a", 1)], schema)
    got = spark.createDataFrame([(x, 1) for x in "bcdef"], schema)
    d = table_diff("t", want, got)
    assert (d.rows, d.missing, d.unexpected) == (5, 1, 5)
    assert sorted(e.split()[0] for e in d.examples) == ["missing", "unexpected", "unexpected"]
