"""The files people already have: a .json file holding one array (streamed), JSON Lines saved as .json, plain text
(.txt/.md by line, paragraph or document), each also compressed; each gives the shards of the same records as
JSON Lines, byte for byte, and names a bad record where it is."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weightprep.config import config_from_dict
from weightprep.errors import InputError
from weightprep.pipeline import build
from weightprep.stages.read import InputFile, expand_inputs, file_kind, read_blocks


def _arrow(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.arrow"))}


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def _build(tmp_path: Path, path: Path, tok, name: str, **cfg) -> tuple[dict, dict[str, bytes]]:
    config = config_from_dict({"pack": {"seq_len": 128}, **cfg})
    manifest = build([str(path)], tmp_path / name, config, tokenizer=tok)
    return manifest, _arrow(tmp_path / name)


def _separators_of(data: bytes) -> list[int]:
    """The separators of the array ``data``, byte by byte (``test_json_array_scan._reference``)."""
    from test_json_array_scan import _reference

    return _reference(data)[0]


def _lines(path: Path, block_bytes: int, max_line: int = 64 << 20, **kw) -> tuple[InputFile, list[tuple[int, bytes, int]]]:
    """(record number, line, byte offset) of every record line the reader hands on."""
    record = InputFile(str(path))
    out = []
    for block in read_blocks(record, block_bytes, max_line, **kw):
        if block.too_long:
            out.append((block.first_line, b"<too long>", block.offset))
            continue
        offset = block.offset
        for i, line in enumerate(block.data.split(b"\n")[: block.n_lines]):
            out.append((block.first_line + i, line, offset))
            offset += len(line) + 1
    return record, out


RECORDS = [
    {"pieces": [{"text": "Q: what is 2+2?\n", "weight": 0}, {"text": "A: 4", "weight": 1}]},
    {"text": 'quotes " and \\ backslashes \\" and ] brackets [ { } , commas'},
    {"prompt": "Translate: chat", "completion": " cat", "meta": [[1, 2], {"a": [3, {"b": "]"}]}]},
    {"text": "unicode ✓ 日本 \u2028 line sep"},
]


@pytest.mark.parametrize("indent", [None, 2, "\t"])
@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_a_json_array_builds_as_its_records_in_json_lines(tmp_path, sample_tok, indent, suffix):
    array = tmp_path / f"data{suffix}"
    text = json.dumps(RECORDS, indent=indent, ensure_ascii=False)
    array.write_bytes(gzip.compress(text.encode()) if suffix.endswith(".gz") else text.encode())
    assert file_kind(str(array)) == "json_array"
    ma, a = _build(tmp_path, array, sample_tok, "out-a")
    mb, b = _build(tmp_path, _jsonl(tmp_path / "data.jsonl", RECORDS), sample_tok, "out-b")
    assert a == b and a
    assert ma["counts"] == mb["counts"] and ma["counts"]["records"] == len(RECORDS)
    assert ma["inputs"][0]["lines"] == len(RECORDS)


def test_json_lines_saved_as_json_build_as_jsonl(tmp_path, sample_tok):
    as_json = _jsonl(tmp_path / "data.json", RECORDS)  # what datasets' to_json writes
    assert file_kind(str(as_json)) == "jsonl"
    ma, a = _build(tmp_path, as_json, sample_tok, "out-a")
    mb, b = _build(tmp_path, _jsonl(tmp_path / "data.jsonl", RECORDS), sample_tok, "out-b")
    assert a == b and ma["counts"] == mb["counts"]


_strings = st.text(st.sampled_from(list('ab"\\\n\t,[]{}: ✓')), max_size=12)
_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | _strings,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_strings, inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    records=st.lists(_values, max_size=8),
    indent=st.sampled_from([None, 1, 4]),
    block=st.integers(1, 64),
    bom=st.booleans(),
)
def test_the_splitter_hands_on_each_element_at_its_offset(tmp_path, records, indent, block, bom):
    """Every element of any array, whatever the chunk size cuts (inside strings, escapes, nesting), is one line that
    parses to it, numbered from 0, at the byte offset of the bytes it spans in the file."""
    path = tmp_path / "a.json"
    raw = (b"\xef\xbb\xbf" if bom else b"") + b" \n" + json.dumps(records, indent=indent).encode() + b"\n "
    path.write_bytes(raw)
    record, got = _lines(path, block)
    assert [json.loads(line) for _, line, _ in got] == records
    assert [n for n, _, _ in got] == list(range(len(records)))
    assert record.lines == len(records) and record.size == len(raw)
    for _, line, offset in got:  # the record's own bytes, newlines as tabs, its separator as the newline
        span = raw[offset : offset + len(line)]
        assert span.replace(b"\n", b"\t") == line


@pytest.mark.parametrize(
    ("text", "record", "problem"),
    [
        ('[{"text": "a"},, {"text": "b"}]', 1, "an empty element"),
        ('[{"text": "a"},]', 1, "an empty element"),
        ('[{"text": "a"}] [{"text": "b"}]', 0, "bytes after the array's closing ']'"),
        ('[{"text": "a"}]x', 0, "bytes after the array's closing ']'"),  # the very next byte
        ('[{"text": "a"}, {"text": "b"', 1, "the file ends inside the array"),
        ('[{"text": "a"}}, {"text": "b"}]', 0, "unbalanced brackets: a '}' closes the array"),
    ],
)
def test_a_broken_array_stops_the_read_naming_the_record(tmp_path, sample_tok, text, record, problem):
    path = tmp_path / "data.json"
    path.write_text(text)
    for on_invalid in ("error", "skip"):  # nothing after it can be numbered: not a reject
        with pytest.raises(InputError) as err:
            build([str(path)], tmp_path / f"o-{on_invalid}", config_from_dict({"validate": {"on_invalid": on_invalid}}),
                  tokenizer=sample_tok)  # fmt: skip
        assert str(err.value).startswith(f"{path}: record {record}: <json>: malformed JSON array: {problem}")


def test_a_bad_record_of_an_array_is_named_by_its_index(tmp_path, sample_tok):
    records = [{"text": "a"}, {"text": "b"}, {"pieces": [{"text": "c", "weight": -1}]}, {"text": "d\ne"}]
    path = tmp_path / "data.json"
    path.write_text(json.dumps(records, indent=2))
    with pytest.raises(InputError) as err:
        build([str(path)], tmp_path / "o", config_from_dict({}), tokenizer=sample_tok)
    assert str(err.value) == f"{path}: record 2: pieces[0].weight: expected a finite number >= 0, found -1"
    m = build([str(path)], tmp_path / "o2", config_from_dict({"validate": {"on_invalid": "skip"}}), tokenizer=sample_tok)
    assert m["counts"]["records"] == 4 and m["counts"]["rejected"] == {"bad_weight": 1}
    reject = json.loads((tmp_path / "o2" / "rejects.jsonl").read_text())
    offset = path.read_bytes().index(b'{\n    "pieces"') - len(b"\n  ")  # just past the ',' before it
    assert (reject["record"], reject["byte_offset"], reject["reason"]) == (2, offset, "bad_weight")
    assert json.loads(reject["original"]) == records[2]


def test_a_raw_newline_inside_a_string_is_malformed_not_read_as_a_space(tmp_path):
    path = tmp_path / "data.json"
    path.write_bytes(b'[{"text": "a\nb"}, {"text": "c"}]')
    _, got = _lines(path, 1 << 20)
    assert [n for n, _, _ in got] == [0, 1]
    with pytest.raises(json.JSONDecodeError):
        json.loads(got[0][1])


@pytest.mark.parametrize("first_long", [False, True])
def test_a_record_longer_than_the_limit_is_rejected_at_its_length_and_offset(tmp_path, first_long):
    """Read by chunks of any size: a too-long record's block says its exact length and offset and keeps its first
    1,024 bytes; a record of exactly the limit is no too-long one; the records after keep their offsets."""
    records = [{"text": "a"}, {"text": "x" * 5000}, {"text": "b"}, {"text": "y" * 300}, {"text": "c"}, {"text": "d"}]
    if first_long:
        records[0] = {"text": "z" * 1700}
    records[4] = {"text": "w" * (256 - len(json.dumps(records[4], indent=1)) - 3)}  # its span: exactly the limit
    path = tmp_path / "data.json"
    raw = json.dumps(records, indent=1).encode()
    path.write_bytes(raw)
    separators = _separators_of(raw)
    spans = list(zip([raw.index(b"[") + 1, *(s + 1 for s in separators[:-1])], separators, strict=True))
    assert spans[4][1] - spans[4][0] == 256
    for block in (1, 16, 64, 1 << 20):
        got = []
        for b in read_blocks(InputFile(str(path)), block, 256):
            if b.too_long:  # its exact length and offset: the bytes from after the '[' or ',' to the separator
                # what it held when it passed the limit (with max_line_bytes >= 1,024, as configs have it, that is
                # the record's own bytes; with 256 here, its read may have gone on past its end)
                held = min(len(b.data), b.too_long)
                assert b.n_lines == 1 and 256 < len(b.data) <= 1024
                assert b.data[:held] == raw[b.offset : b.offset + held].replace(b"\n", b"\t")
                got.append((b.first_line, b.offset, b.too_long))
            else:
                lines = b.data.split(b"\n")[:-1]
                offsets = np.cumsum([0, *(len(line) + 1 for line in lines[:-1])]) + b.offset
                got += [(b.first_line + i, int(o), line) for i, (o, line) in enumerate(zip(offsets, lines, strict=True))]
        expected = [
            (i, a, z - a) if z - a > 256 else (i, a, raw[a:z].replace(b"\n", b"\t")) for i, (a, z) in enumerate(spans)
        ]  # fmt: skip
        assert got == expected
        assert [i for i, _, x in got if isinstance(x, int)] == ([0, 1, 3] if first_long else [1, 3])
    (long,) = [b for b in read_blocks(InputFile(str(path)), 1 << 20, 1024) if b.too_long and b.first_line == 1]
    assert long.data == raw[long.offset : long.offset + 1024].replace(b"\n", b"\t")  # its first 1,024 bytes kept


def test_a_long_record_is_never_held_whole(tmp_path):
    """A 24 MB record read with a 1 MiB limit: the reader holds its first bytes only, whatever is read at a time."""
    import tracemalloc

    path = tmp_path / "data.json"
    path.write_text(json.dumps([{"text": "a"}, {"text": "x" * (24 << 20)}, {"text": "b"}]))
    tracemalloc.start()
    try:
        got = [(b.first_line, b.too_long) for b in read_blocks(InputFile(str(path)), 64 << 10, 1 << 20)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [(n, long > 0) for n, long in got] == [(0, False), (1, True), (2, False)]
    assert peak < 8 << 20, peak


@pytest.mark.parametrize("cut", [-9, -1])  # inside the next record, or just before the separating ','
def test_a_part_that_does_not_end_after_a_record_is_an_error(tmp_path, cut):
    """A part read from an exact plan must end just after a separating ','; elsewhere the file changed since the
    plan, and the part says so rather than hand on a piece of a record."""
    records = [{"text": f"record {i}"} for i in range(20)]
    raw = json.dumps(records, indent=2).encode()
    path = tmp_path / "data.json"
    path.write_bytes(raw)
    comma = _separators_of(raw)[9]
    end = comma + 1 + (cut if cut == -1 else 20 + cut)
    with pytest.raises(InputError, match="does not end after a record as planned"):
        list(read_blocks(InputFile(str(path)), 1024, 1 << 20, start=0, end=end))
    assert len(list(read_blocks(InputFile(str(path)), 1024, 1 << 20, start=0, end=comma + 1))) == 1


def test_a_truncated_compressed_array_is_an_error_at_its_record(tmp_path):
    data = gzip.compress(json.dumps([{"text": "a" * 50} for _ in range(2000)]).encode())
    path = tmp_path / "data.json.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError) as err:
        _lines(path, 4096)
    assert err.value.reason == "truncated_input" and ": record " in str(err.value)


TEXT = "First line.\r\nSecond line.\n\nA paragraph\nof two lines.\n\n\n  indented\nlast line, no newline"


@pytest.mark.parametrize(
    ("sample_by", "records"),
    [
        ("line", [(1, "First line."), (2, "Second line."), (4, "A paragraph"), (5, "of two lines."), (8, "  indented"),
                  (9, "last line, no newline")]),
        ("paragraph", [(1, "First line.\nSecond line."), (4, "A paragraph\nof two lines."),
                       (8, "  indented\nlast line, no newline")]),
        ("document", [(1, TEXT.replace("\r\n", "\n") + "\n")]),
    ],
)  # fmt: skip
def test_text_is_a_record_per_line_paragraph_or_document(tmp_path, sample_tok, sample_by, records):
    path = tmp_path / "notes.txt"
    path.write_bytes(TEXT.encode())
    for block in (8, 1 << 20):
        _, got = _lines(path, block, text_sample_by=sample_by)
        assert [(n, json.loads(line)["text"]) for n, line, _ in got if line] == records
    ma, a = _build(tmp_path, path, sample_tok, "out-a", read={"text_sample_by": sample_by})
    mb, b = _build(tmp_path, _jsonl(tmp_path / "t.jsonl", [{"text": t} for _, t in records]), sample_tok, "out-b")
    assert a == b and ma["counts"]["records"] == mb["counts"]["records"] == len(records)


def test_compressed_markdown_builds_as_text(tmp_path, sample_tok):
    lines = ["# Title", "", "Some *markdown* text."]
    path = tmp_path / "doc.md.gz"
    path.write_bytes(gzip.compress("\n".join(lines).encode()))
    assert file_kind(str(path)) == "text"
    _, a = _build(tmp_path, path, sample_tok, "out-a")
    _, b = _build(tmp_path, _jsonl(tmp_path / "t.jsonl", [{"text": t} for t in lines if t]), sample_tok, "out-b")
    assert a == b


def test_a_text_line_that_is_not_utf8_is_rejected_by_its_line(tmp_path, sample_tok):
    path = tmp_path / "t.txt"
    path.write_bytes(b"good\nbad \xff byte\nalso good\n")
    m = build([str(path)], tmp_path / "o", config_from_dict({"validate": {"on_invalid": "skip"}}), tokenizer=sample_tok)
    assert m["counts"]["rejected"] == {"invalid_utf8": 1} and m["counts"]["records"] == 3
    assert json.loads((tmp_path / "o" / "rejects.jsonl").read_text())["line"] == 2


def test_a_directory_gives_its_json_files_and_a_glob_its_text_files(tmp_path):
    for name in ("a.json", "b.json.gz", "c.txt", "d.jsonl", "README.md", "e.csv", "f.txt.zst"):
        (tmp_path / name).write_text("")
    assert [Path(p).name for p in expand_inputs([str(tmp_path)])] == ["a.json", "b.json.gz", "d.jsonl"]
    assert [Path(p).name for p in expand_inputs([f"{tmp_path}/*.txt*"])] == ["c.txt", "f.txt.zst"]


def test_a_compressed_or_unbalanced_array_is_one_part_and_a_text_file_by_line_is_cut(tmp_path):
    from weightprep.distribute.plan import plan_parts

    records = json.dumps([{"text": "x" * 100}] * 50)
    array = tmp_path / "a.json.gz"
    array.write_bytes(gzip.compress(records.encode()))
    broken = tmp_path / "b.json"
    broken.write_text(records.replace("}, {", "}}, {", 1))  # a '}' closes the array: its one part names it
    text = tmp_path / "t.txt"
    text.write_text("line of text\n" * 400)
    assert len(plan_parts([str(array)], 64)) == 1
    assert len(plan_parts([str(broken)], 1024)) == 1
    assert len(plan_parts([str(text)], 1024)) > 1
    assert len(plan_parts([str(text)], 1024, "paragraph")) == 1


def _part_records(path: Path, part_bytes: int, block_bytes: int) -> tuple[list[int], list[tuple[int, bytes, int]]]:
    """The plan's cuts of ``path``, and every record line its parts hand on, numbered as the file's
    (``plan.line_bases``, as the merge and the errors number them)."""
    from weightprep.distribute.plan import line_bases, plan_parts

    parts = plan_parts([str(path)], part_bytes)
    read = [_lines(path, block_bytes, **({"size": p.end} if p.whole else {"start": p.start, "end": p.end})) for p in parts]
    bases = line_bases(parts, [record.lines for record, _ in read])
    return [p.start for p in parts], [(base + n, line, at) for base, (_, got) in zip(bases, read, strict=True) for n, line, at in got]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    records=st.lists(st.fixed_dictionaries({"text": st.text(alphabet='ab"\\[]{},: \n✓', max_size=40)}), min_size=1, max_size=30),
    indent=st.sampled_from([None, 0, 2]),
    part_bytes=st.integers(1, 400),
    block_bytes=st.integers(1, 200),
)
def test_a_cut_array_hands_on_every_record_once_numbered_as_the_file(tmp_path, records, indent, part_bytes, block_bytes):
    path = tmp_path / "data.json"
    data = json.dumps(records, indent=indent, ensure_ascii=False).encode()
    path.write_bytes(data)
    starts, got = _part_records(path, part_bytes, block_bytes)
    assert [n for n, _, _ in got] == list(range(len(records)))
    assert [json.loads(line) for _, line, _ in got] == records
    for _, line, at in got:
        assert json.loads(data[at : at + len(line)]) == json.loads(line)  # each record's offset is the file's
    assert starts[0] == 0  # the first part from the file's start (its '[' read as such, not skipped as a part's)
    for start in starts[1:]:  # a cut falls just past a separating ',' near each multiple of part_bytes
        assert data[start - 1 : start] == b","
    if len(data) > part_bytes:  # every cut past the first multiple; none if the file fits in one part
        assert all(s >= part_bytes for s in starts[1:])
    else:
        assert starts == [0]


@pytest.mark.parametrize("part_bytes", [40, 150, 600, 1 << 20])
def test_a_cut_array_builds_as_json_lines_cut_at_the_same_records(tmp_path, sample_tok, part_bytes):
    """``[r0,r1,...]`` and `` r0\nr1\n...`` hold each record at the same offset, its separator at the same byte: the
    plan cuts both after the same records, and the parts' shards are the same bytes, on one worker or two."""
    from weightprep.distribute.executors import LocalExecutor

    records = [{"text": f"record {i} " + "words " * (i % 7)} for i in range(60)]
    records[17] = {"pieces": [{"text": "Q: 2+2?", "weight": 0}, {"text": " 4", "weight": 1}]}
    lines = [json.dumps(r) for r in records]
    array, jsonl = tmp_path / "data.json", tmp_path / "data.jsonl"
    array.write_text("[" + ",".join(lines) + "]\n")
    jsonl.write_text(" " + "\n".join(lines) + "\n")
    cfg = {"read": {"part_bytes": part_bytes, "block_bytes": 1024}}
    ma, a = _build(tmp_path, array, sample_tok, "out-a", **cfg)
    mj, j = _build(tmp_path, jsonl, sample_tok, "out-j", **cfg)
    assert a == j and len(a) > 0
    assert ma["counts"]["records"] == mj["counts"]["records"] == 60
    if part_bytes == 150:
        config = config_from_dict({"pack": {"seq_len": 128}, **cfg})
        build([str(array)], tmp_path / "out-2", config, tokenizer=sample_tok, executor=LocalExecutor(2))
        assert _arrow(tmp_path / "out-2") == a


