"""Hostile input (issue 5): every shape real files have, each with its exact outcome.

Strict mode (default): exit code 2, one message ``file:line: field: problem`` (plus the byte offset
for compressed input), no traceback, nothing at the output path. ``--skip-invalid``: exit 0, the
line in rejects.jsonl verbatim with file, line, reason and field, the manifest counting it by
reason, and the accounting identity holding. Accepted shapes are counted as records.
"""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from weightprep.accounting import check_accounting
from weightprep.cli import main
from weightprep.constants import MANIFEST_NAME
from weightprep.stages.rejects import REJECTS_NAME

G = b'{"pieces": [{"text": "Q: hi\\n", "weight": 0}, {"text": "Hello!", "weight": 1}]}'
DEEP = b"[" * 100_000 + b"]" * 100_000


def _around(bad: bytes) -> bytes:
    """The bad line as line 2 of 3."""
    return G + b"\n" + bad + b"\n" + G + b"\n"


# name: (file bytes, line, field, reason, words the message must contain, original line)
REJECTED: dict[str, tuple[bytes, int, str, str, str, bytes]] = {
    "truncated_last_line": (G + b"\n" + G[:30], 2, "<json>", "malformed_json", "malformed JSON", G[:30]),
    "invalid_utf8_in_text": (_around(b'{"pieces": [{"text": "caf\xe9", "weight": 1}]}'), 2, "pieces[0].text", "invalid_utf8",
                             "invalid UTF-8 byte 0xe9", b'{"pieces": [{"text": "caf\xe9", "weight": 1}]}'),
    # the first and the last byte that is never valid UTF-8 alone, each named as a byte
    "invalid_utf8_byte_0x80": (_around(b'{"pieces": [{"text": "a\x80", "weight": 1}]}'), 2, "pieces[0].text", "invalid_utf8",
                               "invalid UTF-8 byte 0x80 at character 1", b'{"pieces": [{"text": "a\x80", "weight": 1}]}'),
    "invalid_utf8_byte_0xff": (_around(b'{"pieces": [{"text": "ab\xff", "weight": 1}]}'), 2, "pieces[0].text", "invalid_utf8",
                               "invalid UTF-8 byte 0xff at character 2", b'{"pieces": [{"text": "ab\xff", "weight": 1}]}'),
    # the surrogates just outside the lone bytes' range are surrogates (a JSON escape writes them)
    "surrogate_below_bytes": (_around(b'{"pieces": [{"text": "a\\udc7f", "weight": 1}]}'), 2, "pieces[0].text",
                              "invalid_utf8", "unpaired surrogate \\udc7f", b'{"pieces": [{"text": "a\\udc7f", "weight": 1}]}'),
    "surrogate_above_bytes": (_around(b'{"pieces": [{"text": "a\\udd00", "weight": 1}]}'), 2, "pieces[0].text",
                              "invalid_utf8", "unpaired surrogate \\udd00", b'{"pieces": [{"text": "a\\udd00", "weight": 1}]}'),
    "lone_surrogate_escape": (_around(b'{"pieces": [{"text": "a\\ud800", "weight": 1}]}'), 2, "pieces[0].text", "invalid_utf8",
                              "unpaired surrogate \\ud800", b'{"pieces": [{"text": "a\\ud800", "weight": 1}]}'),
    "duplicate_pieces_key": (_around(b'{"pieces": [{"text": "a", "weight": 1}], "pieces": []}'), 2, "pieces", "duplicate_key",
                             "more than once", b'{"pieces": [{"text": "a", "weight": 1}], "pieces": []}'),
    "duplicate_weight_key": (_around(b'{"pieces": [{"text": "a", "weight": 1, "weight": 0}]}'), 2, "pieces[0].weight",
                             "duplicate_key", "more than once", b'{"pieces": [{"text": "a", "weight": 1, "weight": 0}]}'),
    "weight_as_string": (_around(b'{"pieces": [{"text": "a", "weight": "1.0"}]}'), 2, "pieces[0].weight", "wrong_type",
                         "found string '1.0'", b'{"pieces": [{"text": "a", "weight": "1.0"}]}'),
    "text_as_number": (_around(b'{"pieces": [{"text": 42, "weight": 1}]}'), 2, "pieces[0].text", "wrong_type",
                       "expected a string, found number 42", b'{"pieces": [{"text": 42, "weight": 1}]}'),
    # an integer is shown whole up to 64 bits, beyond by its first 12 digits and its length
    "text_as_64_bit_number": (_around(b'{"pieces": [{"text": 18446744073709551615, "weight": 1}]}'), 2, "pieces[0].text",
                              "wrong_type", "found number 18446744073709551615",
                              b'{"pieces": [{"text": 18446744073709551615, "weight": 1}]}'),
    "text_as_65_bit_number": (_around(b'{"pieces": [{"text": 18446744073709551616, "weight": 1}]}'), 2, "pieces[0].text",
                              "wrong_type", "found number 184467440737... (20 digits)",
                              b'{"pieces": [{"text": 18446744073709551616, "weight": 1}]}'),
    # a value is shown whole up to 40 characters, beyond by its first 37 and "..."
    "weight_as_40_characters": (_around(b'{"pieces": [{"text": "a", "weight": "' + b"w" * 38 + b'"}]}'), 2, "pieces[0].weight",
                                "wrong_type", "found string '" + "w" * 38 + "'",
                                b'{"pieces": [{"text": "a", "weight": "' + b"w" * 38 + b'"}]}'),
    "weight_as_41_characters": (_around(b'{"pieces": [{"text": "a", "weight": "' + b"w" * 39 + b'"}]}'), 2, "pieces[0].weight",
                                "wrong_type", "found string '" + "w" * 36 + "...",
                                b'{"pieces": [{"text": "a", "weight": "' + b"w" * 39 + b'"}]}'),
    "weight_as_boolean": (_around(b'{"pieces": [{"text": "a", "weight": true}]}'), 2, "pieces[0].weight", "wrong_type",
                          "found boolean True", b'{"pieces": [{"text": "a", "weight": true}]}'),
    "weight_nan": (_around(b'{"pieces": [{"text": "a", "weight": NaN}]}'), 2, "pieces[0].weight", "bad_weight", "found nan",
                   b'{"pieces": [{"text": "a", "weight": NaN}]}'),
    "weight_huge_integer": (_around(b'{"pieces": [{"text": "a", "weight": 1' + b"0" * 400 + b"}]}"), 2, "pieces[0].weight",
                            "bad_weight", "401 digits", b'{"pieces": [{"text": "a", "weight": 1' + b"0" * 400 + b"}]}"),
    "weight_negative": (_around(b'{"pieces": [{"text": "a", "weight": -2}]}'), 2, "pieces[0].weight", "bad_weight", "found -2",
                        b'{"pieces": [{"text": "a", "weight": -2}]}'),
    "null_first_line": (b"null\n" + G + b"\n", 1, "<record>", "not_an_object", "found null", b"null"),
    "array_line": (_around(b"[1, 2]"), 2, "<record>", "not_an_object", "found list", b"[1, 2]"),
    "bom_mid_file": (_around(b"\xef\xbb\xbf" + G), 2, "<json>", "malformed_json", "BOM", b"\xef\xbb\xbf" + G),
    "two_objects_one_line": (_around(G + b" " + G), 2, "<json>", "malformed_json", "Extra data", G + b" " + G),
    "empty_pieces": (_around(b'{"pieces": []}'), 2, "pieces", "empty_pieces", "empty list", b'{"pieces": []}'),
    "missing_pieces": (_around(b'{"txt": "a"}'), 2, "pieces", "missing_field", "missing", b'{"txt": "a"}'),
    "deep_nesting_in_pieces": (_around(b'{"pieces": ' + DEEP + b"}"), 2, "<json>", "too_deep", "nested too deeply",
                               b'{"pieces": ' + DEEP + b"}"),
    "crlf_bad_line": (G + b"\r\n" + b'{"pieces": [{"text": "a"}]}\r\n', 2, "pieces[0].weight", "missing_field", "missing",
                      b'{"pieces": [{"text": "a"}]}'),
    "control_char_in_string": (_around(b'{"pieces": [{"text": "a\tb", "weight": 1}]}'), 2, "<json>", "malformed_json",
                               "Invalid control character", b'{"pieces": [{"text": "a\tb", "weight": 1}]}'),
}

