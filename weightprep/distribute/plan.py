"""The split plan: the inputs cut into byte ranges of whole lines, independently of how many workers run them.

A plain JSONL file larger than ``read.split_bytes`` is cut near every multiple ``k * split_bytes`` of that size,
just after the first newline at or past byte ``k * split_bytes - 1``; a split owns the lines that start inside it.
A line longer than a split makes the next cut fall after it (no split is empty unless its file is). A compressed
file, a Parquet or Arrow file, and a file no larger than ``split_bytes`` are one split each. Finding a cut reads
from the cut point to the next newline, nothing else, so planning a terabyte costs a few thousand short reads.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from weightprep.errors import is_columnar, is_compressed

__all__ = ["InputSplit", "plan_splits", "line_bases"]

_SCAN = 1 << 20


@dataclass(frozen=True)
class InputSplit:
    """Split ``index`` of the plan: bytes ``start .. end`` of input ``file`` (``whole``: the file as it is,
    compressed and columnar files included; ``part``: its number among its file's splits)."""

    index: int
    file: int
    path: str
    start: int
    end: int
    part: int
    whole: bool

    @property
    def size(self) -> int:
        return self.end - self.start


def _next_line_start(f, pos: int, size: int) -> int:  # type: ignore[no-untyped-def]
    """The offset just past the first newline at or after ``pos`` (``size`` if there is none)."""
    f.seek(pos)
    while pos < size:
        chunk = f.read(_SCAN)
        if not chunk:
            break
        nl = chunk.find(b"\n")
        if nl >= 0:
            return pos + nl + 1
        pos += len(chunk)
    return size


def file_cuts(path: str, split_bytes: int) -> list[int]:
    """The split boundaries of one plain file: ``[0, c1, ..., size]``."""
    size = os.path.getsize(path)
    if is_compressed(path) or is_columnar(path) or size <= split_bytes:
        return [0, size]
    cuts = [0]
    with open(path, "rb") as f:
        target = split_bytes
        while target < size:
            cut = _next_line_start(f, target - 1, size)
            if cut >= size:
                break
            if cut > cuts[-1]:
                cuts.append(cut)
            target = (cut // split_bytes + 1) * split_bytes  # the next multiple past this cut
    cuts.append(size)
    return cuts


def plan_splits(paths: list[str], split_bytes: int) -> list[InputSplit]:
    """Every input's splits, in input order (file, then offset)."""
    splits: list[InputSplit] = []
    for i, path in enumerate(paths):
        cuts = file_cuts(path, split_bytes)
        for part, (start, end) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)):
            splits.append(InputSplit(len(splits), i, path, start, end, part, whole=len(cuts) == 2))
    return splits


def line_bases(splits: Sequence[InputSplit], lines: Sequence[int]) -> list[int]:
    """Each split's line base: the lines of the earlier splits of its own file (``lines[i]``: the lines of
    ``splits[i]``, a plan's splits in order). A split numbers its lines from 1; its line ``n`` is line
    ``base + n`` of the file. The one place a split's line numbers are made the file's (errors and rejects alike);
    the last split's own count is not used."""
    bases, seen = [], Counter[int]()
    for split, n in zip(splits, lines, strict=True):
        bases.append(seen[split.file])
        seen[split.file] += n
    return bases
