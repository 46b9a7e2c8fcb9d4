"""The stages' pure functions on batches they are handed directly, against expectations computed token by token.

The build tests reach these functions only with the batches real inputs make; these cover the edges those never
produce (empty documents anywhere, a last document that is empty, an empty batch, a document of exactly the row
length, ties between equally full rows, a window reached exactly), found by ``make mutate``. Each expectation is
computed here, document by document, from the stage's documented contract, not by the stage's own code."""

from __future__ import annotations

from collections import Counter
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weightprep.batches import Documents
from weightprep.constants import IGNORE_INDEX
from weightprep.stages import pack
from weightprep.stages.filter import filter_documents
from weightprep.stages.mask import mask
from weightprep.stages.pack import Packer, RowBuffers, best_fit_decreasing, chunk_rows, rows_from_bins

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


def test_mask_without_labels_in_place_unweights_the_given_batch():
    """``labels=False, copy=False`` (a build's documents on their way to the packer): the batch's own weights get
    the first tokens unweighted, no labels are made."""
    batch = _documents([[(5, 1.0), (6, 2.0)], [(7, 0.5)], [], [(8, 0.0), (9, 1.0)]])
    out = mask(batch, labels=False, copy=False)
    assert out.labels is None
    assert out.weights is batch.weights
    assert batch.weights.tolist() == [0.0, 2.0, 0.0, 0.0, 1.0]
    assert out.input_ids.tolist() == [5, 6, 7, 8, 9]


# --- filter ---------------------------------------------------------------------------------------------------------

# Masked documents as the filter gets them: at least one token (the EOS), the first one unweighted and unlabeled.
_masked_document = st.lists(st.tuples(st.integers(0, 999), _weights), min_size=1, max_size=9).map(
    lambda d: [(d[0][0], 0.0), *d[1:]]
)


def _masked(docs: list[list[tuple[int, float]]]) -> Documents:
    batch = _documents(docs)
    labels = np.where(batch.weights > 0, batch.input_ids, IGNORE_INDEX).astype(np.int32)
    return Documents(batch.input_ids, batch.weights, batch.offsets, batch.lines, labels=labels)


def _expected_filter(docs, max_length, overlong):
    """(documents as (line, [(id, weight)]), counts) by the module docstring, one document at a time."""
    out, counts = [], Counter()
    for line, doc in enumerate(docs, start=1):
        if len(doc) <= max_length:
            out.append((line, doc))
            continue
        if overlong == "drop":
            counts["dropped_overlong"] += 1
            counts["tokens_dropped_overlong"] += len(doc)
            counts["weight_dropped_overlong"] += sum(w for _, w in doc)
        elif overlong == "truncate":
            counts["truncated"] += 1
            counts["tokens_truncated"] += len(doc) - max_length
            counts["weight_truncated"] += sum(w for _, w in doc[max_length:])
            out.append((line, doc[:max_length]))
        else:
            counts["chunked"] += 1
            for start in range(0, len(doc), max_length):
                chunk = doc[start : start + max_length]
                counts["chunks"] += 1
                counts["weight_chunked"] += chunk[0][1]  # nothing in the chunk predicts its first token
                out.append((line, [(chunk[0][0], 0.0), *chunk[1:]]))
    kept = []
    for line, doc in out:
        if any(w > 0 for _, w in doc):
            kept.append((line, doc))
        else:
            counts["dropped_unsupervised"] += 1
            counts["tokens_dropped_unsupervised"] += len(doc)
    return kept, counts


def _as_lists(batch: Documents):
    ids, weights, labels = batch.input_ids.tolist(), batch.weights.tolist(), batch.labels.tolist()
    out = []
    for d, line in enumerate(batch.lines.tolist()):
        s, e = int(batch.offsets[d]), int(batch.offsets[d + 1])
        assert labels[s:e] == [t if w > 0 else IGNORE_INDEX for t, w in zip(ids[s:e], weights[s:e], strict=True)]
        out.append((line, list(zip(ids[s:e], weights[s:e], strict=True))))
    return out


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_masked_document, min_size=0, max_size=6),
    st.integers(1, 5),
    st.sampled_from(["drop", "truncate", "chunk"]),
)
def test_filter_documents_against_the_documented_policy(docs, max_length, overlong):
    out, counts = filter_documents(_masked(docs), max_length, overlong)
    expected, expected_counts = _expected_filter(docs, max_length, overlong)
    assert _as_lists(out) == expected
    # Counter equality ignores zero counts (a split removes no tokens; an unsupervised document no weight)
    assert counts == expected_counts, (counts, expected_counts)


