"""Small tokenizers built in-process for tests: no files, no hub, a fraction of a second each.

Every family is trained with ``tokenizers`` on the short corpus below and wrapped as a
``transformers.PreTrainedTokenizerFast``, so it goes through the same code paths as a real model's
tokenizer. Each function is cached (``functools.lru_cache``): one build per test session, and every
caller gets the same object, so treat it as read-only (``copy.deepcopy`` it before changing settings).

The families, and the trap each one guards against:

``bos_eos_distinct()``
    Byte-level BPE with ``<s>`` / ``</s>`` / ``<pad>``, all distinct; its post-processor adds nothing.
    The plain case: weightprep itself writes BOS + pieces + EOS.
``no_bos_pad_is_eos()``
    Byte-level BPE with no BOS at all (``bos_token`` is None) and pad == eos == ``<|endoftext|>``, like Qwen.
    Documents must start with their first text token, and masking by ``input_ids == pad_token_id`` would
    silently unlabel every EOS: labels must be masked by position.
``bos_eos_pad_same()``
    Byte-level BPE where bos == eos == pad == ``<|endoftext|>``, like GPT-2 with ``pad_token = eos_token``.
    One id plays three roles; the EOS label must survive and a pad tail must not be mistaken for documents.
``template_adds_bos()``
    Byte-level BPE, ``<|begin_of_text|>`` / ``<|end_of_text|>`` / ``<|pad|>``, whose ``TemplateProcessing``
    post-processor adds BOS when called with ``add_special_tokens=True``, like Llama. weightprep adds BOS
    itself and must call the tokenizer with ``add_special_tokens=False``, or every document gets two BOS.
``sentencepiece_legacy()``
    BPE with byte fallback behind the legacy SentencePiece conversion, normalizer ``Prepend("▁")`` +
    ``Replace(" ", "▁")`` (Llama-2, Mistral v0.1, TinyLlama, CodeLlama): a word-start marker at the start of
    every call. Pieces after the first must be tokenized as continuations, or each gets a space in front.
``sentencepiece_metaspace()``
    The same model behind pre-tokenizer ``Metaspace(prepend_scheme="first")`` (newer conversions, Mistral
    v0.3): the same trap, set in another component.
``byte_level_prefix_space()``
    Byte-level BPE with ``ByteLevel(add_prefix_space=True)`` (RoBERTa-style): a space before every call.
``wordpiece_like()``
    A WordPiece model with a whitespace pre-tokenizer and ``[UNK]``: not byte-level, so unseen characters
    become ``[UNK]`` and decoding does not give the text back (spaces are normalized). For robustness tests
    where a round trip is not expected; special tokens ``[BOS]`` / ``[EOS]`` / ``[PAD]``.

``sample_tokenizer()`` loads the committed ``sample_data/tokenizer`` (byte-level BPE, 4096 ids, template BOS),
and ``FAMILIES`` maps names to the in-process builders for ``pytest.mark.parametrize``.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "BYTE_LEVEL_FAMILIES",
    "CORPUS",
    "FAMILIES",
    "ROUND_TRIP_FAMILIES",
    "SAMPLE_TOKENIZER_DIR",
    "bos_eos_distinct",
    "bos_eos_pad_same",
    "byte_level_prefix_space",
    "no_bos_pad_is_eos",
    "sample_tokenizer",
    "sentencepiece_legacy",
    "sentencepiece_metaspace",
    "template_adds_bos",
    "wordpiece_like",
]

SAMPLE_TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "sample_data" / "tokenizer"

#: Training text: English with code, accented European text, CJK, RTL and emoji, so that common words
#: get merges of their own while the byte alphabet keeps everything else representable.
CORPUS: tuple[str, ...] = (
    "### Instruction:\nSummarize the text.\n\n### Response:\nThe quick brown fox jumps over the lazy dog.",
    "<|user|>\nHow do I boil an egg?\n<|assistant|>\nPut the egg in boiling water for seven minutes.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # prints 5\n",
    "Weighted tokens teach the model what matters most; prompts get weight zero.",
    "Packing puts many short documents into one fixed-length row, and position ids restart at each one.",
    "Le café était délicieux et la serveuse très aimable. Grüße aus Köln! ¿Dónde está la estación?",
    "東京は日本の首都です。北京是中国的首都。我喜欢学习编程。ありがとうございます。",
    "مرحبا بالعالم. שלום עולם. Emoji: 😀🚀🎉👍🏽 👨‍👩‍👧 🇯🇵",
    "Numbers 0123456789, punctuation .,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`, tabs\tand\nnewlines.",
) * 4


def _byte_level_bpe(specials: list[str], vocab_size: int, add_prefix_space: bool = False) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok


def _sentencepiece(specials: list[str], vocab_size: int, form: str) -> Any:
    """BPE with byte fallback as ``transformers`` converts a SentencePiece model: ``form`` "legacy" puts the
    "▁" marker in the normalizer, "metaspace" in the pre-tokenizer, "gemma" has none (spaces become "▁"). Characters outside the 60 most frequent
    are left out of the alphabet, so byte fallback (``<0xNN>``) is exercised."""
    import json

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True))
    if form == "legacy":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    elif form == "gemma":  # spaces become "▁", no marker in front of a call, none to strip when decoding
        tok.normalizer = normalizers.Replace(" ", "▁")
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    strip = [] if form == "gemma" else [decoders.Strip(" ", 1, 0)]
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), *strip])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, limit_alphabet=60, show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    # the 256 byte tokens, right after the specials as in a Llama vocabulary
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    ordered = sorted(vocab, key=vocab.__getitem__)
    tokens = ordered[: len(specials)] + [f"<0x{b:02X}>" for b in range(256)] + ordered[len(specials) :]
    spec["model"]["vocab"] = {t: i for i, t in enumerate(tokens)}
    for added in spec["added_tokens"]:
        added["id"] = spec["model"]["vocab"][added["content"]]
    return Tokenizer.from_str(json.dumps(spec))


def _wordpiece(specials: list[str], vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    # The vocabulary is counted here rather than by WordPieceTrainer, whose ties are ordered differently
    # from one process to the next: specials, every character seen (alone and as a "##" continuation),
    # then the most frequent words. English text only, so CJK, emoji, ... become [UNK].
    pre = pre_tokenizers.Whitespace()
    words = Counter(w for text in CORPUS[:5] for w, _ in pre.pre_tokenize_str(text))
    chars = sorted({c for w in words for c in w})
    by_freq = sorted(words, key=lambda w: (-words[w], w))
    tokens = list(dict.fromkeys([*specials, *chars, *(f"##{c}" for c in chars), *by_freq]))[:vocab_size]
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(tokens)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(specials)
    return tok


def _build(
    *,
    model: str = "byte_level_bpe",
    bos: str | None,
    eos: str,
    pad: str,
    unk: str | None = None,
    template_bos: bool = False,
    vocab_size: int = 400,
    **model_options: Any,
) -> Any:
    """Train a tokenizer of the given kind on CORPUS and wrap it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    specials = list(dict.fromkeys(t for t in (bos, eos, pad, unk) if t is not None))  # unique, in order
    builders = {"byte_level_bpe": _byte_level_bpe, "sentencepiece": _sentencepiece, "wordpiece": _wordpiece}
    backend = builders[model](specials, vocab_size, **model_options)
    if template_bos:
        assert bos is not None, "a template that adds BOS needs a BOS token"
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1", special_tokens=[(bos, backend.token_to_id(bos))]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        unk_token=unk,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )


