"""The quality suites are valid Great Expectations 1.x expectations, one suite per table."""

from __future__ import annotations

import os

from app.tools.quality import suites
from pipelines import tables as t
from schemas import ad_event as c


def test_every_rule_is_a_gx_expectation_with_a_reason() -> None:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx

    for suite in suites():
        assert suite.rules, suite.table
        for rule in suite.rules:
            expectation = getattr(gx.expectations, rule.kind)(**rule.kwargs)
            assert expectation is not None and rule.why


def test_each_table_has_a_suite_and_quarantine_knows_every_reason() -> None:
    by_table = {s.table: s for s in suites()}
    assert {t.SILVER, t.GOLD_1M, t.CTR_1H, t.ATTRIBUTIONS, t.QUARANTINE, t.SESSIONS} <= set(
        by_table
    )
    (reason_rule,) = [r for r in by_table[t.QUARANTINE].rules if r.kwargs["column"] == "reason"]
    assert set(reason_rule.kwargs["value_set"]) == set(c.REASONS)
    assert c.QUALITY_EVENT_TIME_IN_FUTURE in c.REASONS