@pytest.mark.parametrize("overlong", ["drop", "truncate", "chunk"])
def test_filter_documents_on_an_empty_batch_counts_nothing(overlong):
    out, counts = filter_documents(_masked([]), 3, overlong)
    assert len(out) == 0 and out.input_ids.size == 0
    assert counts == Counter()


@pytest.mark.parametrize(
    ("overlong", "lines", "ids", "counts"),
    [
        ("drop", [1, 5], [1, 2, 3, 4, 17, 18],
         {"dropped_overlong": 2, "tokens_dropped_overlong": 10, "weight_dropped_overlong": 6.0,
          "dropped_unsupervised": 1, "tokens_dropped_unsupervised": 2}),
        ("truncate", [1, 2, 4, 5], [1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 14, 15, 17, 18],
         {"truncated": 2, "tokens_truncated": 2, "weight_truncated": 1.0,
          "dropped_unsupervised": 1, "tokens_dropped_unsupervised": 2}),
        ("chunk", [1, 2, 4, 5], [1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 14, 15, 17, 18],
         {"chunked": 2, "chunks": 4, "weight_chunked": 1.0,
          "dropped_unsupervised": 3, "tokens_dropped_unsupervised": 4}),
    ],
)  # fmt: skip
def test_filter_documents_at_the_length_boundary(overlong, lines, ids, counts):
    """max_length 4: documents of exactly 4 tokens are kept whole, ones of 5 are overlong; a split chunk of only
    its (then unweighted) first token teaches nothing and is dropped as unsupervised."""
    docs = [
        [(1, 0.0), (2, 1.0), (3, 1.0), (4, 1.0)],  # line 1: 4 tokens, fits
        [(5, 0.0), (6, 1.0), (7, 1.0), (8, 1.0), (9, 1.0)],  # line 2: 5 tokens, weight 4
        [(10, 0.0), (11, 0.0)],  # line 3: unsupervised
        [(12, 0.0), (13, 2.0), (14, 0.0), (15, 0.0), (16, 0.0)],  # line 4: 5 tokens, weight 2, none on the 5th
        [(17, 0.0), (18, 1.0)],  # line 5: fits
    ]
    out, got = filter_documents(_masked(docs), 4, overlong)
    assert out.lines.tolist() == lines
    assert out.input_ids.tolist() == ids
    assert got == Counter(counts)


# --- pack -----------------------------------------------------------------------------------------------------------


def _best_fit_reference(lengths: list[int], capacity: int) -> list[list[int]]:
    """Best fit decreasing as pack.py documents it, by scanning every row: documents longest first (equal lengths
    in input order); each goes into the row with the least room left that still has room (> 0) and room for it,
    among equally full rows the one that reached that room last; else into a new row."""
    order = sorted(range(len(lengths)), key=lambda d: -lengths[d])  # sorted() is stable
    bins: list[list[int]] = []
    room: list[int] = []
    since: list[int] = []  # the step at which each row's room last changed
    for step, d in enumerate(order):
        fits = [b for b in range(len(bins)) if room[b] > 0 and lengths[d] <= room[b]]
        if fits:
            b = min(fits, key=lambda b: (room[b], -since[b]))
            bins[b].append(d)
            room[b] -= lengths[d]
            since[b] = step
        else:
            bins.append([d])
            room.append(capacity - lengths[d])
            since.append(step)
    return bins


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 20).flatmap(lambda c: st.tuples(st.just(c), st.lists(st.integers(0, c), max_size=24))))
def test_best_fit_decreasing_against_a_row_by_row_scan(case):
    capacity, lengths = case
    assert best_fit_decreasing(np.array(lengths, dtype=np.int64), capacity) == _best_fit_reference(lengths, capacity)


