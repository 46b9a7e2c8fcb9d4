"""Stage 5 — mask: labels from weights, by position only.

``labels[t] = input_ids[t]`` where ``weights[t] > 0``, else ``IGNORE_INDEX``; and the first token
of every document gets weight 0 / label IGNORE_INDEX, because nothing before it in its document
predicts it (in a packed row the previous document must not learn to predict it either).
Ids are never compared with ``pad_token_id``: when pad == eos, EOS keeps its label.
Labels are not shifted: like every HF causal LM, the loss shifts them.

    input_ids  1  48  27  51  74   2
    weights    0   0   0   1   1   1
    labels  -100 -100 -100 51  74   2
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from weightprep.batches import Documents
from weightprep.constants import IGNORE_INDEX

__all__ = ["mask", "labels_from_weights", "first_tokens", "unlabel_first_tokens"]


def labels_from_weights(input_ids: np.ndarray, weights: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``input_ids`` where the weight is positive, IGNORE_INDEX elsewhere (int32; into ``out``, int32 of the same
    shape, if given)."""
    if out is None:
        return np.where(weights > 0, input_ids, np.int32(IGNORE_INDEX)).astype(np.int32, copy=False)
    unweighted = weights > 0
    np.logical_not(unweighted, out=unweighted)
    np.copyto(out, input_ids, casting="same_kind")
    np.copyto(out, np.int32(IGNORE_INDEX), where=unweighted)
    return out


def first_tokens(docs: Documents) -> np.ndarray:
    """Where each non-empty document's first token is (an empty one has none: its offset is the next's start)."""
    return docs.offsets[:-1][docs.lengths > 0]


def unlabel_first_tokens(docs: Documents) -> None:
    """In place: weight 0 and label IGNORE_INDEX on the first token of every non-empty document."""
    starts = first_tokens(docs)
    docs.weights[starts] = 0.0
    if docs.labels is not None:
        docs.labels[starts] = IGNORE_INDEX


def mask(docs: Documents, *, labels: bool = True, copy: bool = True) -> Documents:
    """Return ``docs`` with first tokens unweighted and labels filled in (see the module docstring).

    ``labels=False`` leaves them None, for a caller that makes them later by the same rule (the packer's rows:
    ``labels_from_weights``); ``copy=False`` unweights the first tokens in ``docs``' own weights, for a caller that
    owns them (else ``docs`` is left as it is)."""
    out = replace(docs, weights=docs.weights.copy() if copy else docs.weights, labels=None)
    unlabel_first_tokens(out)
    return replace(out, labels=labels_from_weights(out.input_ids, out.weights)) if labels else out
