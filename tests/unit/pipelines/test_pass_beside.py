"""A keeping pass's writes beside the next batch (``pipelines.pass_beside``): the batch that joins
waits for them, gets their failure, and what follows a pass (forgetting the windows it covered)
runs only once it has landed."""

from __future__ import annotations

import logging
import threading

import pytest

from pipelines.lease import LeaseLost
from pipelines.pass_beside import PassBeside


def test_a_join_waits_for_the_pass_and_what_follows_it_runs_once_it_has_landed() -> None:
    beside = PassBeside()
    assert beside.join() == 0.0 and beside.batch_id is None  # none in flight: at once
    release, landed, order = threading.Event(), [], []

    def write() -> None:
        assert release.wait(10), "never released"
        order.append("written")

    beside.start(7, write, landed=lambda: landed.append(7))
    assert beside.batch_id == 7 and not landed  # in flight: nothing has landed
    with pytest.raises(AssertionError, match="one pass in flight"):
        beside.start(8, write, landed=lambda: None)
    threading.Timer(0.2, release.set).start()
    assert beside.join() > 0.0  # it waited for the write
    assert order == ["written"] and landed == [7] and beside.batch_id is None
    assert beside.join() == 0.0 and landed == [7]  # landed once


def test_a_failed_pass_fails_the_batch_that_joins_and_never_lands(
    caplog: pytest.LogCaptureFixture,
) -> None:
    beside = PassBeside()
    landed: list[int] = []

    def fails() -> None:
        raise ValueError("MERGE conflict")

    beside.start(5, fails, landed=lambda: landed.append(5))
    with pytest.raises(RuntimeError, match="the pass of batch 5 failed: MERGE conflict") as raised:
        beside.join()
    assert isinstance(raised.value.__cause__, ValueError) and not landed
    # A lost lease is said as it is: another job took the checkpoint over.
    lost = LeaseLost("the checkpoint's lease was taken over")

    def loses() -> None:
        raise lost

    beside.start(4, loses, landed=lambda: landed.append(4))
    with pytest.raises(LeaseLost) as raised_lost:
        beside.join()
    assert raised_lost.value is lost and not landed
    # A query that failed or stopped without its stop's pass only waits: the failure is logged.
    beside.start(6, fails, landed=lambda: landed.append(6))
    with caplog.at_level(logging.WARNING, logger="adattr.sink"):
        beside.settle()
    assert "the pass of batch 6 failed" in caplog.text and not landed
    assert beside.batch_id is None