@pytest.mark.parametrize(
    ("lengths", "capacity", "bins"),
    [
        ([3, 5, 2, 6], 8, [[3, 2], [1, 0]]),  # the docstring's example
        ([8, 8], 8, [[0], [1]]),  # exactly the capacity: a row each, full
        ([7, 1], 8, [[0, 1]]),  # 1 token into the row with 1 left
        ([5, 3, 3], 8, [[0, 1], [2]]),
        ([4, 4, 3, 3, 2], 7, [[0, 3], [1, 2], [4]]),  # rooms 3, 3: a 3 goes into the row that reached 3 last
        ([6, 6, 1], 7, [[0], [1, 2]]),  # two rows with 1 left: the one opened last wins the tie
        ([4, 0], 4, [[0], [1]]),  # an empty document joins no full row
        ([3, 0], 4, [[0, 1]]),  # but the fullest row with room left
        ([], 8, []),
    ],
)
def test_best_fit_decreasing_examples(lengths, capacity, bins):
    assert best_fit_decreasing(np.array(lengths, dtype=np.int64), capacity) == bins
    assert _best_fit_reference(lengths, capacity) == bins


@pytest.mark.parametrize("capacity", [1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64])
def test_best_fit_decreasing_at_power_of_two_capacities(capacity):
    """Every room 1..capacity is used, at capacities around powers of two."""
    lengths = [n for n in range(capacity, 0, -1) for _ in range(2)] + [1] * capacity
    got = best_fit_decreasing(np.array(lengths, dtype=np.int64), capacity)
    assert got == _best_fit_reference(lengths, capacity)
    with pytest.raises(ValueError, match=f"document of {capacity + 1} tokens does not fit a row of {capacity}"):
        best_fit_decreasing(np.array([1, capacity + 1]), capacity)


def test_best_fit_decreasing_keeps_equal_lengths_in_input_order():
    """Enough ties that an unstable sort would reorder them: the rows name documents in input order."""
    lengths = [(7 * i) % 3 + 1 for i in range(64)]
    got = best_fit_decreasing(np.array(lengths, dtype=np.int64), 5)
    assert got == _best_fit_reference(lengths, 5)
    full = best_fit_decreasing(np.full(40, 5), 5)  # a row each, in input order
    assert full == [[d] for d in range(40)]


def _numbered(first: int, lengths: list[int]) -> Documents:
    """Masked documents ``first``, ``first + 1``, ... whose every token is the document's number."""
    docs = [[(first + i, 1.0)] * n for i, n in enumerate(lengths)]
    batch = _documents(docs)
    return Documents(batch.input_ids, batch.weights, batch.offsets, batch.lines, labels=batch.input_ids.copy())


def _tokens_in(rows) -> Counter:
    """Document number -> how many of its tokens ``rows`` hold (pads are -1)."""
    return Counter(rows.input_ids[rows.input_ids >= 0].tolist())


def _documents_in(rows) -> list[int]:
    return sorted(_tokens_in(rows))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.lists(st.lists(st.integers(1, 8), min_size=1, max_size=7), min_size=1, max_size=8))
