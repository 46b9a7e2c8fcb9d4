"""The build on several workers: the part plan, executors (serial, local processes, Ray actors), the merge.

Every executor and worker count must write the same bytes; bad lines in several parts and files are reported by
their line in their file, the earliest in input order, without waiting for later parts; killed workers are
retried; --resume reuses what a killed driver finished, and only when nothing that decides the bytes changed."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, SAMPLE_RAW
from hypothesis import given, settings
from hypothesis import strategies as st
from split_support import Delaying, wait_for_parts

from weightprep.config import config_from_dict
from weightprep.distribute.executors import LocalExecutor, RayExecutor, SerialExecutor
from weightprep.distribute.plan import file_cuts, plan_parts
from weightprep.errors import BuildInterrupted, InputError, LeftoverParts
from weightprep.pipeline import build
from weightprep.stages.read import InputFile, read_blocks

PART = 150_000  # the 763 kB sample: 6 parts


def _digests(out: Path) -> dict[str, str]:
    return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.rglob("*")) if p.is_file()}


def _cfg(**over):
    return config_from_dict({"pack": {"seq_len": 512}, "read": {"part_bytes": PART, "block_bytes": 32768}, **over})


# ---- the part plan ---------------------------------------------------------------------------------------------

_line = st.one_of(
    st.text(alphabet="ab{}\"\r é", max_size=40),  # CR and CRLF inside and at the end of lines
    st.text(alphabet="x", min_size=200, max_size=600),  # lines longer than a part
)


@settings(max_examples=150, deadline=None)
@given(
    lines=st.lists(_line, max_size=30),
    final_newline=st.booleans(),
    bom=st.booleans(),
    part_bytes=st.integers(1, 300),
)
def test_every_line_lands_in_exactly_one_part(tmp_path_factory, lines, final_newline, bom, part_bytes):
    data = (b"\xef\xbb\xbf" if bom else b"") + "\n".join(lines).encode() + (b"\n" if final_newline and lines else b"")
    path = tmp_path_factory.mktemp("plan") / "raw.jsonl"
    path.write_bytes(data)
    cuts = file_cuts(str(path), part_bytes)
    assert cuts[0] == 0 and cuts[-1] == len(data)
    assert all(a < b for a, b in zip(cuts, cuts[1:], strict=False)) or cuts == [0, 0]
    assert all(data[c - 1 : c] == b"\n" for c in cuts[1:-1])  # every inner cut just after a newline
    # lines start at 0 and after each newline: each start lies in exactly one part
    starts = [0, *(i + 1 for i, b in enumerate(data) if b == 10 and i + 1 < len(data))] if data else []
    for s in starts:
        assert sum(a <= s < b for a, b in zip(cuts, cuts[1:], strict=False)) == 1
    # reading the parts gives the lines of reading the file whole, numbered within each part
    whole_record = InputFile(str(path))
    whole = b"".join(b.data for b in read_blocks(whole_record, 1024))
    plan = plan_parts([str(path)], part_bytes)
    parts, lines_total = [], 0
    for s in plan:
        record = InputFile(str(path))
        window = {} if s.whole else {"start": s.start, "end": s.end}
        blocks = list(read_blocks(record, 1024, **window))
        assert all(b.offset >= s.start for b in blocks)
        parts.append(b"".join(b.data for b in blocks))
        assert record.size == s.size
        assert record.sha256 == hashlib.sha256(data[s.start : s.end]).hexdigest()
        lines_total += record.lines
    assert b"".join(parts) == whole
    assert lines_total == whole_record.lines


def test_plan_depends_on_the_input_and_part_bytes_only(tmp_path):
    gz = tmp_path / "a.jsonl.gz"
    gz.write_bytes(b"\x1f\x8b" + b"0" * 5000)
    plan = plan_parts([str(SAMPLE_RAW), str(gz)], PART)
    assert [s.file for s in plan] == [0] * 6 + [1]  # a compressed file is one part
    assert plan[-1].whole and (plan[-1].start, plan[-1].end) == (0, 5002)
    assert [s.index for s in plan] == list(range(7))
    assert plan == plan_parts([str(SAMPLE_RAW), str(gz)], PART)


def _conversation(i: int, words: int) -> dict:
    return {"messages": [{"role": "user", "content": f"question {i}"},
                         {"role": "assistant", "content": " ".join(["word"] * words), "weight": 1.0}]}  # fmt: skip


@pytest.mark.parametrize("layout", ["jsonl", "array"])
def test_a_file_of_conversations_is_cut_into_equal_parts_finer_than_part_bytes(tmp_path, monkeypatch, layout):
    """Rendering a conversation costs ~30x reading the same bytes of pieces: a file whose first record is a
    conversation is cut into K = ceil(size / chat_part_bytes) parts near k/K of its size; pieces are not."""
    from weightprep.distribute import plan as plan_module
    from weightprep.distribute.plan import chat_part_bytes

    monkeypatch.setattr(plan_module, "CHAT_PART_FLOOR", 1000)  # small files stand for large ones
    part_bytes = 160_000
    records = [_conversation(i, 20 + i % 50) for i in range(300)]
    pieces = [{"pieces": [{"text": " ".join(["word"] * (20 + i % 50)), "weight": 1.0}]} for i in range(300)]
    for name, rows in (("chat", records), ("pieces", pieces)):
        lines = [json.dumps(r) for r in rows]
        text = "\n".join(lines) + "\n" if layout == "jsonl" else "[\n" + ",\n".join(lines) + "\n]\n"
        data = text.encode()
        path = tmp_path / (f"{name}.jsonl" if layout == "jsonl" else f"{name}.json")
        path.write_bytes(data)
        size = len(data)
        assert chat_part_bytes(part_bytes) == 10_000 < size <= part_bytes  # one part as pieces
        plan = plan_parts([str(path)], part_bytes)
        if name == "pieces":
            assert [(p.start, p.end) for p in plan] == [(0, size)]
            continue
        k = -(-size // 10_000)  # ceil
        assert len(plan) == k and plan[0].start == 0 and plan[-1].end == size
        # a part starts after a record's separator: the newline of JSON Lines, the "," of an array (written ",\n")
        after = b"{" if layout == "jsonl" else b"\n{"
        separator = b"\n" if layout == "jsonl" else b","
        record_starts = [i for i in range(1, size) if data[i - 1 : i] == separator and data[i : i + len(after)] == after]
        for j, p in enumerate(plan[:-1], start=1):  # each cut: the first record start at or past j/K of the size
            target = -(-j * size // k)
            assert p.end == min(s for s in record_starts if s >= target)
        guessed = plan_parts([str(path)], part_bytes, exact=False)  # a build's plan (an array's cuts may be guessed)
        assert [(p.start, p.end) for p in guessed] == [(p.start, p.end) for p in plan]
        # --part-bytes at the floor or under it: conversations are cut at that size too (into equal parts)
        assert len(plan_parts([str(path)], 1000)) == -(-size // 1000)


@pytest.mark.parametrize(
    ("first", "columns", "conversation"),
    [
        (_conversation(0, 3), None, True),
        ({"dialog": [{"role": "user", "content": "hi"}]}, "messages=dialog", True),  # named by --columns
        ({"dialog": [{"role": "user", "content": "hi"}]}, None, False),  # no shape: the build names the record
        ({"pieces": [{"text": "a", "weight": 1}]}, None, False),
    ],
)  # every shape: tests/test_shapes.py::test_a_conversation_is_a_record_built_through_the_chat_template
def test_the_first_record_tells_a_file_of_conversations(tmp_path, monkeypatch, first, columns, conversation):
    from weightprep.distribute import plan as plan_module
    from weightprep.stages.columns import parse_columns

    monkeypatch.setattr(plan_module, "CHAT_PART_FLOOR", 1000)
    path = tmp_path / "raw.jsonl"
    filler = json.dumps({"pieces": [{"text": "x" * 200, "weight": 1}]})
    path.write_text(json.dumps(first) + "\n" + "\n".join([filler] * 200) + "\n")  # only the first record counts
    parts = plan_parts([str(path)], 48_000, columns=parse_columns(columns))
    assert (len(parts) > 1) is conversation


def test_a_build_cuts_a_file_of_conversations_finer_its_columns_named_as_given(tmp_path, monkeypatch):
    """The build plans with ``read.columns``: a conversation under another field name is known by its first record
    as the parts will read it, and its parts are built as the plan says (each conversation once)."""
    from chat_support import chat_tokenizer

    from weightprep.distribute import plan as plan_module

    monkeypatch.setattr(plan_module, "CHAT_PART_FLOOR", 1000)
    tok_dir = tmp_path / "tok"
    chat_tokenizer("chatml").save_pretrained(str(tok_dir))
    rows = [{"dialog": _conversation(i, 5 + i % 20)["messages"]} for i in range(60)]
    path = tmp_path / "raw.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    size = path.stat().st_size
    part_bytes = 16 * (size // 3 + 1)  # conversations: 3 parts of at most size // 3 + 1 bytes; as pieces, one
    cfg = config_from_dict({"tokenizer": {"name": str(tok_dir)}, "pack": {"seq_len": 256},
                            "read": {"part_bytes": part_bytes, "columns": "messages=dialog"}})  # fmt: skip
    manifest = build([str(path)], tmp_path / "out", cfg, executor=SerialExecutor())
    parts = manifest["inputs"][0]["parts"]
    assert len(parts) == 3 and sum(p["lines"] for p in parts) == 60 and sum(p["bytes"] for p in parts) == size
    assert manifest["counts"]["chat_documents"] == 60


@given(part_bytes=st.integers(1, 1 << 40))
def test_chat_part_bytes_is_a_finer_cut_never_under_the_floor(part_bytes):
    from weightprep.distribute.plan import CHAT_PART_DIVISOR, CHAT_PART_FLOOR, chat_part_bytes

    chat = chat_part_bytes(part_bytes)
    assert min(part_bytes, CHAT_PART_FLOOR) <= chat <= part_bytes
    assert chat == max(part_bytes // CHAT_PART_DIVISOR, min(part_bytes, CHAT_PART_FLOOR))
    assert chat_part_bytes(256 << 20) == 16 << 20  # the default part size's


# ---- same bytes everywhere --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "out"
    build([str(SAMPLE_RAW)], out, _cfg(), executor=SerialExecutor())
    return _digests(out)


def test_a_file_in_one_part_has_its_whole_hash(tmp_path):
    manifest = build([str(SAMPLE_RAW)], tmp_path / "one", _cfg(read={"part_bytes": 1 << 30}))
    assert manifest["inputs"][0]["sha256"] == hashlib.sha256(SAMPLE_RAW.read_bytes()).hexdigest()
    assert "parts" not in manifest["inputs"][0]


@pytest.mark.parametrize(
    "make", ["serial", "local-2", "ray-1", "ray-2", "local-2-delayed", "ray-2-delayed", "local-2-random"]
)
def test_every_executor_writes_the_same_bytes(make, tmp_path, reference, request):
    kind, *rest = make.split("-")
    workers = int(rest[0]) if rest else 1
    if kind == "ray":
        request.getfixturevalue("ray_session")
    inner = {"serial": SerialExecutor(), "local": LocalExecutor(workers), "ray": RayExecutor(workers)}[kind]
    delays = {i: 0.4 * (6 - i) for i in range(6)} if "delayed" in make else {}  # later parts finish first
    if "random" in make:
        rng = random.Random(int(os.environ.get("WEIGHTPREP_DELAY_SEED", "3")))
        delays = {i: rng.uniform(0.0, 1.0) for i in range(6)}
    executor = Delaying(inner, delays)
    out = tmp_path / "out"
    manifest = build([str(SAMPLE_RAW)], out, _cfg(), executor=executor)
    assert _digests(out) == reference
    assert sorted(executor.order) == list(range(6))
    if "delayed" in make:
        assert executor.order != sorted(executor.order)  # they did finish out of order
    entry = manifest["inputs"][0]
    assert entry["sha256"] is None and len(entry["parts"]) == 6
    data = SAMPLE_RAW.read_bytes()
    assert [s["sha256"] for s in entry["parts"]] == [
        hashlib.sha256(data[s["start"] : s["start"] + s["bytes"]]).hexdigest() for s in entry["parts"]
    ]
    assert entry["lines"] == data.count(b"\n") and entry["bytes"] == len(data)


# ---- bad lines in several parts --------------------------------------------------------------------------------


def _with_bad_lines(tmp_path) -> tuple[Path, list[int]]:
    lines = SAMPLE_RAW.read_bytes().splitlines(keepends=True)
    bad = [len(lines) // 5, len(lines) // 2, len(lines) - 3]  # in parts 1, 3 and 5
    for n in bad:
        lines[n - 1] = b'{"pieces": [{"text": "x", "weight": -1}]}\n'
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"".join(lines))
    return path, bad


@pytest.mark.parametrize("kind", ["serial", "local", "ray"])
def test_strict_mode_reports_the_earliest_bad_line_in_input_order(kind, tmp_path, request):
    if kind == "ray":
        request.getfixturevalue("ray_session")
    path, bad = _with_bad_lines(tmp_path)
    inner = {"serial": SerialExecutor(), "local": LocalExecutor(2), "ray": RayExecutor(2)}[kind]
    plan = plan_parts([str(path)], PART)
    first_part = next(s.index for s in plan if s.start <= _offset(path, bad[0]) < s.end)
    delays = {i: (0.0 if i > first_part else 1.0) for i in range(len(plan))}  # later bad parts finish first
    with pytest.raises(InputError) as err:
        build([str(path)], tmp_path / "out", _cfg(), executor=Delaying(inner, delays))
    assert (err.value.line, err.value.field, err.value.offset) == (bad[0], "pieces[0].weight", _offset(path, bad[0]))
    assert str(err.value).startswith(f"{path}:{bad[0]}: pieces[0].weight:")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]  # nothing half-written


def _offset(path: Path, line: int) -> int:
    return sum(len(x) for x in path.read_bytes().splitlines(keepends=True)[: line - 1])


@pytest.mark.parametrize("kind", ["local", "ray"])
def test_skipped_lines_of_every_part_are_numbered_in_their_file(kind, tmp_path, request):
    if kind == "ray":
        request.getfixturevalue("ray_session")
    path, bad = _with_bad_lines(tmp_path)
    one = build([str(path)], tmp_path / "one", _cfg(validate={"on_invalid": "skip"}, read={"part_bytes": 1 << 30}))
    executor = LocalExecutor(2) if kind == "local" else RayExecutor(2)
    many = build([str(path)], tmp_path / "many", _cfg(validate={"on_invalid": "skip"}), executor=executor)
    rejects = [json.loads(x) for x in (tmp_path / "many" / "rejects.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rejects] == bad
    assert [r["byte_offset"] for r in rejects] == [_offset(path, n) for n in bad]
    assert (tmp_path / "many" / "rejects.jsonl").read_bytes() == (tmp_path / "one" / "rejects.jsonl").read_bytes()
    assert many["counts"]["rejected"] == one["counts"]["rejected"] == {"bad_weight": 3}
    assert many["counts"]["records"] == one["counts"]["records"]


def test_a_later_part_whose_bad_line_is_found_first_does_not_win(tmp_path):
    """Part 0 holds a bad line but is held back: part 2's bad line is found first; the error is part 0's."""
    lines = SAMPLE_RAW.read_bytes().splitlines(keepends=True)
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"".join(lines))
    plan = plan_parts([str(path)], PART)
    first_lines = _first_lines(path, plan)
    bad = [first_lines[0] + 3, first_lines[2] + 3]  # in parts 0 and 2
    for n in bad:
        lines[n - 1] = _bad_line(len(lines[n - 1]))
    path.write_bytes(b"".join(lines))
    assert plan_parts([str(path)], PART) == plan
    executor = Delaying(LocalExecutor(2), {0: 8.0})
    with pytest.raises(InputError) as err:
        build([str(path)], tmp_path / "out", _cfg(), executor=executor)
    assert 2 in executor.order and executor.order.index(2) < executor.order.index(0)  # part 2 was found first
    assert str(err.value).startswith(f"{path}:{bad[0]}: pieces[0].weight:")


def _bad_line(size: int) -> bytes:
    """An invalid line (a negative weight) of ``size`` bytes with its newline, so the part cuts stay where they were."""
    head, tail = b'{"pieces": [{"text": "', b'", "weight": -1}]}\n'
    return head + b"x" * max(1, size - len(head) - len(tail)) + tail


def _first_lines(path: Path, plan) -> list[int]:
    """The file's line number of each part's first line, counted from the bytes (not by the build)."""
    data = path.read_bytes()
    return [data[: s.start].count(b"\n") + 1 for s in plan]


def _files_with_bad_lines(tmp_path, bad_at: dict[str, list[tuple[int, int]]]) -> tuple[list[Path], list[tuple[Path, int]]]:
    """Three inputs of a third of the sample each, every one cut into several parts; line ``k`` of part ``part``
    of each file named in ``bad_at`` made invalid. The bad lines as (file, line in that file), in input order."""
    lines = SAMPLE_RAW.read_bytes().splitlines(keepends=True)
    third = len(lines) // 3
    paths, bad = [], []
    for i, name in enumerate(("a", "b", "c")):
        path = tmp_path / f"{name}.jsonl"
        path.write_bytes(b"".join(lines[i * third : (i + 1) * third]))
        plan = plan_parts([str(path)], MULTI_PART)
        assert len(plan) >= 3
        own = path.read_bytes().splitlines(keepends=True)
        for part, k in bad_at.get(name, []):
            n = _first_lines(path, plan)[part] + k
            own[n - 1] = _bad_line(len(own[n - 1]))
            bad.append((path, n))
        path.write_bytes(b"".join(own))
        assert plan_parts([str(path)], MULTI_PART) == plan  # the bad lines did not move the cuts
        paths.append(path)
    return paths, sorted(bad, key=lambda b: (paths.index(b[0]), b[1]))


MULTI_PART = 60_000  # a third of the sample: 4 or 5 parts


def test_strict_mode_numbers_a_bad_line_within_its_own_file(tmp_path):
    """The earliest bad line is in a later part of the second file: its number counts that file's lines only."""
    paths, bad = _files_with_bad_lines(tmp_path, {"b": [(2, 5), (3, 1)], "c": [(1, 2)]})
    cfg = _cfg(read={"part_bytes": MULTI_PART, "block_bytes": 32768})
    with pytest.raises(InputError) as err:
        build([str(p) for p in paths], tmp_path / "out", cfg, executor=Delaying(LocalExecutor(2), {}))
    path, line = bad[0]
    assert (err.value.path, err.value.line, err.value.offset) == (str(path), line, _offset(path, line))
    assert str(err.value).startswith(f"{path}:{line}: pieces[0].weight:")


