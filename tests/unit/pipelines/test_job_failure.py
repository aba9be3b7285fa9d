"""What `adattr run` says when its streaming query fails: Spark's reason, never the dump of the
query's plan after it; for Kafka's data-loss check, what happened and what to do. And what
``finish`` does after a stop: the pass the stop owes, once, and one line if it fails."""

from __future__ import annotations

import pytest

from app.runtime.settings import Settings
from pipelines import job
from pipelines.job import failure_message
from pipelines.lease import LeaseLost

SETTINGS = Settings.from_env(
    {"ADATTR_CHECKPOINTS": "/srv/cp", "ADATTR_WAREHOUSE": "/srv/wh", "ADATTR_INPUT_TOPIC": "ev"}
)
PLAN = """
=== Streaming Query ===
Identifier: adattr-attribution [id = e339d5c1, runId = ed60a4af]
Current Committed Offsets: {KafkaV2[Subscribe[ev]]: {"ev":{"0":495,"3":535}}}

Logical Plan:
~WriteToMicroBatchDataSourceV1 ForeachBatchSink, e339d5c1, Append
+- ~Union false, false
"""
HEAD = "[STREAM_FAILED] Query [id = e339d5c1, runId = ed60a4af] terminated with exception: "
# As Spark 4.2's Kafka source words it (the run that found this: a broker's data wiped, the
# checkpoint and tables kept).
DATA_LOSS = (
    "Some data may have been lost because they are not available in Kafka any more;\n"
    "either the data was aged out by Kafka or the topic may have been deleted before all the "
    "data in the\ntopic was processed.\nIf you don't want your streaming query to fail on such "
    "cases, set the source option failOnDataLoss to false.\nReason: {reason}\nThis could be "
    "either 1) a user error that the start offset is set beyond available offset when starting "
    "query, or 2) the kafka topic-partition is deleted and re-created. SQLSTATE: XXKST"
)


def test_a_topic_that_ends_before_what_the_checkpoint_read_was_recreated() -> None:
    reason = "Partition ev-3 offset was changed from 535 to 508."
    said = failure_message(HEAD + DATA_LOSS.format(reason=reason) + PLAN, SETTINGS)
    assert said.startswith("topic ev ends before offsets the job has already read")
    assert f"({reason})" in said
    assert "deleted and re-created" in said and "The job wrote nothing" in said
    assert "checkpoint in /srv/cp and the tables in /srv/wh belong to the old topic" in said
    assert "empty ADATTR_CHECKPOINTS and ADATTR_WAREHOUSE" in said
    # Not Spark's advice to skip lost records, nor its plan.
    assert "failOnDataLoss" not in said and "Logical Plan" not in said and "SQLSTATE" not in said


def test_records_gone_for_another_reason_name_both_causes_and_the_replay() -> None:
    reason = "Cannot fetch offset 12 (GroupId: g, TopicPartition: ev-0)."
    said = failure_message(HEAD + DATA_LOSS.format(reason=reason) + PLAN, SETTINGS)
    assert said.startswith("Kafka no longer holds records")
    assert f"({reason})" in said and "never skips records" in said
    assert "aged out" in said and "`adattr replay`" in said
    assert "empty ADATTR_CHECKPOINTS and ADATTR_WAREHOUSE" in said
    assert "failOnDataLoss" not in said and "Logical Plan" not in said


def test_any_other_failure_keeps_its_whole_reason_without_the_plan() -> None:
    cause = (
        "[PYTHON_EXCEPTION] An exception was raised by the Python Proxy. Return Message: "
        'Traceback (most recent call last):\n  File "sink.py", line 9, in batch\n'
        "ValueError: boom SQLSTATE: 38000"
    )
    said = failure_message(HEAD + cause + PLAN, SETTINGS)
    assert said == (
        "the streaming query failed: [PYTHON_EXCEPTION] An exception was raised by the Python "
        'Proxy. Return Message: Traceback (most recent call last):\n  File "sink.py", line 9, '
        "in batch\nValueError: boom"
    )


class _Query:
    """What ``finish`` asks of a streaming query."""

    def __init__(self, *, active: bool = False, error: str | None = None) -> None:
        self.id = "q-1"
        self.isActive = active
        self.error = error

    def exception(self) -> str | None:
        return self.error


class _Sink:
    """A sink whose stop pass fails with ``error`` (None: succeeds); counts its passes."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.passes = 0
        self.abandoned = 0  # waits for a pass in flight, owing the rest to the next run

    def finish(self) -> None:
        self.passes += 1
        if self.error is not None:
            raise self.error

    def abandon(self) -> None:
        self.abandoned += 1


class _JavaException:
    def toString(self) -> str:  # py4j's name for it
        return (
            "org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage "
            "7.0 failed 1 times\n\tat org.apache.spark.scheduler.DAGScheduler.failJob"
        )


class _Py4JLike(Exception):
    """What py4j raises for a Java exception PySpark does not convert (``Py4JJavaError``)."""

    def __init__(self) -> None:
        super().__init__("An error occurred while calling o1234.execute.\n")
        self.java_exception = _JavaException()


def _finish(query: _Query, sink: _Sink, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(job._sinks, query.id, sink)
    job.finish(query)  # type: ignore[arg-type]


def test_finish_makes_the_pass_owed_at_a_clean_stop_once(monkeypatch: pytest.MonkeyPatch) -> None:
    stopped = _Sink()
    _finish(_Query(), stopped, monkeypatch)
    job.finish(_Query())  # type: ignore[arg-type]  # again, after a requested stop: nothing
    assert stopped.passes == 1
    # A failed query owes nothing to its stop (its next run's first batch makes the pass), and
    # a running one nothing yet.
    # A failed one only waits for a pass in flight beside its last batch, before its lease
    # goes (pipelines/pass_beside.py).
    for query, waits in ((_Query(error="boom"), 1), (_Query(active=True), 0)):
        untouched = _Sink()
        _finish(query, untouched, monkeypatch)
        assert untouched.passes == 0 and untouched.abandoned == waits


def test_a_failed_pass_at_the_stop_is_one_line_that_says_nothing_is_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    java = "[DELTA_CONCURRENT_APPEND] Files were added by a concurrent update.\n\tat org.apache.x"
    with pytest.raises(job.JobFailedError) as failed:
        _finish(_Query(), _Sink(RuntimeError(java)), monkeypatch)
    said = str(failed.value)
    assert said.startswith(
        "the pass owed at the stop failed ([DELTA_CONCURRENT_APPEND] Files were added by a "
        "concurrent update.): every batch is committed and published; "
    )
    assert "org.apache" not in said
    # An exception PySpark leaves as py4j's (its own first line names only the call): the Java
    # exception's first line.
    with pytest.raises(job.JobFailedError) as failed:
        _finish(_Query(), _Sink(_Py4JLike()), monkeypatch)
    assert str(failed.value).startswith(
        "the pass owed at the stop failed (org.apache.spark.SparkException: Job aborted due to "
        "stage failure: Task 0 in stage 7.0 failed 1 times): "
    ), str(failed.value)
    # A job fenced at the stop says so, as at a batch.
    with pytest.raises(job.JobFailedError, match=r"^fenced: taken over$"):
        _finish(_Query(), _Sink(LeaseLost("fenced: taken over")), monkeypatch)
