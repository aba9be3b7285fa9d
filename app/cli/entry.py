"""The ``adattr`` command line: settings are read here, once, and passed down; each command group's
module (``stack``, ``data``, ``job``, ``checks``, ``proofs``, ``budget``) adds its commands and
handlers, which call one function of the layers below. A user's error becomes one line.

Heavy imports (pyspark, confluent_kafka) happen inside the handlers, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from app.cli import budget, checks, data, job, proofs, stack
from app.cli.commands import Handler
from app.runtime.errors import UserInputError
from app.runtime.kafka_io import KafkaAccessError
from app.runtime.metrics import MetricsError
from app.runtime.settings import Settings, SettingsError
from app.runtime.spark import MissingJarsError, SparkStartError
from app.stack.broker import BrokerError
from app.stack.cluster import ClusterError

# The commands that connect to Kafka with the settings' credentials.
TALK_TO_KAFKA = {"generate", "run", "replay", "audit", "consume", "bench"}
# Errors a user can cause and fix (bad config, broker down, bad input files): one line each.
USER_ERRORS: tuple[type[Exception], ...] = (
    BrokerError,
    ClusterError,
    KafkaAccessError,
    MetricsError,
    MissingJarsError,
    SettingsError,
    SparkStartError,
    UserInputError,
)


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from app.tools.demo import run_demo

    return run_demo(settings, events=args.events, seed=args.seed, command=main)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="adattr",
        description="Real-time ad-event attribution with exactly-once results "
        "(Spark Structured Streaming + Delta Lake + Kafka). Settings come from ADATTR_* "
        "environment variables; see the README.",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="Spark's own output on the console too (ADATTR_VERBOSE=true); by default it goes to "
        "<data_dir>/logs/spark.log",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(handler=handler)
        return p

    for commands in (stack, data, job, checks, proofs, budget):
        commands.add_commands(sub, add)
    demo = add("demo", cmd_demo, "start Kafka, generate traffic, run the job, verify, summarise")
    demo.add_argument("--events", type=int, default=20_000)
    demo.add_argument("--seed", type=int, default=7)
    return parser


def _keep_kafka_client_lines_in_a_file(path: Path) -> None:
    """librdkafka's own lines (a connection retried, the broker a drill stopped, a client closed
    while a broker is away) tell an adattr user nothing the command does not say itself: they go
    to ``path``; the command's errors still reach the console as exceptions. --verbose: stderr."""
    from app.runtime.kafka_io import CLIENT_LOG

    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(message)s"))
    CLIENT_LOG.addHandler(handler)
    CLIENT_LOG.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verbose:  # in the environment, so that the jobs a command starts inherit it
        os.environ["ADATTR_VERBOSE"] = "true"
    logging.basicConfig(level=logging.INFO, format="  %(message)s", stream=sys.stderr)
    for noisy in ("py4j", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        settings = Settings.from_env(os.environ)
    except SettingsError as exc:
        print(f"adattr: bad setting: {exc}", file=sys.stderr)
        return 2
    if not settings.verbose:
        _keep_kafka_client_lines_in_a_file(settings.data_dir / "logs" / "kafka-clients.log")
    try:
        if args.command in TALK_TO_KAFKA and settings.kafka_security_protocol != "PLAINTEXT":
            from app.runtime.kafka_io import KafkaConnection, check_access

            check_access(KafkaConnection.of(settings))  # a wrong password or CA: say so at once
        return int(args.handler(args, settings))
    except USER_ERRORS as exc:
        print(f"adattr {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from confluent_kafka import KafkaException

        if isinstance(exc, KafkaException):  # e.g. the broker went away mid-command
            from app.runtime.kafka_io import KafkaConnection, explain

            print(
                f"adattr {args.command}: {explain(exc, KafkaConnection.of(settings))}",
                file=sys.stderr,
            )
            return 1
        raise