def test_skipped_lines_of_several_files_are_numbered_in_their_own_file(tmp_path):
    paths, bad = _files_with_bad_lines(tmp_path, {"a": [(1, 3)], "b": [(0, 4), (2, 5), (3, 1)], "c": [(2, 2)]})
    cfg = _cfg(read={"part_bytes": MULTI_PART, "block_bytes": 32768}, validate={"on_invalid": "skip"})
    build([str(p) for p in paths], tmp_path / "out", cfg)
    rejects = [json.loads(x) for x in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["source"], r["line"], r["byte_offset"]) for r in rejects] == [
        (str(p), n, _offset(p, n)) for p, n in bad
    ]
    for r in rejects:  # and that line of that file is the one rejected
        assert Path(r["source"]).read_text().splitlines()[r["line"] - 1] == r["original"]


def test_rejects_of_later_parts_keep_their_non_ascii_text_byte_for_byte(tmp_path):
    """A rejected line of a later part is renumbered in the merge (a JSON round trip): its non-ASCII text must come
    out as the one-part build writes it, not \\u-escaped."""
    paths, _ = _files_with_bad_lines(tmp_path, {"a": [(0, 2), (2, 3)]})
    lines = paths[0].read_bytes().splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith(b'{"pieces": [{"text": "xx'):  # a bad line: same length, CJK in place of 6 x's
            lines[i] = line.replace(b"xxxxxx", "東京".encode(), 1)
    paths[0].write_bytes(b"".join(lines))
    one = _cfg(read={"part_bytes": 1 << 30, "block_bytes": 32768}, validate={"on_invalid": "skip"})
    many = _cfg(read={"part_bytes": MULTI_PART, "block_bytes": 32768}, validate={"on_invalid": "skip"})
    build([str(paths[0])], tmp_path / "one", one)
    build([str(paths[0])], tmp_path / "many", many)
    rejects = (tmp_path / "many" / "rejects.jsonl").read_bytes()
    assert rejects.count("東京".encode()) == 2  # the premise: both bad lines, in two parts, hold the text
    assert rejects == (tmp_path / "one" / "rejects.jsonl").read_bytes()


