"""The bench's sustained rate (`adattr bench`): which batches it counts, and in what order the
variants run."""

from __future__ import annotations

import itertools
from typing import Any

from app.tools.bench import VARIANTS, run_order, sustained_rate


def _progress(*batches: tuple[int, int]) -> list[dict[str, Any]]:
    """Spark's progress of one batch per (records, milliseconds), batch of none included."""
    return [
        {"batchId": i, "numInputRows": n, "durationMs": {"triggerExecution": ms}}
        for i, (n, ms) in enumerate(batches)
    ]


def test_the_first_batch_and_the_topics_small_tail_are_left_out() -> None:
    # warm-up, three full batches (a batch of none among them), then the 200 records left
    got = sustained_rate(
        _progress((1000, 9000), (1000, 2000), (1000, 2000), (0, 500), (1000, 1000), (200, 1500))
    )
    assert (got["batches"], got["records_total"]) == (5, 4200)
    assert (got["records_measured"], got["seconds_measured"]) == (3000, 5.0)
    assert got["events_per_s"] == 600.0
    assert got["tail_records_excluded"] == 200
    assert got["batch_records_ms"][-1] == (200, 1500)  # kept in the result all the same


def test_a_last_batch_of_half_the_largest_or_more_is_counted() -> None:
    got = sustained_rate(_progress((1000, 9000), (1000, 2000), (500, 1000)))
    assert (got["records_measured"], got["seconds_measured"]) == (1500, 3.0)
    assert got["tail_records_excluded"] == 0


def test_the_one_batch_after_warm_up_is_counted_however_small() -> None:
    got = sustained_rate(_progress((1000, 9000), (80, 1000)))
    assert (got["records_measured"], got["events_per_s"]) == (80, 80.0)
    assert got["tail_records_excluded"] == 0


def test_the_sinks_own_counts_replace_sparks_double_count() -> None:
    progress = _progress((2000, 9000), (2000, 2000), (400, 1000))
    got = sustained_rate(progress, {0: 1000, 1: 1000, 2: 200})
    assert (got["records_total"], got["records_measured"]) == (2200, 1000)
    assert got["tail_records_excluded"] == 200


def test_no_variant_runs_twice_in_a_row_and_b3_runs_right_after_b2() -> None:
    reps = 7
    runs = [v for rep in range(reps) for v in run_order(VARIANTS, rep)]
    assert runs[:5] == list(VARIANTS)  # the first repeat in the order the table shows
    assert all(a != b for a, b in itertools.pairwise(runs)), runs
    for rep in range(reps):
        order = run_order(VARIANTS, rep)
        assert sorted(order) == sorted(VARIANTS)
        if rep < 4:
            assert order.index("B3") == order.index("B2") + 1, order
    assert run_order(("B3", "B1"), 1) == ["B1", "B3"]