# name: (file bytes, records accepted)
ACCEPTED: dict[str, tuple[bytes, int]] = {
    "utf8_bom": (b"\xef\xbb\xbf" + G + b"\n" + G + b"\n", 2),
    "crlf_line_endings": (G + b"\r\n" + G + b"\r\n", 2),
    "blank_and_whitespace_lines": (b"\n" + G + b"\n\n  \t\r\n" + G + b"\n\n", 2),
    "missing_final_newline": (G + b"\n" + G, 2),
    "extra_keys": (b'{"id": 7, "pieces": [{"text": "a", "weight": 1, "role": "user"}], "meta": {"src": "x"}}\n', 1),
    "duplicate_metadata_keys": (b'{"id": 1, "id": 2, "pieces": [{"text": "a", "weight": 1, "role": "a", "role": "b"}]}\n', 1),
    "invalid_utf8_in_metadata": (b'{"src": "caf\xe9", "pieces": [{"text": "a", "weight": 1}]}\n', 1),
    "deep_nesting_in_metadata": (b'{"pieces": [{"text": "a", "weight": 1}], "meta": ' + DEEP + b"}\n" + G + b"\n", 2),
    "empty_text_pieces": (b'{"pieces": [{"text": "", "weight": 0}, {"text": "a", "weight": 1}, {"text": "", "weight": 2}]}\n', 1),
    "zero_token_document": (b'{"pieces": [{"text": "", "weight": 1}]}\n' + G + b"\n", 2),
    "integer_and_exponent_weights": (b'{"pieces": [{"text": "a", "weight": 2}, {"text": "b", "weight": 1.5e0}, {"text": "c", "weight": -0.0}]}\n', 1),
    "escaped_nul_and_emoji": (b'{"pieces": [{"text": "a\\u0000b \\ud83d\\ude00", "weight": 1}]}\n', 1),
}


