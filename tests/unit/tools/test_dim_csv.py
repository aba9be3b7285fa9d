from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from app.runtime.errors import UserInputError
from app.tools.dim_csv import read_dim_csv, write_dim_csv

HEADER = "ad_id,campaign_id,advertiser_id,cpm,cpc\n"


def _csv(tmp_path: Path, body: str, header: str = HEADER) -> Path:
    path = tmp_path / "dim.csv"
    path.write_text(header + body)
    return path


def test_reads_and_round_trips(tmp_path: Path) -> None:
    rows = read_dim_csv(_csv(tmp_path, "ad-1,cmp-1,adv-1,2.5,0.300001\n\nad-2,cmp-1,adv-1,0,1\n"))
    assert rows == [
        ("ad-1", "cmp-1", "adv-1", Decimal("2.5"), Decimal("0.300001")),
        ("ad-2", "cmp-1", "adv-1", Decimal("0"), Decimal("1")),
    ]
    write_dim_csv(tmp_path / "out.csv", rows)
    assert read_dim_csv(tmp_path / "out.csv") == rows


@pytest.mark.parametrize(
    ("body", "header", "message"),
    [
        ("ad-1,cmp-1,adv-1,-1,1\n", HEADER, r"line 2: cpm must be a non-negative decimal"),
        ("ad-1,cmp-1,adv-1,1,0.1234567\n", HEADER, r"line 2: cpc must be .* at most 6"),
        ("ad-1,cmp-1,adv-1,1\n", HEADER, r"line 2: 4 fields, expected 5"),
        ("ad-1,c,a,1,1\nad-1,c,a,2,2\n", HEADER, r"line 3: ad_id 'ad-1' repeats line 2"),
        (",c,a,1,1\n", HEADER, r"line 2: ad_id must be 1-64 characters"),
        ("ad-1,c,a,1,1\n", "ad,campaign,advertiser,cpm,cpc\n", r"line 1 must be the header"),
        ("", HEADER, r"no data rows"),
    ],
)
def test_bad_csv_names_the_line(tmp_path: Path, body: str, header: str, message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        read_dim_csv(_csv(tmp_path, body, header))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="no such file"):
        read_dim_csv(tmp_path / "nope.csv")
