"""Crash safety (issue 5): a real ``weightprep build`` SIGKILLed at random moments leaves either
nothing or the previous complete dataset at the output path, and a rerun is byte-identical to an
uninterrupted build. About 40-60 s: each kill needs a fresh process."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner
from conftest import SAMPLE_RAW

from weightprep.cli import main

ARGS = ["--seq-len", "512", "--max-shard-bytes", "65536"]  # many small shards: kills land mid-write


def _command() -> list[str]:
    script = Path(sys.executable).with_name("weightprep")
    return [str(script)] if script.exists() else [sys.executable, "-m", "weightprep"]


def _snapshot(path: Path) -> dict[str, bytes] | None:
    if not path.exists():
        return None
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def _kill_during(cmd: list[str], tmp_name: Path, rng: random.Random, *, from_start: bool) -> int | None:
    """Start ``cmd``; SIGKILL it at a random moment (after it began writing, unless ``from_start``)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmp = tmp_name.parent / f".{tmp_name.name}.tmp-{proc.pid}"
    if from_start:
        time.sleep(rng.uniform(0.0, 10.0))
    else:
        deadline = time.monotonic() + 60
        while not tmp.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 3.0))
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return proc.returncode


def test_sigkill_at_random_moments(tmp_path):
    rng = random.Random(int(os.environ.get("WEIGHTPREP_CRASH_SEED", "5")))
    raw = tmp_path / "raw.jsonl"
    raw.write_bytes(SAMPLE_RAW.read_bytes() * 12)  # ~9 MB: a few seconds of work after start-up
    out = tmp_path / "out"
    cmd = [*_command(), "build", str(raw), "--out", str(out), *ARGS]

    reference = tmp_path / "reference"
    result = CliRunner().invoke(main, ["build", str(raw), "--out", str(out), *ARGS])
    assert result.exit_code == 0, result.output
    out.rename(reference)
    expected = _snapshot(reference)

    # 1. no previous output: a kill leaves nothing (or, had it finished, the complete dataset)
    _kill_during(cmd, out, rng, from_start=True)
    assert _snapshot(out) in (None, expected)
    shutil.rmtree(out, ignore_errors=True)

    # 2. a previous, different, complete dataset: kills during an --overwrite leave it in place
    result = CliRunner().invoke(main, ["build", str(raw), "--out", str(out), "--seq-len", "256"])
    assert result.exit_code == 0, result.output
    previous = _snapshot(out)
    for _ in range(2):
        _kill_during([*cmd, "--overwrite"], out, rng, from_start=False)
        found = _snapshot(out)
        if found is None:  # killed between the two renames of the replace: the old one waits beside it
            assert any(p.name.startswith(".out.old-") for p in tmp_path.iterdir())
        else:
            assert found in (previous, expected)
            if found == expected:  # it finished: make the next kill replace the previous one again
                shutil.rmtree(out)
                shutil.copytree(reference, out)

    # 3. a rerun succeeds, cleans up after the killed builds, and matches the uninterrupted build
    done = subprocess.run([*cmd, "--overwrite"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert _snapshot(out) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "raw.jsonl", "reference"]