def _invoke(tmp_path: Path, inputs: list[Path | str], *flags: str):
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["build", *map(str, inputs), "--out", str(out), *flags])
    return result, out


def _manifest(out: Path) -> dict:
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    check_accounting(manifest["counts"])
    return manifest


def _assert_failed_cleanly(result, out: Path, code: int = 2) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)  # a clean exit, not an escaped exception
    assert not out.exists()
    assert not [p.name for p in out.parent.iterdir() if p.name.startswith(".out.")]  # no temporary leftovers


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_rejected_strict(name, tmp_path):
    data, line, field, _, words, _ = REJECTED[name]
    path = tmp_path / "raw.jsonl"
    path.write_bytes(data)
    result, out = _invoke(tmp_path, [path])
    _assert_failed_cleanly(result, out)
    assert f"error: {path}:{line}: {field}: " in result.output
    assert words in result.output


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_rejected_skip_invalid(name, tmp_path):
    data, line, field, reason, words, original = REJECTED[name]
    path = tmp_path / "raw.jsonl"
    path.write_bytes(data)
    result, out = _invoke(tmp_path, [path], "--skip-invalid")
    assert result.exit_code == 0, result.output
    assert f"rejected 1 ({reason} 1)" in result.output
    (entry,) = [json.loads(x) for x in (out / REJECTS_NAME).read_text(encoding="utf-8").splitlines()]
    assert (entry["source"], entry["line"], entry["reason"], entry["field"]) == (str(path), line, reason, field)
    assert words in entry["problem"]
    kept = entry["original"].encode() if "original" in entry else base64.b64decode(entry["original_base64"])
    assert kept == original
    assert ("original" in entry) == _is_utf8(original)
    assert data[entry["byte_offset"] :].startswith(original)
    counts = _manifest(out)["counts"]
    n_records = sum(1 for x in data.splitlines() if x.strip())
    assert (counts["records"], counts["accepted"], counts["rejected"]) == (n_records, n_records - 1, {reason: 1})


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_accepted_shapes(name, tmp_path):
    data, n = ACCEPTED[name]
    path = tmp_path / "raw.jsonl"
    path.write_bytes(data)
    result, out = _invoke(tmp_path, [path])
    assert result.exit_code == 0, result.output
    counts = _manifest(out)["counts"]
    assert (counts["records"], counts["accepted"], counts["rejected"]) == (n, n, {})
    if name == "zero_token_document":
        assert counts["empty_documents"] == 1