@pytest.mark.parametrize("kind", ["local", "ray"])
def test_strict_mode_does_not_wait_for_the_later_parts_that_run(kind, tmp_path, request):
    """A bad line in part 0 while part 1 runs (a long delay): the build fails at once; part 1's worker is
    killed, not left behind, and nothing is left on disk."""
    if kind == "ray":
        request.getfixturevalue("ray_session")
    path, _ = _with_bad_lines(tmp_path)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[9] = b'{"pieces": [{"text": "x", "weight": -1}]}\n'  # line 10, in part 0
    path.write_bytes(b"".join(lines))
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    delay = 120.0
    start = time.monotonic()
    with pytest.raises(InputError) as err:
        inner = LocalExecutor(2) if kind == "local" else RayExecutor(2)
        # part 0 (the bad line) starts its work only once part 1 runs: the premise below holds however slow the
        # workers are to start
        executor = Delaying(inner, {1: delay}, str(pid_dir), after={0: 1})
        build([str(path)], tmp_path / "out", _cfg(), executor=executor)
    assert time.monotonic() - start < delay / 3
    assert str(err.value).startswith(f"{path}:10: pieces[0].weight:")
    running = [int(p.suffix[1:]) for p in pid_dir.glob("1.*")]
    assert running  # the premise: part 1 was running
    for pid in running:
        if kind == "local":
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)  # gone, and reaped
        else:
            _assert_gone(pid)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "pids"]


