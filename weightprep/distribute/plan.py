"""The plan of input parts: the inputs cut into byte ranges of whole lines, independently of how many workers run them.

A plain JSONL file larger than ``read.part_bytes`` is cut near every multiple ``k * part_bytes`` of that size,
just after the first newline at or past byte ``k * part_bytes - 1``; a part owns the lines that start inside it.
A line longer than a part makes the next cut fall after it (no part is empty unless its file is). A compressed
file, a Parquet or Arrow file, and a file no larger than ``part_bytes`` are one part each. Finding a cut reads
from the cut point to the next newline, nothing else, so planning a terabyte costs a few thousand short reads.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from weightprep import storage
from weightprep.errors import is_columnar, is_compressed

__all__ = ["InputPart", "plan_parts", "line_bases"]

#: Bytes read at a time looking for a cut's newline: 4 KiB first, doubled up to _SCAN (in a store each read is a
#: range request: a cut costs a few kilobytes, not a megabyte)
_SCAN = 1 << 20
_FIRST_SCAN = 1 << 12


@dataclass(frozen=True)
class InputPart:
    """Part ``index`` of the plan: bytes ``start .. end`` of input ``file`` (``whole``: the file as it is,
    compressed and columnar files included; ``number``: its number among its file's parts)."""

    index: int
    file: int
    path: str
    start: int
    end: int
    number: int
    whole: bool

    @property
    def size(self) -> int:
        return self.end - self.start


def _next_line_start(f, pos: int, size: int) -> int:  # type: ignore[no-untyped-def]
    """The offset just past the first newline at or after ``pos`` (``size`` if there is none)."""
    f.seek(pos)
    step = _FIRST_SCAN
    while pos < size:
        chunk = f.read(step)
        step = min(2 * step, _SCAN)
        if not chunk:
            break
        nl = chunk.find(b"\n")
        if nl >= 0:
            return pos + nl + 1
        pos += len(chunk)
    return size


def file_cuts(path: str, part_bytes: int) -> list[int]:
    """The part boundaries of one plain file: ``[0, c1, ..., size]``."""
    size = storage.size(path)
    if is_compressed(path) or is_columnar(path) or size <= part_bytes:
        return [0, size]
    cuts = [0]
    with storage.open_input(path) as f:  # an object: a range request at each cut point, nothing else
        target = part_bytes
        while target < size:
            cut = _next_line_start(f, target - 1, size)
            if cut >= size:
                break
            if cut > cuts[-1]:
                cuts.append(cut)
            target = (cut // part_bytes + 1) * part_bytes  # the next multiple past this cut
    cuts.append(size)
    return cuts


def plan_parts(paths: list[str], part_bytes: int) -> list[InputPart]:
    """Every input's parts, in input order (file, then offset)."""
    parts: list[InputPart] = []
    for i, path in enumerate(paths):
        cuts = file_cuts(path, part_bytes)
        for number, (start, end) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)):
            parts.append(InputPart(len(parts), i, path, start, end, number, whole=len(cuts) == 2))
    return parts


def line_bases(parts: Sequence[InputPart], lines: Sequence[int]) -> list[int]:
    """Each part's line base: the lines of the earlier parts of its own file (``lines[i]``: the lines of
    ``parts[i]``, a plan's parts in order). A part numbers its lines from 1; its line ``n`` is line
    ``base + n`` of the file. The one place a part's line numbers are made the file's (errors and rejects alike);
    the last part's own count is not used."""
    bases, seen = [], Counter[int]()
    for part, n in zip(parts, lines, strict=True):
        bases.append(seen[part.file])
        seen[part.file] += n
    return bases