def test_line_numbers_stay_exact_after_blank_and_crlf_lines(tmp_path):
    path = tmp_path / "raw.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + G + b"\r\n\r\n\n" + G + b"\r\n" + b'{"pieces": [{"text": "a", "weight": -1}]}\r\n')
    result, out = _invoke(tmp_path, [path])
    _assert_failed_cleanly(result, out)
    assert f"{path}:5: pieces[0].weight: " in result.output


def test_invalid_record_among_many_blocks_all_rejected(tmp_path):
    """Skip mode across blocks: every bad line quarantined in order, good ones all kept."""
    lines = []
    for i in range(3000):
        lines.append(b'{"pieces": [{"text": "x", "weight": -1}]}' if i % 500 == 7 else G)
    path = tmp_path / "raw.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    result, out = _invoke(tmp_path, [path], "--skip-invalid")
    assert result.exit_code == 0, result.output
    entries = [json.loads(x) for x in (out / REJECTS_NAME).read_text().splitlines()]
    assert [e["line"] for e in entries] == [i + 1 for i in range(3000) if i % 500 == 7]
    counts = _manifest(out)["counts"]
    assert (counts["records"], counts["accepted"], counts["rejected"]) == (3000, 2994, {"bad_weight": 6})


# --- a line of hundreds of MB --------------------------------------------------------------


def test_huge_line_rejected_without_reading_it_whole(tmp_path):
    """A 300 MB line (gzip keeps the file small) against the default 64 MiB limit: bounded memory."""
    import tracemalloc

    from weightprep.batches import Reject
    from weightprep.stages.read import InputFile, read_blocks
    from weightprep.stages.validate import parse_block

    path = tmp_path / "raw.jsonl.gz"
    huge = b'{"pieces": [{"text": "' + b"a" * (300 << 20) + b'", "weight": 1}]}'
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(G + b"\n" + huge + b"\n" + G + b"\n")
    del huge
    tracemalloc.start()
    rejects: list[Reject] = []
    records = 0
    for block in read_blocks(InputFile(str(path)), 8 << 20):
        records += len(parse_block(block, rejects))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < (64 << 20) + 4 * (8 << 20), f"peak {peak / 2**20:.0f} MiB"  # the line limit plus a few blocks
    assert records == 2
    (r,) = rejects
    assert (r.line, r.reason, r.field, r.offset) == (2, "line_too_long", "<line>", len(G) + 1)
    assert r.line_bytes == len(b'{"pieces": [{"text": "", "weight": 1}]}') + (300 << 20)
    assert len(r.raw) == 1024 and r.raw.startswith(b'{"pieces": [{"text": "aaa')