# ---- faults -----------------------------------------------------------------------------------------------------


def _kill_first_worker(pid_dir: Path, index: int) -> threading.Thread:
    """SIGKILL the process that starts part ``index`` (once) while it sleeps in its delay."""

    def kill() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = sorted(pid_dir.glob(f"{index}.*"))
            if found:
                os.kill(int(found[0].suffix[1:]), signal.SIGKILL)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("kind", ["local", "ray"])
def test_a_killed_worker_is_retried_and_the_bytes_are_the_same(kind, tmp_path, reference, request):
    if kind == "ray":
        request.getfixturevalue("ray_session")
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    inner = LocalExecutor(2) if kind == "local" else RayExecutor(2)
    executor = Delaying(inner, {2: 2.0}, str(pid_dir))
    killer = _kill_first_worker(pid_dir, 2)
    build([str(SAMPLE_RAW)], tmp_path / "out", _cfg(), executor=executor)
    killer.join()
    assert len(list(pid_dir.glob("2.*"))) >= 2  # part 2 ran again, in another process
    assert _digests(tmp_path / "out") == reference


_DRIVER = """
import sys
sys.path.insert(0, {tests!r})
from split_support import Delaying
from weightprep.config import config_from_dict
from weightprep.distribute.executors import SerialExecutor
from weightprep.pipeline import build
cfg = config_from_dict({cfg!r})
build([{raw!r}], {out!r}, cfg, executor=Delaying(SerialExecutor(), {{i: 0.5 for i in range(6)}}))
"""


