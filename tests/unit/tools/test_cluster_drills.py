"""How a cluster drill shares the live traffic among its faults."""

from __future__ import annotations

import pytest

from app.tools.cluster_drills import _shares


@pytest.mark.parametrize(
    ("slices", "n", "sizes"),
    [(6, 1, [6]), (6, 2, [3, 3]), (5, 2, [2, 3]), (3, 2, [1, 2]), (1, 2, [0, 1]), (0, 2, [0, 0])],
)
def test_the_slices_are_shared_in_order_the_last_fault_the_larger(
    slices: int, n: int, sizes: list[int]
) -> None:
    traffic = [[(str(i).encode(), b"")] for i in range(slices)]
    shares = _shares(traffic, n)
    assert [len(s) for s in shares] == sizes
    assert [x for share in shares for x in share] == traffic  # nothing lost, nothing twice
