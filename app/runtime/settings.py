"""Typed settings, read once at the CLI edge from ``ADATTR_*`` environment variables.

Every setting has a loopback/local default so that the embedded stack (local Spark, a local
Kafka broker, Delta on local disk) works with no configuration at all. An ``ADATTR_*`` variable
that is not a known setting, or a value that does not parse, is rejected with a message naming
the variable: a typo must never silently fall back to a default.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

PREFIX = "ADATTR_"
# Read by shell scripts (infra/setup.sh), not by the application; accepted so they do not trip
# the unknown-variable check.
SCRIPT_ONLY = frozenset({"ADATTR_PYTHON"})
STATE_STORES = ("rocksdb", "hdfs")
DELIVERIES = ("exactly-once", "at-least-once")
COMPACTIONS = ("job", "delta", "off")
KAFKA_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
_DURATION = re.compile(r"^\s*(\d+)\s*(second|minute|hour|day)s?\s*$")
_UNIT_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


class SettingsError(ValueError):
    """A setting is unknown or malformed; the message names the variable and the fix."""


_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


# The checkout adattr runs from (app/runtime/settings.py is two folders below it): where infra/
# and app/submit.py live for the tools that need them.
REPO_ROOT = Path(__file__).resolve().parents[2]


def parse_duration_seconds(text: str) -> int:
    """``'10 minutes'`` -> 600. Raises ``ValueError`` on anything else."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"expected '<n> seconds|minutes|hours|days', got {text!r}")
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


