"""Shared fixtures: one SparkSession per test run, and real Kafka brokers.

The broker fixture uses ``ADATTR_BOOTSTRAP_SERVERS`` when it is set (a broker you run) and
otherwise starts its own ``kafka.Kafka`` from the fetched jars on free loopback ports in a
temporary folder, and stops it at the end of the run, so no test depends on a process started
by hand and none is left behind. The secure broker (SASL_SSL, SCRAM users, ACLs) is started the
way a user starts it, with ``adattr up --secure``, and stopped with ``adattr down``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from app.runtime.settings import Settings
from app.stack.broker import LocalBroker, free_port
from app.stack.secure_kafka import MECHANISM, SecureKafka
from tests.builders import TEST_JVM_OPTIONS, adattr_env, run_adattr

# An xdist worker's __main__ (execnet's) has neither a spec nor a file, which
# pyspark.sql.connect, imported by Great Expectations, takes for a doctest run without Spark
# Connect's packages, and exits (SystemExit 0 inside `import great_expectations`). Under a
# plain pytest it raises the ImportError Great Expectations expects; so does a worker with this.
_main = sys.modules["__main__"]
if os.environ.get("PYTEST_XDIST_WORKER") and _main.__spec__ is None:
    if not hasattr(_main, "__file__"):
        _main.__file__ = "<pytest-xdist worker>"

# `make test` runs the suite on two pytest-xdist workers: most of a test's time is one JVM's
# single-threaded work (a CI run kept the two cores 67% busy), which a second test fills. Each
# worker has its own session fixtures (the Spark session, a broker). A module is one unit of
# work, so its module fixtures are made once and tests that build on the one before (the job
# module's) run in order on one worker; the job module and the secure broker's share that
# broker and are one unit. The longest units are sent first (CI's durations), so the run does
# not end on one of them alone. (xdist's own `--dist loadgroup` no longer groups under pytest 9,
# whose node ids it cannot rewrite.)
_LONGEST_FIRST = (
    "tests/integration/pipelines/test_job.py",
    "tests/integration/tools/test_drills.py",
    "tests/integration/stack/test_cluster.py",
    "tests/integration/tools/test_bench.py",
    "tests/unit/pipelines/test_hourly_pass.py",
    "tests/integration/pipelines/test_run_modes.py",
    "tests/integration/pipelines/test_exactly_once_output.py",
    "tests/integration/tools/test_quickstart.py",
)
_ONE_UNIT = {
    "tests/integration/stack/test_secure_kafka.py": "tests/integration/pipelines/test_job.py"
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Replaces xdist's default (``-n 2`` alone, ``--dist load``); another ``--dist`` given
    stands. A worker that dies leaves the rest of its unit to the other worker, which then runs
    the job module's later tests without the earlier ones (as xdist does with any unit)."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModulesLongestFirst(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return _ONE_UNIT.get(module, module)

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:  # the queue is full, none assigned yet: reorder it once
                self.ordered = True
                last = len(_LONGEST_FIRST)
                units = sorted(
                    self.workqueue.items(),
                    key=lambda u: _LONGEST_FIRST.index(u[0]) if u[0] in _LONGEST_FIRST else last,
                )
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return ModulesLongestFirst(config, log)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def base_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    root = tmp_path_factory.mktemp("adattr")
    return replace(
        Settings.from_env({}),
        warehouse=str(root / "warehouse"),
        checkpoints=root / "checkpoints",
        data_dir=root / "data",
        spark_master="local[2]",
        shuffle_partitions=2,
        spark_driver_memory="2g",
        verbose=True,  # the in-process JVM's output stays in what pytest captures
        # TEST_JVM_OPTIONS are for the short JVMs of subprocesses: this session's JVM lives
        # as long as the run and runs whole jobs, which C2 pays off (an in-process job test,
        # test_writes_are_idempotent_even_without_delta_txn, took 105 s on C1 only, 63 s on C2).
    )


@pytest.fixture(scope="session")
def kafka_bootstrap(
    tmp_path_factory: pytest.TempPathFactory, base_settings: Settings
) -> Iterator[str]:
    given = os.environ.get("ADATTR_BOOTSTRAP_SERVERS")
    if given:
        yield given
        return
    broker = LocalBroker(
        data_dir=tmp_path_factory.mktemp("kafka"),
        jars_dir=base_settings.jars_dir,
        port=free_port(),
        controller_port=free_port(),
        java_options=Settings.from_env({"ADATTR_JVM_OPTIONS": TEST_JVM_OPTIONS}).java_options,
    )
    broker.start(timeout=120)
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def spark(base_settings: Settings):  # type: ignore[no-untyped-def]
    from app.runtime.spark import build_spark

    session = build_spark(base_settings, app_name="adattr-tests")
    yield session
    session.stop()


def isolated_settings(base: Settings, bootstrap: str, root: Path) -> Settings:
    """Own warehouse, checkpoints and topics under root, on the shared broker."""
    suffix = root.name.replace("_", "-")[-40:]
    return replace(
        base,
        bootstrap_servers=bootstrap,
        warehouse=str(root / "warehouse"),
        checkpoints=root / "checkpoints",
        input_topic=f"ad-events-{suffix}",
        output_topic=f"ad-metrics-{suffix}",
        control_topic=f"adattr-control-{suffix}",
    )


@pytest.fixture
def settings(base_settings: Settings, tmp_path: Path, kafka_bootstrap: str) -> Settings:
    return isolated_settings(base_settings, kafka_bootstrap, tmp_path)


@dataclass(frozen=True)
class SecureBroker:
    """The broker of ``adattr up --secure``, and the settings that connect to it as a user."""

    bootstrap: str
    kafka: SecureKafka
    env: dict[str, str]  # what `adattr up --secure` ran with
    up_output: str

    def provision(self, settings: Settings) -> None:
        """The topics and ACLs of ``settings`` (own topics per test), made as the admin."""
        self.kafka.provision(replace(settings, bootstrap_servers=self.bootstrap), self.bootstrap)

    def as_user(self, settings: Settings, user: str) -> Settings:
        return replace(
            settings,
            bootstrap_servers=self.bootstrap,
            kafka_security_protocol="SASL_SSL",
            kafka_sasl_mechanism=MECHANISM,
            kafka_sasl_username=user,
            kafka_sasl_password_file=str(self.kafka.password_file(user)),
            kafka_ssl_ca_file=str(self.kafka.ca_file),
        )


@pytest.fixture(scope="session")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    data_dir = tmp_path_factory.mktemp("secure")
    env = adattr_env(
        data_dir=str(data_dir),
        bootstrap_servers=f"127.0.0.1:{free_port()}",
        kafka_controller_port=str(free_port()),
    )
    up = run_adattr(env, "up", "--secure", timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield SecureBroker(
            env["ADATTR_BOOTSTRAP_SERVERS"], SecureKafka(data_dir / "kafka-secure"), env, up.stdout
        )
    finally:
        down = run_adattr(env, "down", timeout=120)
        assert "kafka (secure): stopped" in down.stdout, down.stdout + down.stderr
