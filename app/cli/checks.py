"""`adattr verify | audit | reconcile | quality`: the tables against a truth file, the ledger's
invariants, a batch recomputation from bronze, the Great Expectations suites."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from app.cli.commands import Add, Subcommands
from app.runtime.errors import UserInputError
from app.runtime.settings import Settings


def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    from app.runtime.spark import build_spark
    from app.tools.verify import diff, observed

    try:
        truth = json.loads(Path(args.truth).read_text())
    except (OSError, ValueError) as exc:
        raise UserInputError(f"cannot read truth file {args.truth}: {exc}") from None
    spark = build_spark(settings, "adattr-verify")
    problems = diff(truth, observed(spark, settings.warehouse_uri))
    if problems:
        print(f"verify: {len(problems)} difference(s) from {args.truth}:")
        for line in problems[:50]:
            print(f"  {line}")
        return 1
    print(
        f"verify: OK: {truth['records']:,} records, {len(truth['windows']):,} windows, "
        f"{sum(truth['quarantine'].values()):,} quarantined, {truth['duplicates']:,} duplicates, "
        f"{truth['late']:,} late, {len(truth['attributions']):,} conversions "
        f"({sum(a['status'] == 'attributed' for a in truth['attributions']):,} attributed), "
        f"{len(truth['ctr_1h']):,} hourly CTR windows, {len(truth['sessions']):,} closed "
        f"sessions: the tables match {args.truth} exactly"
    )
    return 0


def cmd_audit(args: argparse.Namespace, settings: Settings) -> int:
    from app.runtime.kafka_io import KafkaConnection
    from app.runtime.spark import build_spark
    from app.tools.audit import audit
    from pipelines.job import current_generation

    spark = build_spark(settings, "adattr-audit")
    gen = current_generation(settings.checkpoints)
    checks = audit(spark, settings.warehouse_uri, KafkaConnection.of(settings))
    print(f"audit of every generation (current: {gen.number}, {gen.app_id}):")
    for check in checks:
        print(f"  {'OK    ' if check.ok else 'BREACH'} {check.name}: {check.detail}")
    breaches = sum(not check.ok for check in checks)
    print(f"audit: {len(checks)} checks, {breaches} breach(es)")
    return 1 if breaches else 0


def cmd_reconcile(args: argparse.Namespace, settings: Settings) -> int:
    from app.runtime.spark import build_spark
    from app.tools.reconcile import reconcile

    spark = build_spark(settings, "adattr-reconcile")
    started = time.monotonic()
    diffs = reconcile(
        spark,
        settings.warehouse_uri,
        max_bytes=settings.max_record_bytes,
        lookback_seconds=settings.attribution_lookback_seconds,
        session_gap_seconds=settings.session_gap_seconds,
    )
    print("reconcile: every table recomputed from bronze_ad_events in one batch job, vs the stream")
    for d in diffs:
        print(
            f"  {'OK  ' if d.ok else 'DIFF'} {d.table}: {d.rows:,} rows; "
            f"{d.missing:,} missing, {d.unexpected:,} unexpected"
        )
        for example in d.examples:
            print(f"         {example}")
    bad = sum(not d.ok for d in diffs)
    print(f"reconcile: {len(diffs)} tables, {bad} differ ({time.monotonic() - started:.1f}s)")
    return 1 if bad else 0


def cmd_quality(args: argparse.Namespace, settings: Settings) -> int:
    from app.runtime.spark import build_spark
    from app.tools.quality import run_quality

    spark = build_spark(settings, "adattr-quality")
    report = run_quality(
        spark,
        settings.warehouse_uri,
        settings.data_dir / "gx",
        lookback_seconds=settings.attribution_lookback_seconds,
    )
    failed = len(report.failures)
    print(f"quality: {report.checked} expectations checked, {failed} failed")
    for f in report.failures:
        print(f"  FAILED {f.table}: {f.expectation}: {f.why}")
        print(f"         unexpected: {f.unexpected}; e.g. {f.examples}")
    if report.docs is not None:
        print(f"Data Docs: file://{report.docs.resolve()}")
    return 1 if failed else 0


def add_commands(sub: Subcommands, add: Add) -> None:
    verify = add("verify", cmd_verify, "compare the tables with a truth file; non-zero on any diff")
    verify.add_argument("--truth", required=True, help="truth file from `adattr generate --truth`")
    add("audit", cmd_audit, "check the ledger's invariants against the tables and Kafka")
    add(
        "reconcile",
        cmd_reconcile,
        "recompute every table from bronze in batch mode and diff it with the stream's",
    )
    add(
        "quality",
        cmd_quality,
        "validate every table with the Great Expectations suites; writes Data Docs",
    )
