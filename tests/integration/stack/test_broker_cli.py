"""`adattr up`, `status`, `down` against a real broker on free ports, twice in a row."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from app.stack.broker import free_port
from tests.builders import adattr_env, run_adattr

pytestmark = pytest.mark.integration


def _env(tmp_path: Path, port: int, controller: int) -> dict[str, str]:
    return adattr_env(
        bootstrap_servers=f"127.0.0.1:{port}",
        kafka_controller_port=str(controller),
        data_dir=str(tmp_path / "data"),
    )


def _our_jvms(tmp_path: Path) -> list[str]:
    done = subprocess.run(["pgrep", "-fa", "kafka.Kafka"], capture_output=True, text=True)
    return [line for line in done.stdout.splitlines() if str(tmp_path) in line]


def test_up_status_down_twice_leaves_no_jvm(tmp_path: Path) -> None:
    env = _env(tmp_path, free_port(), free_port())
    for _ in range(2):
        up = run_adattr(env, "up")
        assert up.returncode == 0, up.stderr
        assert "started: kafka: running" in up.stdout
        again = run_adattr(env, "up")  # starting twice is harmless
        assert again.returncode == 0 and "already running" in again.stdout
        status = run_adattr(env, "status")
        assert "kafka: running" in status.stdout
        assert len(_our_jvms(tmp_path)) == 1
        down = run_adattr(env, "down")
        assert down.returncode == 0 and "stopped" in down.stdout
        assert _our_jvms(tmp_path) == []
        assert "not running" in run_adattr(env, "status").stdout
    # Storage was formatted once and reused: the second start found the same cluster.
    assert (tmp_path / "data" / "kafka" / "data" / "meta.properties").exists()


def test_port_taken_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        up = run_adattr(_env(tmp_path, port, free_port()), "up", "--timeout", "5")
    assert up.returncode == 1
    assert f"port 127.0.0.1:{port} is already taken" in up.stderr
    assert "Traceback" not in up.stderr
    assert _our_jvms(tmp_path) == []


def test_security_settings_are_checked_before_anything_starts(tmp_path: Path) -> None:
    """A security setting that does not fit is one line naming it (exit 2), the password never
    shown; `adattr up` (PLAINTEXT) with SASL_SSL settings points at `up --secure` (exit 1)."""
    env = _env(tmp_path, free_port(), free_port())
    # pragma: allowlist nextline secret (a test value, not a real one)
    secret = "hunter2-do-not-print"
    (tmp_path / "pw").write_text(secret + "\n")
    sasl = {
        **env,
        "ADATTR_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "ADATTR_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "ADATTR_KAFKA_SASL_USERNAME": "adattr-job",
        "ADATTR_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "pw"),
    }
    both = run_adattr({**sasl, "ADATTR_KAFKA_SASL_PASSWORD": secret}, "up")
    assert both.returncode == 2
    assert both.stderr.startswith("adattr: bad setting: ADATTR_KAFKA_SASL_PASSWORD_FILE=")
    assert "exactly one of" in both.stderr and secret not in both.stdout + both.stderr
    stray = run_adattr({**env, "ADATTR_KAFKA_SASL_PASSWORD": secret}, "status")
    assert stray.returncode == 2 and "ADATTR_KAFKA_SASL_PASSWORD=<hidden>" in stray.stderr
    assert secret not in stray.stdout + stray.stderr
    up = run_adattr(sasl, "up")
    assert up.returncode == 1
    assert "ADATTR_KAFKA_SECURITY_PROTOCOL=SASL_SSL: `adattr up --secure` starts" in up.stderr
    assert "Traceback" not in up.stderr and secret not in up.stdout + up.stderr
    assert _our_jvms(tmp_path) == []
