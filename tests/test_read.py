"""The read stage's bytes (``weightprep.stages.read``): a byte range of a file is read as exactly its lines, numbered
from 1 with the file's own offsets; every file's size and SHA-256 are of its raw bytes (the range's, for a range);
``InputFile.behind`` ends at what was read. Each against a reference computed here from the file's bytes."""

from __future__ import annotations

import gzip
import hashlib
import json

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from weightprep.stages.read import InputFile, read_blocks


def _line(i: int, width: int) -> bytes:
    return json.dumps({"pieces": [{"text": f"{i}:" + "y" * width, "weight": 1}]}).encode() + b"\n"


def _blocks(path, block_bytes: int, **window) -> tuple[list, InputFile]:
    record = InputFile(str(path))
    out = []
    for block in read_blocks(record, block_bytes, **window):
        out.append((block.first_line, block.n_lines, block.offset, block.data, record.behind))
    return out, record


@settings(max_examples=60, deadline=None)
@given(widths=st.lists(st.integers(0, 90), min_size=1, max_size=25), data=st.data(),
       block_bytes=st.sampled_from([1, 7, 64, 4096]))  # fmt: skip
def test_a_byte_range_is_read_as_exactly_its_lines(tmp_path_factory, widths, data, block_bytes):
    lines = [_line(i, w) for i, w in enumerate(widths)]
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    a = data.draw(st.integers(0, len(lines) - 1))
    b = data.draw(st.integers(a + 1, len(lines)))
    path = tmp_path_factory.mktemp("r") / "in.jsonl"
    raw = b"".join(lines)
    path.write_bytes(raw)
    blocks, record = _blocks(path, block_bytes, start=starts[a], end=starts[b])
    assert b"".join(d for *_, d, _ in blocks) == b"".join(lines[a:b])
    # lines numbered from 1 within the range, offsets of the file
    got = [(first, off) for first, _, off, _, _ in blocks]
    want, line, off = [], 1, starts[a]
    for _, n, _, d, _ in blocks:
        want.append((line, off))
        line, off = line + n, off + len(d)
    assert got == want and line - 1 == b - a == record.lines
    piece = raw[starts[a] : starts[b]]
    assert record.size == len(piece) and record.sha256 == hashlib.sha256(piece).hexdigest()
    behind = [bh for *_, bh in blocks]
    assert behind == [off + len(d) - starts[a] for _, _, off, d, _ in blocks] and behind[-1] == len(piece)


@pytest.mark.parametrize("kind", ["jsonl", "jsonl.gz", "jsonl.zst"])
def test_a_files_size_and_hash_are_of_its_raw_bytes(kind, tmp_path):
    data = b"".join(_line(i, i % 50) for i in range(300))
    raw = {"jsonl": data, "jsonl.gz": gzip.compress(data), "jsonl.zst": zstandard.compress(data)}[kind]
    path = tmp_path / f"in.{kind}"
    path.write_bytes(raw)
    blocks, record = _blocks(path, 512)
    assert b"".join(d for *_, d, _ in blocks) == data
    assert (record.size, record.sha256, record.lines) == (len(raw), hashlib.sha256(raw).hexdigest(), 300)
    assert blocks[-1][-1] == len(raw)


def test_a_range_past_the_end_of_the_file_stops_at_its_end(tmp_path):
    """A file shorter than the range asked for (it shrank after the plan): its lines, nothing invented."""
    data = b"".join(_line(i, 3) for i in range(5))
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    blocks, record = _blocks(path, 16, start=0, end=len(data) + 100)
    assert b"".join(d for *_, d, _ in blocks) == data and record.size == len(data) and record.lines == 5


def test_a_file_without_a_final_newline_is_behind_by_its_size_not_the_newline_supplied(tmp_path):
    path = tmp_path / "in.jsonl"
    data = _line(0, 5) + _line(1, 5).rstrip(b"\n")
    path.write_bytes(data)
    blocks, record = _blocks(path, 1 << 16)
    assert b"".join(d for *_, d, _ in blocks) == data + b"\n"
    assert blocks[-1][-1] == record.size == len(data)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 4000), min_size=1, max_size=12),
       block_bytes=st.sampled_from([7, 300, 1500, 1 << 16]), final_newline=st.booleans())  # fmt: skip