def test_a_bad_record_in_a_later_part_is_named_by_its_index_in_the_file(tmp_path, sample_tok):
    records = [{"text": f"record {i} " + "x" * (i % 11)} for i in range(80)]
    records[23] = {"pieces": [{"text": "c", "weight": -1}]}
    records[61] = {"text": 5}
    path = tmp_path / "data.json"
    path.write_text(json.dumps(records, indent=2))
    cfg = {"read": {"part_bytes": 300, "block_bytes": 1024}}
    from weightprep.distribute.plan import plan_parts

    assert len(plan_parts([str(path)], 300)) > 10
    with pytest.raises(InputError) as err:
        _build(tmp_path, path, sample_tok, "o", **cfg)
    assert str(err.value).startswith(f"{path}: record 23: pieces[0].weight:")
    m, _ = _build(tmp_path, path, sample_tok, "o2", validate={"on_invalid": "skip"}, **cfg)
    assert m["counts"]["records"] == 80 and sum(m["counts"]["rejected"].values()) == 2
    rejects = [json.loads(line) for line in (tmp_path / "o2" / "rejects.jsonl").read_text().splitlines()]
    assert [r["record"] for r in rejects] == [23, 61]
    assert [json.loads(r["original"]) for r in rejects] == [records[23], records[61]]
    assert [json.loads(path.read_bytes()[r["byte_offset"] :].split(b"\n  },")[0] + b"}") for r in rejects] == [
        records[23], records[61]
    ]  # fmt: skip


