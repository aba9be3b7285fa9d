"""Where a soak's growth is: each step's median over the first and the last sixth of its data
batches, from the sink's log lines (``adattr.sink batch N: <counts> | <phases> (<steps>)``).

    .venv/bin/python infra/bench/soak_steps.py .adattr/bench/<run>/soak.log [<other run's log>]

A step missing from every batch of a sixth prints as ``-``. Batches without accepted events
(a moved watermark only) are left out: their cost is the fixed cost's, not the data's.
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

STEPS = (
    "read",
    "attributions_computed",
    "read+state+classify",
    "records",
    "gold_attributions:source",
    "gold_attributions:source+kept",
    "gold_attributions:kept",
    "gold_attributions:merge",
    "gold_ad_metrics_1m:published",
    "gold_ad_metrics_1m:merge",
    "gold_campaign_ctr_1h:merge",
    "gold_user_sessions",
    "latest_clicks",
    "gold",
    "kafka",
    "ledger",
)


def value(line: str, step: str) -> float | None:
    found = re.search(rf"[ (]{re.escape(step)}=([0-9.,]+)s?\b", line)
    return float(found.group(1).replace(",", "")) if found else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", type=Path)
    for log in parser.parse_args().logs:
        batches = [
            line
            for line in log.read_text().splitlines()
            if "adattr.sink batch" in line and (value(line, "accepted") or 0) > 0
        ]
        sixth = max(1, len(batches) // 6)
        print(f"{log}: {len(batches)} data batches, a sixth = {sixth}")
        for name, part in (("first", batches[:sixth]), ("last", batches[-sixth:])):
            cells = []
            for step in STEPS:
                found = [v for v in (value(line, step) for line in part) if v is not None]
                cells.append(f"{step}={statistics.median(found):,.2f}" if found else f"{step}=-")
            print(f"  {name:5} " + " ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
