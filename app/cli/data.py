"""`adattr dim load | generate`: the dimension from a CSV, and ad events (with a truth file) to
the input topic."""

from __future__ import annotations

import argparse
import json
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

from app.cli.commands import Add, Subcommands
from app.runtime.errors import UserInputError
from app.runtime.settings import Settings

if TYPE_CHECKING:
    from app.tools.generator import GenConfig


def cmd_dim_load(args: argparse.Namespace, settings: Settings) -> int:
    from app.runtime.spark import build_spark
    from app.tools.dim_csv import read_dim_csv
    from pipelines.dimension import upsert_dim_ads

    rows = read_dim_csv(Path(args.csv))  # all checks before Spark starts
    spark = build_spark(settings, "adattr-dim-load")
    version, total = upsert_dim_ads(spark, settings.warehouse_uri, rows)
    print(f"dim_ads: upserted {len(rows)} rows from {args.csv}; version {version}, {total} ads")
    return 0


def gen_config(args: argparse.Namespace, settings: Settings) -> GenConfig:
    from app.tools.generator import GenConfig

    cfg = GenConfig.for_settings(
        settings,
        events=args.events,
        seed=args.seed,
        users=args.users,
        ads=args.ads,
        duplicate_ratio=args.duplicate_ratio,
        late_ratio=args.late_ratio,
        malformed_ratio=args.malformed_ratio,
        step_ms=args.step_ms,
    )
    try:
        cfg.validate()
    except ValueError as exc:
        raise UserInputError(str(exc)) from None
    return cfg


def cmd_generate(args: argparse.Namespace, settings: Settings) -> int:
    from app.runtime.kafka_io import KafkaConnection, app_topics, ensure_topics
    from app.tools.dim_csv import write_dim_csv
    from app.tools.generator import plan_traffic, produce

    traffic = plan_traffic(gen_config(args, settings))
    if args.truth:
        Path(args.truth).write_text(json.dumps(traffic.truth, indent=1))
    if args.dim_csv:
        write_dim_csv(Path(args.dim_csv), traffic.dim_rows)
    if args.budgets_csv:
        # Every other campaign gets half of what it will spend: the budget service must alert.
        with Path(args.budgets_csv).open("w") as f:
            f.write("campaign_id,daily_budget\n")
            for i, (campaign, total) in enumerate(sorted(traffic.truth["campaigns"].items())):
                budget = Decimal(total["spend"]) * (Decimal("0.5") if i % 2 else Decimal(2))
                f.write(f"{campaign},{budget.quantize(Decimal('0.01'))}\n")
    records = {"all": traffic.main + traffic.tail, "main": traffic.main, "tail": traffic.tail}
    chosen = records[args.segment]
    kafka = KafkaConnection.of(settings)
    # The input topic only: a producer of ad events may see no other (ACLs on a secure broker).
    ensure_topics(kafka, [t for t in app_topics(settings) if t.name == settings.input_topic])
    produce(chosen, kafka, settings.input_topic, rate=args.rate)
    print(f"generate: {len(chosen):,} records ({args.segment}) to {settings.input_topic}")
    return 0


def add_commands(sub: Subcommands, add: Add) -> None:
    dim = sub.add_parser("dim", help="manage the dim_ads dimension", description="manage dim_ads")
    dim_sub = dim.add_subparsers(dest="dim_command", required=True, metavar="ACTION")
    load = dim_sub.add_parser(
        "load",
        help="upsert a CSV (ad_id,campaign_id,advertiser_id,cpm,cpc) into dim_ads",
        description="upsert a CSV (ad_id,campaign_id,advertiser_id,cpm,cpc) into dim_ads",
    )
    load.add_argument("csv", help="CSV file with a header row")
    load.set_defaults(handler=cmd_dim_load)

    gen = add("generate", cmd_generate, "produce realistic ad events (and a truth file)")
    gen.add_argument("--events", type=int, default=10_000, help="records in the main segment")
    gen.add_argument("--seed", type=int, default=7, help="same seed, same events")
    gen.add_argument("--rate", type=float, default=None, help="records/s (default: max speed)")
    gen.add_argument("--duplicate-ratio", type=float, default=0.02)
    gen.add_argument("--late-ratio", type=float, default=0.001)
    gen.add_argument("--malformed-ratio", type=float, default=0.01)
    gen.add_argument("--users", type=int, default=500)
    gen.add_argument("--ads", type=int, default=50)
    gen.add_argument(
        "--step-ms",
        type=int,
        default=200,
        help="event time between consecutive records (default 200: 20k records span ~67 min)",
    )
    gen.add_argument("--truth", help="write the expected results to this JSON file")
    gen.add_argument("--dim-csv", help="write the matching dim_ads CSV to this file")
    gen.add_argument(
        "--budgets-csv", help="write daily budgets per campaign (half of them too small)"
    )
    gen.add_argument(
        "--segment",
        choices=("all", "main", "tail"),
        default="all",
        help="main: everything but the late events; tail: only the late events, to send "
        "after the job has processed main (so they are late whatever the batch boundaries)",
    )