def test_lines_beyond_the_limit_come_alone_with_their_head_and_the_rest_keep_their_numbers(
    tmp_path_factory, lengths, block_bytes, final_newline
):
    """With a limit of 1500 bytes a line: a longer line is handed on alone (one line, too_long = its length, its
    first HEAD_BYTES bytes, its own offset), never whole; every other line as it is; numbers and offsets go on
    after it as in the file."""
    from weightprep.stages.read import HEAD_BYTES

    limit = 1500
    lines = [(f"{i}|".encode() + b"z" * n)[: max(n, 1)] for i, n in enumerate(lengths)]
    raw = b"\n".join(lines) + (b"\n" if final_newline else b"")
    path = tmp_path_factory.mktemp("l") / "in.jsonl"
    path.write_bytes(raw)
    record = InputFile(str(path))
    got = []  # (line number, offset, bytes or head, too_long)
    for block in read_blocks(record, block_bytes, limit):
        if block.too_long:
            assert block.n_lines == 1
            got.append((block.first_line, block.offset, block.data, block.too_long))
            continue
        offset = block.offset
        for k, line in enumerate(block.data.split(b"\n")[:-1]):
            got.append((block.first_line + k, offset, line, 0))
            offset += len(line) + 1
    want, offset = [], 0
    for i, line in enumerate(lines):
        long = len(line) > limit
        want.append((i + 1, offset, line[:HEAD_BYTES] if long else line, len(line) if long else 0))
        offset += len(line) + 1
    assert got == want
    assert record.lines == len(lines) and record.size == len(raw)


def test_a_missing_file_is_named_as_missing_not_as_a_pattern(tmp_path):
    from weightprep.errors import UsageError
    from weightprep.stages.read import check_inputs, expand_inputs

    missing = str(tmp_path / "missing.jsonl")
    assert expand_inputs([missing]) == [missing]
    with pytest.raises(UsageError, match="input file not found"):
        check_inputs(expand_inputs([missing]))


@pytest.mark.parametrize("columns", [None, {"body": "text"}])
def test_a_parquet_file_without_a_record_column_is_refused_before_reading_rows(columns, tmp_path):
    """check_inputs reads the schema only: no column is a record's (or, renamed, one is)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from weightprep.errors import UsageError
    from weightprep.stages.read import check_inputs

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"body": ["x"]}), path)
    if columns is None:
        with pytest.raises(UsageError, match="no column holds a record"):
            check_inputs([str(path)])
    else:
        check_inputs([str(path)], columns)


def test_a_range_longer_than_the_readers_buffer_is_read_to_its_last_byte(tmp_path):
    """1 MiB of lines and an empty one: the range is read in two calls, the second for its last byte."""
    line = b"w" * 1023 + b"\n"
    data = line * 1024 + b"\n" + line
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    end = (1 << 20) + 1
    blocks, record = _blocks(path, 1 << 16, start=0, end=end)
    assert b"".join(d for *_, d, _ in blocks) == data[:end]
    assert record.size == end and record.lines == 1025 and blocks[-1][-1] == end


def test_first_record_reads_only_what_it_can_parse(tmp_path, monkeypatch):
    """``read.first_record``: the first object of a JSON Lines file or array (a BOM and blank lines before it
    aside), None for anything else; a first record longer than ``FIRST_RECORD_BYTES`` is not looked at."""
    from weightprep.stages import read as read_module
    from weightprep.stages.read import first_record

    record = {"messages": [{"role": "user", "content": "question"}, {"role": "assistant", "content": "answer"}]}
    cases = {
        "a.jsonl": b"\xef\xbb\xbf\n  \n" + json.dumps(record).encode() + b"\n{}\n",
        "b.json": b" [ " + json.dumps(record).encode() + b", 7]",
        "c.jsonl": b"not json\n" + json.dumps(record).encode() + b"\n",
        "d.jsonl": b"[1, 2]\n",
        "e.json": b"[[" + json.dumps(record).encode() + b"]]",
        "f.txt": json.dumps(record).encode() + b"\n",
        "g.jsonl": b"",
        "h.jsonl": json.dumps(record).encode(),  # no final newline: the whole file is the line
        "i.jsonl.gz": b"\x1f\x8b" + b"0" * 50,  # compressed: one part anyway
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
    found = {name: first_record(str(tmp_path / name)) for name in cases}
    assert found == {"a.jsonl": record, "b.json": record, "c.jsonl": None, "d.jsonl": None, "e.json": None,
                     "f.txt": None, "g.jsonl": None, "h.jsonl": record, "i.jsonl.gz": None}  # fmt: skip
    long = {"messages": [{"role": "user", "content": "x" * 50_000}]}
    for name, data in (("long.jsonl", json.dumps(long).encode() + b"\n"), ("long.json", b"[" + json.dumps(long).encode() + b"]")):
        (tmp_path / name).write_bytes(data)
        assert first_record(str(tmp_path / name)) == long  # read in growing reads until it ends
        monkeypatch.setattr(read_module, "FIRST_RECORD_BYTES", 40_000)
        assert first_record(str(tmp_path / name)) is None  # it ends past what may be read
        monkeypatch.undo()
