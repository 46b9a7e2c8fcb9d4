"""Character spans of tokens from their ids alone: what the chat stage puts weights on tokens with.

tokenizers' offsets cost more than the tokenization itself (a Python tuple per token, about 0.9 µs each), and
fastokens returns none. But where a tokenizer's tokens spell out the text byte for byte, a token's span is simply
where its bytes fall: read each id's bytes from the vocabulary once, sum the byte lengths of a document's tokens,
and map the byte positions to characters. That holds for

- byte-level BPE (decoder ``ByteLevel``: GPT-2, Llama-3, Qwen, DeepSeek): a token's characters stand for bytes
  through GPT-2's byte-to-unicode table;
- SentencePiece conversions whose decoder only turns ``▁`` back into a space and ``<0xNN>`` into its byte
  (Gemma): ``▁the`` is `` the``.

Added tokens (``<|im_start|>``) spell their content. An added token that strips the whitespace around it, or is
matched on normalized text under a normalizer, has no fixed bytes; a document holding one takes tokenizers'
offsets instead.

The spans of a document are used only where its tokens' bytes, put back together, are exactly the document's
UTF-8 bytes; this is checked for every document, in one vectorized comparison per run of documents. Where they
are not (a normalizer changed the text, a tokenizer that prepends a word-start marker, a token without fixed
bytes), ``spans`` returns None for that document and the caller asks tokenizers for offsets. So the spans are never a
guess: the bytes match, and the tokens come in order, so each token covers exactly its own bytes.

A token that holds part of a multi-byte character spans that whole character (as tokenizers' offsets do):
``"東"`` is three bytes; byte-level tokens ``[æĿ, ±]`` (2 + 1 bytes) both span characters ``[0, 1)``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = ["TokenSpans"]

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
#: tokens per run of documents in ``TokenSpans.spans``: its arrays stay small enough to be reused, not faulted in
_CHUNK_TOKENS = 1 << 15
#: the bytes of a token that the spelling check compares as one little-endian word (``TokenSpans._misspelled``)
_WORD = 8
#: a word's low ``n`` bytes, for ``n`` from 0 to ``_WORD``
_MASKS = np.array([(1 << (8 * n)) - 1 for n in range(_WORD + 1)], dtype=np.uint64)


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, inverted: the character that stands for each byte -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in chars.items()}


def _decoder_kind(decoder: dict[str, Any] | None) -> str | None:
    """``"byte_level"``, ``"sentencepiece"`` (``▁`` -> space and byte fallback only), or None (unknown)."""
    if decoder is None:
        return None
    if decoder.get("type") == "ByteLevel":
        return "byte_level"
    parts = decoder.get("decoders", []) if decoder.get("type") == "Sequence" else [decoder]
    for part in parts:
        t = part.get("type")
        if t == "Replace" and part.get("pattern") == {"String": "▁"} and part.get("content") == " ":
            continue
        if t not in ("ByteFallback", "Fuse"):
            return None  # Strip (a prefix marker to drop), Metaspace, WordPiece, ...: not bytes for bytes
    return "sentencepiece"


class TokenSpans:
    """The bytes of every id of one tokenizer (``tokenizers.Tokenizer``), and spans of documents from their ids.

    Example (byte-level BPE): ``"Hi 東"`` encoded as ``[Hi, Ġ, æĿ, ±]`` -> starts ``[0, 2, 3, 3]``, ends
    ``[2, 3, 4, 4]``."""

    def __init__(self, backend: Any) -> None:
        # only the components that decide the bytes: no parse of the whole tokenizer.json (the vocabulary)
        decoder = None if backend.decoder is None else json.loads(backend.decoder.__getstate__())
        kind = _decoder_kind(decoder)
        vocab: dict[str, int] = backend.get_vocab(with_added_tokens=True)
        size = max(vocab.values(), default=-1) + 1
        surfaces: list[bytes | None] = [None] * size
        if kind is not None:
            alphabet = _byte_level_alphabet()
            fallback = bool(getattr(backend.model, "byte_fallback", False))
            for token, i in vocab.items():
                surfaces[i] = _model_bytes(token, kind, alphabet, fallback)
            normalized = backend.normalizer is not None
            for i, added in backend.get_added_tokens_decoder().items():
                fixed = not (added.lstrip or added.rstrip or added.single_word or (added.normalized and normalized))
                surfaces[i] = added.content.encode("utf-8") if fixed else None
        #: whether any id has bytes (False: every document needs tokenizers' offsets)
        self.supported = kind is not None
        self._lengths = np.array([-1 if s is None else len(s) for s in surfaces], dtype=np.int64)
        self._starts = np.zeros(size + 1, dtype=np.int64)
        np.cumsum(np.maximum(self._lengths, 0), out=self._starts[1:])
        self._bytes = np.frombuffer(b"".join(s for s in surfaces if s is not None), dtype=np.uint8)
        # per id: its first _WORD bytes as a word, and the mask of its bytes' part of a word (``_misspelled``)
        known = np.maximum(self._lengths, 0)
        self._words = np.stack([_first_words(self._bytes, self._starts[:-1], known), _MASKS[np.minimum(known, _WORD)]], axis=1)

    def spans(self, texts: list[str], ids: np.ndarray, offsets: np.ndarray) -> list[tuple[np.ndarray, np.ndarray] | None]:
        """Per document ``d`` (tokens ``ids[offsets[d]:offsets[d + 1]]`` of ``texts[d]``): the character (start,
        end) of each token, or None where its tokens' bytes are not exactly the text's.

        Worked out over runs of documents of about ``_CHUNK_TOKENS`` tokens: the arrays of a whole block (millions
        of tokens, several int64 per token) are fresh pages at every call, and faulting them in
        cost more than the arithmetic (10 s of system time for 20,000 conversations)."""
        offsets = np.asarray(offsets, dtype=np.int64)
        found: list[tuple[np.ndarray, np.ndarray] | None] = []
        for d, e, starts, ends, ok in self.runs(texts, ids, offsets):
            cuts = (offsets[d : e + 1] - offsets[d]).tolist()
            base = 0  # the document's first character among the run's
            for k, good in enumerate(ok.tolist()):
                x, y = cuts[k], cuts[k + 1]
                found.append((starts[x:y] - base, ends[x:y] - base) if good else None)
                base += len(texts[d + k])
        return found

    def runs(
        self, texts: list[str], ids: np.ndarray, offsets: np.ndarray
    ) -> Iterator[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]]:
        """``spans`` run by run (``_CHUNK_TOKENS`` tokens): ``(d, e, starts, ends, ok)``, documents ``d`` to ``e``
        (exclusive), the (start, end) of each of their tokens (``ids[offsets[d]:offsets[e]]``) among the characters
        of those documents' texts put end to end, and per document whether its tokens spell its text (where not,
        its spans are not to be read, and need not go forwards)."""
        ids = np.asarray(ids)  # widened run by run (``_run``): a block's ids as int64 would be fresh pages again
        offsets = np.asarray(offsets, dtype=np.int64)
        d = 0
        while d < len(texts):
            e = max(d + 1, int(np.searchsorted(offsets, offsets[d] + _CHUNK_TOKENS, side="right")) - 1)
            e = min(e, len(texts))
            a = int(offsets[d])
            yield d, e, *self._run(texts[d:e], ids[a : offsets[e]], offsets[d : e + 1] - a)
            d = e

    def _run(self, texts: list[str], ids: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``runs``' spans and ``ok`` of documents whose tokens are all of ``ids`` (``offsets`` from 0).

        Every token's bytes are placed at the running sum of the bytes before it (``before``); where every
        document's tokens have as many bytes as its text (the usual case), that is where they are in the texts put
        end to end, and a text of ASCII characters only has a character per byte: its tokens' spans need no other
        arithmetic."""
        encoded = [t.encode("utf-8") for t in texts]
        counts = np.diff(offsets)
        ids = ids.astype(np.intp, copy=False)  # once: numpy widens other ids at every lookup
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= len(self._lengths)):
            known = (ids >= 0) & (ids < len(self._lengths))
            lengths = np.full(len(ids), -1, dtype=np.int64)  # -1: an id with no bytes (unknown, or none in the vocabulary)
            lengths[known] = self._lengths[ids[known]]
        else:
            lengths = self._lengths[ids]
        holes = len(lengths) > 0 and int(lengths.min()) < 0
        size = np.maximum(lengths, 0) if holes else lengths
        before = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(size, out=before[1:])
        per_doc = before[offsets[1:]] - before[offsets[:-1]]
        sizes = np.fromiter(map(len, encoded), dtype=np.int64, count=len(texts))
        aligned = per_doc == sizes
        ok = aligned.copy()
        if holes:
            hole_count = np.zeros(len(ids) + 1, dtype=np.int64)
            np.cumsum(lengths < 0, out=hole_count[1:])
            ok &= hole_count[offsets[1:]] == hole_count[offsets[:-1]]
        raw = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        if ok.any():  # the tokens' bytes of the documents whose byte counts match, against their text bytes
            if ok.all():
                tokens, lens, first, text_bytes, bounds = ids, size, before[:-1], raw, offsets[1:]
            else:
                take = np.repeat(ok, counts)
                tokens, lens = ids[take], size[take]
                first = np.cumsum(lens) - lens
                text_bytes = np.frombuffer(b"".join(e for e, good in zip(encoded, ok, strict=True) if good), dtype=np.uint8)
                bounds = np.cumsum(counts[ok])  # where each of those documents' tokens end
            wrong = self._misspelled(tokens, lens, first, text_bytes)
            if len(wrong):
                ok[np.flatnonzero(ok)[np.unique(np.searchsorted(bounds, wrong, side="right"))]] = False
        # every token's bytes, then characters, placed in the documents' text bytes put end to end
        byte_start = before[:-1]
        if not aligned.all():  # a document of other byte counts: the ones after it start where their text does
            text_base = np.zeros(len(texts), dtype=np.int64)
            np.cumsum(sizes[:-1], out=text_base[1:])
            byte_start = np.minimum(np.maximum(byte_start + np.repeat(text_base - before[offsets[:-1]], counts), 0), len(raw))
        if all(map(str.isascii, texts)) and aligned.all():  # a character per byte: the bytes' places themselves
            return before[:-1], before[1:], ok
        last = np.minimum(np.maximum(byte_start + size - 1, 0), len(raw))
        # the character of a byte (len(raw): one past the last character): its position less the UTF-8
        # continuation bytes up to it; these are few (or none: ASCII text), so counted by a search rather than
        # over every byte
        continuation = np.flatnonzero((raw & 0xC0) == 0x80)
        if len(continuation):
            byte_start = byte_start - np.searchsorted(continuation, byte_start, side="right")
            last = last - np.searchsorted(continuation, last, side="right")
        return byte_start, np.where(size > 0, last + 1, byte_start), ok

    def _misspelled(self, ids: np.ndarray, lens: np.ndarray, first: np.ndarray, text_bytes: np.ndarray) -> np.ndarray:
        """The tokens (indices into ``ids``) whose bytes are not ``text_bytes[first[t]:first[t] + lens[t]]``
        (``lens``: their bytes' lengths). A token's first ``_WORD`` bytes are compared as one word with the text's
        word at its place, the bytes of a longer token past those one by one: a check per token, not per byte."""
        n = len(text_bytes)
        padded = np.zeros(n + _WORD, dtype=np.uint8)
        padded[:n] = text_bytes
        windows = np.ndarray((n + 1,), dtype="<u8", buffer=padded, strides=(1,))  # the word at every byte
        words = self._words.take(ids, axis=0)  # (``take``: faster than indexing, on these unaligned words too)
        bad = (windows.take(first) & words[:, 1]) != words[:, 0]
        long = np.flatnonzero(lens > _WORD)
        if len(long):
            rest = lens[long] - _WORD
            owner = np.repeat(np.arange(len(long)), rest)
            at = np.arange(int(rest.sum())) - np.repeat(np.cumsum(rest) - rest, rest) + _WORD  # byte within its token
            differs = self._bytes[self._starts[ids[long]][owner] + at] != padded[first[long][owner] + at]
            bad[long[owner[differs]]] = True
        return np.flatnonzero(bad)


def _first_words(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The first ``_WORD`` bytes of each byte string ``data[starts[i]:starts[i] + lengths[i]]`` as one
    little-endian uint64, the bytes past its end zero."""
    k = np.arange(_WORD)
    padded = np.concatenate([data, np.zeros(_WORD, dtype=np.uint8)])
    grid = np.where(k < lengths[:, None], padded[starts[:, None] + k], 0).astype(np.uint8)
    return grid.view("<u8").reshape(-1)


def _model_bytes(token: str, kind: str, alphabet: dict[str, int], fallback: bool) -> bytes | None:
    """The bytes that a vocabulary token stands for in the text."""
    if kind == "byte_level":
        try:
            return bytes(alphabet[c] for c in token)
        except KeyError:
            return None
    if fallback and (m := _BYTE_FALLBACK.fullmatch(token)):
        return bytes([int(m.group(1), 16)])
    return token.replace("▁", " ").encode("utf-8")
