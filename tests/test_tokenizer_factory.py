"""The test tokenizers have the special-token properties the rest of the suite relies on."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from tokenizer_factory import (
    BYTE_LEVEL_FAMILIES,
    FAMILIES,
    bos_eos_distinct,
    bos_eos_pad_same,
    no_bos_pad_is_eos,
    sample_tokenizer,
    template_adds_bos,
    wordpiece_like,
)

RAW = Path(__file__).resolve().parent.parent / "sample_data" / "raw.jsonl"
MIXED = "Hello, wörld! 東京と北京 😀🚀 👨‍👩‍👧 שלום  two  spaces\n\ttab"


@pytest.mark.parametrize("make_tok", FAMILIES.values(), ids=FAMILIES.keys())
def test_every_family_is_fast_cached_and_has_eos_and_pad(make_tok):
    tok = make_tok()
    assert tok is make_tok()  # built once per session
    assert tok.is_fast
    assert tok.eos_token_id is not None and tok.pad_token_id is not None


def test_bos_eos_distinct():
    tok = bos_eos_distinct()
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    assert len({tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}) == 3
    # No template: add_special_tokens=True adds nothing, weightprep writes BOS/EOS itself.
    assert tok("hi", add_special_tokens=True)["input_ids"] == tok("hi", add_special_tokens=False)["input_ids"]


def test_no_bos_pad_is_eos():
    tok = no_bos_pad_is_eos()
    assert tok.bos_token is None and tok.bos_token_id is None
    assert tok.pad_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|endoftext|>")


def test_bos_eos_pad_same():
    tok = bos_eos_pad_same()
    assert tok.bos_token_id == tok.eos_token_id == tok.pad_token_id is not None


@pytest.mark.parametrize("make_tok", [template_adds_bos, sample_tokenizer], ids=["template", "sample"])
def test_template_adds_bos_only_with_special_tokens(make_tok):
    tok = make_tok()
    bos = tok.bos_token_id
    assert bos is not None and bos not in {tok.eos_token_id, tok.pad_token_id}
    plain = tok("hi there", add_special_tokens=False)["input_ids"]
    assert plain and bos not in plain
    assert tok("hi there", add_special_tokens=True)["input_ids"] == [bos, *plain]  # exactly one BOS


@pytest.mark.parametrize("make_tok", BYTE_LEVEL_FAMILIES.values(), ids=BYTE_LEVEL_FAMILIES.keys())
def test_byte_level_round_trip(make_tok):
    tok = make_tok()
    for text in (MIXED, " leading space", "trailing space ", "🙂", "中文"):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text


def test_wordpiece_like_maps_unseen_characters_to_unk():
    tok = wordpiece_like()
    assert tok.unk_token == "[UNK]"
    ids = tok("hello 東京 😀", add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id in ids
    assert tok.decode(ids) != "hello 東京 😀"
    assert len({tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id}) == 4


def test_sample_tokenizer_loads_and_round_trips_raw_jsonl():
    tok = sample_tokenizer()
    assert tok.is_fast and len(tok) == 4096 and tok.model_max_length == 4096
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|bos|>", "<|eos|>", "<|pad|>")
    assert len({tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}) == 3
    with open(RAW, encoding="utf-8") as f:
        records = [json.loads(line) for line in itertools.islice(f, 40)]
    texts = [p["text"] for rec in records for p in rec["pieces"]]
    assert any(not t.isascii() for t in texts)
    for text, ids in zip(texts, tok(texts, add_special_tokens=False)["input_ids"], strict=True):
        assert tok.decode(ids) == text
