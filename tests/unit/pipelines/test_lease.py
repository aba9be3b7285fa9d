"""The checkpoint lease (pipelines.lease): one holder at a time across machines, taken over only
when expired or when its holder on this host is gone, and a holder that lost it stops."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from pipelines.lease import Lease, LeaseHeldError, LeaseLost


def _other_host(folder: Path, **kw: object) -> Lease:
    return Lease(folder, host="other-host", pid=4242, **kw)  # type: ignore[arg-type]


def _expire(lease: Lease) -> None:
    path = lease.folder / f"{lease.epoch:012d}.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "expires_ms": int(time.time() * 1000) - 1}))


def test_a_live_lease_refuses_a_second_job_with_its_holder(tmp_path: Path) -> None:
    first = _other_host(tmp_path)
    first.acquire()
    try:
        with pytest.raises(LeaseHeldError, match=r"a job on other-host \(pid 4242\) holds"):
            Lease(tmp_path).acquire()
        first.check()  # still the holder
    finally:
        first.release()


def test_an_expired_lease_is_taken_over_and_its_holder_is_fenced(tmp_path: Path) -> None:
    paused = _other_host(tmp_path)
    paused.acquire()
    paused._stop.set()  # paused: no more renewals
    _expire(paused)
    new = Lease(tmp_path)
    new.acquire()
    try:
        assert (new.epoch, paused.epoch) == (2, 1)
        with pytest.raises(LeaseLost, match=r"fenced: .* taken over by a job on .* \(number 2\)"):
            paused.check()
        new.check()
    finally:
        new.release()


def test_a_dead_holder_on_this_host_frees_the_lease_at_once(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    crashed = Lease(tmp_path, pid=gone.pid)
    crashed.acquire()
    crashed._stop.set()
    restarted = Lease(tmp_path)
    restarted.acquire()  # no wait for the 30 s expiry
    assert restarted.epoch == 2
    restarted.release()


def test_two_jobs_starting_at_once_one_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    winner = _other_host(tmp_path)
    winner.acquire()
    loser = Lease(tmp_path)
    # The loser read the folder before the winner created number 1.
    monkeypatch.setattr(loser, "current", lambda: (0, None))
    with pytest.raises(LeaseHeldError):
        loser.acquire()
    assert loser.epoch == 0
    winner.release()


def test_renewal_extends_and_a_lease_running_out_stops_the_holder(tmp_path: Path) -> None:
    lease = Lease(tmp_path, seconds=30)
    lease.acquire()
    lease._stop.set()
    path = tmp_path / "000000000001.json"
    _expire(lease)
    with pytest.raises(LeaseLost, match="left"):
        lease.check()
    lease.renew()
    assert json.loads(path.read_text())["expires_ms"] > time.time() * 1000 + 29_000
    lease.check()
    lease.release()


def test_release_frees_it_for_another_host_and_old_files_are_pruned(tmp_path: Path) -> None:
    for n in range(1, 9):
        lease = _other_host(tmp_path) if n % 2 else Lease(tmp_path)
        lease.acquire()
        assert lease.epoch == n
        lease.release()
    assert sorted(p.name for p in tmp_path.glob("*.json"))[0] == "000000000004.json"
