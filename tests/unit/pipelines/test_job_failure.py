"""What `adattr run` says when its streaming query fails: Spark's reason, never the dump of the
query's plan after it; for Kafka's data-loss check, what happened and what to do."""

from __future__ import annotations

from app.runtime.settings import Settings
from pipelines.job import failure_message

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
