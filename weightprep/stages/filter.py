"""Stage 6 — filter: overlong documents (drop, truncate or chunk) and documents that teach nothing.

A document longer than ``max_length`` tokens is, by ``overlong``:

- ``drop`` (default): removed, counted as ``dropped_overlong``;
- ``truncate``: cut to its first ``max_length`` tokens (its EOS is lost), counted as ``truncated``;
- ``chunk``: cut into consecutive chunks of ``max_length`` tokens, each a document of its own whose
  first token is unlabeled (nothing in the chunk predicts it), counted as ``chunked`` / ``chunks``.

Then any document with no positive weight left (a prompt-only record, or a chunk that held only
prompt) is removed and counted as ``dropped_unsupervised``. Vectorized over the batch.

Besides documents, every step counts the tokens and weight it removes (``tokens_<reason>``,
``weight_<reason>``; chunking removes weight only, by unlabeling each chunk's first token), so the
build can check that what it writes is exactly what it accepted minus what was dropped or cut.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

import numpy as np

from weightprep.batches import Documents
from weightprep.stages.mask import first_tokens, unlabel_first_tokens

__all__ = ["filter_documents"]


def filter_documents(
    docs: Documents, max_length: int, overlong: Literal["drop", "truncate", "chunk"]
) -> tuple[Documents, Counter[str]]:
    """Apply the overlong policy, then drop unsupervised documents; return the batch and the counts."""
    counts: Counter[str] = Counter()

    def removed(reason: str, before: Documents, after: Documents) -> None:
        counts[f"tokens_{reason}"] += len(before.input_ids) - len(after.input_ids)
        counts[f"weight_{reason}"] += float(before.weights.sum(dtype=np.float64) - after.weights.sum(dtype=np.float64))

    lengths = docs.lengths
    long = lengths > max_length
    n_long = int(long.sum())
    if n_long:
        starts = docs.offsets[:-1]
        if overlong == "drop":
            counts["dropped_overlong"] += n_long
            kept = docs.where(~long)
            removed("dropped_overlong", docs, kept)
            docs = kept
        elif overlong == "truncate":
            counts["truncated"] += n_long
            kept = docs.segments(starts, np.minimum(lengths, max_length), docs.lines)
            removed("truncated", docs, kept)
            docs = kept
        else:  # chunk
            parts = np.where(long, -(-lengths // max_length), 1)
            doc_of_part = np.repeat(np.arange(len(docs)), parts)
            first_part = np.cumsum(parts) - parts
            k = np.arange(len(doc_of_part)) - first_part[doc_of_part]  # chunk number within its document
            part_starts = starts[doc_of_part] + k * max_length
            part_lengths = np.minimum(max_length, lengths[doc_of_part] - k * max_length)
            counts["chunked"] += n_long
            counts["chunks"] += int(parts[long].sum())
            kept = docs.segments(part_starts, part_lengths, docs.lines[doc_of_part])
            unlabel_first_tokens(kept)
            removed("chunked", docs, kept)
            docs = kept
    # a document's largest weight (weights are >= 0: positive exactly where one is), over the non-empty ones only:
    # reduceat at an empty document's offset would read its neighbour's first token, or past the end. A pieces
    # document holds EOS at least, but a conversation's is what its template renders, which may be nothing.
    largest = np.zeros(len(docs), np.float32)
    nonempty = docs.lengths > 0
    if nonempty.any():
        largest[nonempty] = np.maximum.reduceat(docs.weights, first_tokens(docs))
    unsupervised = ~(largest > 0)
    n_unsup = int(unsupervised.sum())
    if n_unsup:
        counts["dropped_unsupervised"] += n_unsup
        kept = docs.where(~unsupervised)
        removed("dropped_unsupervised", docs, kept)
        docs = kept
    return docs, counts