def test_long_line_strict_and_skip_cli(tmp_path):
    path = tmp_path / "raw.jsonl"
    long_line = b'{"pieces": [{"text": "' + b"b" * 20000 + b'", "weight": 1}]}'
    path.write_bytes(G + b"\n" + long_line + b"\n" + G)
    result, out = _invoke(tmp_path, [path], "--max-line-bytes", "4096")
    _assert_failed_cleanly(result, out)
    assert f"{path}:2: <line>: line of {len(long_line):,} bytes is longer than read.max_line_bytes" in result.output
    result, out = _invoke(tmp_path, [path], "--max-line-bytes", "4096", "--skip-invalid")
    assert result.exit_code == 0, result.output
    (entry,) = [json.loads(x) for x in (out / REJECTS_NAME).read_text().splitlines()]
    assert entry["reason"] == "line_too_long" and entry["original_truncated"] and entry["line_bytes"] == len(long_line)
    assert long_line.startswith(entry["original"].encode())
    assert _manifest(out)["counts"]["rejected"] == {"line_too_long": 1}


# --- compressed input that ends early -------------------------------------------------------


def _compress(kind: str, data: bytes) -> bytes:
    if kind == "gz":
        return gzip.compress(data)
    import zstandard

    return zstandard.ZstdCompressor().compress(data)