def test_packer_packs_each_window_of_exactly_window_documents(window, batches):
    """Windows of exactly ``window`` documents in input order, packed as soon as that many are pending."""
    packer = Packer(8, -1, window=window)
    lengths = [n for batch in batches for n in batch]
    tokens: Counter = Counter()
    total = packed = 0
    for batch in batches:
        emitted = list(packer.add(_numbered(total, batch)))
        total += len(batch)
        assert len(emitted) == total // window - packed // window  # the windows completed by this batch
        for rows in emitted:
            assert _documents_in(rows) == list(range(packed, packed + window))
            assert int(rows.documents.sum()) == window
            tokens += _tokens_in(rows)
            packed += window
    rest = list(packer.flush())
    assert len(rest) == (1 if total > packed else 0)
    if rest:
        assert _documents_in(rest[0]) == list(range(packed, total))
        tokens += _tokens_in(rest[0])
    assert tokens == Counter(dict(enumerate(lengths)))  # every document once, whole
    assert list(packer.flush()) == []


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 7),
    st.lists(
        st.tuples(st.lists(st.integers(0, 8), min_size=0, max_size=6), st.booleans(), st.booleans()), min_size=1, max_size=7
    ),
    st.integers(0, 3),
)
def test_packer_windows_are_their_batches_joined(window, batches, reuse):
    """Whatever the batches (with turn codes or without, float64 weights or float32, empty documents, windows across
    batches or inside one): each window's rows are those of its documents joined by ``Documents.concat`` (turns
    zeros for a batch without them unless no batch of the window has them, each column of the dtype of their join)
    and packed by ``best_fit_decreasing`` and ``rows_from_bins``."""
    rng = np.random.default_rng(len(batches))
    made, total = [], 0
    for lengths, with_turns, wide in batches:
        docs = _numbered(total, lengths)
        turns = rng.integers(1, 5, len(docs.input_ids)).astype(np.int32) if with_turns else None
        weights = docs.weights.astype(np.float64) * 0.1 if wide else docs.weights  # 0.1: no float32 holds it
        made.append(Documents(docs.input_ids, weights, docs.offsets, docs.lines, labels=docs.labels, turns=turns))
        total += len(lengths)

    def columns(rows):
        return [rows.input_ids.tolist(), rows.labels.tolist(), rows.weights.tolist(), str(rows.weights.dtype),
                rows.position_ids.tolist(),
                None if rows.turns is None else rows.turns.tolist(), [s.tolist() for s in rows.seq_lengths]]  # fmt: skip

    packer = Packer(8, -1, window=window, reuse=reuse)
    got = [columns(r) for d in made for r in packer.add(d)] + [columns(r) for r in packer.flush()]
    joined = Documents.concat(made) if len(made) > 1 else made[0]
    expected = []
    for a in range(0, total, window):
        b = min(a + window, total)
        parts = []  # the window's documents, batch by batch, as views (turns None where its batch has none)
        first = 0
        for d in made:
            lo, hi = max(a, first), min(b, first + len(d))
            if lo < hi:
                t0, t1 = int(d.offsets[lo - first]), int(d.offsets[hi - first])
                parts.append(Documents(d.input_ids[t0:t1], d.weights[t0:t1], d.offsets[lo - first : hi - first + 1] - t0,
                                       d.lines[lo - first : hi - first], labels=None,
                                       turns=None if d.turns is None else d.turns[t0:t1]))  # fmt: skip
            first += len(d)
        docs = Documents.concat(parts)
        bins = best_fit_decreasing(docs.lengths, 8)
        expected += [columns(rows_from_bins(docs, bins[i : i + chunk_rows(8)], 8, -1, attention_mask=False))
                     for i in range(0, len(bins), chunk_rows(8))]  # fmt: skip
    assert got == expected
    assert sum(len(c[6]) for c in got) >= (1 if int(joined.lengths.sum()) else 0)


def test_packer_starts_afresh_after_a_flush():
    packer = Packer(8, -1, window=3)
    assert list(packer.add(_numbered(0, [2, 2]))) == []
    assert [_documents_in(r) for r in packer.flush()] == [[0, 1]]
    assert list(packer.add(_numbered(2, [2, 2]))) == []  # 2 pending, not 3
    assert [_documents_in(r) for r in packer.add(_numbered(4, [2]))] == [[2, 3, 4]]
    assert list(packer.flush()) == []


def _rows_reference(docs: Documents, bins: list[list[int]], seq_len: int, pad_id: int):
    """Rows built one document slice at a time (the plain loop ``rows_from_bins`` vectorizes)."""
    n = len(bins)
    ids, labels = np.full((n, seq_len), pad_id, np.int32), np.full((n, seq_len), IGNORE_INDEX, np.int32)
    weights, positions = np.zeros((n, seq_len), np.float32), np.zeros((n, seq_len), np.int32)
    turns, segments = np.zeros((n, seq_len), np.int32), []
    for r, members in enumerate(bins):
        pos, segs = 0, []
        for d in members:
            s, e = int(docs.offsets[d]), int(docs.offsets[d + 1])
            ids[r, pos : pos + e - s], labels[r, pos : pos + e - s] = docs.input_ids[s:e], docs.labels[s:e]
            weights[r, pos : pos + e - s], turns[r, pos : pos + e - s] = docs.weights[s:e], docs.turns[s:e]
            positions[r, pos : pos + e - s] = np.arange(e - s)
            segs.append(e - s)
            pos += e - s
        if pos < seq_len:
            positions[r, pos:] = np.arange(seq_len - pos)
            segs.append(seq_len - pos)
        segments.append(segs)
    return ids, labels, weights, positions, turns, segments


#: ``pack._SLICE_TOKENS`` that send every chunk through the slices (0) or through the token index (none reaches it)
_BOTH_COPIES = pytest.mark.parametrize("slice_tokens", [0, 1 << 40], ids=["slices", "index"])


