"""Errors a user can cause and fix (bad config, broker down, bad input files).

The CLI prints these as one clear line instead of a stack trace.
"""

from __future__ import annotations

from app.broker import BrokerError
from app.cluster import ClusterError
from app.kafka_io import KafkaAccessError
from app.metrics import MetricsError
from app.settings import SettingsError
from app.spark import MissingJarsError, SparkStartError


class UserInputError(ValueError):
    """Bad input from the user (a CSV, a flag value); the message names the row or flag."""


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
