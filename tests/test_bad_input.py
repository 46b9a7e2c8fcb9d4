"""Bad input: one clear message naming file, line and field; a non-zero exit; nothing at the output path."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from weightprep.cli import main
from weightprep.stages.validate import validate_record

GOOD = json.dumps({"pieces": [{"text": "Q: hi\n", "weight": 0}, {"text": "Hello!", "weight": 1}]})

# (bad line, field named in the message, words the message must contain)
CASES = {
    "malformed_json": ('{"pieces": [{"text": "a", "weight": 1}', "<json>", "malformed JSON"),
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
    txt = tmp_path / "data.txt"
    txt.write_text("hi\n")
    result = CliRunner().invoke(main, ["build", str(txt), "--out", str(tmp_path / "o")])
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