@pytest.mark.parametrize("kind", ["gz", "zst"])
@pytest.mark.parametrize("skip", [False, True], ids=["strict", "skip"])
def test_truncated_compressed_input_is_fatal(kind, skip, tmp_path):
    data = b"".join(G + b"\n" for _ in range(5000))
    packed = _compress(kind, data)
    path = tmp_path / f"raw.jsonl.{kind}"
    path.write_bytes(packed[: len(packed) // 2])
    result, out = _invoke(tmp_path, [path], *(["--skip-invalid"] if skip else []))
    _assert_failed_cleanly(result, out)
    assert f"error: {path}:" in result.output and "(decompressed byte " in result.output
    assert "<file>: the compressed stream cannot be read past this line" in result.output
    assert "truncated or corrupt" in result.output


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_complete_compressed_input_reads_fully(kind, tmp_path):
    data = b"".join(G + b"\n" for _ in range(300))
    path = tmp_path / f"raw.jsonl.{kind}"
    path.write_bytes(_compress(kind, data) + (_compress(kind, G + b"\n") if kind == "zst" else b""))  # zstd: 2 frames
    result, out = _invoke(tmp_path, [path])
    assert result.exit_code == 0, result.output
    assert _manifest(out)["counts"]["records"] == 300 + (kind == "zst")


def test_compressed_error_names_decompressed_offset(tmp_path):
    path = tmp_path / "raw.jsonl.gz"
    path.write_bytes(gzip.compress(G + b"\n" + G + b"\n" + b'{"pieces": 1}\n'))
    result, out = _invoke(tmp_path, [path])
    _assert_failed_cleanly(result, out)
    assert f"{path}:3 (decompressed byte {2 * (len(G) + 1)}): pieces: expected a list" in result.output


def test_garbage_gzip_is_a_clear_error(tmp_path):
    path = tmp_path / "raw.jsonl.gz"
    path.write_bytes(b"this is not gzip at all\n")
    result, out = _invoke(tmp_path, [path])
    _assert_failed_cleanly(result, out)
    assert "truncated or corrupt" in result.output


# --- empty files, directories, globs ---------------------------------------------------------


def test_empty_file_alone_is_an_error(tmp_path):
    path = tmp_path / "raw.jsonl"
    path.write_bytes(b"")
    result, out = _invoke(tmp_path, [path])
    _assert_failed_cleanly(result, out)
    assert "the input holds no records" in result.output
    path.write_bytes(b"\n \n\r\n")
    result, out = _invoke(tmp_path, [path])
    _assert_failed_cleanly(result, out)


def test_empty_file_beside_others_is_counted(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b"")
    (tmp_path / "b.jsonl").write_bytes(G + b"\n")
    result, out = _invoke(tmp_path, [tmp_path / "a.jsonl", tmp_path / "b.jsonl"])
    assert result.exit_code == 0, result.output
    manifest = _manifest(out)
    assert [(i["lines"], i["bytes"]) for i in manifest["inputs"]] == [(0, 0), (1, len(G) + 1)]


def test_directory_input_reads_its_jsonl_files_sorted(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "b.jsonl").write_bytes(G + b"\n")
    (data / "a.jsonl.gz").write_bytes(gzip.compress(G + b"\n" + G + b"\n"))
    (data / "c.jsonl.zst").write_bytes(_compress("zst", G + b"\n"))
    (data / "notes.txt").write_text("not input\n")
    (data / ".hidden.jsonl").write_bytes(b"garbage\n")
    (data / "sub").mkdir()
    (data / "sub" / "d.jsonl").write_bytes(b"garbage\n")
    result, out = _invoke(tmp_path, [data])
    assert result.exit_code == 0, result.output
    manifest = _manifest(out)
    assert [Path(i["path"]).name for i in manifest["inputs"]] == ["a.jsonl.gz", "b.jsonl", "c.jsonl.zst"]
    assert manifest["counts"]["records"] == 4


def test_empty_directory_missing_glob_and_duplicates_are_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    result, out = _invoke(tmp_path, [tmp_path / "empty"])
    _assert_failed_cleanly(result, out)
    assert "holds no *.jsonl" in result.output
    result, out = _invoke(tmp_path, [f"{tmp_path}/nothing-*.jsonl"])
    _assert_failed_cleanly(result, out)
    assert "no file matches" in result.output
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_bytes(G + b"\n")
    result, out = _invoke(tmp_path, [tmp_path / "data", tmp_path / "data" / "a.jsonl"])
    _assert_failed_cleanly(result, out)
    assert "is given twice" in result.output


def test_glob_input(tmp_path):
    for name in ("x1.jsonl", "x2.jsonl"):
        (tmp_path / name).write_bytes(G + b"\n")
    result, out = _invoke(tmp_path, [f"{tmp_path}/x*.jsonl"])
    assert result.exit_code == 0, result.output
    assert _manifest(out)["counts"]["records"] == 2


# --- the output path ---------------------------------------------------------------------------


def test_overwrite_refuses_a_directory_that_is_not_a_build(tmp_path):
    path = tmp_path / "raw.jsonl"
    path.write_bytes(G + b"\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    result = CliRunner().invoke(main, ["build", str(path), "--out", str(out), "--overwrite"])
    assert result.exit_code == 2 and "is not a weightprep output" in result.output
    assert (out / "precious.txt").read_text() == "keep me"


def test_output_containing_the_input_is_refused(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_bytes(G + b"\n")
    (data / MANIFEST_NAME).write_text("{}")  # even when it looks like a build
    result = CliRunner().invoke(main, ["build", str(data), "--out", str(data), "--overwrite"])
    assert result.exit_code == 2 and "is inside the output path" in result.output
    assert (data / "a.jsonl").exists()


def test_stale_leftovers_of_dead_builds_are_recovered(tmp_path):
    """A killed build's temp dir is removed; a replace killed between its renames gets the old dataset back."""
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    path = tmp_path / "raw.jsonl"
    path.write_bytes(G + b"\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["build", str(path), "--out", str(out)])
    assert result.exit_code == 0
    before = (out / MANIFEST_NAME).read_bytes()
    # simulate a kill between `out -> .out.old-PID` and `tmp -> out`
    out.rename(tmp_path / f".out.old-{dead.pid}")
    (tmp_path / f".out.tmp-{dead.pid}").mkdir()
    (tmp_path / f".out.tmp-{dead.pid}" / "part-00000.arrow").write_bytes(b"half")
    result = CliRunner().invoke(main, ["build", str(path), "--out", str(out)])
    assert result.exit_code == 2 and "already exists" in result.output  # the previous dataset is back
    assert (out / MANIFEST_NAME).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "raw.jsonl"]