@_BOTH_COPIES
@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 12),
    st.lists(st.integers(0, 12), max_size=30),
    st.randoms(use_true_random=False),
    st.booleans(),
)
def test_rows_from_bins_matches_a_row_by_row_copy(slice_tokens, seq_len, lengths, rnd, attention_mask):
    """Every column, the segments and the pad tails, against plain slice copies; empty documents, full rows,
    rows of one document and bins in any order included; by slices and by the token index alike."""
    lengths = [min(n, seq_len) for n in lengths]
    rng = np.random.default_rng(rnd.randrange(1 << 30))
    total = sum(lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)
    weights = rng.choice([0.0, 0.5, 1.0], total).astype(np.float32)
    input_ids = rng.integers(0, 1000, total, dtype=np.int32)
    docs = Documents(
        input_ids=input_ids, weights=weights, offsets=offsets, lines=np.arange(len(lengths), dtype=np.int64),
        labels=np.where(weights > 0, input_ids, IGNORE_INDEX).astype(np.int32),
        turns=rng.integers(0, 5, total, dtype=np.int32),
    )
    bins = best_fit_decreasing(np.array(lengths, dtype=np.int64), seq_len)
    rnd.shuffle(bins)
    with mock.patch.object(pack, "_SLICE_TOKENS", slice_tokens):
        rows = rows_from_bins(docs, bins, seq_len, -7, attention_mask=attention_mask)
    ids, labels, weights_, positions, turns, segments = _rows_reference(docs, bins, seq_len, -7)
    np.testing.assert_array_equal(rows.input_ids, ids)
    np.testing.assert_array_equal(rows.labels, labels)
    np.testing.assert_array_equal(rows.weights, weights_)
    np.testing.assert_array_equal(rows.position_ids, positions)
    np.testing.assert_array_equal(rows.turns, turns)
    assert [s.tolist() for s in rows.seq_lengths] == segments
    assert all(s.dtype == np.int32 for s in rows.seq_lengths)
    assert rows.input_ids.dtype == rows.labels.dtype == rows.position_ids.dtype == np.int32
    assert rows.documents.tolist() == [len(b) for b in bins]
    used = [sum(lengths[d] for d in b) for b in bins]
    assert rows.real_tokens.tolist() == used
    if attention_mask:
        assert rows.attention_mask.tolist() == [[int(t < u) for t in range(seq_len)] for u in used]
    else:
        assert rows.attention_mask is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_document, st.booleans()), max_size=8), st.booleans())
def test_documents_where_keeps_the_marked_documents_in_order(marked, with_labels):
    """``Documents.where`` (filter's drop) against the kept documents listed one by one; empty ones included."""
    docs = [d for d, _ in marked]
    keep = np.array([k for _, k in marked], dtype=bool)
    batch = _masked(docs) if with_labels and all(docs) else _documents(docs)
    batch = Documents(batch.input_ids, batch.weights, batch.offsets, batch.lines * 10, labels=batch.labels,
                      turns=batch.input_ids + 1)  # fmt: skip
    out = batch.where(keep)
    kept = [(line, d) for line, (d, k) in enumerate(marked, start=1) if k]
    assert out.lines.tolist() == [10 * line for line, _ in kept]
    assert out.lengths.tolist() == [len(d) for _, d in kept]
    assert out.input_ids.tolist() == [t for _, d in kept for t, _ in d]
    assert out.turns.tolist() == [t + 1 for _, d in kept for t, _ in d]
    assert out.weights.tolist() == [w for _, d in kept for _, w in d]
    if batch.labels is None:
        assert out.labels is None
    else:
        assert out.labels.tolist() == [t if w > 0 else IGNORE_INDEX for _, d in kept for t, w in d]


