"""Exactly-once output to Kafka: one transaction per micro-batch, with a commit marker.

Spark's own Kafka sink is at-least-once. This is the foreachBatch counterpart of Flink's
TwoPhaseCommitSinkFunction: the batch's Delta commits come first (they are idempotent: Delta's
txnAppId/txnVersion, keyed MERGEs, and the finalising UPDATEs' own condition), then one Kafka
transaction carries every changed gold row *and* a marker ``(app id, batch id)`` on the
compacted control topic, then the ledger row and Spark's commit log. A crash at any point is
repaired by Spark re-executing the batch:

- before the Kafka commit: the transaction is open or aborted; the restarted job's
  ``init_transactions`` (same ``transactional.id``) fences the dead producer and aborts it, the
  Delta writes are skipped, and the rows the batch changed (stamped with its generation and batch
  id in Delta, so they are found again) are published again, under the same record ids;
- after the Kafka commit: the marker is there, so the re-executed batch publishes nothing.

Only this job writes the control topic under this transactional id, so the newest marker per app
id, read once at start-up, plus what this process committed since, is the whole truth.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from app.runtime.crash import crash_point
from app.runtime.kafka_io import KafkaConnection, consumer_config, producer_config

log = logging.getLogger("adattr.publish")

# The broker caps a producer's transaction.timeout.ms at transaction.max.timeout.ms (15 minutes
# by default, infra/kafka/server.properties). Ours must exceed the longest batch (a transaction
# spans one batch's publishing only, seconds, but a 1M-record batch publishes ~300k rows) and stay
# below that cap, or init_transactions fails. 10 minutes: an open transaction of a dead job stalls
# read_committed readers at most this long even if the job is never restarted.
TRANSACTION_TIMEOUT_MS = 600_000
ATTEMPTS = 5
Record = tuple[bytes, bytes]


class PublishError(RuntimeError):
    """Publishing cannot go on in this process; the message says why and what to do."""


@dataclass(frozen=True)
class Marker:
    app_id: str
    generation: int
    batch_id: int
    records: int

    def encode(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True).encode()


def last_committed_batch(
    kafka: KafkaConnection, control_topic: str, app_id: str, timeout: float
) -> int:
    """The newest batch id with a committed marker for ``app_id`` (-1 when none): reads the
    control topic to its end, committed records only."""
    consumer = Consumer(
        consumer_config(
            kafka,
            f"adattr-control-reader-{app_id}",
            committed_only=True,
            **{"enable.partition.eof": True},
        )
    )
    try:
        topic = consumer.list_topics(control_topic, timeout=timeout).topics.get(control_topic)
        if topic is None or topic.error is not None:
            raise PublishError(
                f"control topic {control_topic} is missing or unreadable "
                f"({topic.error if topic else 'absent'}); `adattr up` creates it"
            )
        consumer.assign(
            [TopicPartition(control_topic, p, OFFSET_BEGINNING) for p in topic.partitions]
        )
        pending = set(topic.partitions)
        newest = -1
        deadline = time.monotonic() + timeout
        while pending:
            msg = consumer.poll(1.0)
            if msg is None:
                if time.monotonic() > deadline:
                    raise PublishError(
                        f"could not read {control_topic} to its end in {timeout:.0f}s: another "
                        "producer may hold a transaction open on it"
                    )
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                    continue
                raise KafkaException(error)
            if msg.key() == app_id.encode():
                newest = max(newest, int(json.loads(msg.value() or b"{}")["batch_id"]))
        return newest
    finally:
        consumer.close()


class Publisher(Protocol):
    @property
    def transactional_id(self) -> str | None: ...

    def publish(
        self, batch_id: int, records: Callable[[], Iterable[Record]], *, crash_at: str = ""
    ) -> str: ...


class PlainPublisher:
    """At-least-once output, for the benchmark's B2 only (``ADATTR_DELIVERY=at-least-once``):
    the same records, no transaction, no marker, no idempotent producer, so a re-executed batch
    publishes its rows again and a crash mid-batch leaves a partial batch visible."""

    transactional_id: str | None = None

    def __init__(self, kafka: KafkaConnection, *, output_topic: str, timeout: float = 60.0) -> None:
        self.output_topic = output_topic
        self.timeout = timeout
        self.producer = Producer(producer_config(kafka, **{"enable.idempotence": False}))

    def publish(
        self, batch_id: int, records: Callable[[], Iterable[Record]], *, crash_at: str = ""
    ) -> str:
        failures: list[KafkaError] = []

        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                failures.append(err)

        n = 0
        for key, value in records():
            while True:
                try:
                    self.producer.produce(
                        self.output_topic, key=key, value=value, on_delivery=on_delivery
                    )
                    break
                except BufferError:
                    self.producer.poll(0.05)
            n += 1
        self.producer.flush(self.timeout)
        if failures:
            raise PublishError(f"publishing batch {batch_id} failed: {failures[0].str()}")
        return f"sent:{n}"


class TransactionalPublisher:
    """One transactional producer for the life of the job (its ``transactional.id`` is stable
    per job, so a restart fences the previous incarnation)."""

    def __init__(
        self,
        kafka: KafkaConnection,
        *,
        output_topic: str,
        control_topic: str,
        transactional_id: str,
        app_id: str,
        generation: int,
        timeout: float = 60.0,
    ) -> None:
        self.transactional_id = transactional_id
        self.output_topic = output_topic
        self.control_topic = control_topic
        self.app_id = app_id
        self.generation = generation
        self.timeout = timeout
        # For the job's metrics: when the open transaction began (epoch s), and aborts so far.
        self.open_since: float | None = None
        self.aborted = 0
        self.producer = Producer(
            producer_config(
                kafka,
                **{
                    "transactional.id": transactional_id,
                    "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                },
            )
        )
        # Fences any earlier producer with this id and aborts the transaction it left open.
        self._call(lambda: self.producer.init_transactions(timeout), "init_transactions")
        self.last_committed = last_committed_batch(kafka, control_topic, app_id, timeout)
        log.info(
            "publisher %s ready: last committed batch of %s is %d",
            transactional_id,
            app_id,
            self.last_committed,
        )

    def publish(
        self, batch_id: int, records: Callable[[], Iterable[Record]], *, crash_at: str = ""
    ) -> str:
        """Publishes the batch's records and its marker in one transaction, unless the marker
        is already committed. Returns the outcome for the ledger: ``committed:<n>`` or
        ``already-committed``. ``records`` is called again if the transaction is redone."""
        if batch_id <= self.last_committed:
            return "already-committed"
        for attempt in range(1, ATTEMPTS + 1):
            failures: list[KafkaError] = []
            try:
                n = self._one_transaction(batch_id, records(), failures, crash_at)
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                if err.fatal():
                    raise PublishError(
                        f"fatal Kafka error while publishing batch {batch_id}: {err.str()} "
                        "(e.g. fenced by a newer instance of this job); restart the job: its "
                        "new producer fences this one and the batch is published again"
                    ) from exc
                if err.txn_requires_abort() or err.retriable():
                    log.warning(
                        "batch %d: transaction attempt %d/%d failed (%s): aborting and redoing",
                        batch_id,
                        attempt,
                        ATTEMPTS,
                        err.str(),
                    )
                    self._abort()
                    continue
                raise PublishError(f"publishing batch {batch_id} failed: {err.str()}") from exc
            self.last_committed = batch_id
            return f"committed:{n}"
        raise PublishError(
            f"publishing batch {batch_id} failed {ATTEMPTS} times; the batch fails and Spark "
            "re-executes it on restart (nothing was committed to Kafka for it)"
        )

    def _one_transaction(
        self, batch_id: int, records: Iterable[Record], failures: list[KafkaError], crash_at: str
    ) -> int:
        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                failures.append(err)

        self.producer.begin_transaction()
        self.open_since = time.time()
        n = 0
        for key, value in records:
            self._produce(self.output_topic, key, value, on_delivery)
            n += 1
        marker = Marker(self.app_id, self.generation, batch_id, n)
        self._produce(self.control_topic, self.app_id.encode(), marker.encode(), on_delivery)
        self.producer.flush(self.timeout)
        crash_point(crash_at, "in_kafka_transaction")
        if failures:
            # A record the broker refused: the whole transaction must go.
            raise KafkaException(failures[0])
        self.producer.commit_transaction(self.timeout)
        self.open_since = None
        return n

    def _produce(self, topic: str, key: bytes, value: bytes, on_delivery: Any) -> None:
        while True:
            try:
                self.producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
                return
            except BufferError:
                self.producer.poll(0.05)  # the local queue is full: let deliveries drain it

    def _abort(self) -> None:
        try:
            self.producer.abort_transaction(self.timeout)
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.fatal():
                raise PublishError(f"cannot abort the transaction: {err.str()}") from exc
            log.warning("abort_transaction: %s", err.str())
        self.open_since = None
        self.aborted += 1

    def _call(self, action: Callable[[], None], what: str) -> None:
        for attempt in range(1, ATTEMPTS + 1):
            try:
                action()
                return
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                if err.retriable() and attempt < ATTEMPTS:
                    log.warning("%s: %s (retrying)", what, err.str())
                    continue
                raise PublishError(f"{what} failed: {err.str()}") from exc

    def close(self) -> None:
        self.producer.flush(self.timeout)
