"""A lease on the checkpoint that holds across machines: one job per checkpoint, cluster-wide.

The run lock (``pipelines.job.exclusive``, an ``flock``) is the kernel's: exact on one machine,
and across machines only on a shared file system that honours locks. The lease needs only what
every shared store gives: creating a file that must not exist yet is atomic (POSIX ``O_EXCL``,
NFSv3+, HDFS; S3 and GCS conditional puts), and a file is read whole or not at all.

- The lease is a series of numbered files next to the checkpoint
  (``<checkpoints>/attribution/lease/000000000042.json``), each naming its holder (host, pid, a
  random owner id) and an expiry in wall-clock milliseconds. The highest number is the lease.
- **Acquire**: a job reads the highest; if it is unexpired and its holder alive, the job is
  refused with one line naming the holder. Otherwise it creates the next number with ``O_EXCL``:
  of two jobs starting at once, one creates it and the other is refused. A holder on the same
  host whose pid is gone (SIGKILLed) frees it at once, so a restart need not wait for expiry.
- **Renew**: a thread extends the holder's own file every third of the lease.
- **Fence**: before a batch writes anything, and again before its Kafka transaction, the job
  checks that its number is still the highest and that its lease has a third of its time left;
  otherwise it stops (``LeaseLost``) without writing. A job that was paused past its expiry (a
  long GC, a frozen VM) and lost the lease to another therefore stops at its next check.

What it does not cover: a write already past its check when the pause begins lands after the
expiry (the window is one batch's Delta commits; Delta's txn ids, keyed MERGEs and the
finalising UPDATE's own condition make the new holder's re-execution of that batch a no-op, and
the new holder's Kafka producer fences the old one's transaction through the shared
``transactional.id``). Clocks are assumed to agree within a
small fraction of the lease (NTP).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.runtime.processes import pid_alive

KEEP = 5  # lease files kept (the current one and a few before it, for the record)


class LeaseHeldError(RuntimeError):
    """Another job holds the checkpoint's lease."""


class LeaseLost(RuntimeError):
    """This job no longer holds the lease: it must not write."""


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Lease:
    folder: Path
    seconds: float = 30.0
    owner: str = field(default_factory=lambda: uuid.uuid4().hex)
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    epoch: int = 0  # 0: not held
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    # -- files ---------------------------------------------------------------------------------
    def _path(self, epoch: int) -> Path:
        return self.folder / f"{epoch:012d}.json"

    def _epochs(self) -> list[int]:
        if not self.folder.exists():
            return []
        return sorted(int(p.stem) for p in self.folder.glob("*.json") if p.stem.isdigit())

    def _read(self, epoch: int) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = json.loads(self._path(epoch).read_text())
            return found
        except (OSError, ValueError):  # being renewed (replaced) or pruned: read it again
            return None

    def current(self) -> tuple[int, dict[str, Any] | None]:
        """The highest lease file and what it says (None: none, or unreadable for now)."""
        epochs = self._epochs()
        if not epochs:
            return 0, None
        for _ in range(3):
            found = self._read(epochs[-1])
            if found is not None:
                return epochs[-1], found
            time.sleep(0.01)
        return epochs[-1], None

    def _record(self, expires_ms: int) -> str:
        return json.dumps(
            {
                "owner": self.owner,
                "host": self.host,
                "pid": self.pid,
                "epoch": self.epoch,
                "expires_ms": expires_ms,
            }
        )

    # -- the protocol --------------------------------------------------------------------------
    def acquire(self) -> None:
        """Takes the lease, or raises LeaseHeldError naming who holds it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        epoch, held = self.current()
        if epoch and (held is None or self._live(held)):
            raise LeaseHeldError(_held_by(held, self.folder))
        self.epoch = epoch + 1
        try:
            fd = os.open(self._path(self.epoch), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            _, winner = self.current()
            self.epoch = 0
            raise LeaseHeldError(_held_by(winner, self.folder)) from None
        with os.fdopen(fd, "w") as out:
            out.write(self._record(_now_ms() + int(self.seconds * 1000)))
            out.flush()
            os.fsync(out.fileno())
        for old in self._epochs()[:-KEEP]:
            self._path(old).unlink(missing_ok=True)
        self._thread = threading.Thread(target=self._renew_loop, name="adattr-lease", daemon=True)
        self._thread.start()

    def _live(self, held: dict[str, Any]) -> bool:
        if held["expires_ms"] <= _now_ms():
            return False
        # Same host, holder gone (SIGKILLed, crashed): free now rather than at its expiry.
        return not (held["host"] == self.host and not pid_alive(int(held["pid"])))

    def renew(self) -> None:
        """Extends this holder's lease file, if it is still the lease."""
        if not self.epoch or self.current()[0] != self.epoch:
            return
        tmp = self.folder / f".{self.epoch:012d}.{self.owner}.tmp"
        tmp.write_text(self._record(_now_ms() + int(self.seconds * 1000)))
        tmp.replace(self._path(self.epoch))  # atomic: readers see the old or the new one

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            try:
                self.renew()
            except OSError:
                pass  # the check before the next batch decides: an expiring lease stops it

    def check(self) -> None:
        """Raises LeaseLost unless this job holds the lease with a third of it left."""
        epoch, held = self.current()
        if epoch != self.epoch:
            raise LeaseLost(
                f"fenced: this job's lease on the checkpoint (number {self.epoch}) was taken "
                f"over by {_who(held)} (number {epoch}); stopping before writing anything more"
            )
        if held is None or held.get("owner") != self.owner:
            raise LeaseLost(f"the lease file {self._path(self.epoch)} is not this job's")
        left = (held["expires_ms"] - _now_ms()) / 1000
        if left < self.seconds / 3:
            raise LeaseLost(
                f"this job's lease on the checkpoint has {left:.1f}s left (renewals failed or "
                f"the job was paused); stopping before writing anything more"
            )

    def release(self) -> None:
        """Stops renewing and marks the lease expired (if it is still ours)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.epoch and self.current()[0] == self.epoch:
            tmp = self.folder / f".{self.epoch:012d}.{self.owner}.tmp"
            tmp.write_text(self._record(0))
            tmp.replace(self._path(self.epoch))
        self.epoch = 0


def _who(held: dict[str, Any] | None) -> str:
    if held is None:
        return "another job"
    return f"a job on {held['host']} (pid {held['pid']})"


def _held_by(held: dict[str, Any] | None, folder: Path) -> str:
    if held is None:
        return f"another job is taking the checkpoint's lease ({folder}) right now"
    left = max(0.0, (held["expires_ms"] - _now_ms()) / 1000)
    return (
        f"{_who(held)} holds the checkpoint's lease ({folder}, renewed every "
        f"few seconds, {left:.0f}s left); stop it first"
    )
