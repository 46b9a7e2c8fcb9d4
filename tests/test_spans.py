"""Token spans from ids alone (``weightprep.stages.spans``): tokenizers' own offsets wherever the tokens' bytes spell
the text, None (so the chat stage asks tokenizers) wherever they do not."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from chat_support import FAMILIES, chat_tokenizer
from hypothesis import example, given, settings
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


# -- hand-built tokenizers: exact spans computed by hand, for the edge cases real vocabularies never show --------


def _gpt2_bytes_to_unicode() -> dict[int, str]:
    """GPT-2's ``bytes_to_unicode`` (openai/gpt-2 encoder.py), written out independently of the module."""
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def test_the_byte_level_alphabet_is_gpt2s_table():
    from tokenizers.pre_tokenizers import ByteLevel

    from weightprep.stages.spans import _byte_level_alphabet

    alphabet = _byte_level_alphabet()
    assert alphabet == {c: b for b, c in _gpt2_bytes_to_unicode().items()}
    assert set(alphabet) == set(ByteLevel.alphabet())
    # the bounds of the printable ranges stand for themselves; the gaps next to them are moved above 255
    for b in (0x21, 0x7E, 0xA1, 0xAC, 0xAE, 0xFF):
        assert alphabet[chr(b)] == b
    for b in (0x20, 0x7F, 0xA0, 0xAD):
        assert chr(b) not in alphabet


def _word_level(vocab, decoder="byte_level", normalizer=None):
    """A WordLevel tokenizer over ``vocab`` (holes allowed): its ids are set by hand, it is never asked to encode."""
    from tokenizers import Tokenizer, decoders, models

    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    if decoder == "byte_level":
        tok.decoder = decoders.ByteLevel()
    else:  # Gemma's: "▁" -> " ", <0xNN> -> its byte
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.normalizer = normalizer
    return tok


def _one(spans, texts, docs):
    ids = np.asarray([i for d in docs for i in d], dtype=np.int64)
    offsets = np.cumsum([0] + [len(d) for d in docs])
    return [None if s is None else list(zip(s[0].tolist(), s[1].tolist(), strict=True))
            for s in spans.spans(texts, ids, offsets)]  # fmt: skip


def test_ids_outside_the_vocabulary_and_holes_get_none_the_others_keep_exact_spans():
    """Vocabulary {a: 0, b: 1, "東": 3} (id 2 a hole, id 4 the size): a document holding the hole, -1, the size or
    far beyond gets None even where the other tokens' bytes make up its text; the documents around it keep exact
    spans (id 3 after the hole is read at its own bytes)."""
    tok = _word_level({"a": 0, "b": 1, "æĿ±": 3})
    spans = TokenSpans(tok)
    texts = ["ab", "ab", "ab", "ab", "ab", "a東b"]
    docs = [[0, 1], [0, 2, 1], [0, -1, 1], [0, 4, 1], [0, 1000, 1], [0, 3, 1]]
    assert _one(spans, texts, docs) == [[(0, 1), (1, 2)], None, None, None, None, [(0, 1), (1, 2), (2, 3)]]


def test_an_id_that_would_read_past_the_vocabulary_gets_none():
    """-1 or the size alone, where the text is as long as the last token: None, no index past the bytes."""
    spans = TokenSpans(_word_level({"a": 0, "bc": 1}))
    assert _one(spans, ["bc", "bc", "a"], [[-1], [2], [0]]) == [None, None, [(0, 1)]]


def test_an_unknown_id_in_a_one_token_vocabulary_gets_none():
    spans = TokenSpans(_word_level({"a": 0}))
    assert _one(spans, ["a", "a"], [[0], [7]]) == [[(0, 1)], None]


def test_an_empty_vocabulary_gives_none_rather_than_failing():
    """No id has bytes: every document with a token needs tokenizers' offsets (None); one without spans nothing."""
    spans = TokenSpans(_word_level({}))
    assert _one(spans, ["a", ""], [[0], []]) == [None, []]