@functools.lru_cache
def bos_eos_distinct() -> Any:
    """Byte-level BPE; ``<s>``, ``</s>``, ``<pad>`` distinct; adds no special tokens by itself."""
    return _build(bos="<s>", eos="</s>", pad="<pad>")


@functools.lru_cache
def no_bos_pad_is_eos() -> Any:
    """Byte-level BPE without BOS; pad == eos == ``<|endoftext|>`` (like Qwen)."""
    return _build(bos=None, eos="<|endoftext|>", pad="<|endoftext|>")


@functools.lru_cache
def bos_eos_pad_same() -> Any:
    """Byte-level BPE; bos == eos == pad == ``<|endoftext|>`` (like GPT-2 with pad set to eos)."""
    return _build(bos="<|endoftext|>", eos="<|endoftext|>", pad="<|endoftext|>")


@functools.lru_cache
def template_adds_bos() -> Any:
    """Byte-level BPE whose post-processor prepends BOS when ``add_special_tokens=True`` (like Llama)."""
    return _build(bos="<|begin_of_text|>", eos="<|end_of_text|>", pad="<|pad|>", template_bos=True)


@functools.lru_cache
def sentencepiece_legacy() -> Any:
    """Legacy SentencePiece conversion: normalizer ``Prepend("▁")`` + ``Replace``, byte fallback (like Llama-2)."""
    return _build(model="sentencepiece", form="legacy", bos="<s>", eos="</s>", pad="<unk>", unk="<unk>", template_bos=True)


