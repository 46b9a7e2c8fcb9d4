"""Bad input: one clear message naming file, line and field; a non-zero exit; nothing at the output path."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from weightprep.cli import main
from weightprep.stages.validate import validate_record

GOOD = json.dumps({"pieces": [{"text": "Q: hi\n", "weight": 0}, {"text": "Hello!", "weight": 1}]})

# (bad line, field named in the message, words the message must contain)
CASES = {
    "malformed_json": ('{"pieces": [{"text": "a", "weight": 1}', "<json>", "malformed JSON"),
    "unterminated_string": ('{"pieces": [{"text": "abc', "<json>", "Unterminated string starting at column 22"),
    "not_an_object": ("[1, 2, 3]", "<record>", "JSON object"),
    "missing_pieces": ('{"body": "no accepted shape here"}', "pieces", "missing"),
    "pieces_not_list": ('{"pieces": "abc"}', "pieces", "expected a list"),
    "empty_pieces": ('{"pieces": []}', "pieces", "empty list"),
    "piece_not_object": ('{"pieces": ["abc"]}', "pieces[0]", "expected an object"),
    "text_missing": ('{"pieces": [{"weight": 1}]}', "pieces[0].text", "missing"),
    "text_not_string": ('{"pieces": [{"text": "ok", "weight": 1}, {"text": 5, "weight": 1}]}', "pieces[1].text", "expected a string, found number 5"),
    "text_null": ('{"pieces": [{"text": null, "weight": 1}]}', "pieces[0].text", "expected a string, found null"),
    "weight_missing": ('{"pieces": [{"text": "a"}]}', "pieces[0].weight", "missing"),
    "weight_string": ('{"pieces": [{"text": "a", "weight": "1.0"}]}', "pieces[0].weight", "found string '1.0'"),
    "weight_bool": ('{"pieces": [{"text": "a", "weight": true}]}', "pieces[0].weight", "found boolean True"),
    "weight_nan": ('{"pieces": [{"text": "a", "weight": NaN}]}', "pieces[0].weight", "nan"),
    "weight_inf": ('{"pieces": [{"text": "a", "weight": Infinity}]}', "pieces[0].weight", "inf"),
    "weight_overflow": ('{"pieces": [{"text": "a", "weight": 1e400}]}', "pieces[0].weight", "inf"),
    "weight_float32_overflow": ('{"pieces": [{"text": "a", "weight": 1e39}]}', "pieces[0].weight", "1e+39 (beyond float32"),
    "weight_negative": ('{"pieces": [{"text": "a", "weight": 1}, {"text": "b", "weight": -0.5}]}', "pieces[1].weight", "-0.5"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_record_names_file_line_field(case, write_jsonl, tmp_path):
    bad_line, field, words = CASES[case]
    path = write_jsonl([GOOD, GOOD, "", bad_line, GOOD])  # a blank line too: line numbers must still be exact
    out = tmp_path / "shards"
    result = CliRunner().invoke(main, ["build", str(path), "--out", str(out)])
    assert result.exit_code == 2, result.output
    message = result.stderr if hasattr(result, "stderr") else result.output
    assert f"{path}:4: {field}: " in message
    assert words in message
    assert "Traceback" not in result.output
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw.jsonl"]  # no temporary leftovers either


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_record_in_a_later_block_and_gzip(case, tmp_path):
    """The exact line is found when the bad record sits deep in a later block of a compressed file."""
    import gzip

    from weightprep.config import config_from_dict
    from weightprep.errors import InputError
    from weightprep.pipeline import build
    from weightprep.tokenizer import load_tokenizer

    bad_line, field, _ = CASES[case]
    lines = [GOOD] * 3000 + [bad_line] + [GOOD] * 10
    path = tmp_path / "raw.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    cfg = config_from_dict({"read": {"block_bytes": 4096}})
    with pytest.raises(InputError) as info:
        build([str(path)], tmp_path / "out", cfg, tokenizer=load_tokenizer(None))
    assert (info.value.line, info.value.field) == (3001, field)
    assert not (tmp_path / "out").exists()


def test_validate_record_accepts_valid_and_extra_keys():
    assert validate_record({"pieces": [{"text": "", "weight": 0}, {"text": "x", "weight": 2, "role": "a"}], "id": 7}) is None
    assert validate_record({"pieces": [{"text": "x", "weight": 1}]}) is None


def test_missing_input_file_and_bad_extension(tmp_path):
    result = CliRunner().invoke(main, ["build", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "not found" in result.output and "Traceback" not in result.output
    csv = tmp_path / "data.csv"  # (.txt is plain text: tests/test_inputs.py)
    csv.write_text("hi\n")
    result = CliRunner().invoke(main, ["build", str(csv), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and ".jsonl" in result.output
    assert not (tmp_path / "o").exists()


def test_config_errors_name_every_key(tmp_path, write_jsonl):
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text("pack:\n  seq_len: 2k\n  windw: 5\nfilter:\n  overlong: chop\nextra: 1\n")
    path = write_jsonl([GOOD])
    result = CliRunner().invoke(main, ["build", str(path), "--pipeline", str(pipeline), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    for needle in ("pack.seq_len: expected an integer", "pack.windw: unknown key", "filter.overlong: expected one of", "extra: unknown key"):
        assert needle in result.output
    assert "Traceback" not in result.output and not (tmp_path / "o").exists()


def test_cli_flag_overrides_are_validated(tmp_path, write_jsonl):
    path = write_jsonl([GOOD])
    result = CliRunner().invoke(main, ["build", str(path), "--seq-len", "1", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "pack.seq_len: must be at least 2" in result.output
    result = CliRunner().invoke(main, ["build", str(path), "--max-length", "4096", "--seq-len", "1024", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "filter.max_length" in result.output


# --- weights must be finite as float32, the shards' type, wherever they enter ----------------------------------

F32_MAX = float(np.finfo(np.float32).max)
# float32's largest; float64 neighbours above it that round down to it; the tie half an ulp above (rounds to even:
# inf); the float64 just below the tie (rounds down); values plainly beyond; and the examples
BOUNDARY = [
    F32_MAX,
    float(np.nextafter(F32_MAX, np.inf)),
    F32_MAX + 2.0**103,
    float(np.nextafter(F32_MAX + 2.0**103, 0)),
    3.5e38,
    5e38,
    1e39,
    1.0,
]


def _float32_finite(x: float) -> bool:
    """The rule, as numpy's own cast gives it."""
    with np.errstate(over="ignore"):
        return bool(np.isfinite(np.float32(x)))


