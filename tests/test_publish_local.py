"""The local half of the commit protocol (``weightprep.stages.publish``): a build written into a hidden directory
beside the output and renamed into place; a replace through ``.NAME.old-PID``; what killed builds leave, by the
process that left it (dead or alive) and by the output it was for; ``--resume`` adopting a dead build's parts."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest
from conftest import SAMPLE_RAW, PartInterrupter

from weightprep.batches import Rows, turn_code
from weightprep.config import config_from_dict
from weightprep.constants import TURNS_NAME
from weightprep.errors import UsageError
from weightprep.manifest import read_manifest
from weightprep.pipeline import build
from weightprep.stages import publish
from weightprep.stages.write import ShardWriter, _ShardSet, arrow_schema

LINES = SAMPLE_RAW.read_bytes().splitlines(keepends=True)
OLD = b"".join(LINES[:40])
NEW = b"".join(LINES[40:70]) + b'{"pieces": "not a list"}\n'


class _Killed(BaseException):
    """A kill -9, as the code sees it: nothing of weightprep catches it."""


def _cfg():
    return config_from_dict({"pack": {"seq_len": 128}, "validate": {"on_invalid": "skip"}})


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_leftovers_of_other_outputs_beside_are_kept(tmp_path):
    (tmp_path / "raw.jsonl").write_bytes(OLD)
    dead = _dead_pid()
    for name in (f".shards.tmp-{dead}", f".other.tmp-{dead}", f".shards2.old-{dead}"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "x").write_text("x")
    build([str(tmp_path / "raw.jsonl")], tmp_path / "shards", _cfg())
    assert not (tmp_path / f".shards.tmp-{dead}").exists()  # this output's: a killed build's, removed
    assert (tmp_path / f".other.tmp-{dead}" / "x").exists() and (tmp_path / f".shards2.old-{dead}" / "x").exists()


def test_a_local_replace_killed_between_its_renames_gets_the_earlier_build_back(tmp_path, monkeypatch):
    """Replacing is out -> .out.old-PID, then the new directory -> out: a kill between the two leaves the earlier
    build in .old, which the next build to out puts back before anything else."""
    import os
    from pathlib import Path

    (tmp_path / "old.jsonl").write_bytes(OLD)
    (tmp_path / "new.jsonl").write_bytes(NEW)
    out = tmp_path / "shards"
    build([str(tmp_path / "old.jsonl")], out, _cfg())
    earlier = {p.name: p.read_bytes() for p in out.iterdir()}
    real = Path.rename

    def killed_at_the_second(self, target):
        if Path(target) == out:
            raise _Killed("kill -9")
        return real(self, target)

    monkeypatch.setattr(Path, "rename", killed_at_the_second)
    with pytest.raises(_Killed):
        build([str(tmp_path / "new.jsonl")], out, _cfg(), overwrite=True)
    monkeypatch.setattr(Path, "rename", real)
    assert not out.exists()
    dead = _dead_pid()  # the process is gone: its leftovers carry a dead process's id
    for p in tmp_path.iterdir():
        if p.name.endswith(f"-{os.getpid()}"):
            p.rename(tmp_path / p.name.replace(f"-{os.getpid()}", f"-{dead}"))
    with pytest.raises(UsageError, match="already exists"):  # put back first, then refused without --overwrite
        build([str(tmp_path / "new.jsonl")], out, _cfg())
    assert {p.name: p.read_bytes() for p in out.iterdir()} == earlier
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.jsonl", "old.jsonl", "shards"]


def _local(tmp_path, data=OLD, name="raw.jsonl"):
    (tmp_path / name).write_bytes(data)
    return str(tmp_path / name)


def test_a_local_build_lists_its_shards_and_leaves_nothing_beside_it(tmp_path):
    """The manifest that is written is the one returned, it lists exactly the shards written with their rows, and
    a replace leaves neither the temporary nor the earlier directory beside the output."""
    import datasets

    out = tmp_path / "a" / "b" / "shards"  # parents made as needed
    build([_local(tmp_path)], out, _cfg())
    manifest = build([_local(tmp_path, NEW, "new.jsonl")], out, _cfg(), overwrite=True)
    assert read_manifest(out) == manifest
    assert sorted(s["filename"] for s in manifest["shards"]) == sorted(p.name for p in out.glob("*.arrow"))
    assert sum(s["rows"] for s in manifest["shards"]) == len(datasets.load_from_disk(str(out)))
    assert sorted(p.name for p in out.parent.iterdir()) == ["shards"]


def test_a_local_build_whose_records_all_drop_writes_one_empty_shard(tmp_path):
    cfg = config_from_dict({"pack": {"seq_len": 16}, "validate": {"on_invalid": "skip"}})  # every document overlong
    manifest = build([_local(tmp_path)], tmp_path / "out", cfg)
    assert [s["rows"] for s in manifest["shards"]] == [0] and manifest["counts"]["rows"] == 0
    import datasets

    assert len(datasets.load_from_disk(str(tmp_path / "out"))) == 0


def test_a_failed_local_build_leaves_nothing(tmp_path):
    from weightprep.errors import InputError

    bad = _local(tmp_path, OLD + b'{"pieces": 3}\n')
    with pytest.raises(InputError, match="raw.jsonl:41: pieces"):
        build([bad], tmp_path / "out", config_from_dict({"pack": {"seq_len": 128}}))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw.jsonl"]


def test_local_output_checks(tmp_path, monkeypatch):
    raw = _local(tmp_path)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(UsageError, match="exists and is not a directory"):
        publish.prepare_output(tmp_path / "afile", overwrite=True)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "raw.jsonl").write_bytes(OLD)
    with pytest.raises(UsageError, match="is inside the output path"):
        publish.prepare_output(tmp_path / "out", overwrite=True, inputs=[str(tmp_path / "out" / "raw.jsonl")])
    (tmp_path / "out" / "raw.jsonl").unlink()
    monkeypatch.chdir(tmp_path / "out")
    assert publish.prepare_output(".", overwrite=True, inputs=[raw]) == tmp_path / "out"  # "." as its real name


def test_directories_of_live_processes_are_left_alone(tmp_path):
    import os
    import subprocess
    import sys

    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for name in (f".shards.tmp-{live.pid}", f".shards.old-{live.pid}", f".shards.old-{os.getpid()}"):
            (tmp_path / name).mkdir()
            (tmp_path / name / "x").write_text("x")
        build([_local(tmp_path)], tmp_path / "shards", _cfg())
        for name in (f".shards.tmp-{live.pid}", f".shards.old-{live.pid}", f".shards.old-{os.getpid()}"):
            assert (tmp_path / name / "x").exists(), name
    finally:
        live.kill()
        live.wait()


def test_a_killed_local_build_is_resumed_from_its_parts_and_other_plans_are_dropped(tmp_path, monkeypatch):
    """The directory of a dead build of this plan is adopted by --resume (its finished parts not run again); one
    of another plan is removed; without --resume or --overwrite the build stops and says what it found."""
    import os

    from weightprep.errors import BuildInterrupted, LeftoverParts

    raw = _local(tmp_path, OLD + NEW)
    cfg = config_from_dict({"pack": {"seq_len": 128}, "read": {"part_bytes": 4_000}, "validate": {"on_invalid": "skip"}})
    ctrl_c = PartInterrupter(monkeypatch)
    runs = ctrl_c.runs
    with pytest.raises(BuildInterrupted):
        build([raw], tmp_path / "shards", cfg)
    dead = _dead_pid()
    (tmp_path / f".shards.tmp-{os.getpid()}").rename(tmp_path / f".shards.tmp-{dead}")
    other = tmp_path / f".shards.tmp-{_dead_pid()}"
    (other / "parts" / "00000").mkdir(parents=True)
    (other / "plan.json").write_text("another plan")
    (other / "parts" / "00000" / "result.json").write_text("{}")
    ctrl_c.interrupt = False
    with pytest.raises(LeftoverParts):
        build([raw], tmp_path / "shards", cfg)
    runs.clear()
    build([raw], tmp_path / "shards", cfg, resume=True)
    assert 0 not in runs and 1 in runs  # part 0 reused
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw.jsonl", "shards"]  # the other plan's removed
    fresh = build([raw], tmp_path / "fresh", cfg)
    assert read_manifest(tmp_path / "shards")["counts"] == fresh["counts"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "shards").glob("*.arrow")} == {
        p.name: p.read_bytes() for p in (tmp_path / "fresh").glob("*.arrow")}


def test_overwrite_removes_a_dead_builds_parts(tmp_path):
    dead = tmp_path / f".shards.tmp-{_dead_pid()}"
    (dead / "parts" / "00000").mkdir(parents=True)
    (dead / "plan.json").write_text("p")
    (dead / "parts" / "00000" / "result.json").write_text("{}")
    build([_local(tmp_path)], tmp_path / "shards", _cfg(), overwrite=True)
    assert not dead.exists()


def test_alive_tells_running_processes_from_dead_and_zombie_ones():
    import os
    import subprocess
    import sys
    import time

    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # exits, and is not waited for: a zombie
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with open(f"/proc/{zombie.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.05)
        assert publish._alive(running.pid) is True
        assert publish._alive(os.getpid()) is True
        assert publish._alive(zombie.pid) is False  # its leftovers are a dead build's
        assert publish._alive(_dead_pid()) is False
        from pathlib import Path

        with pytest.MonkeyPatch.context() as m:  # another user's process: signals refused, so it is taken as alive
            m.setattr(os, "kill", lambda pid, sig: (_ for _ in ()).throw(PermissionError(pid)))
            assert publish._alive(running.pid) is True
        with pytest.MonkeyPatch.context() as m:  # no /proc to read (another system): a live process stays alive
            m.setattr(Path, "read_text", lambda self, *a, **k: (_ for _ in ()).throw(OSError(str(self))))
            assert publish._alive(running.pid) is True
    finally:
        running.kill()
        running.wait()
        zombie.wait()


def test_interrupted_builds_of_an_output_whose_parent_is_missing_are_none(tmp_path):
    assert publish.interrupted_builds(tmp_path / "missing" / "shards") == []



def test_resume_never_touches_a_live_builds_directory_nor_adopts_another_plan(tmp_path, monkeypatch):
    """Only a dead build's directory of this very plan is adopted; a live process's is left as it is, and one of
    another plan (named to sort first) is removed, not adopted."""
    import os
    import subprocess
    import sys

    from weightprep.errors import BuildInterrupted

    raw = _local(tmp_path, OLD + NEW)
    cfg = config_from_dict({"pack": {"seq_len": 128}, "read": {"part_bytes": 4_000}, "validate": {"on_invalid": "skip"}})
    ctrl_c = PartInterrupter(monkeypatch)
    with pytest.raises(BuildInterrupted):
        build([raw], tmp_path / "shards", cfg)
    ours = tmp_path / f".shards.tmp-{_dead_pid()}"
    (tmp_path / f".shards.tmp-{os.getpid()}").rename(ours)
    plan = (ours / "plan.json").read_text()
    other = tmp_path / f".shards.tmp-0{_dead_pid()}"  # sorts before ours
    (other / "parts" / "00000").mkdir(parents=True)
    (other / "plan.json").write_text("another plan")
    (other / "parts" / "00000" / "result.json").write_text("{}")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        theirs = tmp_path / f".shards.tmp-{live.pid}"
        (theirs / "parts").mkdir(parents=True)
        (theirs / "plan.json").write_text(plan)  # even a live build of this plan is its own
        ctrl_c.interrupt = False
        ctrl_c.runs.clear()
        build([raw], tmp_path / "shards", cfg, resume=True)
        assert 0 not in ctrl_c.runs  # our part 0 reused (not the other plan's)
        assert (theirs / "plan.json").read_text() == plan and not other.exists()
    finally:
        live.kill()
        live.wait()
    fresh = build([raw], tmp_path / "fresh", cfg)
    assert read_manifest(tmp_path / "shards")["counts"] == fresh["counts"]


def test_a_stale_directory_of_this_process_is_emptied_before_a_build_uses_it(tmp_path):
    import os

    stale = tmp_path / f".shards.tmp-{os.getpid()}"
    stale.mkdir()
    (stale / "junk.arrow").write_text("from an earlier build in this process")
    build([_local(tmp_path)], tmp_path / "shards", _cfg())
    assert "junk.arrow" not in {p.name for p in (tmp_path / "shards").iterdir()}


def test_the_manifest_and_state_files_are_written_in_one_canonical_form(tmp_path):
    """Byte-identical outputs need one spelling of the manifest: sorted keys, two-space indent, UTF-8 as is, a final
    newline; and datasets' fingerprints of 16 hex digits."""
    import json

    raw = _local(tmp_path, OLD, "données-ü.jsonl")
    cfg = config_from_dict({"pack": {"seq_len": 128}, "split": {"validation_fraction": 0.2}})
    build([raw], tmp_path / "out", cfg)
    text = (tmp_path / "out" / "weightprep_manifest.json").read_text(encoding="utf-8")
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    assert "données-ü.jsonl" in text
    build([raw], tmp_path / "whole", _cfg())  # no split: the state.json at the top
    for state in (tmp_path / "out" / "train", tmp_path / "out" / "validation", tmp_path / "whole"):
        fingerprint = json.loads((state / "state.json").read_text())["_fingerprint"]
        assert len(fingerprint) == 16 and int(fingerprint, 16) >= 0
        for name in ("state.json", "dataset_info.json"):  # as datasets writes them: sorted, two-space indent
            text = (state / name).read_text()
            assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n", name


