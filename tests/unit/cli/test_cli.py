from __future__ import annotations

import subprocess
import sys

import pytest

from app.cli import build_parser, main


def test_every_subcommand_has_help() -> None:
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert {"up", "down", "status"} <= set(commands)
    for name in commands:
        with pytest.raises(SystemExit) as exit_info:
            main([name, "--help"])
        assert exit_info.value.code == 0


def test_bad_setting_is_one_clear_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "status"],
        env={"ADATTR_WAREHOUS": "/tmp", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "unknown setting(s) ADATTR_WAREHOUS" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_kafka_failure_is_one_clear_line(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    from confluent_kafka import KafkaError, KafkaException

    import app.cli.stack

    def broker_gone(args, settings):  # type: ignore[no-untyped-def]
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Broker transport failure"))

    monkeypatch.setattr(app.cli.stack, "cmd_status", broker_gone)
    assert main(["status"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("adattr status: Kafka error:") and "Broker transport failure" in err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--soak", "0"], "--soak takes minutes above 0, not 0"),
        (["--rate", "500"], "--rate is the soak's rate: use it with --soak"),
        (["--soak", "5", "--rate", "-1"], "--rate takes events/s above 0, not -1"),
    ],
)
def test_a_bad_soak_is_refused_before_anything_starts(argv, says, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["bench", *argv]) == 1
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["run", "--available-now"], ["replay", "--from-earliest"]])
def test_a_job_kept_out_by_another_is_refused_before_any_jvm(  # type: ignore[no-untyped-def]
    argv, monkeypatch, tmp_path, capsys
) -> None:
    import app.runtime.metrics
    import app.runtime.spark
    import app.tools.replay
    from pipelines import job

    built: list[str] = []
    monkeypatch.setattr(app.runtime.spark, "build_spark", lambda s, name: built.append(name))
    monkeypatch.setattr(app.runtime.metrics, "serve", lambda r, s: built.append("metrics"))
    held = {0: app.tools.replay.Partition(low=0, high=10)}  # the topic, as a replay checks it
    monkeypatch.setattr(app.tools.replay, "describe_topic", lambda kafka, topic: held)
    for key, value in {"CHECKPOINTS": "c", "WAREHOUSE": "w", "DATA_DIR": "d"}.items():
        monkeypatch.setenv(f"ADATTR_{key}", str(tmp_path / value))
    monkeypatch.setenv("ADATTR_METRICS_PORT", "9464")  # the job's port, taken by the holder
    with job.exclusive(tmp_path / "c"):  # another job holds the checkpoint's run lock
        assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"adattr {argv[0]}: the job is already running on {tmp_path / 'c'}" in err
    assert built == []  # refused in a second: no port bound, no Spark session (so no JVM)


@pytest.mark.parametrize(
    ("argv", "title", "faults"),
    [
        (["worker"], "worker", ("worker",)),
        (["broker", "--cluster"], "broker --cluster", ("broker",)),
        (["cluster"], "cluster", ("worker", "broker")),
    ],
)
def test_each_cluster_drill_meets_its_faults(argv, title, faults, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import app.tools.cluster_drills

    ran = []
    monkeypatch.setattr(
        app.tools.cluster_drills,
        "drill_on_cluster",
        lambda base, title, faults, **kw: ran.append((title, tuple(faults), kw)) or 0,
    )
    assert main(["drill", *argv, "--events", "600", "--seed", "3"]) == 0
    assert ran == [(title, faults, {"seed": 3, "events": 600})]


@pytest.mark.parametrize("argv", [["--cluster"], []])
def test_a_broker_outage_needs_the_drills_own_single_broker(argv, capsys) -> None:  # type: ignore[no-untyped-def]
    seconds = "5" if argv else "-1"
    assert main(["drill", "crash", "--broker-outage", seconds, *argv]) == 1
    assert "--broker-outage takes seconds >= 0 and the drill's own single broker" in (
        capsys.readouterr().err
    )