def test_the_boundary_cases_straddle_the_cast():
    assert [_float32_finite(x) for x in BOUNDARY] == [True, True, False, True, False, False, False, True]


# a record with weight ``w`` at one entry point, and the field its error must name
RECORD_ENTRIES = {
    "piece": (lambda w: {"pieces": [{"text": "a", "weight": 0}, {"text": "b", "weight": w}]}, "pieces[1].weight"),
    "prompt_weight": (lambda w: {"prompt": "a", "completion": "b", "prompt_weight": w}, "prompt_weight"),
    "completion_weight": (lambda w: {"prompt": "a", "completion": "b", "completion_weight": w}, "completion_weight"),
    "message": (lambda w: {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b",
                                                                           "weight": w}]}, "messages[1].weight"),
    "conversation_completion_weight": (
        lambda w: {"prompt": [{"role": "user", "content": "a"}], "completion": [{"role": "assistant", "content": "b"}],
                   "completion_weight": w}, "completion_weight"),
}  # fmt: skip


def _check_record_weight(entry: str, w: float) -> None:
    """Every validate path (columnar on a block of pieces or of mixed shapes, line by line beside a bad line) and
    the strict error agree with the cast."""
    from weightprep.batches import Block
    from weightprep.errors import InputError
    from weightprep.stages.validate import check_line, parse_block

    make, field = RECORD_ENTRIES[entry]
    line = json.dumps(make(w))
    assert json.loads(line) == make(w)  # the number survives JSON exactly
    _, problem = check_line(line.encode())
    for first in (GOOD, json.dumps({"text": "plain"})):  # the pieces-only and the mixed-shapes columnar checks
        block = Block("raw.jsonl", 1, 2, f"{first}\n{line}\n".encode())
        if _float32_finite(w):
            assert problem is None
            records = parse_block(block)
            assert records.lines.tolist() == [1, 2]
            assert np.isfinite(records.piece_weights.astype(np.float32)).all()
            with_bad = Block("raw.jsonl", 1, 3, f"{first}\n{line}\nnot json\n".encode())
            assert parse_block(with_bad, []).lines.tolist() == [1, 2]
            continue
        assert problem is not None and (problem.field, problem.reason) == (field, "bad_weight")
        assert problem.problem.startswith("expected a finite number >= 0, found ")
        assert "beyond float32's largest, 3.4028235e+38" in problem.problem
        with pytest.raises(InputError) as err:
            parse_block(block)
        assert str(err.value).startswith(f"raw.jsonl:2: {field}: expected a finite number >= 0")
        rejects: list = []
        assert parse_block(block, rejects).lines.tolist() == [1]
        assert [(r.line, r.field, r.reason) for r in rejects] == [(2, field, "bad_weight")]