def test_a_json_file_rewritten_as_an_array_is_looked_at_again(tmp_path):
    import os

    path = tmp_path / "data.json"
    _jsonl(path, RECORDS)
    assert file_kind(str(path)) == "jsonl"
    path.write_text(json.dumps(RECORDS))
    os.utime(path, ns=(0, 10**9))  # a new modification time, whatever the clock's resolution
    assert file_kind(str(path)) == "json_array"


@pytest.mark.parametrize("part_bytes", [64, 300, 1 << 20])
def test_an_empty_element_in_a_cut_array_is_named_by_its_index_in_the_file(tmp_path, sample_tok, part_bytes):
    """The plan cuts around ``,,`` (it leaves the depth as it is), or makes the array one part where it meets it at
    a cut: either way the build stops at the record that the whole file's reader names."""
    from weightprep.distribute.plan import plan_parts

    text = json.dumps([{"text": f"record {i}"} for i in range(60)], indent=2)
    at = text.index('{\n    "text": "record 41"')
    path = tmp_path / "data.json"
    path.write_text(text[:at] + ",\n  " + text[at:])
    assert len(plan_parts([str(path)], part_bytes)) > (1 if part_bytes < 1000 else 0)
    for on_invalid in ("error", "skip"):
        with pytest.raises(InputError) as err:
            _build(tmp_path, path, sample_tok, f"o-{on_invalid}", read={"part_bytes": part_bytes, "block_bytes": 1024},
                   validate={"on_invalid": on_invalid})  # fmt: skip
        assert str(err.value).startswith(f"{path}: record 41: <json>: malformed JSON array: an empty element")


