"""Stage 3 — tokenize: every piece text exactly once, in large batches, through the Rust tokenizer.

This is the only module that calls a tokenizer on piece texts. It talks to the fast tokenizer's Rust
backend directly (``encode_batch_fast``, no offsets), which spreads a batch over all cores and skips the
Python-side bookkeeping of ``tokenizer(texts)``; special tokens are never added here (the assemble
stage places BOS/EOS itself), and truncation/padding are switched off on a private copy so a
tokenizer saved with them cannot cut or pad pieces.

A document is its pieces back to back, so only its first non-empty piece is tokenized as the start of a
sequence; every later piece is tokenized as a *continuation*. The difference matters for tokenizers that
put a word-start marker at the beginning of every call: SentencePiece conversions (normalizer
``Prepend("▁")``, or pre-tokenizer ``Metaspace(prepend_scheme="first"|"always")``: Llama-2, Mistral,
TinyLlama, CodeLlama) and ``ByteLevel(add_prefix_space=True)`` (RoBERTa-style). Tokenized alone, each
later piece would get a space in front of it. The continuation tokenizer is a copy of the backend with
that marker switched off in its configuration (``continuation_spec``); the text is never edited.
Byte-level tokenizers without a prefix space (GPT-2, Llama-3, Qwen) have no marker: one tokenizer does both.

Example: texts ``["Q: 2+2?\n", "A: 4"]`` -> ids ``[48, 27, 17, ...]`` with offsets ``[0, 6, 9]``:
piece ``p`` is ``ids[offsets[p]:offsets[p + 1]]``.
"""

from __future__ import annotations

import copy
import json
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np

from weightprep.errors import UsageError

__all__ = ["PieceTokenizer", "continuation_spec", "document_starts"]

#: Components known to add nothing at the start of a call (beyond what ``continuation_spec`` switches off).
_NORMALIZERS = {
    "BertNormalizer", "ByteLevel", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "Nmt", "Precompiled", "Prepend",
    "Replace", "Sequence", "Strip", "StripAccents",
}
_PRE_TOKENIZERS = {
    "BertPreTokenizer", "ByteLevel", "CharDelimiterSplit", "Digits", "FixedLength", "Metaspace", "Punctuation",
    "Sequence", "Split", "UnicodeScripts", "Whitespace", "WhitespaceSplit",
}
#: A text that no continuation may change: no marker before it, nothing stripped from it.
_PROBE = "x"


def _refuse(what: str) -> UsageError:
    return UsageError(
        f"cannot tokenize later pieces of a document as continuations: the tokenizer's {what}. Its pieces "
        "would not join to the document's text. Use a tokenizer.json whose normalizer and pre-tokenizer are "
        "among tokenizers' built-in ones, or join the pieces of each record into one before building."
    )


def _continue_component(node: dict | None, kind: str) -> dict | None:
    """The component with its per-call prefix switched off (``None`` where it is only that prefix)."""
    if node is None:
        return None
    known, children = (_NORMALIZERS, "normalizers") if kind == "normalizer" else (_PRE_TOKENIZERS, "pretokenizers")
    kind_name = kind.replace("_", "-")
    t = node.get("type")
    if t not in known:
        raise _refuse(f"{kind_name} {t!r} is not one whose start-of-call behaviour is known")
    if t == "Sequence":
        parts = [_continue_component(c, kind) for c in node[children]]
        return {**node, children: [p for p in parts if p is not None]}
    if kind == "normalizer" and t == "Prepend":  # the legacy SentencePiece conversion's "▁" before every call
        return None
    if kind == "normalizer" and t == "Strip" and node.get("strip_left"):
        raise _refuse("normalizer Strip removes the leading whitespace of every call")
    if kind == "pre_tokenizer" and t == "Metaspace":
        node = {**node, "prepend_scheme": "never"}
        if "add_prefix_space" in node:  # the form written by tokenizers < 0.14
            node["add_prefix_space"] = False
        return node
    if kind == "pre_tokenizer" and t == "ByteLevel":
        return {**node, "add_prefix_space": False}
    return node