@dataclass(frozen=True)
class Settings:
    bootstrap_servers: str = field(
        default="127.0.0.1:9092", metadata={"doc": "Kafka bootstrap servers (host:port,...)"}
    )
    kafka_security_protocol: str = field(
        default="PLAINTEXT",
        metadata={"doc": "how every Kafka client connects: " + ", ".join(KAFKA_PROTOCOLS)},
    )
    kafka_sasl_mechanism: str = field(
        default="",
        metadata={"doc": "SASL_* only: " + ", ".join(SASL_MECHANISMS)},
    )
    kafka_sasl_username: str = field(default="", metadata={"doc": "SASL_* only: the user"})
    kafka_sasl_password: str = field(
        default="",
        repr=False,
        metadata={"doc": "SASL_* only: the password, from the environment (never an argument)"},
    )
    kafka_sasl_password_file: str = field(
        default="",
        metadata={"doc": "SASL_* only: a file whose first line is the password"},
    )
    kafka_ssl_ca_file: str = field(
        default="",
        metadata={"doc": "SSL/SASL_SSL: PEM file of the CA(s) to trust (default: the system's)"},
    )
    kafka_ssl_client_pem: str = field(
        default="",
        metadata={
            "doc": "SSL/SASL_SSL, mutual TLS: one PEM file with the client's certificate chain "
            "and its unencrypted PKCS#8 private key"
        },
    )
    # A string, not a Path: a URI (s3a://bucket/x) must keep its "//", which Path collapses.
    warehouse: str = field(
        default="warehouse",
        metadata={
            "doc": "root of the Delta tables: <warehouse>/<table>; a local folder, or a URI "
            "Hadoop's file systems read (s3a://, abfss://, gs://, hdfs://)"
        },
    )
    checkpoints: Path = field(
        default=Path("checkpoints"), metadata={"doc": "root of the streaming checkpoints"}
    )
    input_topic: str = field(default="ad-events", metadata={"doc": "topic the ad events arrive on"})
    output_topic: str = field(default="ad-metrics", metadata={"doc": "topic the metrics go out on"})
    control_topic: str = field(
        default="adattr-control", metadata={"doc": "compacted topic of per-batch commit markers"}
    )
    input_partitions: int = field(default=4, metadata={"doc": "partitions of the input topic"})
    data_dir: Path = field(
        default=Path(".adattr"), metadata={"doc": "local broker data, logs and pid files"}
    )
    jars_dir: Path = field(
        default=REPO_ROOT / "infra" / ".jars",
        metadata={"doc": "where infra/fetch-jars.sh put the JVM jars"},
    )
    kafka_controller_port: int = field(
        default=9093, metadata={"doc": "KRaft controller port of the local broker"}
    )
    cluster_port: int = field(
        default=19400,
        metadata={
            "doc": "first of the ten loopback ports of `adattr cluster up` (three Kafka nodes, "
            "their controllers, the Spark master and its UI, two worker UIs)"
        },
    )
    spark_master: str = field(default="local[*]", metadata={"doc": "Spark master URL"})
    spark_driver_memory: str = field(default="2g", metadata={"doc": "driver JVM heap"})
    spark_ui: bool = field(default=False, metadata={"doc": "start the Spark UI"})
    spark_codegen: bool = field(
        default=False,
        metadata={
            "doc": "let Spark compile Java for each query stage and projection (its default); "
            "off: interpreted, cheaper for micro-batches of thousands of rows"
        },
    )
    compaction: str = field(
        default="job",
        metadata={
            "doc": "who rewrites a table's small files into files of up to 8 MB once "
            "ADATTR_COMPACT_FILES have piled up: job (the tables a batch appends its records to, "
            "by the job itself right after those writes, in a session of its own with compiled "
            "code; the others by Delta's auto compaction, and by the job at a run's first batch "
            "when earlier runs left that many), delta (Delta's auto compaction "
            "of every table, in the thread that wrote it), off (files pile up, one or more per "
            "table per batch)"
        },
    )
    compact_files: int = field(
        default=50,
        metadata={"doc": "the files a table gathers before its small ones are compacted"},
    )
    hourly_every: int = field(
        default=5,
        metadata={
            "doc": "the sliding-hour table (published to no one) is brought up to date by every "
            "this many batches, by a run's first batch and at its stop; 1: by every batch"
        },
    )
    local_file_system: bool = field(
        default=True,
        metadata={
            "doc": "on a local master, Hadoop's local file system answering through java.nio "
            "what it otherwise answers by starting a readlink or chmod process (~200 per "
            "micro-batch without Hadoop's native library); off: Hadoop's own"
        },
    )
    jvm_class_archive: bool = field(
        default=True,
        metadata={
            "doc": "start the driver JVM from the class-data archive set-up made "
            "(JDK CDS, infra/.jars/cds/): 5-7 s faster starts; off: a plain start"
        },
    )
    jvm_options: str = field(
        default="",
        metadata={
            "doc": "extra options for every JVM adattr starts (the Spark driver and executors, "
            "Kafka nodes, the local cluster's daemons), space-separated; e.g. "
            "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m (C1 only: cheaper short "
            "runs, slower long ones; the tests set it); the driver runs Parallel GC unless "
            "these name a collector"
        },
    )
    verbose: bool = field(
        default=False,
        metadata={
            "doc": "the Spark JVM's own output (its warnings, log4j lines) on the console; off: "
            "in <data_dir>/logs/spark.log, the console shows adattr's lines and errors"
        },
    )
    shuffle_partitions: int = field(
        default=4, metadata={"doc": "spark.sql.shuffle.partitions (and state store partitions)"}
    )
    state_store: str = field(
        default="rocksdb", metadata={"doc": "state store backend: rocksdb (default) or hdfs"}
    )
    watermark_delay: str = field(
        default="10 minutes", metadata={"doc": "event-time watermark delay (dedup, late data)"}
    )
    max_record_bytes: int = field(
        default=16384, metadata={"doc": "Kafka values larger than this are quarantined"}
    )
    max_offsets_per_trigger: int = field(
        default=0, metadata={"doc": "cap on records per micro-batch (0 = no cap)"}
    )
    trigger_interval: str = field(
        default="1 second", metadata={"doc": "processing-time trigger of 'adattr run'"}
    )
    attribution_lookback: str = field(
        default="24 hours",
        metadata={"doc": "how far before a conversion its click may be (last-click attribution)"},
    )
    session_gap: str = field(
        default="30 minutes", metadata={"doc": "inactivity gap that closes a user session"}
    )
    checkpoint_lease: str = field(
        default="30 seconds",
        metadata={
            "doc": "the job's lease on its checkpoint (one job per checkpoint across machines): "
            "renewed every third of it; a holder that misses renewals stops writing"
        },
    )
    transactional_id: str = field(
        default="",
        metadata={
            "doc": "Kafka transactional.id of the job's publisher (default: derived from the "
            "topics, stable across restarts so a restart fences the previous instance)"
        },
    )
    consumer_db: str = field(
        default="",
        metadata={"doc": "database of `adattr consume` (default sqlite:///<data_dir>/budget.db)"},
    )
    metrics_port: int = field(
        default=0,
        metadata={
            "doc": "port of the Prometheus endpoint of `adattr run` and `adattr consume` (0: none)"
        },
    )
    metrics_host: str = field(
        default="127.0.0.1",
        metadata={"doc": "address the metrics endpoint listens on (loopback unless changed)"},
    )
    delivery: str = field(
        default="exactly-once",
        metadata={
            "doc": "exactly-once (default), or at-least-once: plain appends and a plain Kafka "
            "producer, no idempotency machinery; for the benchmark's B2 baseline only"
        },
    )
    crash_at: str = field(
        default="",
        metadata={"doc": "drills and tests only: name[:n],... of crash points to SIGKILL at"},
    )

    @property
    def watermark_delay_seconds(self) -> int:
        return parse_duration_seconds(self.watermark_delay)

    @property
    def attribution_lookback_seconds(self) -> int:
        return parse_duration_seconds(self.attribution_lookback)

    @property
    def session_gap_seconds(self) -> int:
        return parse_duration_seconds(self.session_gap)

    @property
    def checkpoint_lease_seconds(self) -> int:
        return parse_duration_seconds(self.checkpoint_lease)

    @property
    def java_options(self) -> tuple[str, ...]:
        """``jvm_options`` as separate arguments."""
        return tuple(self.jvm_options.split())

    @property
    def publisher_transactional_id(self) -> str:
        return self.transactional_id or f"adattr-attribution-{self.input_topic}-{self.output_topic}"

    @property
    def consumer_db_url(self) -> str:
        return self.consumer_db or f"sqlite:///{(self.data_dir / 'budget.db').resolve()}"

    @property
    def warehouse_uri(self) -> str:
        """The warehouse as Spark takes it: a URI as given, a local folder made absolute."""
        if _URI.match(self.warehouse):
            return self.warehouse.rstrip("/")
        return str(Path(self.warehouse).resolve())

    @property
    def local_warehouse(self) -> Path | None:
        """The warehouse's folder when it is on this machine's disk (None: a URI)."""
        return None if _URI.match(self.warehouse) else Path(self.warehouse).resolve()

    def table_path(self, name: str) -> str:
        return f"{self.warehouse_uri}/{name}"

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        known = {f"{PREFIX}{f.name.upper()}": f for f in dataclasses.fields(cls)}
        unknown = sorted(k for k in environ if k.startswith(PREFIX) and k not in known)
        unknown = [k for k in unknown if k not in SCRIPT_ONLY]
        if unknown:
            raise SettingsError(
                f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        values: dict[str, object] = {}
        for var, f in known.items():
            if var in environ:
                values[f.name] = _convert(var, environ[var], f.type)
        settings = cls(**values)  # type: ignore[arg-type]
        settings.validate()
        return settings

    def validate(self) -> None:
        def fail(name: str, why: str) -> NoReturn:
            shown = "<hidden>" if _is_secret(name) else repr(getattr(self, name))
            raise SettingsError(f"{PREFIX}{name.upper()}={shown}: {why}")

        if not self.warehouse.strip():
            fail("warehouse", "must not be empty (a folder, or a URI such as s3a://bucket/path)")
        if not self.bootstrap_servers.strip():
            fail("bootstrap_servers", "must name at least one host:port")
        for hp in self.bootstrap_servers.split(","):
            host, _, port = hp.strip().rpartition(":")
            if not host or not port.isdigit():
                fail("bootstrap_servers", f"{hp!r} is not host:port")
        self._validate_kafka_security(fail)
        if self.delivery not in DELIVERIES:
            fail("delivery", f"must be one of {', '.join(DELIVERIES)}")
        if self.state_store not in STATE_STORES:
            fail("state_store", f"must be one of {', '.join(STATE_STORES)}")
        if self.compaction not in COMPACTIONS:
            fail("compaction", f"must be one of {', '.join(COMPACTIONS)}")
        durations = (
            "watermark_delay",
            "trigger_interval",
            "attribution_lookback",
            "session_gap",
            "checkpoint_lease",
        )
        for name in durations:
            try:
                seconds = parse_duration_seconds(getattr(self, name))
            except ValueError as exc:
                fail(name, str(exc))
            if seconds < 1 and name in ("attribution_lookback", "session_gap"):
                fail(name, "must be at least 1 second")
            if seconds < 3 and name == "checkpoint_lease":
                fail(name, "must be at least 3 seconds (it is renewed every third of it)")
        for name in ("input_partitions", "shuffle_partitions", "max_record_bytes"):
            if getattr(self, name) < 1:
                fail(name, "must be at least 1")
        if self.compact_files < 2:
            fail("compact_files", "must be at least 2 (one file is never compacted)")
        if self.hourly_every < 1:
            fail("hourly_every", "must be at least 1 (1: every batch)")
        if any(not o.startswith("-") for o in self.java_options):
            fail("jvm_options", "expected JVM options, each starting with '-'")
        if self.max_offsets_per_trigger < 0:
            fail("max_offsets_per_trigger", "must be 0 (no cap) or more")
        if not 0 <= self.metrics_port <= 65535:
            fail("metrics_port", "must be a port number (1-65535), or 0 for no endpoint")
        if not self.metrics_host.strip():
            fail("metrics_host", "must name an address (127.0.0.1 keeps it on this machine)")
        try:
            from app.runtime.crash import parse

            parse(self.crash_at)
        except ValueError as exc:
            fail("crash_at", str(exc))
        for name in ("input_topic", "output_topic", "control_topic"):
            if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", getattr(self, name)):
                fail(name, "is not a valid Kafka topic name")

    def _validate_kafka_security(self, fail: Callable[[str, str], NoReturn]) -> None:
        protocol = self.kafka_security_protocol
        if protocol not in KAFKA_PROTOCOLS:
            fail("kafka_security_protocol", f"must be one of {', '.join(KAFKA_PROTOCOLS)}")
        sasl = (
            "kafka_sasl_mechanism",
            "kafka_sasl_username",
            "kafka_sasl_password",
            "kafka_sasl_password_file",
        )
        if protocol.startswith("SASL_"):
            if self.kafka_sasl_mechanism not in SASL_MECHANISMS:
                fail("kafka_sasl_mechanism", f"must be one of {', '.join(SASL_MECHANISMS)}")
            if not self.kafka_sasl_username:
                fail("kafka_sasl_username", f"{protocol} needs a user name")
            if bool(self.kafka_sasl_password) == bool(self.kafka_sasl_password_file):
                fail(
                    "kafka_sasl_password_file",
                    f"{protocol} needs the password from exactly one of "
                    f"{PREFIX}KAFKA_SASL_PASSWORD and {PREFIX}KAFKA_SASL_PASSWORD_FILE",
                )
            if self.kafka_sasl_password_file:
                try:
                    password = read_password(Path(self.kafka_sasl_password_file))
                except OSError as exc:
                    fail("kafka_sasl_password_file", f"cannot be read ({exc.strerror})")
                if not password:
                    fail("kafka_sasl_password_file", "holds no password on its first line")
        else:
            for name in sasl:
                if getattr(self, name):
                    fail(name, f"is for SASL_SSL or SASL_PLAINTEXT, not {protocol}")
        for name in ("kafka_ssl_ca_file", "kafka_ssl_client_pem"):
            path = getattr(self, name)
            if not path:
                continue
            if not protocol.endswith("SSL"):
                fail(name, f"is for SSL or SASL_SSL, not {protocol}")
            try:
                text = Path(path).read_text(errors="replace")
            except OSError as exc:
                fail(name, f"cannot be read ({exc.strerror})")
            blocks = set(re.findall(r"-----BEGIN ([A-Z0-9 ]+)-----", text))
            if "CERTIFICATE" not in blocks:
                fail(name, "holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
            if name == "kafka_ssl_client_pem" and "PRIVATE KEY" not in blocks:
                fail(
                    name,
                    # pragma: allowlist nextline secret (names the PEM header, holds no key)
                    "holds no unencrypted PKCS#8 private key (-----BEGIN PRIVATE KEY-----); "
                    "`openssl pkcs8 -topk8 -nocrypt` converts one",
                )


def read_password(path: Path) -> str:
    """The first line of a password file, without its line end."""
    lines = path.read_text().splitlines()
    return lines[0] if lines else ""


def _is_secret(name: str) -> bool:
    """A field kept out of the repr is kept out of error messages too."""
    return any(f.name == name and not f.repr for f in dataclasses.fields(Settings))


def _convert(var: str, raw: str, kind: object) -> object:
    kind_name = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
    try:
        if kind_name == "int":
            return int(raw)
        if kind_name == "bool":
            lowered = raw.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError("expected true/false")
        if kind_name == "Path":
            if not raw.strip():
                raise ValueError("must not be empty")
            return Path(raw)
        return raw
    except ValueError as exc:
        raise SettingsError(f"{var}={raw!r}: {exc}") from None
