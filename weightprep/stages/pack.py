"""Stage 7 — pack (or pad): documents into fixed-length rows.

Packed: documents are collected into windows of exactly ``window`` documents (the last one shorter), in
input order whatever batches they arrive in, so the rows do not depend on block sizes. Each window is
sorted longest first and each document put into the fullest open row that still has room
(best-fit-decreasing, O(log L) per document through a segment tree over remaining capacity). Rows come out in the order they were opened,
documents within a row in the order they were placed, so the result is deterministic. Example,
seq_len 8, documents A (3 tokens), B (2), pad id 0::

    input_ids     A0 A1 A2 B0 B1  0  0  0
    position_ids   0  1  2  0  1  0  1  2
    seq_lengths   [3, 2, 3]                # the pad tail is the last segment
    labels/weights carry over from the documents; pads get IGNORE_INDEX / 0

Unpacked: one document per row, in input order, right-padded, plus an ``attention_mask``.
Cost: O(window) memory in documents; fill is typically > 99% with a window of thousands of
documents, since only the last few rows of each window are left part-full.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from weightprep.batches import Documents, Rows
from weightprep.constants import IGNORE_INDEX

__all__ = ["best_fit_decreasing", "rows_from_bins", "Packer"]

#: Rows materialized at a time, to bound memory whatever the window size.
_ROWS_PER_CHUNK = 1024


def best_fit_decreasing(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """Assign document indices to bins of ``capacity`` tokens; every length must be <= capacity.

    Documents are placed longest first (equal lengths in input order), each into the bin with the least room
    left that still has room (> 0) for it, among bins with equal room the one that reached that room last;
    a document no bin takes opens a new bin. Bins are listed in the order they were opened.

    >>> best_fit_decreasing(np.array([3, 5, 2, 6]), 8)
    [[3, 2], [1, 0]]
    """
    size = 1
    while size < capacity + 1:
        size *= 2
    tree = [0] * (2 * size)  # tree[node] = number of open bins whose remaining room is in node's range
    by_room: list[list[int]] = [[] for _ in range(capacity + 1)]
    room: list[int] = []
    bins: list[list[int]] = []

    def update(r: int, delta: int) -> None:
        i = r + size
        while i:
            tree[i] += delta
            i //= 2

    def smallest_room_at_least(n: int) -> int:
        i = n + size
        if tree[i]:
            return n
        while i > 1:
            if i % 2 == 0 and tree[i + 1]:
                i += 1
                break
            i //= 2
        else:
            return -1
        while i < size:
            i = 2 * i if tree[2 * i] else 2 * i + 1
        return i - size

    for doc in np.argsort(-lengths, kind="stable").tolist():
        n = int(lengths[doc])
        if n > capacity:
            raise ValueError(f"document of {n} tokens does not fit a row of {capacity}")
        r = smallest_room_at_least(n)
        if r < 0:
            b = len(bins)
            bins.append([doc])
            room.append(capacity - n)
        else:
            b = by_room[r].pop()
            update(r, -1)
            bins[b].append(doc)
            room[b] = r - n
        if room[b] > 0:
            by_room[room[b]].append(b)
            update(room[b], +1)
    return bins


def rows_from_bins(docs: Documents, bins: list[list[int]], seq_len: int, pad_id: int, *, attention_mask: bool) -> Rows:
    """Materialize ``bins`` (lists of document indices of ``docs``) as padded rows of ``seq_len``.

    One slice copy per document and column: cheaper than building token-level index arrays,
    since documents are hundreds of tokens long.
    """
    assert docs.labels is not None, "rows are built from masked documents"
    n_rows = len(bins)
    shape = (n_rows, seq_len)
    input_ids = np.full(shape, pad_id, dtype=np.int32)
    labels = np.full(shape, IGNORE_INDEX, dtype=np.int32)
    weights = np.zeros(shape, dtype=np.float32)
    position_ids = np.empty(shape, dtype=np.int32)
    turns = None if docs.turns is None else np.zeros(shape, dtype=np.int32)
    arange = np.arange(seq_len, dtype=np.int32)
    src_ids, src_labels, src_weights = docs.input_ids, docs.labels, docs.weights
    starts, lengths = docs.offsets[:-1].tolist(), docs.lengths.tolist()
    used = np.zeros(n_rows, dtype=np.int64)
    seq_lengths: list[np.ndarray] = []
    for r, members in enumerate(bins):
        pos = 0
        segs = []
        for d in members:
            s, n = starts[d], lengths[d]
            input_ids[r, pos : pos + n] = src_ids[s : s + n]
            labels[r, pos : pos + n] = src_labels[s : s + n]
            weights[r, pos : pos + n] = src_weights[s : s + n]
            position_ids[r, pos : pos + n] = arange[:n]
            if turns is not None:
                turns[r, pos : pos + n] = docs.turns[s : s + n]  # type: ignore[index]
            segs.append(n)
            pos += n
        assert pos <= seq_len
        if pos < seq_len:  # the pad tail restarts its positions, like a document of its own
            position_ids[r, pos:] = arange[: seq_len - pos]
            segs.append(seq_len - pos)
        used[r] = pos
        seq_lengths.append(np.asarray(segs, dtype=np.int32))
    mask = (arange[None, :] < used[:, None]).astype(np.int8) if attention_mask else None
    docs_per_row = np.fromiter(map(len, bins), dtype=np.int64, count=n_rows)
    return Rows(input_ids, labels, weights, position_ids, seq_lengths, used, docs_per_row, mask, turns)


class Packer:
    """Streams masked, filtered documents into fixed-length ``Rows`` (packed or padded)."""

    def __init__(self, seq_len: int, pad_id: int, *, packed: bool = True, window: int = 20000) -> None:
        self.seq_len = seq_len
        self.pad_id = pad_id
        self.packed = packed
        self.window = window
        self._pending: list[Documents] = []
        self._pending_docs = 0

    def add(self, docs: Documents) -> Iterator[Rows]:
        """Take a batch; yield rows whenever a full window is ready."""
        if not self.packed:
            yield from self._emit(docs, [[i] for i in range(len(docs))])
            return
        self._pending.append(docs)
        self._pending_docs += len(docs)
        while self._pending_docs >= self.window:  # windows of exactly ``window`` documents, whatever the batches
            pending = Documents.concat(self._pending)
            n = len(pending)
            window = pending.take(np.arange(self.window))
            rest = pending.take(np.arange(self.window, n))
            self._pending, self._pending_docs = ([rest] if len(rest) else []), n - self.window
            yield from self._emit(window, best_fit_decreasing(window.lengths, self.seq_len))

    def flush(self) -> Iterator[Rows]:
        """Pack whatever is pending (call once more at the end of the input)."""
        if not self._pending:
            return
        docs = Documents.concat(self._pending)
        self._pending, self._pending_docs = [], 0
        yield from self._emit(docs, best_fit_decreasing(docs.lengths, self.seq_len))

    def _emit(self, docs: Documents, bins: list[list[int]]) -> Iterator[Rows]:
        for start in range(0, len(bins), _ROWS_PER_CHUNK):
            yield rows_from_bins(
                docs, bins[start : start + _ROWS_PER_CHUNK], self.seq_len, self.pad_id, attention_mask=not self.packed
            )