def continuation_spec(spec: dict) -> dict | None:
    """A ``tokenizer.json`` (as a dict) that tokenizes text as the continuation of a sequence, or ``None`` when
    the tokenizer already does (it adds nothing at the start of a call). Raises ``UsageError`` for a tokenizer
    whose start-of-call behaviour cannot be established."""
    cont = {
        **spec,
        "normalizer": _continue_component(spec.get("normalizer"), "normalizer"),
        "pre_tokenizer": _continue_component(spec.get("pre_tokenizer"), "pre_tokenizer"),
    }
    if cont == spec:
        return None
    return cont


def _probe_adds_nothing(backend: Any) -> bool:
    """Whether the backend keeps ``_PROBE`` as it is through its normalizer and pre-tokenizer."""
    text = backend.normalizer.normalize_str(_PROBE) if backend.normalizer is not None else _PROBE
    if backend.pre_tokenizer is not None:
        text = "".join(s for s, _ in backend.pre_tokenizer.pre_tokenize_str(text))
    return text == _PROBE


def document_starts(texts: list[str], piece_offsets: np.ndarray) -> np.ndarray:
    """Indices of the pieces that start a document: each record's first non-empty piece (an empty piece has no
    tokens, so the piece after it is still the start of the sequence)."""
    nonempty = np.flatnonzero(np.fromiter(map(bool, texts), dtype=bool, count=len(texts)))
    candidates = np.append(nonempty, len(texts))[np.searchsorted(nonempty, piece_offsets[:-1])]
    return candidates[candidates < piece_offsets[1:]]


class PieceTokenizer:
    """Callable turning a list of piece texts into flat int32 ids plus int64 offsets."""

    def __init__(self, tokenizer: Any, batch_size: int = 4096) -> None:
        backend = tokenizer.backend_tokenizer
        if backend.truncation is not None or backend.padding is not None:
            backend = copy.deepcopy(backend)  # never change the caller's tokenizer
            backend.no_truncation()
            backend.no_padding()
        self.backend = backend
        self.batch_size = batch_size
        self.continuation = self._continuation(backend)

    @staticmethod
    def _continuation(backend: Any) -> Any | None:
        from tokenizers import Tokenizer

        spec = continuation_spec(json.loads(backend.to_str()))
        cont = backend if spec is None else Tokenizer.from_str(json.dumps(spec))
        if not _probe_adds_nothing(cont):
            raise _refuse(f"normalizer and pre-tokenizer still change {_PROBE!r} with their start marker off")
        return None if spec is None else cont

    def __call__(self, texts: list[str], piece_offsets: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Ids and offsets of ``texts``, the pieces of records ``piece_offsets`` (``None``: one record each)."""
        if self.continuation is None or piece_offsets is None:
            return self.to_arrays(self.encode(texts))
        is_start = np.zeros(len(texts), dtype=bool)
        is_start[document_starts(texts, piece_offsets)] = True
        order = np.concatenate([np.flatnonzero(is_start), np.flatnonzero(~is_start)])
        encodings = self.encode([texts[i] for i in order[: is_start.sum()]]) + self.encode(
            [texts[i] for i in order[is_start.sum() :]], self.continuation
        )
        by_piece = [None] * len(texts)
        for i, encoding in zip(order.tolist(), encodings, strict=True):
            by_piece[i] = encoding
        return self.to_arrays(by_piece)

    def encode(self, texts: list[str], backend: Any = None) -> list[Any]:
        """The Rust side: ``Encoding`` objects, computed on all cores with the GIL released."""
        backend = self.backend if backend is None else backend
        encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
        encodings: list[Any] = []
        for start in range(0, len(texts), self.batch_size):
            encodings.extend(encode(texts[start : start + self.batch_size], add_special_tokens=False))
        return encodings

    @staticmethod
    def to_arrays(encodings: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        """The Python side: flat int32 ids and int64 offsets from the encodings, in one pass over the ids
        (``len(encoding)`` is its number of ids, so no list of id lists is kept)."""
        lengths = np.fromiter(map(len, encodings), dtype=np.int64, count=len(encodings))
        offsets = np.zeros(len(encodings) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.fromiter(
            chain.from_iterable(map(attrgetter("ids"), encodings)), dtype=np.int32, count=int(offsets[-1])
        )
        return flat, offsets