def test_resume_after_a_killed_driver_reuses_its_finished_parts(tmp_path, reference):
    out = tmp_path / "out"
    cfg = {"pack": {"seq_len": 512}, "read": {"part_bytes": PART, "block_bytes": 32768}}
    script = _DRIVER.format(tests=str(REPO / "tests"), cfg=cfg, raw=str(SAMPLE_RAW), out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        done = [p for p in tmp_path.glob(".out.tmp-*/parts/0000?") if (p / "result.json").is_file()]
        if len(done) >= 3:
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    executor = Delaying(SerialExecutor(), {})
    build([str(SAMPLE_RAW)], out, _cfg(), executor=executor, resume=True)
    assert len(executor.reused) >= 3 and len(executor.order) == 6
    assert _digests(out) == reference
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the killed build's directory was adopted


class _Killed(BaseException):
    """The driver killed mid-build, as the build sees it: no ``except Exception`` runs, only ``finally``."""


class _KilledAfter(Delaying):
    """``inner`` (default: this process), "killed" (``_Killed``) once ``n`` parts of the build have finished and,
    with ``running``, once one of those parts has noted its pid in ``pid_dir`` (waited for up to a minute, so that
    the kill finds it running however slowly the workers take their next part)."""

    def __init__(self, n: int, inner=None, delays=None, pid_dir=None, running=()) -> None:
        super().__init__(inner or SerialExecutor(), delays or {}, pid_dir)
        self.n, self.running = n, running

    def map(self, parts, progress=None, **options):
        with contextlib.closing(super().map(parts, progress, **options)) as results:
            for done, result in enumerate(results, 1):
                yield result
                if done == self.n and options.get("task") is None:
                    if self.running:
                        wait_for_parts(self.pid_dir, self.running)
                    raise _Killed


def _killed_build(inputs: list[str], out: Path, cfg, finished: int = 2, executor=None) -> None:
    """A build killed after ``finished`` parts: its temporary directory left as a dead process leaves it."""
    with pytest.raises(_Killed):
        build(inputs, out, cfg, executor=executor or _KilledAfter(finished))
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    assert sorted(p.name for p in (tmp / "parts").iterdir()) == [f"{i:05d}" for i in range(finished)]
    tmp.rename(out.parent / f".{out.name}.tmp-999999999")


def test_without_resume_a_killed_builds_parts_are_kept_until_overwrite(tmp_path, reference):
    """A plain rerun that finds an interrupted build's finished parts stops before any work, names them and the two
    ways on, and keeps them; with --overwrite the build starts over and removes them."""
    _killed_build([str(SAMPLE_RAW)], tmp_path / "out", _cfg())
    leftover = tmp_path / ".out.tmp-999999999"
    executor = Delaying(SerialExecutor(), {})
    with pytest.raises(LeftoverParts, match=r"left 2 finished part\(s\) in .*\.out\.tmp-999999999: .*--resume.*--overwrite") as exc:
        build([str(SAMPLE_RAW)], tmp_path / "out", _cfg(), executor=executor)
    assert (exc.value.kept, exc.value.finished) == (str(leftover), 2)
    assert executor.order == [] and not (tmp_path / "out").exists()
    assert sorted(p.name for p in (leftover / "parts").iterdir()) == ["00000", "00001"]  # kept
    build([str(SAMPLE_RAW)], tmp_path / "out", _cfg(), executor=executor, overwrite=True)
    assert executor.reused == []  # the same build, but no --resume: nothing reused
    assert _digests(tmp_path / "out") == reference
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # and its leftovers are gone


def test_a_leftover_without_a_finished_part_does_not_stop_a_rerun(tmp_path, reference):
    (tmp_path / ".out.tmp-999999999" / "parts" / "00000.tmp-1-ab").mkdir(parents=True)
    (tmp_path / ".out.tmp-999999999" / "plan.json").write_text("a build killed before its first part finished")
    build([str(SAMPLE_RAW)], tmp_path / "out", _cfg())
    assert _digests(tmp_path / "out") == reference
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


class _CtrlCAfter(_KilledAfter):
    """As ``_KilledAfter``, with a real Ctrl-C (``KeyboardInterrupt``)."""

    def map(self, parts, progress=None, **options):
        if self.n == 0 and options.get("task") is None:
            raise KeyboardInterrupt  # before any part
        try:
            yield from super().map(parts, progress, **options)
        except _Killed:
            raise KeyboardInterrupt from None


def test_ctrl_c_says_what_it_kept_and_resume_says_what_it_reused(tmp_path, reference):
    out = tmp_path / "out"
    with pytest.raises(BuildInterrupted) as exc:
        build([str(SAMPLE_RAW)], out, _cfg(), executor=_CtrlCAfter(2))
    kept = tmp_path / f".out.tmp-{os.getpid()}"
    assert (exc.value.finished, exc.value.total, exc.value.kept, exc.value.out) == (2, 6, str(kept), str(out))
    assert sorted(p.name for p in (kept / "parts").iterdir()) == ["00000", "00001"]
    kept.rename(tmp_path / ".out.tmp-999999999")  # as a process that is gone leaves it
    notes: list[str] = []
    resumed = Delaying(SerialExecutor(), {})
    build([str(SAMPLE_RAW)], out, _cfg(), executor=resumed, resume=True, notify=notes.append)
    assert resumed.reused == [0, 1]
    assert "--resume: 2 of 6 part(s) finished by the interrupted build are reused; 4 left to build" in notes
    assert _digests(out) == reference


def test_ctrl_c_before_any_part_finished_leaves_nothing(tmp_path):
    with pytest.raises(KeyboardInterrupt) as exc:
        build([str(SAMPLE_RAW)], tmp_path / "out", _cfg(), executor=_CtrlCAfter(0))
    assert not isinstance(exc.value, BuildInterrupted)
    assert list(tmp_path.iterdir()) == []


def test_resume_says_when_it_found_nothing_to_reuse(tmp_path):
    notes: list[str] = []
    build([str(SAMPLE_RAW)], tmp_path / "out", _cfg(), resume=True, notify=notes.append)
    assert "--resume: no interrupted build of this output was found: building all 6 part(s)" in notes


def _assert_gone(pid: int) -> None:
    """Ray worker ``pid`` has ended (soon: ``ray.kill`` is asynchronous; Ray reaps it, not us)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            os.kill(pid, 0)
            stat = Path(f"/proc/{pid}/stat").read_text()
        except (ProcessLookupError, FileNotFoundError):
            return
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return
        assert time.monotonic() < deadline, f"process {pid} still runs"
        time.sleep(0.05)


def test_an_interrupted_build_kills_its_running_parts_and_resumes(tmp_path, reference):
    """Interrupted while workers run parts 2 and 3 (long delays): it ends at once, those workers are killed,
    the finished parts stay for --resume, which writes the bytes of an uninterrupted build."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    delay = 120.0
    executor = _KilledAfter(2, LocalExecutor(2), {2: delay, 3: delay}, str(pid_dir), running=(2, 3))
    start = time.monotonic()
    _killed_build([str(SAMPLE_RAW)], tmp_path / "out", _cfg(), executor=executor)  # no partial part left
    assert time.monotonic() - start < delay / 3
    running = [int(p.suffix[1:]) for p in [*pid_dir.glob("2.*"), *pid_dir.glob("3.*")]]
    assert running  # the premise (waited for by _KilledAfter): a part was running when the build was killed
    for pid in running:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # gone, and reaped
    resumed = Delaying(SerialExecutor(), {})
    build([str(SAMPLE_RAW)], tmp_path / "out", _cfg(), executor=resumed, resume=True)
    assert resumed.reused == [0, 1]
    assert _digests(tmp_path / "out") == reference


def test_resume_ignores_a_leftover_of_another_plan(tmp_path, reference):
    stale = tmp_path / ".out.tmp-999999999" / "parts" / "00000"
    stale.mkdir(parents=True)
    (stale / "result.json").write_text("{}")
    (tmp_path / ".out.tmp-999999999" / "plan.json").write_text("not this build")
    executor, notes = Delaying(SerialExecutor(), {}), []
    build([str(SAMPLE_RAW)], tmp_path / "out", _cfg(), executor=executor, resume=True, notify=notes.append)
    assert executor.reused == []  # another plan: nothing reused
    assert any("were made from other inputs, configuration or tokenizer: discarded; building all 6" in n for n in notes)
    assert _digests(tmp_path / "out") == reference
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # and its leftovers are gone


def test_the_resume_key_covers_the_plan(sample_tok):
    """A plan guessed from a JSON array's layout and the exact one differ where the guess missed: a part finished
    under one is never reused under the other (``resume_key``)."""
    from weightprep.pipeline import resume_key
    from weightprep.tokenizer import tokenizer_summary

    cfg, inputs, summary = _cfg(), [str(SAMPLE_RAW)], tokenizer_summary(sample_tok)
    plan, other = plan_parts(inputs, PART), plan_parts(inputs, PART // 2)
    moved = [dataclasses.replace(plan[0], end=plan[0].end + 1), dataclasses.replace(plan[1], start=plan[1].start + 1), *plan[2:]]
    key = resume_key(cfg, inputs, sample_tok, summary, "1", None, plan)
    assert key == resume_key(cfg, inputs, sample_tok, summary, "1", None, plan_parts(inputs, PART))
    assert len({key, resume_key(cfg, inputs, sample_tok, summary, "1", None, other),
                resume_key(cfg, inputs, sample_tok, summary, "1", None, moved)}) == 3  # fmt: skip


_TOKENIZER_EDITS = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@pytest.mark.parametrize("change", ["nothing", "config", "input", *_TOKENIZER_EDITS, "version"])
def test_resume_reuses_parts_only_of_the_same_config_and_input(change, tmp_path, monkeypatch):
    """A resume reuses the killed build's parts only if nothing that could decide their bytes changed: the
    configuration, the input, a file of the tokenizer's directory (here edited so that the ids stay the same, so
    only the key can tell) or weightprep's version."""
    import shutil

    import weightprep
    from weightprep.tokenizer import SAMPLE_TOKENIZER_DIR

    raw = tmp_path / "raw.jsonl"
    raw.write_bytes(SAMPLE_RAW.read_bytes())
    tok_dir = shutil.copytree(SAMPLE_TOKENIZER_DIR, tmp_path / "tok")
    out = tmp_path / "out"
    _killed_build([str(raw)], out, _cfg(tokenizer={"name": str(tok_dir)}))
    cfg = _cfg(tokenizer={"name": str(tok_dir)}, **({"assemble": {"eos_weight": 0.5}} if change == "config" else {}))
    if change == "input":  # another first record: part 0 is not what the killed build read
        lines = raw.read_bytes().splitlines(keepends=True)
        raw.write_bytes(b"".join([lines[1], lines[0], *lines[2:]]))
    if change in _TOKENIZER_EDITS:  # the same JSON, other bytes: an unrelated key, or another layout
        before = (tok_dir / change).read_bytes()
        data = json.loads(before)
        edited = {**data, "comment": "edited"} if change == "tokenizer_config.json" else data
        (tok_dir / change).write_text(json.dumps(edited, indent=None if change == "tokenizer.json" else 4))
        assert (tok_dir / change).read_bytes() != before
    if change == "version":
        monkeypatch.setattr(weightprep, "__version__", weightprep.__version__ + ".post1")
    executor = Delaying(SerialExecutor(), {})
    manifest = build([str(raw)], out, cfg, executor=executor, resume=True)
    assert executor.reused == ([0, 1] if change == "nothing" else [])
    build([str(raw)], tmp_path / "fresh", cfg)
    assert _digests(out) == _digests(tmp_path / "fresh")
    assert manifest["weightprep_version"] == weightprep.__version__
    assert "chat" not in manifest  # no conversation: no template used
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh", "out", "raw.jsonl", "tok"]


def _conversations(tmp_path, n: int) -> tuple[Path, list[dict]]:
    """A chat tokenizer's directory, and ``n`` conversation records."""
    from chat_support import chat_tokenizer

    tok_dir = tmp_path / "tok"
    chat_tokenizer("chatml").save_pretrained(str(tok_dir))
    records = [
        {"messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]}
        for i in range(n)
    ]
    return tok_dir, records


_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + SEP + m['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
)


@pytest.mark.parametrize("where", ["nothing", "chat_template_file", "tokenizer_config"])
def test_resume_after_the_chat_template_changed_starts_over(where, tmp_path):
    """The template's text decides the rows, wherever it is: in --chat-template's file or in the tokenizer's
    tokenizer_config.json. A resume after it changed reuses nothing."""
    tok_dir, records = _conversations(tmp_path, 240)
    (tok_dir / "chat_template.jinja").unlink()
    template_file = tmp_path / "chat.jinja"

    def use(template: str) -> None:
        if where == "tokenizer_config":
            config = json.loads((tok_dir / "tokenizer_config.json").read_text())
            (tok_dir / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
        else:
            template_file.write_text(template)

    first, second = _TEMPLATE.replace("SEP", "'\\n'"), _TEMPLATE.replace("SEP", "' says:\\n'")
    raw = tmp_path / "chats.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in records))
    use(first)
    cfg = config_from_dict({
        "tokenizer": {"name": str(tok_dir)}, "pack": {"seq_len": 128}, "read": {"part_bytes": 6000},
        "chat": {"template": None if where == "tokenizer_config" else str(template_file)},
    })  # fmt: skip
    assert len(plan_parts([str(raw)], 6000)) >= 4
    build([str(raw)], tmp_path / "first", cfg)
    out = tmp_path / "out"
    _killed_build([str(raw)], out, cfg)
    if where != "nothing":
        use(second)
    executor = Delaying(SerialExecutor(), {})
    manifest = build([str(raw)], out, cfg, executor=executor, resume=True)
    assert executor.reused == ([0, 1] if where == "nothing" else [])
    build([str(raw)], tmp_path / "fresh", cfg)
    assert _digests(out) == _digests(tmp_path / "fresh")
    if where != "nothing":  # the premise: the two templates write other rows
        shards = [{k: v for k, v in _digests(d).items() if k.endswith(".arrow")} for d in (out, tmp_path / "first")]
        assert shards[0] != shards[1]
    used = first if where == "nothing" else second
    assert manifest["chat"]["template_sha256"] == hashlib.sha256(used.encode()).hexdigest()


@pytest.mark.parametrize("make", ["local-1", "local-2-delayed", "ray-2"])
def test_every_executor_writes_the_same_chat_turns(make, tmp_path, request):
    """Conversations cut into several parts: chat_turns.jsonl (and the shards) are the serial build's bytes
    whoever runs the parts, however many, in whatever order they finish."""
    kind, workers, *delayed = make.split("-")
    if kind == "ray":
        request.getfixturevalue("ray_session")
    tok_dir, records = _conversations(tmp_path, 240)
    for i, r in enumerate(records):  # turns of several lengths, so rows hold several conversations and their parts
        r["messages"][1]["content"] += " and more" * (i % 7)
    raw = tmp_path / "chats.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = config_from_dict({"tokenizer": {"name": str(tok_dir)}, "pack": {"seq_len": 128}, "read": {"part_bytes": 6000}})
    n_parts = len(plan_parts([str(raw)], 6000))
    assert n_parts >= 4
    build([str(raw)], tmp_path / "serial", cfg, executor=SerialExecutor())
    reference = _digests(tmp_path / "serial")
    assert "chat_turns.jsonl" in reference
    turns = (tmp_path / "serial" / "chat_turns.jsonl").read_text().splitlines()
    assert len(turns) >= len(records)
    inner = LocalExecutor(int(workers)) if kind == "local" else RayExecutor(int(workers))
    delays = {i: 0.3 * (n_parts - i) for i in range(n_parts)} if delayed else {}  # later parts finish first
    executor = Delaying(inner, delays)
    build([str(raw)], tmp_path / "out", cfg, executor=executor)
    if delayed:
        assert executor.order != sorted(executor.order)  # they did finish out of order
    assert _digests(tmp_path / "out") == reference


@pytest.mark.parametrize("kind", ["local", "ray"])
def test_one_pool_serves_both_passes_of_a_build(kind, tmp_path, monkeypatch, request):
    """--validation-records reads the parts twice (keys, then the build): the worker processes (Ray actors) are
    started once."""
    import concurrent.futures

    starts = []

    class CountedPool(concurrent.futures.ProcessPoolExecutor):
        def __init__(self, *args, **kwargs):
            starts.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", CountedPool)
    if kind == "ray":
        request.getfixturevalue("ray_session")
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    executor = Delaying(LocalExecutor(2) if kind == "local" else RayExecutor(2), {}, str(pid_dir))
    build([str(SAMPLE_RAW)], tmp_path / "out", _cfg(split={"validation_records": 50}), executor=executor)
    assert len(executor.order) == 12  # both passes ran every part
    assert starts == ([1] if kind == "local" else [])
    assert len({p.suffix for p in pid_dir.iterdir()}) == 2  # by the same two processes


def test_validation_records_cut_is_merged_from_every_part(tmp_path):
    """--validation-records: the N smallest keys of every part merge into the cut of the whole input."""
    split = {"validation_records": 50}
    one = build([str(SAMPLE_RAW)], tmp_path / "one", _cfg(split=split, read={"part_bytes": 1 << 30}))
    serial = build([str(SAMPLE_RAW)], tmp_path / "serial", _cfg(split=split), executor=SerialExecutor())
    build([str(SAMPLE_RAW)], tmp_path / "local", _cfg(split=split), executor=LocalExecutor(2))
    assert _digests(tmp_path / "serial") == _digests(tmp_path / "local")
    for name in ("train", "validation"):
        assert serial["splits"][name]["counts"]["records"] == one["splits"][name]["counts"]["records"]
    assert one["splits"]["validation"]["counts"]["records"] >= 50


def test_the_first_pass_of_validation_records_renders_no_conversation(tmp_path, monkeypatch):
    import weightprep.stages.chat as chat  # the chat stage's module: blocks imports it at the first conversation

    tok_dir, records = _conversations(tmp_path, 40)
    raw = tmp_path / "chats.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in records))
    rendered = []
    real = chat.render_chats
    monkeypatch.setattr(chat, "render_chats", lambda r, *a: rendered.append(len(r)) or real(r, *a))
    cfg = config_from_dict({"tokenizer": {"name": str(tok_dir)}, "pack": {"seq_len": 64}, "split": {"validation_records": 5}})
    manifest = build([str(raw)], tmp_path / "out", cfg)
    assert sum(rendered) == 40  # each conversation once: by the build, not by the pass that finds the cut
    assert manifest["splits"]["validation"]["counts"]["records"] == 5


def test_validation_records_reports_a_refused_conversation_before_a_later_bad_line(tmp_path):
    """The key pass renders nothing, so it meets the bad weight of line 9 first; the conversation the template
    refuses on line 3 is the earliest bad line, and is the one reported."""
    tok_dir, records = _conversations(tmp_path, 10)
    records[2]["messages"][0]["content"] = "<|im_start|>x"  # a control token in content
    lines = [json.dumps(r) for r in records]
    lines[8] = '{"pieces": [{"text": "x", "weight": -1}]}'
    raw = tmp_path / "chats.jsonl"
    raw.write_text("".join(x + "\n" for x in lines))
    cfg = config_from_dict({"tokenizer": {"name": str(tok_dir)}, "pack": {"seq_len": 64}, "split": {"validation_records": 2}})
    with pytest.raises(InputError) as err:
        build([str(raw)], tmp_path / "out", cfg)
    assert (err.value.line, err.value.field) == (3, "messages[0].content")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chats.jsonl", "tok"]


@pytest.mark.parametrize("executor", [SerialExecutor(), LocalExecutor(2)], ids=["serial", "local-2"])
def test_progress_counts_input_bytes_up_to_the_whole_input(tmp_path, executor):
    seen: list[tuple[int, int]] = []
    manifest = build(
        [str(SAMPLE_RAW)], tmp_path / "out", _cfg(), executor=executor,
        progress=lambda done, counts: seen.append((done, counts["accepted"])),
    )
    done = [d for d, _ in seen]
    assert done == sorted(done) and done[-1] == SAMPLE_RAW.stat().st_size
    assert seen[-1][1] == manifest["counts"]["accepted"]
    if isinstance(executor, SerialExecutor):
        assert len(seen) > 6  # within parts too, block by block


def test_the_cli_runs_the_parts_on_worker_processes(tmp_path):
    """What users type: --part-bytes, --executor local --workers 2; the summary and the same bytes."""
    from click.testing import CliRunner

    from weightprep.cli import main

    out = tmp_path / "out"
    args = ["build", str(SAMPLE_RAW), "--out", str(out), "--seq-len", "512", "--part-bytes", str(PART)]
    result = CliRunner().invoke(main, [*args, "--executor", "local", "--workers", "2"])
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output
    # block_bytes is not a flag: compare with a serial build of the same flags instead of the reference
    again = CliRunner().invoke(main, [*args[:3], str(tmp_path / "serial"), *args[4:], "--executor", "serial"])
    assert again.exit_code == 0, again.output
    assert _digests(out) == _digests(tmp_path / "serial")
    bad = CliRunner().invoke(main, [*args, "--executor", "spark", "--overwrite"])
    assert bad.exit_code == 2 and "spark" in bad.output


class _Watched(LocalExecutor):
    """A LocalExecutor that notes the warm-up it was given, the processes ``warm`` started and the job's key."""

    warmup: Any = None
    key: str | None = None
    warmed: set[int] = set()

    def warm(self, warmup: Any, n_parts: int) -> None:
        super().warm(warmup, n_parts)
        self.warmup, self.warmed = warmup, set(self._pool._processes)

    def start(self, job: Any, n_parts: int) -> LocalExecutor:
        self.key = job.worker_key
        return super().start(job, n_parts)


def test_a_build_warms_its_workers_for_its_job(tmp_path, reference):
    """The pool starts before the driver loads its tokenizer, its processes making their state (``Warmup``) under
    the key of the job that reaches them later; the bytes are the serial build's."""
    from weightprep.distribute.job import Warmup

    executor = _Watched(2)
    build([str(SAMPLE_RAW)], tmp_path / "out", _cfg(), executor=executor)
    assert isinstance(executor.warmup, Warmup) and len(executor.warmed) == 2
    assert executor.warmup.key == executor.key and executor.warmup.cfg == _cfg()
    assert _digests(tmp_path / "out") == reference


def test_a_build_that_ends_before_its_parts_stops_the_warm_workers(tmp_path, monkeypatch):
    import weightprep.pipeline as pipeline
    from weightprep.errors import UsageError

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise UsageError("no output today")

    monkeypatch.setattr(pipeline, "open_output", refuse)
    executor = _Watched(2)
    with pytest.raises(UsageError, match="no output today"):
        build([str(SAMPLE_RAW)], tmp_path / "out", _cfg(), executor=executor)
    assert len(executor.warmed) == 2 and executor._pool is None
    for pid in executor.warmed:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_warm_state_is_the_one_its_job_uses(tmp_path, monkeypatch):
    """``Warmup`` makes the worker state under its key: the job with that key runs on it without loading the
    tokenizer again; a warm-up whose load fails leaves no state (the part's own load reports why)."""
    from weightprep.distribute import job as job_module

    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)  # restored after: the warm-up sets it
    cfg = _cfg(read={"part_bytes": 1 << 30})
    job_module.Warmup(cfg, "warm-test")(None)
    state = job_module._WORKERS["warm-test"]
    try:
        def no_second_load(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("the job loaded a tokenizer of its own")

        monkeypatch.setattr(job_module, "load_tokenizer", no_second_load)
        job = job_module.PartJob(cfg, None, tmp_path, worker_key="warm-test")
        assert job.worker() is state and job.with_options(cut=None).worker() is state
        part = plan_parts([str(SAMPLE_RAW)], 1 << 30, "line")[0]
        result = job(part)
        assert result["error"] is None and result["counts"][""]["accepted"] > 0
    finally:
        job_module._WORKERS.pop("warm-test").close()
    monkeypatch.undo()
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    bad = config_from_dict({"tokenizer": {"name": str(tmp_path / "no-such-tokenizer")}})
    job_module.Warmup(bad, "warm-bad")(None)
    assert "warm-bad" not in job_module._WORKERS


def test_a_build_whose_driver_is_a_worker_runs_parts_with_its_own_tokenizer(tmp_path, reference, monkeypatch):
    """``LocalExecutor(driver=True)`` (the command line's): one process fewer; the parts run here use the tokenizer
    the build loaded (a second load in this process would fail), and the bytes are the serial build's."""
    from weightprep.distribute import job as job_module

    ran_here: list[int] = []
    call = job_module.PartJob._call

    def noted(self: Any, part: Any, progress: Any) -> Any:
        ran_here.append(part.index)
        return call(self, part, progress)

    def no_second_load(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the job loaded a tokenizer of its own")

    monkeypatch.setattr(job_module.PartJob, "_call", noted)
    monkeypatch.setattr(job_module, "load_tokenizer", no_second_load)  # in this process: the pool's loads its own
    executor = _Watched(2, driver=True)
    build([str(SAMPLE_RAW)], tmp_path / "out", _cfg(), executor=executor)
    assert _digests(tmp_path / "out") == reference
    assert len(executor.warmed) == 1 and ran_here and len(ran_here) < 6


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.integers(0, 10**12), min_size=1, max_size=5),
    names=st.lists(st.text(min_size=0, max_size=6), min_size=1, max_size=3),
    base=st.integers(0, 10**12),
    first=st.booleans(),
)
def test_shifted_lines_are_the_json_of_the_shifted_entries(rows, names, base, first):
    """The merge's shift of a part's row (or line) numbers: each line is exactly what ``json.dumps`` writes for the
    parsed entry with the number shifted, whether it opens the line (the turns file, shifted in the text) or not
    (a reject, parsed); names with quotes, commas, digits and non-ASCII characters included."""
    from weightprep.distribute.merge import _shift

    entries = []
    for r in rows:
        spans = [[r % 97, 3, name, r % 5] for name in names]
        entry = {"row": r, "turns": spans} if first else {"source": names[0], "row": r, "reason": names[-1]}
        entries.append(entry)
    lines = [json.dumps(e, ensure_ascii=False) + "\n" for e in entries]
    expected = [json.dumps({**e, "row": e["row"] + base}, ensure_ascii=False) + "\n" for e in entries]
    assert list(_shift(iter(lines), "row", base)) == expected
    assert list(_shift(iter(lines), "row", 0)) == lines


@contextlib.contextmanager
def _left_to_the_collector():
    """The ResourceWarnings of what runs inside: files it left open for the garbage collector to close (collected
    here, at the end)."""
    import gc
    import warnings

    found: list[warnings.WarningMessage] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield found
        gc.collect()
    found.extend(w for w in caught if issubclass(w.category, ResourceWarning))


def test_a_parts_progress_counts_each_block_and_its_rejects_file_is_closed_by_the_job(tmp_path):
    """The job reports each block's records as they are accepted (the progress line's counts: a total so far, not the
    last block's), ending at the part's own counts; the rejects file it kept is closed when it returns, not left to
    the garbage collector (an unclosed file warns, and may hold unwritten lines)."""
    from weightprep.distribute.job import PartJob

    lines = SAMPLE_RAW.read_text().splitlines()
    raw = tmp_path / "raw.jsonl"
    raw.write_text("\n".join([*lines[:60], "{not json", *lines[60:120]]) + "\n")
    cfg = _cfg(read={"part_bytes": 1 << 30, "block_bytes": 4096}, validate={"on_invalid": "skip"})
    part = plan_parts([str(raw)], 1 << 30, "line")[0]
    seen: list[tuple[int, int, int]] = []
    (tmp_path / "work").mkdir()
    with _left_to_the_collector() as unclosed:
        result = PartJob(cfg, None, tmp_path / "work")(
            part, lambda consumed, counts: seen.append((consumed, counts["accepted"], counts["tokens"]))
        )
    assert result["error"] is None and result["rejected"] == {"malformed_json": 1}
    assert len(seen) > 3  # a line for each block
    steps = zip(seen, seen[1:], strict=False)
    assert all(x <= y for a, b in steps for x, y in zip(a, b, strict=True))  # bytes, records, tokens so far: never back
    counts = result["counts"][""]
    assert seen[-1][1:] == (counts["accepted"], counts["tokens_accepted"]) == (120, seen[-1][2])
    assert not unclosed
    (kept,) = (tmp_path / "work").glob(f"*/{result['rejects_file']}")
    assert kept.read_text().count("\n") == 1


@pytest.mark.parametrize("on_invalid", ["error", "skip"])
def test_a_part_that_fails_after_writing_rows_closes_what_it_wrote(tmp_path, monkeypatch, on_invalid):
    """Input that cannot be read after rows were written (either mode: a line past reading stops a skipping build
    too): the job returns the line's error and closes its open shard, turns file (``ShardWriter.abort``) and rejects
    file instead of leaving them to the garbage collector."""
    from weightprep.constants import TURNS_NAME
    from weightprep.distribute import job as job_module

    tok_dir, records = _conversations(tmp_path, 400)
    raw = tmp_path / "chats.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = config_from_dict({"tokenizer": {"name": str(tok_dir)}, "pack": {"seq_len": 256, "window": 16},
                            "read": {"part_bytes": 1 << 30, "block_bytes": 2048}, "validate": {"on_invalid": on_invalid}})  # fmt: skip
    work = tmp_path / "work"
    work.mkdir()
    real = job_module.parsed_blocks
    opened: list[Path] = []

    def unreadable_after_rows_were_written(*args: Any) -> Any:
        blocks = real(*args)
        yield next(blocks)
        deadline = time.monotonic() + 30
        while not opened and time.monotonic() < deadline:
            time.sleep(0.01)  # the first block's rows reach the writer's thread
            opened.extend(work.rglob(TURNS_NAME))
        raise InputError(str(raw), 200, "messages", "cannot be read", reason="unreadable")

    monkeypatch.setattr(job_module, "parsed_blocks", unreadable_after_rows_were_written)
    part = plan_parts([str(raw)], 1 << 30, "line")[0]
    with _left_to_the_collector() as unclosed:
        result = job_module.PartJob(cfg, None, work)(part)
    assert opened  # the premise: a turns file was open when the error came
    assert (result["error"]["line"], result["error"]["problem"]) == (200, "cannot be read")
    assert not unclosed
