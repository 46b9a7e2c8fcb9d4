"""The validation split of ``weightprep build``: whole records, by content, deterministic, disjoint, accounted."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import SAMPLE_RAW, load_records
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import check_rows, reference_document, rows_as_numpy

from weightprep.accounting import check_accounting
from weightprep.config import config_from_dict
from weightprep.constants import MANIFEST_NAME
from weightprep.errors import ConfigError, UsageError
from weightprep.pipeline import build

SEQ = 512


def _records(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "answer", "prompt", "key", "phrase", "the", "a", "of", "to", "in"]
    out = []
    for i in range(n):
        pieces = [{"text": f"Q{i}: " + " ".join(rng.choices(words, k=rng.randint(1, 12))), "weight": 0.0}]
        pieces.append({"text": " " + " ".join(rng.choices(words, k=rng.randint(1, 30))), "weight": rng.choice([1.0, 2.0])})
        out.append({"pieces": pieces})
    return out


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _build(inp: Path, out: Path, tok, **sections) -> dict:
    cfg = config_from_dict({"pack": {"seq_len": SEQ}, **sections})
    return build([str(inp)], out, cfg, tokenizer=tok, overwrite=True)


def _split_documents(out: Path, split: str | None, tok) -> list[tuple[list[int], list[float]]]:
    import datasets

    ds = datasets.load_from_disk(str(out))
    if split is not None:
        ds = ds[split]
    return check_rows(rows_as_numpy(ds), SEQ, tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id, packed=True)


def _key(doc) -> tuple:
    return tuple(doc[0]), tuple(round(w, 6) for w in doc[1])


def _files(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("split") / "raw.jsonl", _records(600))


def test_splits_are_disjoint_and_their_union_is_the_unsplit_build(data, tmp_path, sample_tok):
    import datasets

    whole = _build(data, tmp_path / "whole", sample_tok)
    split = _build(data, tmp_path / "split", sample_tok, split={"validation_fraction": 0.25, "seed": 7})
    loaded = datasets.load_from_disk(str(tmp_path / "split"))
    assert isinstance(loaded, datasets.DatasetDict) and set(loaded) == {"train", "validation"}
    train = Counter(map(_key, _split_documents(tmp_path / "split", "train", sample_tok)))
    val = Counter(map(_key, _split_documents(tmp_path / "split", "validation", sample_tok)))
    every = Counter(map(_key, _split_documents(tmp_path / "whole", None, sample_tok)))
    assert not set(train) & set(val)
    assert train + val == every
    # each split is packed on its own: rows of one split hold only that split's documents
    counts = split["splits"]
    assert counts["train"]["counts"]["rows"] == len(loaded["train"])
    assert counts["validation"]["counts"]["rows"] == len(loaded["validation"])
    assert counts["train"]["counts"]["documents_written"] == sum(train.values())
    assert counts["validation"]["counts"]["documents_written"] == sum(val.values())
    assert split["counts"]["records"] == whole["counts"]["records"] == 600
    assert split["counts"]["tokens"] == whole["counts"]["tokens"]
    for c in (counts["train"]["counts"], counts["validation"]["counts"], split["counts"]):
        check_accounting(c)
    assert counts["train"]["counts"]["records"] + counts["validation"]["counts"]["records"] == 600
    # binomial(600, 0.25): mean 150, sd ~10.6
    assert 100 < counts["validation"]["counts"]["records"] < 200


def test_assignment_follows_the_record_not_its_position(data, tmp_path, sample_tok):
    records = load_records(data)
    shuffled = records[:]
    random.Random(3).shuffle(shuffled)
    shuffled_path = _write(tmp_path / "shuffled.jsonl", shuffled)
    a = _build(data, tmp_path / "a", sample_tok, split={"validation_fraction": 0.3})
    b = _build(shuffled_path, tmp_path / "b", sample_tok, split={"validation_fraction": 0.3})
    assert a["splits"]["validation"]["counts"]["records"] == b["splits"]["validation"]["counts"]["records"]
    for name in ("train", "validation"):
        docs_a = Counter(map(_key, _split_documents(tmp_path / "a", name, sample_tok)))
        docs_b = Counter(map(_key, _split_documents(tmp_path / "b", name, sample_tok)))
        assert docs_a == docs_b, name
    # a different seed moves records between the splits
    _build(data, tmp_path / "c", sample_tok, split={"validation_fraction": 0.3, "seed": 1})
    docs_c = Counter(map(_key, _split_documents(tmp_path / "c", "validation", sample_tok)))
    assert docs_c != Counter(map(_key, _split_documents(tmp_path / "a", "validation", sample_tok)))


def test_validation_documents_are_the_reference_documents_of_their_records(tmp_path, sample_tok):
    records = _records(80, seed=5)
    inp = _write(tmp_path / "raw.jsonl", records)
    _build(inp, tmp_path / "out", sample_tok, split={"validation_records": 10})
    expected = Counter(_key(reference_document(sample_tok, r["pieces"])) for r in records)
    val = Counter(map(_key, _split_documents(tmp_path / "out", "validation", sample_tok)))
    train = Counter(map(_key, _split_documents(tmp_path / "out", "train", sample_tok)))
    assert sum(val.values()) == 10
    assert val + train == expected


def test_duplicates_stay_together(tmp_path, sample_tok):
    base = _records(60, seed=9)
    records = base + base[:30] + base[:10]  # 40 records occur more than once
    inp = _write(tmp_path / "raw.jsonl", records)
    for how in ({"validation_fraction": 0.3}, {"validation_records": 12}):
        out = tmp_path / "out"
        _build(inp, out, sample_tok, split=how)
        val = set(map(_key, _split_documents(out, "validation", sample_tok)))
        train = set(map(_key, _split_documents(out, "train", sample_tok)))
        assert val and train and not val & train, how


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    block_kib=st.sampled_from([1, 4, 64]), batch=st.sampled_from([3, 97, 16384]), window=st.sampled_from([7, 20000]),
    fraction=st.sampled_from([None, 0.2]),
)  # fmt: skip
def test_rows_are_byte_identical_whatever_the_block_size(
    data, tmp_path_factory, sample_tok, block_kib, batch, window, fraction
):
    """Blocks and tokenizer batches change neither the split nor the rows (packing windows are exact)."""
    split = {"validation_fraction": fraction}
    base = tmp_path_factory.mktemp("base") / "out"
    _build(data, base, sample_tok, split=split, pack={"seq_len": SEQ, "window": window})
    other = tmp_path_factory.mktemp("other") / "out"
    _build(
        data, other, sample_tok, split=split, pack={"seq_len": SEQ, "window": window},
        read={"block_bytes": block_kib * 1024}, tokenizer={"batch_size": batch},
    )  # fmt: skip
    # the config (block size, batch size) is recorded in the manifest, hence in state.json's fingerprint
    arrow = {k: v for k, v in _files(base).items() if k.endswith(".arrow")}
    assert {k: v for k, v in _files(other).items() if k.endswith(".arrow")} == arrow
    assert len(arrow) == (1 if fraction is None else 2)
    a, b = (json.loads((d / MANIFEST_NAME).read_text()) for d in (base, other))
    assert (a["counts"], a.get("splits"), a["shards"]) == (b["counts"], b.get("splits"), b["shards"])


def test_validation_records_exact_and_with_rejects(tmp_path, sample_tok):
    records = [json.dumps(r) for r in _records(50, seed=2)]
    records[10] = '{"pieces": [{"text": 1, "weight": 1}]}'
    records[20] = "not json"
    inp = tmp_path / "raw.jsonl"
    inp.write_text("\n".join(records) + "\n")
    m = _build(inp, tmp_path / "out", sample_tok, split={"validation_records": 7}, validate={"on_invalid": "skip"})
    assert m["splits"]["validation"]["counts"]["records"] == 7
    assert m["splits"]["train"]["counts"]["records"] == 41
    assert m["counts"]["records"] == 50 and sum(m["counts"]["rejected"].values()) == 2
    assert (tmp_path / "out" / "rejects.jsonl").is_file()
    check_accounting(m["counts"])


def test_without_the_flag_the_layout_is_unchanged(data, tmp_path, sample_tok):
    import datasets

    m = _build(data, tmp_path / "out", sample_tok)
    assert "splits" not in m and all("split" not in s for s in m["shards"])
    assert not (tmp_path / "out" / "dataset_dict.json").exists()
    assert isinstance(datasets.load_from_disk(str(tmp_path / "out")), datasets.Dataset)
    state = json.loads((tmp_path / "out" / "state.json").read_text())
    assert state["_split"] is None


def test_rerun_is_byte_identical(data, tmp_path, sample_tok):
    _build(data, tmp_path / "a", sample_tok, split={"validation_fraction": 0.1})
    _build(data, tmp_path / "b", sample_tok, split={"validation_fraction": 0.1})
    files = _files(tmp_path / "a")
    assert "validation/state.json" in files and "dataset_dict.json" in files and MANIFEST_NAME in files
    assert _files(tmp_path / "b") == files


def test_bad_split_settings_are_refused(data, tmp_path, sample_tok):
    with pytest.raises(ConfigError, match="not both"):
        config_from_dict({"split": {"validation_fraction": 0.1, "validation_records": 3}})
    with pytest.raises(ConfigError, match="between 0 and 1"):
        config_from_dict({"split": {"validation_fraction": 1.0}})
    with pytest.raises(ConfigError, match="at least 1"):
        config_from_dict({"split": {"validation_records": 0}})
    with pytest.raises(UsageError, match="would leave no training records"):
        _build(data, tmp_path / "out", sample_tok, split={"validation_records": 600})
    assert not (tmp_path / "out").exists()


def test_cli_split_inspect_and_train_loader(tmp_path):
    from weightprep.cli import main
    from weightprep.train.data import load_shards

    out = tmp_path / "shards"
    args = ["build", str(SAMPLE_RAW), "--out", str(out), "--seq-len", "256", "--validation-fraction", "0.2",
            "--split-seed", "4"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "validation:" in result.output and "train:" in result.output
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["config"]["split"] == {"validation_fraction": 0.2, "validation_records": None, "seed": 4}
    shards = load_shards(out)
    assert len(shards.dataset) == manifest["splits"]["train"]["counts"]["rows"]
    assert len(shards.validation) == manifest["splits"]["validation"]["counts"]["rows"]
    shown = CliRunner().invoke(main, ["inspect", str(out), "--split", "validation", "--row", "0", "--no-color"])
    assert shown.exit_code == 0, shown.output
    assert "row 0 of validation" in shown.output
    bad = CliRunner().invoke(main, ["inspect", str(out), "--split", "test"])
    assert bad.exit_code != 0 and "no split 'test'" in bad.output
    both = CliRunner().invoke(main, [*args, "--overwrite", "--validation-records", "5"])
    assert both.exit_code == 2 and "not both" in both.output


def test_a_records_key_is_the_documented_digest_of_its_pieces_or_its_canonical_conversation():
    """The key (module docstring of ``stages/split.py``) is computable without weightprep: BLAKE2b-64 of the seed
    (int64, little-endian), then each piece's UTF-8 length (uint64), weight (float64) and bytes; for a
    conversation, ``chat\\0`` and its canonical JSON: keys sorted, no spaces, characters as themselves in UTF-8
    (so a conversation whose keys come in another order, or with its characters escaped, keeps its split)."""
    import hashlib
    import struct

    import numpy as np

    from weightprep.batches import Chat, Records
    from weightprep.stages.split import record_keys
    from weightprep.stages.validate import check_line

    seed = -7
    pieces = Records("x.jsonl", np.array([1]), ["a", "é!"], np.array([1.0, 2.5]), np.array([0, 2]))
    h = hashlib.blake2b(struct.pack("<q", seed), digest_size=8)
    for text, weight in (("a", 1.0), ("é!", 2.5)):
        h.update(struct.pack("<Qd", len(text.encode()), weight) + text.encode())
    assert record_keys(pieces, seed).tolist() == [int.from_bytes(h.digest(), "little")]

    lines = [
        '{"messages": [{"role": "user", "content": "h\\u00e9llo", "weight": 0}], "tools": null}',
        '{"tools": null, "messages": [{"weight": 0, "content": "héllo", "role": "user"}]}',
    ]
    chats = [check_line(line.encode())[0] for line in lines]
    assert all(isinstance(c, Chat) for c in chats)
    canonical = '{"chat_template_kwargs":null,"messages":[{"content":"héllo","role":"user","weight":0}],"tools":null}'
    h = hashlib.blake2b(struct.pack("<q", seed) + b"chat\0" + canonical.encode(), digest_size=8)
    records = Records("x.jsonl", np.array([1, 2]), [], np.zeros(0), np.zeros(3, dtype=np.int64), chats)
    assert record_keys(records, seed).tolist() == [int.from_bytes(h.digest(), "little")] * 2
