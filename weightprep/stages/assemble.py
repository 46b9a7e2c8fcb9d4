"""Stage 4 — assemble: BOS + the pieces' tokens + EOS, each token carrying its piece's weight.

The joined text is never re-tokenized: a document's ids are the concatenation of its pieces'
ids, so each weight stays on exactly the tokens of its own piece. Example with BOS=1, EOS=2::

    pieces   "Q: hi\n" (w=0)   "Hello!" (w=1)        eos_weight=1
    ids      1 | 48 27 93      | 51 74 5 | 2
    weights  0 | 0  0  0       | 1  1  1 | 1

BOS gets weight 0: it is the first token of its document and nothing predicts it (the mask stage
enforces that for whatever token comes first). Fully vectorized: no per-record Python loop.
"""

from __future__ import annotations

import numpy as np

from weightprep.batches import Documents, Records
from weightprep.tokenizer import SpecialTokens

__all__ = ["assemble"]


def assemble(
    records: Records,
    piece_ids: np.ndarray,
    piece_offsets: np.ndarray,
    specials: SpecialTokens,
    eos_weight: float,
) -> Documents:
    """Build one document per record from its pieces' token ids (see the module docstring)."""
    n_records = len(records)
    n_special = 1 + (specials.bos is not None)
    piece_lengths = np.diff(piece_offsets)
    # tokens per record = sum of its pieces' lengths
    content_ends = piece_offsets[records.piece_offsets]  # token offset at each record boundary
    content_lengths = np.diff(content_ends)
    doc_lengths = content_lengths + n_special
    offsets = np.zeros(n_records + 1, dtype=np.int64)
    np.cumsum(doc_lengths, out=offsets[1:])

    total = int(offsets[-1])
    input_ids = np.empty(total, dtype=np.int32)
    weights = np.empty(total, dtype=np.float32)

    # each content token of record r moves right by r * n_special (+1 for BOS) positions
    record_of_token = np.repeat(np.arange(n_records, dtype=np.int64), content_lengths)
    shift = record_of_token * n_special + (specials.bos is not None)
    dest = np.arange(len(piece_ids), dtype=np.int64) + shift
    input_ids[dest] = piece_ids
    weights[dest] = np.repeat(records.piece_weights.astype(np.float32), piece_lengths)

    if specials.bos is not None:
        input_ids[offsets[:-1]] = specials.bos
        weights[offsets[:-1]] = 0.0
    input_ids[offsets[1:] - 1] = specials.eos
    weights[offsets[1:] - 1] = eos_weight
    return Documents(input_ids=input_ids, weights=weights, offsets=offsets, lines=records.lines.copy())