@pytest.mark.parametrize("stray", ["Z", "z", "~", "|", "^", "\\\\"])
def test_a_stray_byte_between_records_is_that_record_s_error_not_a_bracket(tmp_path, sample_tok, stray):
    """Bytes that differ from a bracket in one bit (``Z`` ``z`` ``~`` ``|`` ``^`` ``\\``) are no bracket: the
    element holding one is refused as malformed JSON under its own number, and the array's structure around it is
    read as it is."""
    path = tmp_path / "data.json"
    path.write_text('[{"text": "a"}, ' + stray + ', {"text": "b"}]')
    with pytest.raises(InputError) as err:
        build([str(path)], tmp_path / "o", config_from_dict({}), tokenizer=sample_tok)
    assert str(err.value).startswith(f"{path}: record 1: <json>: malformed JSON")
    skip = build([str(path)], tmp_path / "s", config_from_dict({"validate": {"on_invalid": "skip"}}), tokenizer=sample_tok)
    assert skip["counts"]["records"] == 3 and skip["counts"]["documents_written"] == 2


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("alike", [True, False])
def test_an_array_planned_from_its_layout_builds_as_planned_exactly(tmp_path, sample_tok, monkeypatch, alike, workers):
    """A pretty-printed array is cut where its head's layout says records start (``plan_array.guessed_cuts``, no
    pass over the file); where later records are laid out otherwise, a part's reader finds the guess wrong and the
    build plans exactly and builds again, saying so. Either way the shards, manifest and plan are the exact plan's."""
    from weightprep.distribute import plan_array
    from weightprep.distribute.executors import LocalExecutor

    records = [{"pieces": [{"text": f"Q{i}: what is {i}?", "weight": 0}, {"text": f" {i}" * (i % 9 + 1), "weight": 1}]}
               for i in range(90)]  # fmt: skip
    texts = [json.dumps(r, indent=2).replace("\n", "\n  ") for r in records]
    gaps = [",\n  " if alike or i < 30 or i % 3 else ", " for i in range(len(texts) - 1)]
    path = tmp_path / "data.json"
    path.write_text("[\n  " + texts[0] + "".join(g + t for g, t in zip(gaps, texts[1:], strict=True)) + "\n]\n")
    config = config_from_dict({"pack": {"seq_len": 128}, "read": {"part_bytes": 2000, "block_bytes": 1024}})
    monkeypatch.setattr(plan_array, "_HEAD_BYTES", 3000)  # the first 20 records (4 MiB in a build)
    real, guesses = plan_array.guessed_cuts, []
    monkeypatch.setattr(plan_array, "guessed_cuts", lambda *args, **kwargs: guesses.append(real(*args, **kwargs)) or guesses[-1])

    def run(name: str) -> tuple[dict, dict[str, bytes], list[str]]:
        notes: list[str] = []
        executor = LocalExecutor(workers) if workers > 1 else None
        manifest = build([str(path)], tmp_path / name, config, tokenizer=sample_tok, notify=notes.append, executor=executor)
        return manifest, _arrow(tmp_path / name), notes

    guessed, shards, notes = run("guessed")
    assert len(guesses) == 1 and guesses[0] is not None and len(guesses[0][0]) > 5
    assert [n for n in notes if "laid out" in n] == ([] if alike else [f"{path}: its records are not laid out "
            "throughout as in its first ones; planning its parts exactly (a pass over the file) and building again"])  # fmt: skip
    monkeypatch.setattr(plan_array, "guessed_cuts", lambda *args, **kwargs: None)
    exact, exact_shards, exact_notes = run("exact")
    assert not [n for n in exact_notes if "laid out" in n]
    assert shards == exact_shards and len(shards) > 0
    assert guessed["inputs"] == exact["inputs"] and len(guessed["inputs"][0]["parts"]) > 5
    assert guessed["counts"] == exact["counts"] and guessed["counts"]["records"] == 90


