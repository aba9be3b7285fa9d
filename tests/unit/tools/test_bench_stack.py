"""The bench's stack (`bench_stack`): the job as shipped where a drill's stack shrinks it."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.runtime.settings import Settings
from app.tools.bench import _run_env, bench_stack
from app.tools.drills import Stack

SHAPED = ("watermark_delay", "attribution_lookback", "session_gap", "shuffle_partitions")


def test_the_bench_and_its_own_settings_keep_the_shipped_defaults_a_drill_shrinks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in SHAPED:
        monkeypatch.delenv(f"ADATTR_{name.upper()}", raising=False)
    shipped = Settings.from_env({"ADATTR_DATA_DIR": str(tmp_path)})
    drill = Stack(shipped, "drill", events=10, seed=1, batch=7)
    bench = bench_stack(shipped, "bench", events=10, batch=7)
    for name in SHAPED:
        assert getattr(drill.settings, name) != getattr(shipped, name), name
        # What the bench's own session runs with (its publish cost, a bench tool's Spark) is
        # what the jobs it starts run with: nothing left of the drill's shape in either.
        assert getattr(bench.settings, name) == getattr(shipped, name), name
        assert f"ADATTR_{name.upper()}" not in {**bench.env, **bench.overrides}
    assert bench.settings.max_offsets_per_trigger == 7
    assert bench.settings.trigger_interval == "1 second"


def test_an_override_reaches_the_jobs_env_and_the_stacks_settings(tmp_path: Path) -> None:
    s = Stack(
        Settings.from_env({"ADATTR_DATA_DIR": str(tmp_path)}), "drill", events=10, seed=1, batch=7
    )
    s.override({"ADATTR_MAX_OFFSETS_PER_TRIGGER": "500", "ADATTR_SESSION_GAP": None})
    assert s.env["ADATTR_MAX_OFFSETS_PER_TRIGGER"] == "500"
    assert s.settings.max_offsets_per_trigger == 500
    assert "ADATTR_SESSION_GAP" not in s.overrides


def test_a_measured_run_starts_from_the_stacks_env_and_never_inherits_a_crash_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ADATTR_CRASH_AT", "after_gold")  # left behind by a user's drill
    s = bench_stack(
        Settings.from_env({"ADATTR_DATA_DIR": str(tmp_path)}), "bench", events=10, batch=7
    )
    env = _run_env(s, "b3", own_input=True)
    assert "ADATTR_CRASH_AT" not in env
    assert env["ADATTR_MAX_OFFSETS_PER_TRIGGER"] == "0"  # its own input, uncapped
    assert env["ADATTR_WAREHOUSE"] == str(s.dir / "b3" / "warehouse")
    assert _run_env(s, "b3")["ADATTR_MAX_OFFSETS_PER_TRIGGER"] == "7"  # the stack's cap


def test_progress_is_the_newest_batch_id_not_the_entries_spark_kept(tmp_path: Path) -> None:
    """A drill waits on (planned, committed) growing; past ``minBatchesToRetain`` Spark deletes
    each log's oldest entries, so a count of them would stop growing and the wait never end."""
    s = Stack(
        Settings.from_env({"ADATTR_DATA_DIR": str(tmp_path)}), "drill", events=10, seed=1, batch=7
    )
    assert s.progress() == (0, 0)  # no generation yet
    root = s.settings.checkpoints / "attribution"
    gen = root / "gen-0002"
    for log, ids in (("offsets", range(31, 132)), ("commits", range(30, 130))):
        (gen / log).mkdir(parents=True)
        for i in ids:
            (gen / log / str(i)).write_text("v1")
            (gen / log / f".{i}.crc").write_text("")
    (root / "generation.json").write_text('{"number": 2, "app_id": "a"}')
    assert s.progress() == (132, 130)
