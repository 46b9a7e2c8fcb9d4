"""Token spans from ids alone (``weightprep.stages.spans``): tokenizers' own offsets wherever the tokens' bytes spell
the text, None (so the chat stage asks tokenizers) wherever they do not."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from chat_support import FAMILIES, chat_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizer_factory import (
    BYTE_LEVEL_FAMILIES,
    sentencepiece_legacy,
    sentencepiece_metaspace,
    wordpiece_like,
)

from weightprep.stages.spans import TokenSpans

_BITS = ["Hello", " world", "assistant", "\n", "\n\n", "  ", "\t", "東京は", "😀🚀", "👨‍👩‍👧", "Ünïcödé", "x", "0.5",
         "<|im_start|>", "<|im_end|>", "<|eot_id|>", "<start_of_turn>", "<s>", "</s>", "[INST]", "é", "\u00a0", "ﬁ"]  # fmt: skip
_text = st.lists(st.sampled_from(_BITS), max_size=12).map("".join)

#: Tokenizers whose tokens spell every text (byte-level BPE), or every text without a literal "▁" (Gemma-like).
SPELLING = {
    **{f"chat-{n}": functools.partial(chat_tokenizer, n) for n in FAMILIES},
    **BYTE_LEVEL_FAMILIES,
    "sentencepiece-gemma": functools.partial(chat_tokenizer, "gemma", model="sentencepiece"),
}


@functools.lru_cache
def _spans(name: str) -> TokenSpans:
    return TokenSpans(SPELLING[name]().backend_tokenizer)


def _encode(backend, texts):
    encs = backend.encode_batch(texts, add_special_tokens=False)
    ids = np.concatenate([np.asarray(e.ids, dtype=np.int64) for e in encs] + [np.zeros(0, np.int64)])
    offsets = np.cumsum([0] + [len(e.ids) for e in encs])
    return encs, ids, offsets


@pytest.mark.parametrize("name", list(SPELLING))
@settings(max_examples=60, deadline=None)
@given(texts=st.lists(_text, min_size=1, max_size=5))
def test_spans_are_tokenizers_offsets(name, texts):
    backend = SPELLING[name]().backend_tokenizer
    encs, ids, offsets = _encode(backend, texts)
    got = _spans(name).spans(texts, ids, offsets)
    for text, enc, found in zip(texts, encs, got, strict=True):
        assert found is not None, (text, enc.tokens)
        want = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
        np.testing.assert_array_equal(found[0], want[:, 0])
        np.testing.assert_array_equal(found[1], want[:, 1])


def _assert_offsets(got, encs, wrong):
    """Every document but ``wrong`` has exactly tokenizers' offsets; ``wrong`` has None."""
    for d, (found, enc) in enumerate(zip(got, encs, strict=True)):
        if d == wrong:
            assert found is None, d
            continue
        assert found is not None, d
        want = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
        np.testing.assert_array_equal(found[0], want[:, 0], err_msg=f"starts of document {d}")
        np.testing.assert_array_equal(found[1], want[:, 1], err_msg=f"ends of document {d}")


@pytest.mark.parametrize("wrong", [0, 1])
@pytest.mark.parametrize("edit", ["swap", "drop", "add"])
def test_a_document_whose_ids_do_not_spell_it_gets_none_and_the_others_keep_their_offsets(edit, wrong):
    """One document's first token replaced by another of the same byte length, dropped, or doubled: that document
    gets None, and every other one, before and after it, exactly tokenizers' offsets (a document after one whose
    tokens hold fewer or more bytes than its text is placed by its own text, not by the tokens before it)."""
    backend = chat_tokenizer("chatml").backend_tokenizer
    spans = TokenSpans(backend)
    texts = ["Hello world", "東京は world", "the end 😀", "Ünïcödé<|im_end|>\n", "x"]
    encs, ids, offsets = _encode(backend, texts)
    at = int(offsets[wrong])
    if edit == "swap":  # the byte count still matches: the bytes themselves differ
        same_length = [i for i in backend.get_vocab().values() if i != ids[at] and spans._lengths[i] == spans._lengths[ids[at]]]
        ids = ids.copy()
        ids[at] = same_length[0]
    else:
        ids = np.delete(ids, at) if edit == "drop" else np.insert(ids, at, ids[at])
        offsets = offsets + np.where(np.arange(len(offsets)) > wrong, -1 if edit == "drop" else 1, 0)
    _assert_offsets(spans.spans(texts, ids, offsets), encs, wrong)


def test_a_literal_word_marker_in_gemma_text_gets_none():
    backend = chat_tokenizer("gemma", model="sentencepiece").backend_tokenizer
    _, ids, offsets = _encode(backend, ["a▁b", "a b"])
    got = TokenSpans(backend).spans(["a▁b", "a b"], ids, offsets)
    assert got[0] is None and got[1] is not None  # "▁" reads back as a space: the bytes differ


@pytest.mark.parametrize("make_tok", [sentencepiece_legacy, sentencepiece_metaspace, wordpiece_like])
def test_tokenizers_whose_tokens_do_not_spell_the_text_are_not_supported(make_tok):
    """A prefix marker the decoder strips (Llama-2, Mistral), WordPiece's "##": no spans from ids at all."""
    spans = TokenSpans(make_tok().backend_tokenizer)
    assert not spans.supported
    backend = make_tok().backend_tokenizer
    _, ids, offsets = _encode(backend, ["hello there"])
    assert spans.spans(["hello there"], ids, offsets) == [None]


def test_a_normalizer_that_changes_the_text_and_a_stripping_added_token_get_none():
    from tokenizers import AddedToken, normalizers

    tok = chat_tokenizer("chatml")
    backend = type(tok.backend_tokenizer).from_str(tok.backend_tokenizer.to_str())
    backend.normalizer = normalizers.Lowercase()
    texts = ["Hello", "hello"]
    _, ids, offsets = _encode(backend, texts)
    got = TokenSpans(backend).spans(texts, ids, offsets)
    assert got[0] is None and got[1] is not None
    backend = type(tok.backend_tokenizer).from_str(tok.backend_tokenizer.to_str())
    backend.add_special_tokens([AddedToken("<sep>", rstrip=True)])
    texts = ["a<sep>  b", "a b"]
    _, ids, offsets = _encode(backend, texts)
    got = TokenSpans(backend).spans(texts, ids, offsets)
    assert got[0] is None and got[1] is not None