def test_a_shard_set_caps_each_shard_at_its_rows_and_closes_each_before_the_next(tmp_path):
    """Rows go to ``shard-i.arrow`` files of at most ``rows_per_shard`` rows, each a complete Arrow stream holding
    exactly the rows its entry counts, in order, whatever the batches' sizes."""
    schema = arrow_schema(4, packed=False)

    def batch(first: int, n: int) -> pa.RecordBatch:
        arrays = []
        for f in schema:
            if isinstance(f.type, pa.FixedSizeListType):
                values = np.repeat(np.arange(first, first + n), 4).astype(f.type.value_type.to_pandas_dtype())
                arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(values, f.type.value_type), 4))
            else:
                arrays.append(pa.array([[4]] * n, f.type))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    fds = len(os.listdir("/proc/self/fd"))
    shards = _ShardSet(tmp_path / "set", schema, rows_per_shard=3)
    for first, n in ((0, 2), (2, 5), (7, 1)):
        shards.write(batch(first, n))
    written = shards.close()
    assert len(os.listdir("/proc/self/fd")) == fds  # every shard's file closed
    assert [(p.name, rows) for p, rows in written] == [("shard-00000.arrow", 3), ("shard-00001.arrow", 3),
                                                        ("shard-00002.arrow", 2)]  # fmt: skip
    seen = []
    for path, rows in written:
        with pa.OSFile(str(path), "rb") as f:
            table = pa.ipc.open_stream(f).read_all()
        assert table.num_rows == rows and table.schema.equals(schema)
        seen += [ids[0] for ids in table.column("input_ids").to_pylist()]
    assert seen == list(range(8))
    aborted = _ShardSet(tmp_path / "aborted", schema, rows_per_shard=3)
    aborted.write(batch(0, 4))
    aborted.abort()  # a failed part: its open shard's file is closed too
    assert len(os.listdir("/proc/self/fd")) == fds


def test_an_aborted_writer_closes_its_shards_and_its_turns_files(tmp_path):
    """A part that fails aborts its writer: every split's open shard and turns file is closed (nothing held open
    while the part's directory is removed or kept for --resume)."""
    roles: list[str] = []
    n, length = 3, 4
    code = turn_code(roles, "assistant", 0)
    ids = np.arange(n * length, dtype=np.int32).reshape(n, length)
    rows = Rows(ids, ids.copy(), np.ones((n, length), np.float32), np.tile(np.arange(length, dtype=np.int32), (n, 1)),
                [np.array([length], np.int32)] * n, np.full(n, length), np.ones(n, np.int64),
                turns=np.full((n, length), code, np.int32))  # fmt: skip
    fds = len(os.listdir("/proc/self/fd"))
    writer = ShardWriter(tmp_path, length, packed=True, max_shard_bytes=1 << 20, splits=("train", "validation"),
                         turn_roles=roles)  # fmt: skip
    writer.write(rows, "train")
    writer.write(rows, "validation")
    assert (tmp_path / "train" / TURNS_NAME).exists() and len(os.listdir("/proc/self/fd")) == fds + 4
    writer.abort()
    assert len(os.listdir("/proc/self/fd")) == fds
