"""`adattr consume`: the budget service downstream of the job."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.cli.commands import Add, Subcommands
from app.runtime.settings import Settings


def cmd_consume(args: argparse.Namespace, settings: Settings) -> int:
    from app.budget.consumer import BudgetMetrics, BudgetStore, consume, read_budgets_csv
    from app.runtime.kafka_io import KafkaConnection

    metrics = None
    if settings.metrics_port and (args.until_idle or not args.report):
        from app.runtime.metrics import serve

        metrics = BudgetMetrics()
        serve(metrics.registry, settings)
    store = BudgetStore(settings.consumer_db_url)
    try:
        if args.budgets:
            budgets = read_budgets_csv(Path(args.budgets))
            store.load_budgets(budgets)
            print(f"budgets: {len(budgets)} campaigns from {args.budgets}")
        if not args.report or args.until_idle:
            stats = consume(
                KafkaConnection.of(settings),
                settings.output_topic,
                store,
                until_idle=args.until_idle,
                idle_seconds=args.idle_seconds,
                crash_at=settings.crash_at,
                metrics=metrics,
            )
            print(
                f"consume: {stats.records:,} records, {stats.applied:,} applied, "
                f"{stats.ignored_older:,} older than what is stored (ignored), "
                f"{len(stats.alerts)} new budget alert(s)"
            )
        if args.report:
            print(f"{'campaign':<12} {'spend':>16} {'daily budget':>14}")
            for campaign, spend, budget in store.spend_per_campaign():
                shown = f"{budget:.2f}" if budget is not None else "-"
                print(f"{campaign:<12} {spend:>16.6f} {shown:>14}")
            alerts = store.alerts()
            print(f"budget alerts: {len(alerts)}")
            for campaign, day, spend, budget in alerts:
                print(f"  {campaign} {day}: spend {spend:.6f} >= daily budget {budget:.2f}")
    finally:
        store.close()
    return 0


def add_commands(sub: Subcommands, add: Add) -> None:
    consume_cmd = add(
        "consume",
        cmd_consume,
        "the budget service: read ad-metrics (read_committed) into a database, exactly once",
    )
    consume_cmd.add_argument(
        "--until-idle", action="store_true", help="stop when caught up (no record for a while)"
    )
    consume_cmd.add_argument(
        "--idle-seconds", type=float, default=5.0, help="how long 'idle' is (default 5)"
    )
    consume_cmd.add_argument("--report", action="store_true", help="print spend and alerts")
    consume_cmd.add_argument("--budgets", help="CSV campaign_id,daily_budget to load first")