@functools.lru_cache
def sentencepiece_metaspace() -> Any:
    """SentencePiece conversion with ``Metaspace(prepend_scheme="first")``, byte fallback (like Mistral v0.3)."""
    return _build(model="sentencepiece", form="metaspace", bos="<s>", eos="</s>", pad="<unk>", unk="<unk>")


@functools.lru_cache
def byte_level_prefix_space() -> Any:
    """Byte-level BPE with ``ByteLevel(add_prefix_space=True)``: a space before every call (RoBERTa-style)."""
    return _build(bos="<s>", eos="</s>", pad="<pad>", add_prefix_space=True)


@functools.lru_cache
def wordpiece_like() -> Any:
    """WordPiece, whitespace pre-tokenizer, ``[UNK]``: not byte-level, decoding does not round-trip."""
    return _build(model="wordpiece", bos="[BOS]", eos="[EOS]", pad="[PAD]", unk="[UNK]", vocab_size=300)


@functools.lru_cache
def sample_tokenizer() -> Any:
    """The committed ``sample_data/tokenizer`` (built by ``sample_data/make_tokenizer.py``), loaded offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(SAMPLE_TOKENIZER_DIR), local_files_only=True)


#: Builders by name, for ``@pytest.mark.parametrize("make_tok", FAMILIES.values(), ids=FAMILIES.keys())``.
FAMILIES: dict[str, Callable[[], Any]] = {
    "bos_eos_distinct": bos_eos_distinct,
    "no_bos_pad_is_eos": no_bos_pad_is_eos,
    "bos_eos_pad_same": bos_eos_pad_same,
    "template_adds_bos": template_adds_bos,
    "sentencepiece_legacy": sentencepiece_legacy,
    "sentencepiece_metaspace": sentencepiece_metaspace,
    "byte_level_prefix_space": byte_level_prefix_space,
    "wordpiece_like": wordpiece_like,
}
#: The families for which ``decode(encode(text)) == text`` holds for every string.
BYTE_LEVEL_FAMILIES: dict[str, Callable[[], Any]] = {
    k: v for k, v in FAMILIES.items() if k in ("bos_eos_distinct", "no_bos_pad_is_eos", "bos_eos_pad_same", "template_adds_bos")
}
#: The families whose decoding loses nothing a piece boundary could add or remove: for these a document decodes
#: exactly as its pieces' texts joined and tokenized in one call (SentencePiece drops a leading space and
#: reads a literal "▁" as a space; ByteLevel with a prefix space puts one before the text).
ROUND_TRIP_FAMILIES: dict[str, Callable[[], Any]] = {k: v for k, v in FAMILIES.items() if k != "wordpiece_like"}
