"""Special-token traps, one tokenizer family each: BOS placement, EOS labels when pad == eos, no double BOS."""

from __future__ import annotations

import datasets
import pytest
from reference import IGNORE, check_rows, rows_as_numpy
from tokenizer_factory import FAMILIES

from weightprep.config import config_from_dict
from weightprep.pipeline import build

RECORDS = [
    {"pieces": [{"text": "Q: what is 2+2?\n", "weight": 0}, {"text": "A: 4", "weight": 1}]},
    {"pieces": [{"text": "The quick brown fox", "weight": 2}]},
    {"pieces": [{"text": "東京は日本の首都です。", "weight": 0.5}, {"text": " 😀", "weight": 1}]},
]


def _build(family, write_jsonl, tmp_path, **cfg):
    tok = FAMILIES[family]()
    path = write_jsonl(RECORDS)
    build([str(path)], tmp_path / "out", config_from_dict(cfg or {"pack": {"seq_len": 64}}), tokenizer=tok)
    rows = rows_as_numpy(datasets.load_from_disk(str(tmp_path / "out")))
    return tok, rows


def _documents(rows, tok, packed=True):
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return check_rows(rows, rows["input_ids"].shape[1], pad, packed=packed)


def test_bos_eos_distinct(write_jsonl, tmp_path):
    tok, rows = _build("bos_eos_distinct", write_jsonl, tmp_path)
    docs = _documents(rows, tok)
    assert len(docs) == 3
    for ids, weights in docs:
        assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
        assert ids[-1] == tok.eos_token_id and weights[-1] == 1.0


def test_no_bos_and_pad_is_eos_keeps_eos_label(write_jsonl, tmp_path):
    tok, rows = _build("no_bos_pad_is_eos", write_jsonl, tmp_path)
    assert tok.bos_token_id is None and tok.pad_token_id == tok.eos_token_id
    docs = _documents(rows, tok)
    for ids, weights in docs:
        assert ids[0] != tok.eos_token_id  # the document starts with its first text token...
        assert weights[0] == 0.0  # ...which nothing predicts
        assert ids[-1] == tok.eos_token_id and weights[-1] == 1.0
    eos_positions = rows["input_ids"] == tok.eos_token_id
    labelled_eos = (rows["labels"] == tok.eos_token_id) & eos_positions
    assert labelled_eos.sum() == 3  # every document's EOS is labelled, though it equals the pad id
    assert (rows["labels"][eos_positions & ~labelled_eos] == IGNORE).all()  # and every pad is not


def test_bos_eos_pad_all_the_same(write_jsonl, tmp_path):
    tok, rows = _build("bos_eos_pad_same", write_jsonl, tmp_path)
    special = tok.eos_token_id
    assert tok.bos_token_id == special == tok.pad_token_id
    docs = _documents(rows, tok)
    assert len(docs) == 3
    for ids, weights in docs:
        assert ids[0] == special and weights[0] == 0.0
        assert ids[-1] == special and weights[-1] == 1.0
        assert special not in ids[1:-1]


def test_template_bos_is_not_doubled(write_jsonl, tmp_path):
    tok, rows = _build("template_adds_bos", write_jsonl, tmp_path)
    assert tok("hi", add_special_tokens=True)["input_ids"][0] == tok.bos_token_id  # the trap is armed
    for ids, _ in _documents(rows, tok):
        assert ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id
        assert ids.count(tok.bos_token_id) == 1


def test_add_bos_never_and_eos_weight(write_jsonl, tmp_path):
    tok, rows = _build(
        "bos_eos_distinct", write_jsonl, tmp_path, tokenizer={"add_bos": "never"}, assemble={"eos_weight": 0.25}, pack={"seq_len": 64}
    )
    for ids, weights in _documents(rows, tok):
        assert tok.bos_token_id not in ids
        assert weights[-1] == 0.25


@pytest.mark.parametrize("family", ["wordpiece_like"])
def test_non_byte_level_tokenizer_builds(family, write_jsonl, tmp_path):
    tok, rows = _build(family, write_jsonl, tmp_path)
    assert len(_documents(rows, tok)) == 3


def test_slow_tokenizer_is_refused(monkeypatch):
    from weightprep import tokenizer as tk
    from weightprep.errors import UsageError

    class Slow:
        is_fast = False

    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", lambda *a, **k: Slow())
    with pytest.raises(UsageError, match="fast"):
        tk.load_tokenizer("some/slow-model")


def test_unloadable_tokenizer_is_a_clear_error(tmp_path):
    from weightprep.errors import UsageError
    from weightprep.tokenizer import load_tokenizer

    with pytest.raises(UsageError, match="does-not-exist: no such directory"):  # a path, not a bad repo id
        load_tokenizer(str(tmp_path / "does-not-exist"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="could not load tokenizer"):
        load_tokenizer(str(tmp_path / "empty"))
