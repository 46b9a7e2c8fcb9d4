"""Stage 4 — assemble: BOS + the pieces' tokens + EOS, each token carrying its piece's weight.

The joined text is never re-tokenized: a document's ids are the concatenation of its pieces'
ids, so each weight stays on exactly the tokens of its own piece. Example with BOS=1, EOS=2::

    pieces   "Q: hi\n" (w=0)   "Hello!" (w=1)        eos_weight=1
    ids      1 | 48 27 93      | 51 74 5 | 2
    weights  0 | 0  0  0       | 1  1  1 | 1

BOS gets weight 0: it is the first token of its document and nothing predicts it (the mask stage
enforces that for whatever token comes first). Fully vectorized, no per-record Python loop and no per-token index
array: the ids go in with one masked copy, the weights with one ``repeat`` over the [BOS] piece ... EOS segments.
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
    bos = specials.bos is not None
    n_special = 1 + bos
    # tokens per record = sum of its pieces' lengths
    content_ends = piece_offsets[records.piece_offsets]  # token offset at each record boundary
    offsets = np.zeros(n_records + 1, dtype=np.int64)
    np.cumsum(np.diff(content_ends) + n_special, out=offsets[1:])
    total = int(offsets[-1])
    starts, ends = offsets[:-1], offsets[1:] - 1  # each document's first token (BOS or content) and its EOS

    # ids: the pieces' ids in order into every position that is not BOS/EOS (one masked copy, no index arrays)
    input_ids = np.empty(total, dtype=np.int32)
    content = np.ones(total, dtype=bool)
    if bos:
        content[starts] = False
        input_ids[starts] = specials.bos
    content[ends] = False
    input_ids[content] = piece_ids
    input_ids[ends] = specials.eos

    # weights: the document as segments [BOS] piece ... piece EOS, each segment's weight repeated over its length
    n_pieces = len(piece_offsets) - 1
    slot = np.arange(n_pieces, dtype=np.int64)
    slot += np.repeat(np.arange(n_records, dtype=np.int64) * n_special + bos, np.diff(records.piece_offsets))
    seg_lengths = np.ones(n_pieces + n_special * n_records, dtype=np.int64)
    seg_weights = np.zeros(len(seg_lengths), dtype=np.float32)  # BOS: weight 0
    seg_lengths[slot] = np.diff(piece_offsets)
    seg_weights[slot] = records.piece_weights
    seg_weights[records.piece_offsets[1:] + np.arange(1, n_records + 1) * n_special - 1] = eos_weight
    weights = np.repeat(seg_weights, seg_lengths)
    return Documents(input_ids=input_ids, weights=weights, offsets=offsets, lines=records.lines.copy())
