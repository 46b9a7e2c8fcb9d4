"""The plan of input parts: the inputs cut into byte ranges of whole lines, independently of how many workers run them.

A plain JSONL file larger than ``read.part_bytes`` is cut near every multiple ``k * part_bytes`` of that size,
just after the first newline at or past byte ``k * part_bytes - 1``; a part owns the lines that start inside it.
A line longer than a part makes the next cut fall after it (no part is empty unless its file is). A compressed
file, a Parquet or Arrow file, a text file read by paragraph or as one document, and a file no larger than
``part_bytes`` are one part each (``is_whole``); a text file read by line is cut as JSON Lines is. Finding a cut reads
from the cut point to the next newline, nothing else, so planning a terabyte costs a few thousand short reads.

A file whose first record is a conversation (``shapes.is_conversation``: messages, ShareGPT, Alpaca; read by
``read.first_record``) is cut by the same rule at ``chat_part_bytes(part_bytes)``, 16 times finer (16 MiB for the
default 256 MiB, never under 8 MiB or ``part_bytes`` if that is less): rendering, weighing and aligning a
conversation costs ~30 times what reading the same bytes of pieces does, and a part is the unit that workers share,
so a conversation file of a few hundred megabytes cut at ``part_bytes`` would be rendered on one core. The plan still
depends on the inputs and ``part_bytes`` alone.

A plain JSON array is cut by the same rule with its separating ``,`` for the newline
(``weightprep.distribute.plan_array``). Where a record starts is known only by scanning from the array's start,
so planning it exactly costs one streaming pass over the file up to its last cut, summarized a chunk at a time on
a few threads (bounded memory; an object in a store is read once more for it); an array whose brackets do not
balance is one part. A build plans with ``exact=False``: an array laid out one record to its own lines is cut
where its head's layout says records start, and its parts' readers check it (``plan_array.guessed_cuts``).

With several sources (``weightprep.sources``) the plan is ``K`` mixed parts (``plan_mixed``), ``K`` from the
total input size and ``part_bytes`` alone: each source's files, taken as one stream of bytes, are cut near
``k / K`` of its size for k = 1 .. K-1 (just after a newline, as above), and mixed part ``k`` reads the k-th of
these ranges of every source (K counts parts of ``chat_part_bytes`` where a source's first plain file holds
conversations), so every part holds a ``1/K`` slice of each source and the job interleaves them
(``weightprep.distribute.job``). A compressed or columnar file is not cut: it goes whole to the part where it
starts. Its pieces (``InputPart``s, numbered over the whole plan) are its segments.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from weightprep import storage
from weightprep.errors import is_columnar, is_compressed
from weightprep.stages.columns import Columns

__all__ = [
    "InputPart", "MixedPart", "is_whole", "plan_parts", "plan_mixed", "line_bases", "segment_line_bases",
    "chat_part_bytes", "holds_conversations",
]

#: Bytes read at a time looking for a cut's newline: 4 KiB first, doubled up to _SCAN (in a store each read is a
#: range request: a cut costs a few kilobytes, not a megabyte)
_SCAN = 1 << 20
_FIRST_SCAN = 1 << 12


#: How many times finer than ``read.part_bytes`` a file of conversations is cut (``chat_part_bytes``).
CHAT_PART_DIVISOR = 16
#: The smallest part of conversations ``chat_part_bytes`` makes (unless ``part_bytes`` is smaller): a worker's
#: start (imports, the tokenizer and its chat template: ~1-2 s) must be worth the part it renders.
CHAT_PART_FLOOR = 8 << 20


def chat_part_bytes(part_bytes: int) -> int:
    """The part size of a file of conversations, for ``read.part_bytes`` = ``part_bytes``."""
    return max(part_bytes // CHAT_PART_DIVISOR, min(part_bytes, CHAT_PART_FLOOR))


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
    #: A JSON array's part whose range the plan guessed (``plan_array.guessed_cuts``): the target offset its reader
    #: checks the range against; None: planned exactly.
    check: int | None = None

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


def is_whole(path: str, text_sample_by: str = "line") -> bool:
    """Whether ``path`` is read whole, as one part (see the module docstring)."""
    from weightprep.stages.read import file_kind

    if is_compressed(path) or is_columnar(path):
        return True
    return file_kind(path) == "text" and text_sample_by != "line"


def _array_cuts(path: str, targets: list[int], exact: bool) -> tuple[list[int], list[int | None]] | None:
    """The cuts of a plain JSON array at ``targets`` and the check of each of the parts they make:
    ``guessed_cuts`` unless ``exact`` (or the file's head shows no layout to guess from), else ``record_cuts``
    (none if it is malformed: one part reads it and names the fault; no checks). None if ``path`` is no JSON
    array."""
    from weightprep.distribute.plan_array import guessed_cuts, record_cuts
    from weightprep.stages.read import file_kind

    if not targets or file_kind(path) != "json_array":
        return None
    with storage.open_input(path) as f:
        guessed = None if exact else guessed_cuts(f, targets)
        if guessed is not None:
            return guessed
        f.seek(0)
        with storage.open_input(path) as near:  # the scan, and reads at each cut
            cuts = record_cuts(f, near, targets) or []
    return cuts, [None] * (len(cuts) + 1)


def file_cuts(
    path: str, part_bytes: int, text_sample_by: str = "line", *, exact: bool = True, columns: Columns | None = None
) -> list[int]:
    """The part boundaries of one file: ``[0, c1, ..., size]`` (``exact``, ``columns``: see ``plan_parts``)."""
    return _file_plan(path, part_bytes, text_sample_by, exact, columns)[0]


def _file_plan(
    path: str, part_bytes: int, text_sample_by: str, exact: bool, columns: Columns | None = None
) -> tuple[list[int], list[int | None]]:
    """``file_cuts`` and each part's check (``InputPart.check``)."""
    size = storage.size(path)
    if size <= chat_part_bytes(part_bytes) or is_whole(path, text_sample_by):
        return [0, size], [None]
    targets = _targets(path, size, part_bytes, columns)
    if not targets:
        return [0, size], [None]
    inner, checks = _cuts_at(path, size, targets, exact)
    return [0, *inner, size], checks


def _targets(path: str, size: int, part_bytes: int, columns: Columns | None) -> list[int]:
    """Where the cuts of a file of ``size`` bytes are sought: every multiple of ``part_bytes``; for a file of
    conversations, the ``k / K`` of its size for K parts of at most ``chat_part_bytes`` (parts of equal size: they are
    the work that the workers share)."""
    if holds_conversations(path, columns):
        k_parts = math.ceil(size / chat_part_bytes(part_bytes))
        return [-(-k * size // k_parts) for k in range(1, k_parts)]  # ceil(k * size / K)
    return list(range(part_bytes, size, part_bytes))


def holds_conversations(path: str, columns: Columns | None) -> bool:
    """Whether ``path``'s first record is a conversation (``read.first_record``, ``shapes.is_conversation``)."""
    from weightprep.stages.read import first_record
    from weightprep.stages.shapes import is_conversation

    record = first_record(path)
    return record is not None and is_conversation(record, columns)


def plan_parts(
    paths: list[str], part_bytes: int, text_sample_by: str = "line", *, exact: bool = True,
    columns: Columns | None = None,
) -> list[InputPart]:  # fmt: skip
    """Every input's parts, in input order (file, then offset). ``exact=False``: a large JSON array's cuts may be
    guessed from its layout (``plan_array.guessed_cuts``), each such part carrying the ``check`` its reader makes;
    a build of such a plan is built again from the exact plan if a check fails (``weightprep.pipeline``).
    ``columns`` (``--columns``) names the fields of the first records that tell a file of conversations."""
    parts: list[InputPart] = []
    for i, path in enumerate(paths):
        cuts, checks = _file_plan(path, part_bytes, text_sample_by, exact, columns)
        for number, (start, end, check) in enumerate(zip(cuts[:-1], cuts[1:], checks, strict=True)):
            parts.append(InputPart(len(parts), i, path, start, end, number, len(cuts) == 2, check))
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


@dataclass(frozen=True)
class MixedPart:
    """Mixed part ``index`` of a build with sources: ``segments`` (byte ranges of the sources' files, each an
    ``InputPart`` whose ``file`` is its index among all the sources' files), ``sources[j]`` the source of
    ``segments[j]``; segments in source order, then file order."""

    index: int
    segments: tuple[InputPart, ...]
    sources: tuple[int, ...]

    @property
    def size(self) -> int:
        return sum(s.size for s in self.segments)


def _cuts_at(path: str, size: int, targets: list[int], exact: bool) -> tuple[list[int], list[int | None]]:
    """The line starts just at or after each offset of ``targets`` (ascending, inside the file), deduplicated, and
    the checks of the ranges they make (``_array_cuts``)."""
    array = _array_cuts(path, targets, exact)
    if array is not None:
        return array
    cuts: list[int] = []
    with storage.open_input(path) as f:  # an object: a range request at each cut point, nothing else
        for target in targets:
            if cuts and target <= cuts[-1]:  # a line longer than a part passed it
                continue
            cut = _next_line_start(f, target - 1, size)
            if cut >= size:
                break  # the last line holds this target and every later one
            cuts.append(cut)  # past target - 1, which is at or past the last cut: always a new one
    return cuts, [None] * (len(cuts) + 1)


def plan_mixed(
    sources: list[list[str]], part_bytes: int, text_sample_by: str = "line", *, exact: bool = True,
    columns: Sequence[Columns | None] | None = None,
) -> list[MixedPart]:  # fmt: skip
    """The mixed parts of the sources' files (``sources[s]``: source ``s``'s files, in order); see the module
    docstring (``exact``: as ``plan_parts``'s). Parts left with no segment (only whole files elsewhere) are not
    planned. Where a source's first plain file holds conversations (its ``columns[s]`` naming their fields), K counts
    parts of ``chat_part_bytes``, as for one file."""
    sizes = [[storage.size(p) for p in paths] for paths in sources]
    names = columns if columns is not None else [None] * len(sources)
    chat = any(
        holds_conversations(next(p for p in paths if not is_whole(p, text_sample_by)), names[s])
        for s, paths in enumerate(sources) if any(not is_whole(p, text_sample_by) for p in paths)
    )  # fmt: skip
    unit = chat_part_bytes(part_bytes) if chat else part_bytes
    k_parts = max(1, math.ceil(sum(map(sum, sizes)) / unit))
    ranges: list[list[tuple[int, InputPart]]] = [[] for _ in range(k_parts)]
    file_index = 0
    for s, (paths, file_sizes) in enumerate(zip(sources, sizes, strict=True)):
        total = sum(file_sizes)
        targets = [k * total // k_parts for k in range(1, k_parts)]
        base = 0
        for path, size in zip(paths, file_sizes, strict=True):
            inside = [t - base for t in targets if base < t < base + size]
            plain = not is_whole(path, text_sample_by)
            inner, checks = _cuts_at(path, size, inside, exact) if plain and inside else ([], [None])
            cuts = [0, *inner, size]
            for number, (start, end, check) in enumerate(zip(cuts[:-1], cuts[1:], checks, strict=True)):
                part = InputPart(-1, file_index, path, start, end, number, len(cuts) == 2, check)
                ranges[bisect.bisect_right(targets, base + start)].append((s, part))
            base += size
            file_index += 1
    mixed: list[MixedPart] = []
    index = 0
    for segments in ranges:
        if not segments:
            continue
        numbered = []
        for _, part in segments:
            numbered.append(dataclasses.replace(part, index=index))
            index += 1
        mixed.append(MixedPart(len(mixed), tuple(numbered), tuple(s for s, _ in segments)))
    return mixed


def segment_line_bases(parts: Sequence[MixedPart], lines: Sequence[Sequence[int]]) -> list[list[int]]:
    """``line_bases`` of the segments of mixed parts (``lines[i][j]``: the lines of ``parts[i].segments[j]``): a
    file's segments lie in increasing parts, one per part at most."""
    flat = [seg for part in parts for seg in part.segments]
    bases = iter(line_bases(flat, [n for part_lines in lines for n in part_lines]))
    return [[next(bases) for _ in part.segments] for part in parts]
