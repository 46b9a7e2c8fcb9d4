"""Parquet files and datasets.save_to_disk directories as input: the same shards as JSONL, errors by row and field."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weightprep.config import config_from_dict
from weightprep.errors import InputError, UsageError
from weightprep.pipeline import build


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def _parquet(path: Path, records: list[dict], row_group_size: int = 7) -> Path:
    pq.write_table(pa.Table.from_pylist(records), str(path), row_group_size=row_group_size)
    return path


def _arrow(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.arrow"))}


def _cfg(**sections):
    return config_from_dict({"pack": {"seq_len": 128}, **sections})


def _records(n: int) -> list[dict]:
    return [{"pieces": [{"text": f"Question {i}?", "weight": 0.0}, {"text": f" Answer {i}.", "weight": 1.0 + i % 3}]}
            for i in range(n)]  # fmt: skip


def test_parquet_with_row_groups_equals_jsonl_and_is_in_the_manifest(tmp_path, sample_tok):
    records = _records(40)
    a = build([str(_jsonl(tmp_path / "raw.jsonl", records))], tmp_path / "a", _cfg(), tokenizer=sample_tok)
    path = _parquet(tmp_path / "train-00000.parquet", records)
    assert pq.ParquetFile(str(path)).num_row_groups == 6
    b = build([str(path)], tmp_path / "b", _cfg(read={"block_bytes": 1 << 17}), tokenizer=sample_tok)  # 64-row batches
    assert _arrow(tmp_path / "a") == _arrow(tmp_path / "b")
    assert a["counts"] == b["counts"]
    entry = b["inputs"][0]
    assert entry["lines"] == 40 and entry["bytes"] == path.stat().st_size
    assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_bad_rows_are_named_by_row_and_field(tmp_path, sample_tok):
    records = _records(30)
    records[4]["pieces"][1]["weight"] = -1.0
    records[23]["pieces"][0]["text"] = None
    path = _parquet(tmp_path / "data.parquet", records)
    with pytest.raises(InputError) as err:
        build([str(path)], tmp_path / "out", _cfg(), tokenizer=sample_tok)
    assert str(err.value).startswith(f"{path}: row 4: pieces[1].weight: expected a finite number >= 0")
    assert not (tmp_path / "out").exists()
    m = build([str(path)], tmp_path / "out", _cfg(validate={"on_invalid": "skip"}), tokenizer=sample_tok)
    assert m["counts"]["rejected"] == {"bad_weight": 1, "wrong_type": 1} and m["counts"]["accepted"] == 28
    rejects = [json.loads(x) for x in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["row"], r["field"]) for r in rejects] == [(4, "pieces[1].weight"), (23, "pieces[0].text")]
    assert json.loads(rejects[0]["original"]) == records[4]


def test_a_schema_with_no_accepted_shape_fails_before_reading_rows(tmp_path, sample_tok):
    path = _parquet(tmp_path / "qa.parquet", [{"question": "q", "answer": "a"}])
    with pytest.raises(UsageError, match="found question, answer; map yours with --columns"):
        build([str(path)], tmp_path / "out", _cfg(), tokenizer=sample_tok)
    m = build([str(path)], tmp_path / "out", _cfg(read={"columns": "prompt=question,completion=answer"}), tokenizer=sample_tok)
    pieces = _jsonl(tmp_path / "p.jsonl", [{"pieces": [{"text": "q", "weight": 0}, {"text": "a", "weight": 1}]}])
    p = build([str(pieces)], tmp_path / "p", _cfg(), tokenizer=sample_tok)
    assert _arrow(tmp_path / "out") == _arrow(tmp_path / "p") and m["counts"]["tokens"] == p["counts"]["tokens"]
    # the same mapping names a JSON record's fields (tests/test_shapes.py: inside messages too)
    body = _jsonl(tmp_path / "b.jsonl", [{"pieces": [{"text": "q", "weight": 0}, {"text": "a", "weight": 1}], "body": None}])
    build([str(body)], tmp_path / "x", _cfg(read={"columns": "prompt=question,completion=answer"}), tokenizer=sample_tok)
    assert _arrow(tmp_path / "x") == _arrow(tmp_path / "p")


@pytest.mark.parametrize(
    ("columns", "row", "held"),
    [
        ("text=body", {"text": "the file's own text", "body": "the body"}, ("'text' and 'body'", "--columns text=body")),
        ("text=body", {"body": "the body", "text": "the file's own text"}, ("'body' and 'text'", "--columns text=body")),
        ("text=a,text=b", {"a": "one", "b": "two"}, ("'a' and 'b'", "--columns text=a, text=b")),
    ],
    ids=["onto-text", "onto-text-listed-after", "two-onto-one"],
)
def test_a_mapping_onto_a_name_the_file_already_holds_is_refused_before_any_work(tmp_path, columns, row, held):
    """Two columns becoming one field would keep one and silently drop the other ("last one wins")."""
    from click.testing import CliRunner

    from weightprep.cli import main

    path = _parquet(tmp_path / "d.parquet", [row])
    out = tmp_path / "out"
    # a tokenizer that does not exist: refused before it is loaded, or the error would be about it
    args = ["build", str(path), "--columns", columns, "--out", str(out), "--tokenizer", str(tmp_path / "no-tok")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    message = result.output.replace("\n", " ")
    assert f"{path}: columns {held[0]} would both be the field 'text' (renamed by {held[1]})" in message
    assert "Traceback" not in result.output and not out.exists()


def test_a_column_mapped_twice_is_refused(tmp_path):
    from click.testing import CliRunner

    from weightprep.cli import main

    path = _parquet(tmp_path / "d.parquet", [{"q": "question"}])
    result = CliRunner().invoke(main, ["build", str(path), "--columns", "prompt=q,completion=q", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "column 'q' is mapped twice (prompt=q, completion=q)" in result.output


def test_a_mapping_that_clashes_in_no_file_builds(tmp_path, sample_tok):
    """``text=a,text=b`` over files that each hold one of the two is the way to read differently named files."""
    a = _parquet(tmp_path / "a.parquet", [{"a": "from a"}])
    b = _parquet(tmp_path / "b.parquet", [{"b": "from b"}])
    m = build([str(a), str(b)], tmp_path / "out", _cfg(read={"columns": "text=a,text=b"}), tokenizer=sample_tok)
    assert m["counts"]["documents_written"] == 2


def test_a_save_to_disk_directory_is_an_input(tmp_path, sample_tok):
    import datasets

    records = [{"prompt": f"P{i}", "completion": f" C{i}", "source": "web"} for i in range(25)]
    datasets.Dataset.from_list(records).save_to_disk(str(tmp_path / "ds"))
    a = build([str(tmp_path / "ds")], tmp_path / "a", _cfg(), tokenizer=sample_tok)
    b = build([str(_jsonl(tmp_path / "raw.jsonl", records))], tmp_path / "b", _cfg(), tokenizer=sample_tok)
    assert _arrow(tmp_path / "a") == _arrow(tmp_path / "b") and a["counts"] == b["counts"]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(records)}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(UsageError, match="is a DatasetDict"):
        build([str(tmp_path / "dd")], tmp_path / "c", _cfg(), tokenizer=sample_tok)


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=15)
_weight = st.sampled_from([0.0, 0.5, 1.0, 2.0])
_piece_record = st.builds(
    lambda ps: {"pieces": [{"text": t, "weight": w} for t, w in ps], "text": None},
    st.lists(st.tuples(_text, _weight), min_size=1, max_size=3),
)
_text_record = st.builds(lambda t: {"pieces": None, "text": t}, _text)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(st.one_of(_piece_record, _text_record), min_size=1, max_size=30), group=st.integers(1, 8))
def test_random_records_give_the_same_shards_as_jsonl_and_parquet(tmp_path_factory, sample_tok, records, group):
    tmp = tmp_path_factory.mktemp("rt")
    jsonl = [{k: v for k, v in r.items() if v is not None} for r in records]
    a = build([str(_jsonl(tmp / "raw.jsonl", jsonl))], tmp / "a", _cfg(), tokenizer=sample_tok)
    b = build([str(_parquet(tmp / "raw.parquet", records, group))], tmp / "b", _cfg(), tokenizer=sample_tok)
    assert _arrow(tmp / "a") == _arrow(tmp / "b")
    assert a["counts"] == b["counts"]
