"""The stages' pure functions on batches they are handed directly, against expectations computed token by token.

The build tests reach these functions only with the batches real inputs make; these cover the edges those never
produce (empty documents anywhere, a last document that is empty), found by ``make mutate``."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from weightprep.batches import Documents
from weightprep.constants import IGNORE_INDEX
from weightprep.stages.mask import mask

_weights = st.sampled_from([0.0, 0.5, 1.0, 2.0])
_document = st.lists(st.tuples(st.integers(0, 999), _weights), min_size=0, max_size=6)


def _documents(docs: list[list[tuple[int, float]]]) -> Documents:
    lengths = [len(d) for d in docs]
    offsets = np.zeros(len(docs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return Documents(
        input_ids=np.array([t for d in docs for t, _ in d], dtype=np.int32),
        weights=np.array([w for d in docs for _, w in d], dtype=np.float32),
        offsets=offsets,
        lines=np.arange(1, len(docs) + 1, dtype=np.int64),
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(_document, min_size=1, max_size=6))
def test_mask_unlabels_each_first_token_and_labels_by_weight(docs):
    batch = _documents(docs)
    before = batch.weights.copy()
    out = mask(batch)
    expected_ids, expected_weights, expected_labels = [], [], []
    for doc in docs:
        for i, (token, weight) in enumerate(doc):
            w = 0.0 if i == 0 else weight  # nothing in its document predicts a first token
            expected_ids.append(token)
            expected_weights.append(w)
            expected_labels.append(token if w > 0 else IGNORE_INDEX)
    assert out.input_ids.tolist() == expected_ids
    assert out.weights.tolist() == expected_weights
    assert out.labels is not None and out.labels.dtype == np.int32
    assert out.labels.tolist() == expected_labels
    assert np.array_equal(batch.weights, before), "mask changed the batch it was given"