def test_zero_length_tokens_span_nothing_where_they_stand():
    """A token of no bytes (vocabulary entry ""): an empty span at its place, at the start of the first document,
    in the middle, and at the very end of the last one; an empty document of one such token spans (0, 0)."""
    spans = TokenSpans(_word_level({"": 0, "a": 1, "æĿ±": 2}))
    texts = ["a東", "東a", "a"]
    docs = [[0, 1, 2], [2, 0, 1], [1, 0]]
    assert _one(spans, texts, docs) == [[(0, 0), (0, 1), (1, 2)], [(0, 1), (1, 1), (1, 2)], [(0, 1), (1, 1)]]
    assert _one(spans, [""], [[0]]) == [[(0, 0)]]
    assert _one(spans, ["", ""], [[0], []]) == [[(0, 0)], []]


@pytest.mark.parametrize("text", ["ab", "a東"])  # ASCII only (a character per byte), or not
def test_one_run_of_holes_empty_tokens_and_wrong_byte_counts_keeps_each_document_its_own(text):
    """One run of documents of every kind (``_run``): a hole (id 3) and an id past the vocabulary (None), a token
    of no bytes (an empty span), ids of more and of fewer bytes than the text (None), ids of as many bytes that
    spell another text (None), and plain ones before and after each, which keep exact spans wherever they stand."""
    spans = TokenSpans(_word_level({"": 0, "a": 1, "b": 2, "æĿ±": 4, "bb": 5}))
    second = 2 if text == "ab" else 4
    plain = [1, second]
    exact = [(0, 1), (1, 2)]
    texts = [text, text, text, text, text, text, text, text, text, text, text]
    docs = [plain, [1, 3, second], plain, [1, 0, second], [1, 9, second], plain, [1, 5], [1], plain,
            [2, 1] if text == "ab" else [1, 1, 1, 1], plain]  # fmt: skip
    found = _one(spans, texts, docs)
    assert found == [exact, None, exact, [(0, 1), (1, 1), (1, 2)], None, exact, None, None, exact, None, exact]
    assert _one(spans, texts[:1] + [text + "!"] + texts[:1], [plain, plain, plain]) == [exact, None, exact]
    # a hole, then ids that spell only the start of their text: neither is checked against the others' bytes
    assert _one(spans, texts[:4], [[1, 3, second], plain, [1], plain]) == [None, exact, None, exact]


def test_a_byte_fallback_lookalike_is_its_own_text_without_byte_fallback():
    """"<0x41>" is the byte "A" only where the model falls back to bytes; a WordLevel model has no byte_fallback."""
    spans = TokenSpans(_word_level({"<0x41>": 0, "▁x": 1}, decoder="sentencepiece"))
    assert _one(spans, ["<0x41> x", "A"], [[0, 1], [0]]) == [[(0, 6), (6, 8)], None]


def test_added_tokens_have_bytes_unless_they_strip_or_are_matched_on_normalized_text():
    from tokenizers import AddedToken, normalizers

    tok = _word_level({"a": 0, "b": 1})
    tok.add_tokens([AddedToken("<n>", normalized=True)])
    for flag in ("lstrip", "rstrip", "single_word"):
        tok.add_special_tokens([AddedToken(f"<{flag}>", **{flag: True})])
    ids = tok.get_vocab(with_added_tokens=True)
    # no normalizer: a normalized added token is matched on the text itself, so it has its bytes
    got = _one(TokenSpans(tok), ["a<n>b"] + [f"a<{f}>b" for f in ("lstrip", "rstrip", "single_word")],
               [[0, ids["<n>"], 1]] + [[0, ids[f"<{f}>"], 1] for f in ("lstrip", "rstrip", "single_word")])  # fmt: skip
    assert got == [[(0, 1), (1, 4), (4, 5)], None, None, None]
    tok.normalizer = normalizers.NFC()  # now it is matched on normalized text: no fixed bytes
    assert _one(TokenSpans(tok), ["a<n>b", "ab"], [[0, ids["<n>"], 1], [0, 1]]) == [None, [(0, 1), (1, 2)]]


