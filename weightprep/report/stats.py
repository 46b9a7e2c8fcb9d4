"""What the HTML report plots, computed from the shards themselves, one record batch at a time.

For each split (or the whole build without one): every written document's length, every row's fill (positions
that are not the pad tail, over the row length) and the count of document tokens at each distinct weight. The pad
tail is a row's last segment when it is made only of the pad id with label -100, as ``weightprep build`` writes
it; unpacked rows hold one document and its padding the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from weightprep.constants import IGNORE_INDEX, INPUT_IDS, LABELS, SEQ_LENGTHS, WEIGHTS
from weightprep.manifest import shard_batches

__all__ = ["SplitStats", "document_turns", "split_stats", "row_segments"]

#: Past this many distinct weights the counts are kept per weight rounded to 3 decimals (bounded memory).
MAX_DISTINCT_WEIGHTS = 100_000


@dataclass
class SplitStats:
    """The distributions of one split."""

    rows: int = 0
    doc_lengths: list[np.ndarray] = field(default_factory=list)
    fills: list[np.ndarray] = field(default_factory=list)
    weight_counts: dict[float, int] = field(default_factory=dict)
    pad_positions: int = 0
    weights_rounded: bool = False

    @property
    def lengths(self) -> np.ndarray:
        return np.concatenate(self.doc_lengths) if self.doc_lengths else np.zeros(0, np.int64)

    @property
    def fill(self) -> np.ndarray:
        return np.concatenate(self.fills) if self.fills else np.zeros(0, np.float64)

    def add_weights(self, values: np.ndarray) -> None:
        if self.weights_rounded:
            values = np.round(values.astype(np.float64), 3)
        distinct, counts = np.unique(values, return_counts=True)
        for w, c in zip(distinct.tolist(), counts.tolist(), strict=True):
            self.weight_counts[w] = self.weight_counts.get(w, 0) + c
        if not self.weights_rounded and len(self.weight_counts) > MAX_DISTINCT_WEIGHTS:
            merged: dict[float, int] = {}
            for w, c in self.weight_counts.items():
                key = round(w, 3)
                merged[key] = merged.get(key, 0) + c
            self.weight_counts, self.weights_rounded = merged, True


def row_segments(row: dict[str, Any], pad_id: int | None) -> tuple[list[int], int]:
    """A row's document lengths and its pad-tail length (0 when the row is full)."""
    lengths = [int(n) for n in row[SEQ_LENGTHS]]
    if lengths and pad_id is not None:
        tail = lengths[-1]
        ids, labels = np.asarray(row[INPUT_IDS])[-tail:], np.asarray(row[LABELS])[-tail:]
        if (ids == pad_id).all() and (labels == IGNORE_INDEX).all():
            return lengths[:-1], tail
    return lengths, 0


def _matrix(column: Any, rows: int) -> np.ndarray:
    """A fixed-size list column (every row is seq_len long) as a rows x seq_len array."""
    return np.asarray(column.flatten().to_numpy(zero_copy_only=False)).reshape(rows, -1)


def split_stats(directory: Path | str, shards: list[dict[str, Any]], pad_id: int | None) -> SplitStats:
    """Stream ``shards`` (manifest entries) of ``directory`` into a :class:`SplitStats`."""
    stats = SplitStats()
    for shard in shards:
        for batch in shard_batches(directory, shard):
            n = batch.num_rows
            if n == 0:
                continue
            ids = _matrix(batch.column(INPUT_IDS), n)
            labels = _matrix(batch.column(LABELS), n)
            weights = _matrix(batch.column(WEIGHTS), n)
            segs = batch.column(SEQ_LENGTHS)
            offsets = np.asarray(segs.offsets.to_numpy())
            values = np.asarray(segs.flatten().to_numpy(), dtype=np.int64)
            width = ids.shape[1]
            last = values[offsets[1:] - 1]
            # row_segments' rule, for a whole batch: the last segment is the pad tail when all its ids are the pad
            # id and all its labels are ignored
            in_tail = np.arange(width)[None, :] >= (width - last)[:, None]
            if pad_id is None:
                tail = np.zeros(n, bool)
            else:
                pad_like = (ids == pad_id) & (labels == IGNORE_INDEX)
                tail = np.where(in_tail, pad_like, True).all(axis=1) & (last > 0)
            keep = np.ones(len(values), bool)
            keep[offsets[1:][tail] - 1] = False
            stats.doc_lengths.append(values[keep])
            pads = np.where(tail, last, 0)
            stats.pad_positions += int(pads.sum())
            stats.fills.append((width - pads) / width)
            stats.add_weights(weights[~(in_tail & tail[:, None])])
            stats.rows += n
    return stats


def document_turns(turns: list[list[Any]], start: int, length: int) -> list[tuple[int, int, str | None, int | None]]:
    """The document at row positions ``[start, start + length)`` cut by the row's conversation ``turns``:
    ``(offset in the document, tokens, role, message index)``, with ``role`` None for the text between turns
    (template text such as BOS) and for a document that holds no turn (one made of pieces)."""
    end = start + length
    parts: list[tuple[int, int, str | None, int | None]] = []
    at = start
    for t_start, t_len, role, message in turns:
        a, b = max(t_start, start), min(t_start + t_len, end)
        if a >= b:
            continue
        if a > at:
            parts.append((at - start, a - at, None, None))
        parts.append((a - start, b - a, role, message))
        at = b
    if at < end:
        parts.append((at - start, end - at, None, None))
    return parts