def test_a_source_that_is_an_array_is_guessed_and_checked_as_a_plain_input(tmp_path, sample_tok, monkeypatch):
    """With sources (mixed parts), a JSON array's ranges are guessed as a plain build's are, and a miss plans the
    build exactly and builds again: the shards are the exact plan's."""
    from weightprep.distribute import plan_array
    from weightprep.distribute.plan import plan_mixed
    from weightprep.sources import Source

    records = [{"text": f"record {i} " + "word " * (i % 13)} for i in range(120)]
    texts = [json.dumps(r, indent=2).replace("\n", "\n  ") for r in records]
    gaps = [",\n  " if i < 40 or i % 4 else ",  " for i in range(len(texts) - 1)]  # otherwise from record 40 on
    array = tmp_path / "a.json"
    array.write_text("[\n  " + texts[0] + "".join(g + t for g, t in zip(gaps, texts[1:], strict=True)) + "\n]\n")
    other = _jsonl(tmp_path / "b.jsonl", [{"text": f"other {i}"} for i in range(300)])
    monkeypatch.setattr(plan_array, "_HEAD_BYTES", 2000)
    guessed, exact = (plan_mixed([[str(array)], [str(other)]], 3000, exact=e) for e in (False, True))
    assert len(guessed) == len(exact) > 3
    assert any(s.check is not None for p in guessed for s in p.segments)
    assert all(s.check is None for p in exact for s in p.segments)
    sources = [Source("a", (str(array),)), Source("b", (str(other),))]
    config = config_from_dict({"pack": {"seq_len": 128}, "read": {"part_bytes": 3000, "block_bytes": 1024}})
    notes: list[str] = []
    m = build([], tmp_path / "guessed", config, tokenizer=sample_tok, sources=sources, notify=notes.append)
    assert any("planning its parts exactly" in n for n in notes)
    monkeypatch.setattr(plan_array, "guessed_cuts", lambda *args, **kwargs: None)
    m_exact = build([], tmp_path / "exact", config, tokenizer=sample_tok, sources=sources)
    assert _arrow(tmp_path / "guessed") == _arrow(tmp_path / "exact") != {} and m["counts"] == m_exact["counts"]
    assert m["counts"]["records"] == 420


