"""Reading and checking a ``dim_ads`` CSV before anything touches Delta.

Every problem names its line, so a 10,000-row file with one bad price is fixed in one go.
"""

from __future__ import annotations

import csv
import re
from decimal import Decimal, InvalidOperation
from pathlib import Path

from app.runtime.errors import UserInputError

COLUMNS = ("ad_id", "campaign_id", "advertiser_id", "cpm", "cpc")
_PRICE = re.compile(r"^\d{1,6}(\.\d{1,6})?$")
DimRow = tuple[str, str, str, Decimal, Decimal]


def read_dim_csv(path: Path) -> list[DimRow]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserInputError(f"{path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise UserInputError(f"{path}: not UTF-8 ({exc})") from None
    reader = csv.reader(text.splitlines())
    header = next(reader, None)
    if header is None or tuple(h.strip() for h in header) != COLUMNS:
        raise UserInputError(
            f"{path}: line 1 must be the header {','.join(COLUMNS)}, got {','.join(header or [])!r}"
        )
    rows: list[DimRow] = []
    seen: dict[str, int] = {}
    problems: list[str] = []
    for line_no, cells in enumerate(reader, start=2):
        if not cells or all(not c.strip() for c in cells):
            continue
        if len(cells) != len(COLUMNS):
            problems.append(f"line {line_no}: {len(cells)} fields, expected {len(COLUMNS)}")
            continue
        ad_id, campaign_id, advertiser_id, cpm, cpc = (c.strip() for c in cells)
        for name, value in (
            ("ad_id", ad_id),
            ("campaign_id", campaign_id),
            ("advertiser_id", advertiser_id),
        ):
            if not 1 <= len(value) <= 64:
                problems.append(f"line {line_no}: {name} must be 1-64 characters, got {value!r}")
        prices = []
        for name, value in (("cpm", cpm), ("cpc", cpc)):
            if not _PRICE.match(value):
                problems.append(
                    f"line {line_no}: {name} must be a non-negative decimal with at most 6 "
                    f"decimal places, got {value!r}"
                )
                continue
            try:
                prices.append(Decimal(value))
            except InvalidOperation:
                problems.append(f"line {line_no}: {name} {value!r} is not a number")
        if ad_id in seen:
            problems.append(f"line {line_no}: ad_id {ad_id!r} repeats line {seen[ad_id]}")
        seen[ad_id] = line_no
        if len(prices) == 2:
            rows.append((ad_id, campaign_id, advertiser_id, prices[0], prices[1]))
    if problems:
        shown = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise UserInputError(
            f"{path}: {len(problems)} problem(s), nothing loaded:\n  {shown}{more}"
        )
    if not rows:
        raise UserInputError(f"{path}: no data rows after the header")
    return rows


def write_dim_csv(path: Path, rows: list[DimRow]) -> None:
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