@_BOTH_COPIES
@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 12),
    st.lists(st.lists(st.integers(0, 12), max_size=20), min_size=2, max_size=4),
    st.randoms(use_true_random=False),
)
def test_rows_from_bins_in_reused_buffers_match_a_row_by_row_copy(slice_tokens, seq_len, batches, rnd):
    """Chunks of different sizes made one after the other in the same ``RowBuffers`` (labels made from the weights,
    as the packer's window has none): each equals the row-by-row copy when it is read before the next is made."""
    rng = np.random.default_rng(rnd.randrange(1 << 30))
    buffers = RowBuffers()
    for lengths in batches:
        lengths = [min(n, seq_len) for n in lengths]
        total = sum(lengths)
        weights = rng.choice([0.0, 0.5, 1.0], total).astype(np.float32)
        input_ids = rng.integers(0, 1000, total, dtype=np.int32)
        docs = Documents(
            input_ids=input_ids, weights=weights,
            offsets=np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64),
            lines=np.arange(len(lengths), dtype=np.int64), turns=np.zeros(total, np.int32),
        )  # fmt: skip
        bins = best_fit_decreasing(np.array(lengths, dtype=np.int64), seq_len)
        with mock.patch.object(pack, "_SLICE_TOKENS", slice_tokens):
            rows = rows_from_bins(docs, bins, seq_len, -7, attention_mask=False, buffers=buffers)
        with_labels = Documents(docs.input_ids, docs.weights, docs.offsets, docs.lines, turns=docs.turns,
                                labels=np.array([t if w > 0 else IGNORE_INDEX
                                                 for t, w in zip(input_ids, weights, strict=True)], dtype=np.int32))  # fmt: skip
        ids, labels, weights_, positions, _, segments = _rows_reference(with_labels, bins, seq_len, -7)
        np.testing.assert_array_equal(rows.input_ids, ids)
        np.testing.assert_array_equal(rows.labels, labels)
        np.testing.assert_array_equal(rows.weights, weights_)
        np.testing.assert_array_equal(rows.position_ids, positions)
        assert [s.tolist() for s in rows.seq_lengths] == segments
        assert rows.input_ids.dtype == rows.labels.dtype == rows.position_ids.dtype == np.int32


@pytest.mark.parametrize("reuse", [1, 2, 3])
def test_packer_reusing_its_rows_writes_what_a_fresh_packer_does(reuse):
    """``Packer(reuse=k)``, each chunk read before the k-th after it is made (as the build's writer reads them),
    against fresh arrays: windows joined in the same arrays, rows made in k sets of arrays in turn, a last window of
    several batches flushed."""
    lengths = [(5 * i) % 7 + 1 for i in range(6000)]  # > 1,024 rows of 8 per window: two chunks each, and a flush

    def chunks(reuse: int) -> tuple[list[tuple[list, list, list]], list[np.ndarray]]:
        packer, out, arrays = Packer(8, -1, window=2500, reuse=reuse), [], []
        for start in range(0, len(lengths), 700):
            for rows in packer.add(_numbered(start, lengths[start : start + 700])):
                out.append((rows.input_ids.tolist(), rows.labels.tolist(), rows.position_ids.tolist()))
                arrays.append(rows.input_ids)
        for rows in packer.flush():
            out.append((rows.input_ids.tolist(), rows.labels.tolist(), rows.position_ids.tolist()))
        return out, arrays

    fresh, made = chunks(0)
    reused, arrays = chunks(reuse)
    assert len(fresh) > reuse + 1
    assert reused == fresh
    assert not np.shares_memory(made[0], made[1]), "fresh arrays for each chunk"
    for k in range(len(arrays)):  # no chunk made in the arrays of one of the reuse - 1 before it
        assert all(not np.shares_memory(arrays[k], arrays[j]) for j in range(k + 1, min(k + reuse, len(arrays)))), k
    # and the arrays of a chunk used again for the reuse-th after it (unless a larger chunk grew them)
    assert any(np.shares_memory(arrays[k], arrays[k + reuse]) for k in range(len(arrays) - reuse))