def test_a_raw_newline_inside_a_string_rejects_its_record_only(tmp_path, sample_tok):
    """A raw newline inside a string is invalid JSON, as in JSON Lines: its record is rejected (the splitter hands
    every newline on as a tab, a control byte there), never read as a string holding a newline or a space; the
    newlines and tabs between tokens are whitespace."""
    path = tmp_path / "data.json"
    path.write_bytes(b'[\n\t{"text": "a"},\n  {"text": "b\nc"},\r\n  {\n"text":\t"d"\n}\n]\n')
    with pytest.raises(InputError) as err:
        _build(tmp_path, path, sample_tok, "o")
    assert str(err.value).startswith(f"{path}: record 1: <json>: malformed JSON: Invalid control character")
    m, _ = _build(tmp_path, path, sample_tok, "o2", validate={"on_invalid": "skip"})
    assert m["counts"]["records"] == 3 and m["counts"]["rejected"] == {"malformed_json": 1}
    reject = json.loads((tmp_path / "o2" / "rejects.jsonl").read_text())
    assert reject["record"] == 1 and reject["original"] == '\t  {"text": "b\tc"}'
    for block_bytes in (3, 7, 1024):  # the newline at a chunk's first or last byte, or inside one
        lines = _lines(path, block_bytes)[1]
        assert [n for n, _, _ in lines] == [0, 1, 2] and lines[1][1] == b'\t  {"text": "b\tc"}'