@settings(max_examples=80, deadline=None)
@given(texts=st.lists(_text, min_size=1, max_size=8), chunk=st.integers(1, 12), wrong=st.integers(0, 7))
@example(texts=["x", "x", "x", "x", "x"], chunk=2, wrong=7)  # runs that fill their tokens exactly
@example(texts=["x", "", "x", "", "", "x"], chunk=1, wrong=2)  # documents without tokens at a run's end
def test_runs_of_documents_are_greedy_and_give_each_document_its_own_offsets(texts, chunk, wrong):
    """``spans`` works over runs of documents of at most ``_CHUNK_TOKENS`` tokens (a longer document alone): each
    run is the longest that fits, every document is in exactly one run, and the spans are each document's own
    tokenizers' offsets whatever the runs (a document whose ids do not spell it still gets None, in its place)."""
    import weightprep.stages.spans as spans_module

    name = "chat-qwen2_5" if "chat-qwen2_5" in SPELLING else next(iter(SPELLING))
    backend = SPELLING[name]().backend_tokenizer
    encs, ids, offsets = _encode(backend, texts)
    wrong = wrong if wrong < len(texts) and len(encs[wrong].ids) > 0 else None
    if wrong is not None:  # its first id replaced by another: its tokens no longer spell its text
        ids = ids.copy()
        ids[offsets[wrong]] = (ids[offsets[wrong]] + 1) % backend.get_vocab_size()
        if backend.decode([int(i) for i in ids[offsets[wrong] : offsets[wrong + 1]]]) == texts[wrong]:
            wrong = None  # the replacement spells the same text (rare): nothing to check there
    runs: list[int] = []  # documents per run
    real = spans_module.TokenSpans._run

    def spy(self, run_texts, run_ids, run_offsets):
        assert run_offsets[0] == 0 and run_offsets[-1] == len(run_ids) and len(run_offsets) == len(run_texts) + 1
        runs.append(len(run_texts))
        return real(self, run_texts, run_ids, run_offsets)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spans_module, "_CHUNK_TOKENS", chunk)
        mp.setattr(spans_module.TokenSpans, "_run", spy)
        got = _spans(name).spans(texts, ids, offsets)
    # the runs an independent greedy cut makes: from d, as many documents as fit in `chunk` tokens (at least one)
    want, d = [], 0
    while d < len(texts):
        e = d + 1
        while e < len(texts) and offsets[e + 1] - offsets[d] <= chunk:
            e += 1
        want.append(e - d)
        d = e
    assert runs == want
    assert len(got) == len(texts)
    for d, (found, enc) in enumerate(zip(got, encs, strict=True)):
        if d == wrong:
            assert found is None, d
            continue
        assert found is not None, (d, texts[d])
        expected = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
        np.testing.assert_array_equal(found[0], expected[:, 0], err_msg=f"starts of document {d}")
        np.testing.assert_array_equal(found[1], expected[:, 1], err_msg=f"ends of document {d}")


@functools.lru_cache
def _surfaces(name: str) -> dict[int, bytes]:
    """Every id's bytes as ``TokenSpans`` holds them (the tests above hold them to tokenizers' offsets)."""
    spans = _spans(name)
    return {i: bytes(spans._bytes[spans._starts[i] : spans._starts[i] + n]) for i, n in enumerate(spans._lengths.tolist()) if n >= 0}


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_misspelled_are_the_tokens_whose_bytes_differ_at_their_place(data):
    """The spelling check (``TokenSpans._misspelled``: a token's first 8 bytes as one word, a longer token's rest
    byte by byte) finds exactly the tokens whose bytes differ from the text's at their place, against a comparison
    of bytes strings: any tokens (added ones of 12 bytes and more among them), the text changed at any bytes, or
    not at all, and bytes past the last token."""
    name = "chat-chatml"
    spans, surfaces = _spans(name), _surfaces(name)
    known = sorted(surfaces)
    long = [i for i in known if len(surfaces[i]) > 8]
    assert long and len(long) < len(known)
    ids = data.draw(st.lists(st.one_of(st.sampled_from(known), st.sampled_from(long)), max_size=24))
    text = bytearray(b"".join(surfaces[i] for i in ids))
    for at in data.draw(st.lists(st.integers(0, max(len(text) - 1, 0)), max_size=3)) if text else []:
        text[at] ^= data.draw(st.integers(1, 255))
    text += data.draw(st.binary(max_size=9))  # bytes past the last token: never compared
    lens = np.array([len(surfaces[i]) for i in ids], dtype=np.int64)
    first = np.cumsum(lens) - lens
    got = spans._misspelled(np.array(ids, dtype=np.intp), lens, first, np.frombuffer(bytes(text), dtype=np.uint8))
    want = [t for t, i in enumerate(ids) if bytes(text[first[t] : first[t] + lens[t]]) != surfaces[i]]
    assert got.tolist() == want