@pytest.mark.parametrize("entry", sorted(RECORD_ENTRIES))
@pytest.mark.parametrize("w", BOUNDARY, ids=repr)
def test_a_record_weight_must_be_finite_as_float32(entry, w):
    _check_record_weight(entry, w)


@settings(max_examples=60, deadline=None)
@given(entry=st.sampled_from(sorted(RECORD_ENTRIES)), w=st.floats(3.40282e38, 3.40284e38))
def test_a_record_weight_near_float32_max_is_judged_by_the_cast(entry, w):
    _check_record_weight(entry, w)


@pytest.mark.parametrize("w", BOUNDARY, ids=repr)
def test_eos_and_role_weights_must_be_finite_as_float32(w):
    from weightprep.config import config_from_dict
    from weightprep.errors import ConfigError

    for section, value, key in [
        ("assemble", {"eos_weight": w}, "assemble.eos_weight"),
        ("chat", {"role_weights": f"assistant={w!r},user=0"}, "chat.role_weights"),
    ]:
        if _float32_finite(w):
            config_from_dict({section: value})
            continue
        with pytest.raises(ConfigError) as err:
            config_from_dict({section: value})
        assert any(p.startswith(f"{key}: ") and "beyond float32's largest" in p for p in err.value.problems)


def test_a_float32_overflow_through_the_cli_flags_exits_2(tmp_path, write_jsonl):
    path = write_jsonl([GOOD])
    for flag, value, words in [
        ("--eos-weight", "1e39", "assemble.eos_weight: must be a finite number >= 0, got 1e+39"),
        ("--role-weights", "assistant=5e38", "chat.role_weights: expected ROLE=WEIGHT"),
    ]:
        result = CliRunner().invoke(main, ["build", str(path), flag, value, "--out", str(tmp_path / "o")])
        assert result.exit_code == 2 and words in result.output, result.output
        assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("w", [1e39, 3.5e38, F32_MAX], ids=repr)
def test_a_parquet_float64_weight_column_is_held_to_float32(tmp_path, sample_tok, w):
    """Parquet keeps float64 weights as they are; the shards cannot."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from weightprep.config import config_from_dict
    from weightprep.errors import InputError
    from weightprep.manifest import read_manifest, read_row
    from weightprep.pipeline import build

    rows = [{"prompt": "Q0", "completion": " A0", "completion_weight": 1.0},
            {"prompt": "Q1", "completion": " A1", "completion_weight": w}]  # fmt: skip
    table = pa.Table.from_pylist(rows, schema=pa.schema([("prompt", pa.string()), ("completion", pa.string()),
                                                         ("completion_weight", pa.float64())]))  # fmt: skip
    path = tmp_path / "d.parquet"
    pq.write_table(table, str(path))
    cfg = config_from_dict({"pack": {"seq_len": 64}})
    if not _float32_finite(w):
        with pytest.raises(InputError) as err:
            build([str(path)], tmp_path / "out", cfg, tokenizer=sample_tok)
        assert str(err.value).startswith(f"{path}: row 1: completion_weight: expected a finite number >= 0")
        assert not (tmp_path / "out").exists()
        return
    manifest = build([str(path)], tmp_path / "out", cfg, tokenizer=sample_tok)
    weights = read_row(tmp_path / "out", read_manifest(tmp_path / "out"), 0)["weights"]
    assert np.isfinite(weights).all() and weights.max() == np.float32(w)
    assert np.isfinite(manifest["counts"]["total_weight"])
