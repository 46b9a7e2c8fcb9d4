"""Stage 7 — pack (or pad): documents into fixed-length rows.

Packed: documents are collected into windows of exactly ``window`` documents (the last one shorter), in
input order whatever batches they arrive in, so the rows do not depend on block sizes. Each window is
sorted longest first and each document put into the fullest open row that still has room
(best-fit-decreasing, O(log L) per document: a ``bisect`` over the room values that open rows have). Rows come
out in the order they were opened,
documents within a row in the order they were placed, so the result is deterministic. Example,
seq_len 8, documents A (3 tokens), B (2), pad id 0::

    input_ids     A0 A1 A2 B0 B1  0  0  0
    position_ids   0  1  2  0  1  0  1  2
    seq_lengths   [3, 2, 3]                # the pad tail is the last segment
    weights carry over from the documents, labels are ids where the weight is positive (the mask stage's
    rule, ``labels_from_weights``); pads get weight 0, label IGNORE_INDEX

Unpacked: one document per row, in input order, right-padded, plus an ``attention_mask``.
Cost: O(window) memory in documents (8 bytes per token: ids and weights, 12 with turns; a batch's documents are
copied into the window's arrays as they arrive, or taken as views where a whole window lies in one batch); fill is
typically > 99% with a window of thousands of documents, since only the last few rows of each window are left
part-full. A chunk's rows are made by slices of the documents where these are long, through one token index where
they are short (``rows_from_bins``), ~3.5 and ~9 ns a token.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator
from itertools import chain
from typing import Any

import numpy as np

from weightprep.batches import Documents, Rows, _ranges
from weightprep.constants import IGNORE_INDEX
from weightprep.stages.mask import labels_from_weights

__all__ = ["best_fit_decreasing", "rows_from_bins", "Packer", "RowBuffers"]

#: Rows materialized at a time, to bound memory whatever the window size: as many as hold ``_CHUNK_TOKENS``
#: positions (128 rows of 2,048), at most 1,024. A chunk's columns (~28 bytes a position: ids, labels, weights,
#: positions, turns and the gather index) are fresh pages at their first use; at 256Ki positions they are ~7 MB,
#: which stay in the cache from one chunk to the next, where 2Mi positions (the rule before) were ~59 MB: a
#: 30k-record build spent 0.37 s of system time against 0.64 s (docs/performance.md)
_ROWS_PER_CHUNK = 1024
_CHUNK_TOKENS = 1 << 18
#: Documents of this many tokens on average, or more, are copied into a chunk's rows slice by slice (a
#: ``concatenate``: ~4 ns a token for conversations of ~700 tokens); shorter ones through one token index
#: (``take``: ~9 ns a token whatever their length, where a slice per document costs more per token below ~150).
_SLICE_TOKENS = 128


def chunk_rows(seq_len: int) -> int:
    """How many rows of ``seq_len`` a chunk holds."""
    return max(1, min(_ROWS_PER_CHUNK, _CHUNK_TOKENS // seq_len))


def best_fit_decreasing(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """Assign document indices to bins of ``capacity`` tokens; every length must be <= capacity.

    Documents are placed longest first (equal lengths in input order), each into the bin with the least room
    left that still has room (> 0) for it, among bins with equal room the one that reached that room last;
    a document no bin takes opens a new bin. Bins are listed in the order they were opened.

    The open bins are kept by room: a stack of bins per room value (the last to reach it on top) and the sorted
    list of the room values that have a bin, so the best fit is one ``bisect`` (O(log L)) and a room value
    appearing or emptying one insertion or deletion in a list of at most ``capacity`` ints (a memmove).

    >>> best_fit_decreasing(np.array([3, 5, 2, 6]), 8)
    [[3, 2], [1, 0]]
    """
    order = np.argsort(-lengths, kind="stable")
    sizes = lengths[order].tolist()
    if sizes and sizes[0] > capacity:
        raise ValueError(f"document of {sizes[0]} tokens does not fit a row of {capacity}")
    rooms: list[int] = []  # sorted room values (> 0) that at least one open bin has
    by_room: dict[int, list[int]] = {}  # room -> its bins, the one that reached it last at the end
    bins: list[list[int]] = []
    for doc, n in zip(order.tolist(), sizes, strict=True):
        i = bisect_left(rooms, n)
        if i == len(rooms):  # no bin has room: open one
            b = len(bins)
            bins.append([doc])
            left = capacity - n
        else:
            r = rooms[i]
            stack = by_room[r]
            b = stack.pop()
            if not stack:
                del rooms[i], by_room[r]
            bins[b].append(doc)
            left = r - n
        if left > 0:
            stack = by_room.get(left)
            if stack is None:
                by_room[left] = [b]
                insort(rooms, left)
            else:
                stack.append(b)
    return bins


class RowBuffers:
    """The arrays of one chunk of rows, reused by the next chunk (``rows_from_bins(buffers=...)``): made afresh each
    time they would be as many pages for the system to map and zero (a window's documents are kept the same way, in
    ``_Window``). Each grows to the largest asked for and stays; what is made in them is valid until they are used
    again."""

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}

    def get(self, name: str, n: int, dtype: Any) -> np.ndarray:
        """``n`` elements of ``dtype`` (their values left as they were)."""
        array = self._arrays.get(name)
        if array is None or len(array) < n or array.dtype != dtype:
            array = self._arrays[name] = np.empty(n, dtype=dtype)
        return array[:n]


def rows_from_bins(
    docs: Documents, bins: list[list[int]], seq_len: int, pad_id: int, *, attention_mask: bool,
    buffers: RowBuffers | None = None,
) -> Rows:  # fmt: skip
    """Materialize ``bins`` (lists of document indices of ``docs``) as padded rows of ``seq_len``; in ``buffers``'
    arrays if given (the rows are then valid until ``buffers`` is used again).

    ``docs`` are masked documents; without their ``labels`` (the packer's window does not keep them), the rows'
    labels are made from the rows' ids and weights by the mask stage's own rule (``labels_from_weights``): the
    same labels, since the mask stage made them so and a pad has weight 0.

    A row is its segments back to back (its documents, then the pad tail if any), and the positions restart at
    every segment start (the concatenation of ``arange(segment length)`` over the segments). Where the documents
    are long (``_SLICE_TOKENS``), every column of the ``n x seq_len`` block is its segments' slices joined
    (``_Segments``); else it is one ``take`` from its document column through one token index (a pad position
    reads any token, then the few pad positions are overwritten).
    """
    n_rows = len(bins)
    shape = (n_rows, seq_len)
    per_row = np.fromiter(map(len, bins), dtype=np.int64, count=n_rows)
    order = np.fromiter(chain.from_iterable(bins), dtype=np.int64, count=int(per_row.sum()))
    lengths = docs.lengths[order]
    row_ends = np.cumsum(per_row) - 1  # index in ``order`` of each row's last document
    used = np.diff(np.cumsum(lengths)[row_ends], prepend=0) if len(order) else np.zeros(n_rows, dtype=np.int64)
    assert (used <= seq_len).all()
    tail = seq_len - used
    has_tail = tail > 0
    # segments: each row's documents, then its pad tail where it has one
    segs_per_row = per_row + has_tail
    seg_ends = np.cumsum(segs_per_row)
    seg_first = seg_ends - segs_per_row  # index of each row's first segment
    seg_lengths = np.empty(int(segs_per_row.sum()), dtype=np.int64)
    seg_sources = np.zeros(len(seg_lengths), dtype=np.int64)  # where each segment's tokens start in ``docs``
    doc_slot = np.repeat(seg_first, per_row) + (np.arange(len(order)) - np.repeat(row_ends + 1 - per_row, per_row))
    seg_lengths[doc_slot] = lengths
    seg_sources[doc_slot] = docs.offsets[:-1][order]
    tail_slot = (seg_ends - 1)[has_tail]
    seg_lengths[tail_slot] = tail[has_tail]
    size = n_rows * seq_len

    def buffer(name: str, dtype: Any) -> np.ndarray | None:
        return None if buffers is None else buffers.get(name, size, dtype)

    if n_rows and len(order) and int(used.sum()) >= _SLICE_TOKENS * len(order):
        # long documents: every column the concatenation of its segments' slices (and the pads'), no token index
        is_pad = np.zeros(len(seg_lengths), dtype=bool)
        is_pad[tail_slot] = True
        column = _Segments(seg_sources.tolist(), seg_lengths.tolist(), is_pad.tolist(), seq_len)
        input_ids = column(docs.input_ids, pad_id, buffer("input_ids", docs.input_ids.dtype))
        weights = column(docs.weights, 0, buffer("weights", docs.weights.dtype))
        if docs.labels is None:
            out = buffer("labels", np.int32)
            labels = labels_from_weights(input_ids, weights, out)
        else:
            labels = column(docs.labels, IGNORE_INDEX, buffer("labels", docs.labels.dtype))
        turns = None if docs.turns is None else column(docs.turns, 0, buffer("turns", docs.turns.dtype))
        position_ids = column.positions(buffer("position_ids", np.int32))
        input_ids, labels, weights, position_ids = (a.reshape(shape) for a in (input_ids, labels, weights, position_ids))
        turns = None if turns is None else turns.reshape(shape)
    else:
        # n_rows * seq_len token indices; a pad tail's run from 0, clipped to the last token, then overwritten
        gather = _ranges(seg_sources, seg_lengths, out=buffer("gather", np.int64))
        pads = _ranges(np.flatnonzero(has_tail) * seq_len + used[has_tail], tail[has_tail])

        input_ids = _column(docs.input_ids, gather, pads, pad_id, shape, buffer("input_ids", docs.input_ids.dtype))
        weights = _column(docs.weights, gather, pads, 0, shape, buffer("weights", docs.weights.dtype))
        if docs.labels is None:
            out = buffer("labels", np.int32)
            labels = labels_from_weights(input_ids, weights, None if out is None else out.reshape(shape))
        else:
            labels = _column(docs.labels, gather, pads, IGNORE_INDEX, shape, buffer("labels", docs.labels.dtype))
        turns = None if docs.turns is None else _column(docs.turns, gather, pads, 0, shape, buffer("turns", docs.turns.dtype))
        del gather, pads  # before the positions: the block's two index arrays are not held at once
        starts = np.zeros(len(seg_lengths), dtype=np.int32)
        position_ids = _ranges(starts, seg_lengths, np.int32, out=buffer("position_ids", np.int32)).reshape(shape)
    seq_lengths = np.split(seg_lengths.astype(np.int32), seg_ends[:-1]) if n_rows else []
    mask = (np.arange(seq_len)[None, :] < used[:, None]).astype(np.int8) if attention_mask else None
    return Rows(input_ids, labels, weights, position_ids, seq_lengths, used, per_row, mask, turns)


class _Segments:
    """A chunk's columns made from its segments (``rows_from_bins``): each segment a slice of a document column
    (``sources``: where it starts; ``lengths``) or, where ``is_pad``, a pad tail; the slices are joined by one
    ``concatenate``, a copy of each document's tokens as they lie."""

    def __init__(self, sources: list[int], lengths: list[int], is_pad: list[bool], seq_len: int) -> None:
        self.segments = list(zip(sources, lengths, is_pad, strict=True))
        self.lengths, self.seq_len = lengths, seq_len

    def __call__(self, values: np.ndarray, pad: Any, out: np.ndarray | None) -> np.ndarray:
        """``values`` through the segments, ``pad`` in the pad tails (flat; into ``out`` if given)."""
        filler = np.full(self.seq_len, pad, dtype=values.dtype)
        return np.concatenate([filler[:n] if tail else values[s : s + n] for s, n, tail in self.segments], out=out)

    def positions(self, out: np.ndarray | None) -> np.ndarray:
        """Each segment's positions from 0, pad tails included (int32; into ``out`` if given)."""
        counting = np.arange(self.seq_len, dtype=np.int32)
        return np.concatenate([counting[:n] for n in self.lengths], out=out)


def _column(
    values: np.ndarray, gather: np.ndarray, pads: np.ndarray, pad: Any, shape: tuple[int, int],
    out: np.ndarray | None = None,
) -> np.ndarray:  # fmt: skip
    """``values`` at the ``gather`` positions (clipped: a pad's position need not be a token), ``pad`` at ``pads``
    (into ``out``, flat, of ``values``' dtype, if given)."""
    if not len(values):  # no tokens at all: every position a pad
        if out is None:
            return np.full(shape, pad, dtype=values.dtype)
        out.fill(pad)
        return out.reshape(shape)
    out = values.take(gather, mode="clip", out=out)
    out[pads] = pad
    return out.reshape(shape)


def _slice(docs: Documents, a: int, b: int) -> Documents:
    """Documents ``a`` to ``b`` of ``docs``, as views (no copy); without labels (the window keeps none)."""
    t0, t1 = int(docs.offsets[a]), int(docs.offsets[b])
    return Documents(
        input_ids=docs.input_ids[t0:t1], weights=docs.weights[t0:t1], offsets=docs.offsets[a : b + 1] - t0,
        lines=docs.lines[a:b], labels=None, turns=None if docs.turns is None else docs.turns[t0:t1],
    )  # fmt: skip


class _Window:
    """The documents of one packing window, their tokens copied in as they arrive into arrays kept from one window
    to the next: a batch is freed once it is in (its memory reused by the next block's), where a window joined at
    its cut held its batches and their joined copy at once, twice its tokens' pages. The window's columns are those
    ``Documents.concat`` of its batches gives: each of the dtype NumPy gives their join, turns zeros for a batch
    without them unless none has them."""

    def __init__(self, size: int) -> None:
        self.size = size  # documents in a full window
        self.count = 0  # documents in
        self.tokens = 0
        self._arrays: dict[str, np.ndarray] = {}  # grown as needed, kept
        self._dtypes: dict[str, Any] = {}  # this window's join's dtype per column
        self._lengths: list[np.ndarray] = []
        self._lines: list[np.ndarray] = []

    def put(self, docs: Documents, a: int, b: int) -> None:
        """Documents ``a`` to ``b`` of ``docs`` in (copied)."""
        t0, t1 = int(docs.offsets[a]), int(docs.offsets[b])
        at, end = self.tokens, self.tokens + (t1 - t0)
        if docs.turns is not None and "turns" not in self._dtypes and self.count:  # zeros for the batches before
            self._column("turns", np.zeros(at, np.int32), 0, at, b - a)
        columns = [("input_ids", docs.input_ids), ("weights", docs.weights)]
        if docs.turns is not None or "turns" in self._dtypes:
            columns.append(("turns", docs.turns if docs.turns is not None else np.zeros(len(docs.input_ids), np.int32)))
        for name, values in columns:
            self._column(name, values[t0:t1], at, end, b - a)
        self._lengths.append(np.diff(docs.offsets[a : b + 1]))
        self._lines.append(docs.lines[a:b])
        self.count += b - a
        self.tokens = end

    def _column(self, name: str, values: np.ndarray, at: int, end: int, docs: int) -> None:
        """``values`` at ``[at, end)`` of column ``name``, grown (its tokens so far kept) where it is too short."""
        dtype = self._dtypes[name] = np.result_type(self._dtypes.get(name, values.dtype), values.dtype)
        array = self._arrays.get(name)
        if array is None or len(array) < end or not np.can_cast(dtype, array.dtype, "safe"):
            # room for the window at this batch's tokens per document, plus a tenth (a later batch may need more)
            guess = end + int((end - at) / max(docs, 1) * (self.size - self.count - docs) * 1.1)
            grown = np.empty(max(guess, 0 if array is None else len(array) * 3 // 2, end), dtype=dtype)
            if at:
                grown[:at] = array[:at]  # type: ignore[index]
            array = self._arrays[name] = grown
        array[at:end] = values

    def documents(self) -> Documents:
        """The window's documents (views of the kept arrays: valid until the next ``put`` after ``clear``)."""
        lengths = np.concatenate(self._lengths)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])

        def column(name: str) -> np.ndarray:
            return self._arrays[name][: self.tokens].astype(self._dtypes[name], copy=False)

        return Documents(
            input_ids=column("input_ids"), weights=column("weights"), offsets=offsets,
            lines=np.concatenate(self._lines), labels=None, turns=column("turns") if "turns" in self._dtypes else None,
        )  # fmt: skip

    def clear(self) -> None:
        self.count = self.tokens = 0
        self._dtypes, self._lengths, self._lines = {}, [], []


class Packer:
    """Streams masked, filtered documents into fixed-length ``Rows`` (packed or padded).

    ``reuse`` (> 0): every ``Rows`` is made in one of ``reuse`` sets of arrays (``RowBuffers``), taken in turn, so it
    stays valid until ``reuse`` more have been asked for: for a caller that is done with each by then (a build's
    writer: one ``Rows`` made while the one before waits for the writer and the one before that is written), not one
    that keeps them; 0: fresh arrays for each. A window's documents are always held in arrays kept from one window
    to the next (``_Window``); no ``Rows`` shares them."""

    def __init__(self, seq_len: int, pad_id: int, *, packed: bool = True, window: int = 20000, reuse: int = 0) -> None:
        self.seq_len = seq_len
        self.pad_id = pad_id
        self.packed = packed
        self.window = window
        self._buffers = [RowBuffers() for _ in range(reuse)]
        self._turn = 0  # the set of arrays the next ``Rows`` is made in
        self._held = _Window(window)

    def add(self, docs: Documents) -> Iterator[Rows]:
        """Take a batch; yield rows whenever a full window is ready."""
        if not self.packed:
            yield from self._emit(docs, [[i] for i in range(len(docs))])
            return
        # labels are ids where the weight is positive (the mask stage's rule): the window keeps ids and weights
        # only, a third less memory per token held, and the rows get their labels back (``rows_from_bins``)
        held, a = self._held, 0
        while a < len(docs):  # windows of exactly ``window`` documents, whatever the batches
            if not held.count and len(docs) - a >= self.window:  # a whole window in this batch: its views, no copy
                window = _slice(docs, a, a + self.window)
                a += self.window
                yield from self._emit(window, best_fit_decreasing(window.lengths, self.seq_len))
                continue
            b = min(len(docs), a + self.window - held.count)
            held.put(docs, a, b)
            a = b
            if held.count == self.window:
                yield from self._flush_held()

    def flush(self) -> Iterator[Rows]:
        """Pack whatever is pending (call once more at the end of the input)."""
        if self._held.count:
            yield from self._flush_held()

    def _flush_held(self) -> Iterator[Rows]:
        """The held window's rows (all made before the next document goes in), then an empty window."""
        window = self._held.documents()
        try:
            yield from self._emit(window, best_fit_decreasing(window.lengths, self.seq_len))
        finally:
            self._held.clear()

    def _emit(self, docs: Documents, bins: list[list[int]]) -> Iterator[Rows]:
        rows = chunk_rows(self.seq_len)
        for start in range(0, len(bins), rows):
            yield rows_from_bins(
                docs, bins[start : start + rows], self.seq_len, self.pad_id, attention_mask=not self.packed,
                buffers=self._next_buffers(),
            )  # fmt: skip

    def _next_buffers(self) -> RowBuffers | None:
        """The arrays of the next ``Rows`` (None: fresh ones)."""
        if not self._buffers:
            return None
        buffers = self._buffers[self._turn]
        self._turn = (self._turn + 1) % len(self._buffers)
        return buffers