@pytest.mark.parametrize("seq_len", [128, 512, 2048, 4096, 65536])
def test_a_chunk_of_rows_holds_256ki_positions_at_most_1024_rows(seq_len, monkeypatch):
    """A chunk (one ``Rows``, one record batch of a shard) is as many rows as hold 256Ki positions, at most 1,024
    rows: its arrays do not grow with ``seq_len``. The rows are those of chunks of any size, in the same order."""

    lengths = [(7919 * i) % (seq_len // 2) + 1 for i in range((20 << 20) // seq_len)]  # ~5M tokens: several chunks

    def rows_of(packer: Packer) -> tuple[list[int], list[list[int]]]:
        sizes, ids = [], []
        for rows in [*packer.add(_numbered(0, lengths)), *packer.flush()]:
            sizes.append(len(rows.input_ids))
            ids += rows.input_ids.tolist()
        return sizes, ids

    sizes, ids = rows_of(Packer(seq_len, -1, window=len(lengths)))
    expected = min(1024, (1 << 18) // seq_len)
    assert len(sizes) > 1 and set(sizes[:-1]) == {expected} and 0 < sizes[-1] <= expected
    assert pack.chunk_rows(1 << 22) == 1  # a row longer than a chunk's positions: a row a chunk
    monkeypatch.setattr(pack, "chunk_rows", lambda seq_len: 7)  # another chunk size: the same rows
    assert rows_of(Packer(seq_len, -1, window=len(lengths)))[1] == ids


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(st.tuples(st.integers(0, 5), _weights), min_size=0, max_size=4), max_size=8),
    st.booleans(),
    st.sampled_from([0.0, 1.0, 0.3]),
)
def test_assemble_matches_a_record_by_record_loop(records, with_bos, eos_weight):
    """BOS (or not) + each piece's ids with its weight + EOS, per record, against a plain loop; empty pieces and
    records of no piece included."""
    from weightprep.batches import Records
    from weightprep.stages.assemble import assemble
    from weightprep.tokenizer import SpecialTokens

    rng = np.random.default_rng(len(records))
    pieces = [p for r in records for p in r]
    piece_ids = [rng.integers(10, 99, n).astype(np.int32) for n, _ in pieces]
    piece_offsets = np.concatenate([[0], np.cumsum([len(i) for i in piece_ids], dtype=np.int64)]).astype(np.int64)
    batch = Records(
        path="x.jsonl", lines=np.arange(1, len(records) + 1, dtype=np.int64), texts=["t"] * len(pieces),
        piece_weights=np.array([w for _, w in pieces], dtype=np.float64),
        piece_offsets=np.concatenate([[0], np.cumsum([len(r) for r in records], dtype=np.int64)]).astype(np.int64),
    )
    flat = np.concatenate(piece_ids) if piece_ids else np.zeros(0, np.int32)
    specials = SpecialTokens(bos=1 if with_bos else None, eos=2, pad=0)
    docs = assemble(batch, flat, piece_offsets, specials, eos_weight)
    ids, weights, k = [], [], 0
    for r, record in enumerate(records):
        doc_ids, doc_weights = ([1], [0.0]) if with_bos else ([], [])
        for _, w in record:
            doc_ids += piece_ids[k].tolist()
            doc_weights += [w] * len(piece_ids[k])
            k += 1
        ids.append(doc_ids + [2])
        weights.append(doc_weights + [eos_weight])
        assert docs.lines[r] == r + 1
    assert [docs.input_ids[a:b].tolist() for a, b in zip(docs.offsets[:-1], docs.offsets[1:], strict=True)] == ids
    expected = [np.float32(w) for doc in weights for w in doc]
    assert docs.input_ids.dtype == np.int32 and docs.weights.dtype == np.float32
    assert docs.weights.tolist() == [float(w) for w in expected]


def test_the_collector_is_paused_while_a_block_is_parsed_and_rendered_and_left_as_it_was(tmp_path, monkeypatch):
    """``parsed_blocks`` parses each block (and renders its conversations) with the cyclic collector paused, and
    gives it back enabled; a caller that had paused it finds it paused, also after an error in the block."""
    import gc

    import weightprep.blocks as blocks
    from weightprep.blocks import collection_paused, parsed_blocks
    from weightprep.config import config_from_dict
    from weightprep.distribute.plan import plan_parts
    from weightprep.stages import validate
    from weightprep.stages.read import InputFile

    path = tmp_path / "in.jsonl"
    path.write_text('{"pieces": [{"text": "a", "weight": 1}]}\n{"text": "b"}\n')
    seen: list[bool] = []
    original = validate.parse_block

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return original(*args, **kwargs)

    cfg = config_from_dict({})
    part = plan_parts([str(path)], cfg.read.part_bytes)[0]
    was = gc.isenabled()
    try:
        gc.enable()
        monkeypatch.setattr(blocks, "parse_block", spy)
        assert sum(len(r) for r, _, _ in parsed_blocks(part, InputFile(str(path)), cfg, None)) == 2
        assert seen == [False] and gc.isenabled()
        with pytest.raises(ZeroDivisionError), collection_paused():
            assert not gc.isenabled()
            1 / 0  # noqa: B018
        assert gc.isenabled()
        gc.disable()
        with collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
