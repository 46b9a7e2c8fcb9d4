"""Stage 3 — tokenize: every piece text exactly once, in large batches, through the Rust tokenizer.

This is the only module that calls a tokenizer. It talks to the fast tokenizer's Rust backend
directly (``encode_batch_fast``, no offsets), which spreads a batch over all cores and skips the
Python-side bookkeeping of ``tokenizer(texts)``; special tokens are never added here (the assemble
stage places BOS/EOS itself), and truncation/padding are switched off on a private copy so a
tokenizer saved with them cannot cut or pad pieces.

Example: texts ``["Q: 2+2?\n", "A: 4"]`` -> ids ``[48, 27, 17, ...]`` with offsets ``[0, 6, 9]``:
piece ``p`` is ``ids[offsets[p]:offsets[p + 1]]``.
"""

from __future__ import annotations

import copy
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np

__all__ = ["PieceTokenizer"]


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
        self._encode = getattr(backend, "encode_batch_fast", backend.encode_batch)

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return self.to_arrays(self.encode(texts))

    def encode(self, texts: list[str]) -> list[Any]:
        """The Rust side: ``Encoding`` objects, computed on all cores with the GIL released."""
        encodings: list[Any] = []
        for start in range(0, len(texts), self.batch_size):
            encodings.extend(self._encode(texts[start : start + self.batch_size], add_special_tokens=False))
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
