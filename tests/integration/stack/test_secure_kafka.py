"""adattr over SASL_SSL with ACLs, run as users run it: the broker of ``adattr up --secure``, each
command with one user's settings. A wrong password, an unknown CA and a missing ACL each end the
command with one line naming the cause; no password shows in an argument list, a log, the
ledger or the checkpoint. (The golden test in test_job.py runs over this broker too.)"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from app.runtime.processes import children
from app.runtime.settings import Settings, read_password
from app.stack.broker import free_port
from app.stack.secure_kafka import BUDGET, EVENTS, JOB, USERS
from app.tools.dim_csv import read_dim_csv
from pipelines import tables as t
from pipelines.dimension import upsert_dim_ads
from tests.builders import Samples, run_adattr, scrape, settings_env
from tests.conftest import SecureBroker, isolated_settings

pytestmark = pytest.mark.integration


@pytest.fixture
def settings(base_settings: Settings, secure_broker: SecureBroker, tmp_path: Path) -> Settings:
    """Own topics (their ACLs made by the admin), warehouse, checkpoints and data folder."""
    settings = replace(
        isolated_settings(base_settings, secure_broker.bootstrap, tmp_path),
        data_dir=tmp_path / "data",
        max_offsets_per_trigger=600,
    )
    secure_broker.provision(settings)
    return settings


def _as(secure_broker: SecureBroker, settings: Settings, user: str, **extra: str) -> dict[str, str]:
    return settings_env(secure_broker.as_user(settings, user), **extra)


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_up_secure_tells_each_user_how_to_connect(secure_broker: SecureBroker) -> None:
    out = secure_broker.up_output
    assert "SASL_SSL only (SCRAM-SHA-512 over TLS)" in out
    for user in USERS:
        env_file = secure_broker.kafka.env_file(user)
        assert str(env_file) in out
        values = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
        assert values["ADATTR_KAFKA_SASL_USERNAME"] == user
        assert Path(values["ADATTR_KAFKA_SASL_PASSWORD_FILE"]) == secure_broker.kafka.password_file(
            user
        )
        password = read_password(secure_broker.kafka.password_file(user))
        assert password not in out and password not in env_file.read_text()


def test_the_job_and_the_budget_service_run_over_sasl_ssl_and_no_password_shows(
    spark: SparkSession, secure_broker: SecureBroker, settings: Settings, tmp_path: Path
) -> None:
    dim = tmp_path / "dim.csv"
    sent = run_adattr(
        _as(secure_broker, settings, EVENTS),
        *("generate", "--events", "1500", "--seed", "5", "--dim-csv", str(dim)),
    )
    assert sent.returncode == 0, sent.stderr
    # The dimension is a Delta table (no Kafka, so nothing of SASL to show): loaded in this
    # session, as `dim load` does, without a JVM start of its own.
    upsert_dim_ads(spark, settings.warehouse_uri, read_dim_csv(dim))

    # The job as its user; every argument list of its process tree read while it runs.
    adattr = str(Path(sys.executable).with_name("adattr"))
    job = subprocess.Popen(
        [adattr, "run", "--available-now"],
        env=_as(secure_broker, settings, JOB),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    cmdlines: dict[int, bytes] = {}
    while job.poll() is None:
        for pid in [job.pid, *children(job.pid)]:
            try:
                cmdlines[pid] = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                pass  # ended meanwhile
        time.sleep(0.2)
    out, err = job.communicate()
    assert job.returncode == 0, out[-2000:] + err[-2000:]
    assert "run: stopped" in out
    assert any(b"java" in line for line in cmdlines.values()), "the Spark JVM was never seen"

    ledger = spark.read.format("delta").load(settings.table_path(t.LEDGER)).collect()
    outcomes = [r.kafka_outcome for r in ledger]
    rows = sum(int(o.split(":")[1]) for o in outcomes if o.startswith("committed:"))
    assert rows > 0

    # The budget service as its user, its metrics endpoint scraped while it runs.
    port = free_port()
    consumer = subprocess.Popen(
        [adattr, "consume", "--until-idle", "--idle-seconds", "10"],
        env=_as(secure_broker, settings, BUDGET, metrics_port=str(port)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        samples = _scrape_until(
            port,
            lambda s: (
                s.get(("adattr_budget_records_total", (("result", "applied"),))) == rows
                and _lags(s) == [0.0] * settings.input_partitions
            ),
        )
    finally:
        budget_out, budget_err = consumer.communicate(timeout=120)
    assert consumer.returncode == 0, budget_err
    assert f"consume: {rows} records, {rows} applied" in budget_out
    assert samples[("adattr_budget_records_total", (("result", "ignored_older"),))] == 0
    assert ("adattr_budget_alerts_total", ()) in samples

    shown = [
        sent.stdout + sent.stderr,
        out + err,
        budget_out + budget_err,
        *(line.decode(errors="replace") for line in cmdlines.values()),
        *(p.read_text(errors="replace") for p in (settings.data_dir / "logs").iterdir()),
        *(p.read_text(errors="replace") for p in settings.checkpoints.rglob("*") if p.is_file()),
        *(json.dumps(r.asDict(recursive=True), default=str) for r in ledger),
    ]
    assert any("kafka" in text for text in shown[4:])  # the logs were written
    for user in USERS:
        password = read_password(secure_broker.kafka.password_file(user))
        assert not [text[:200] for text in shown if password in text], user


def _lags(samples: Samples) -> list[float]:
    return [v for (name, _), v in sorted(samples.items()) if name == "adattr_budget_offset_lag"]


def _scrape_until(port: int, done: Callable[[Samples], bool]) -> Samples:
    """Scrapes the endpoint until ``done`` holds for what it shows (60 s at most)."""
    deadline = time.monotonic() + 60
    samples: Samples = {}
    while time.monotonic() < deadline:
        try:
            samples = scrape(port)
        except OSError:  # not serving yet
            time.sleep(0.2)
            continue
        if done(samples):
            return samples
        time.sleep(0.2)  # polling the endpoint for the condition
    raise AssertionError(f"the metrics never showed what was expected: {samples}")


def test_a_wrong_password_an_unknown_ca_and_a_missing_acl_each_end_in_one_line(
    secure_broker: SecureBroker, settings: Settings, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong.password"
    # pragma: allowlist nextline secret (a test value, not a real one)
    wrong.write_text("not-the-password\n")
    generate = ("generate", "--events", "50")

    line = _one_line(
        run_adattr(
            _as(secure_broker, settings, EVENTS, kafka_sasl_password_file=str(wrong)), *generate
        )
    )
    assert line.startswith(f"adattr generate: Kafka at {secure_broker.bootstrap} (SASL_SSL as ")
    assert "SASL authentication error" in line and "invalid credentials" in line
    assert "not-the-password" not in line

    other_ca = tmp_path / "other-ca.pem"
    other_key = tmp_path / "other.key"
    make_ca = "req -x509 -newkey rsa:2048 -noenc -days 1 -subj /CN=other -keyout".split()
    subprocess.run(
        ["openssl", *make_ca, str(other_key), "-out", str(other_ca)],
        capture_output=True,
        check=True,
    )
    line = _one_line(
        run_adattr(_as(secure_broker, settings, EVENTS, kafka_ssl_ca_file=str(other_ca)), *generate)
    )
    assert "SSL handshake failed" in line and "certificate verify failed" in line

    # Logged in, but no ACL lets the budget service write events, or the producers read metrics.
    line = _one_line(run_adattr(_as(secure_broker, settings, BUDGET), *generate))
    assert line == (
        f"adattr generate: Kafka refused User:{BUDGET} at {secure_broker.bootstrap}: no ACL "
        "allows it on the topic (TOPIC_AUTHORIZATION_FAILED: Authorization failed.)"
    )
    line = _one_line(run_adattr(_as(secure_broker, settings, EVENTS), "consume", "--until-idle"))
    assert line.startswith(f"adattr consume: Kafka refused User:{EVENTS} at ")
    assert "TOPIC_AUTHORIZATION_FAILED" in line
