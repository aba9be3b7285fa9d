"""The batch's phase timer: marks one after another, and a phase split in two."""

from __future__ import annotations

import pytest

from pipelines import timing
from pipelines.timing import StepTimer


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(timing.time, "monotonic", c)
    return c


def test_a_split_phase_gives_its_part_and_the_rest_of_the_time_since_the_last_mark(
    clock: _Clock,
) -> None:
    timer = StepTimer()
    clock.now += 2.0
    timer.mark("gold")
    clock.now += 1.5
    timer.mark_split("changed_rows", 0.25, "kafka")
    assert timer.steps == {"gold": 2.0, "changed_rows": 0.25, "kafka": 1.25}
    clock.now += 0.5  # the next mark counts from the split's end
    timer.mark("ledger")
    assert timer.steps["ledger"] == 0.5


def test_a_part_longer_than_the_phase_is_capped_so_the_phases_still_add_up(clock: _Clock) -> None:
    timer = StepTimer()
    clock.now += 1.0
    timer.mark_split("changed_rows", 3.0, "kafka")
    assert timer.steps == {"changed_rows": 1.0, "kafka": 0.0}
