"""Where the plan cuts a plain JSON array into input parts: just past the first separating ``,`` at or after
``target - 1`` for each target offset (the rule JSON Lines is cut by, a newline there), skipping a target that an
earlier cut already passed.

Whether a ``,`` separates records depends on everything before it (inside a string? how deep?), so the state at a
target is known only from the array's first byte. It is found in two passes, the first parallel:

1. The file up to the last target is cut into chunks (a chunk ends at each ``target - 1``, and every
   ``chunk_bytes`` between), read in order and summarized on a pool of threads (NumPy releases the GIL): a chunk's
   real quotes (an odd run of backslashes escapes one) and its brackets, for each state it may start in -- inside
   a string or not, and, inside one, after an odd or an even run of backslashes (which can only change its first
   quote). Summary: whether it ends inside a string, its net change of depth and the lowest depth it reaches.
   A chunk is two comparisons and two ``flatnonzero`` over its bytes, about 4x faster than the splitter's full
   scan, which also finds commas and newlines and rewrites the bytes.
2. The summaries are chained from the file's start (not inside a string, depth 0), which gives the exact state at
   each ``target - 1``; from there the splitter itself (``ArrayScanner``, set to that state) reads on to the first
   separating ``,``: the cut. A few kilobytes a target.

The state is the splitter's, byte for byte, so the cuts are those of one splitter pass over the file, and each
part's reader (which starts in that state) meets its records exactly. Where the first pass cannot say -- the depth
falls to 0 before the last target (the array closes early, or its brackets do not balance), a chunk of
backslashes only, a fault where the splitter reads on from a target -- the plan makes that one pass instead (``sequential_cuts``), which stops at the first fault:
the array is then one part, and its reader names the fault. An empty element (``,,``) leaves the depth as it is:
the plan cuts around it and the part holding it names it, numbered as the file's record
(``weightprep.distribute.plan.line_bases``).

Memory: a few chunks in flight (twice the threads) and each thread's work arrays (``Scratch``: two bytes a byte of
its chunk, and the positions of its quotes and brackets).

A build does not make that pass where it can guess (``guessed_cuts``): most arrays put each record on its own
lines, the same bytes between any two (``,\\n  {`` from ``json.dump(indent=2)``, ``,\\n{`` one record a line),
and a raw newline cannot be inside a string. The splitter reads the file's head (4 MiB) exactly; where its
separators are all followed by the same bytes holding a newline, and those bytes occur nowhere else there
(``layout``), each cut is guessed as just past the first occurrence at or after ``target - 1``: a few kilobytes
read a target instead of a pass over the file (1 GiB: 0.13 s against 0.63-0.69 s on 2 cores,
``benchmarks/json_array_bench.py``). The guess is checked where the state is known for free, by the part readers:
part 0 starts at the file's start, and a part whose start is right knows the splitter's state throughout, so it
checks that it ends just after the first separating ``,`` at or after its target (the last part: that none follows
it; ``json_array.array_blocks``). By induction every part is right if every check passes; the first wrong cut is
found by the part before it, whose error comes first in input order (``executors.run_parts``), and the build then
plans exactly and builds again (``weightprep.pipeline.build``, which says so): a build's parts are always the exact
plan's.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from weightprep.stages.json_array import (
    SPACE,
    ArrayScanner,
    Scratch,
    depth_changes,
    escaped,
    outside,
    structure,
)

__all__ = ["guessed_cuts", "layout", "record_cuts", "sequential_cuts"]

_QUOTE = ord('"')
_scratch = threading.local()
#: Bytes read at a time by the second pass, from a target on: 64 KiB first, doubled up to the chunk size.
_FIRST_READ = 64 << 10
_NO_BRACKET = 1 << 62


@dataclass(frozen=True)
class _Summary:
    """One chunk of the first pass. ``cases[c]``: (ends inside a string, net change of depth, lowest depth reached
    relative to its start: after one of its brackets, ``_NO_BRACKET`` if it has none) for case ``c``: 0 starting outside a string, 1 inside after an
    even run of backslashes, 2 inside after an odd run. ``tail``: the run of backslashes it ends with (``len``:
    all backslashes)."""

    size: int
    tail: int
    cases: tuple[tuple[bool, int, int], ...]


def _summary(chunk: bytes) -> _Summary:
    data = np.frombuffer(chunk, dtype=np.uint8)
    scratch = _scratch.__dict__.setdefault("scratch", Scratch())  # one a thread of the pool
    quotes = scratch.find(data, _QUOTE)
    where = structure(data, scratch)
    delta = depth_changes(data, where)

    def case(real: np.ndarray, out_even: np.ndarray, inside: bool) -> tuple[bool, int, int]:
        depths = np.cumsum(delta[out_even != inside])  # (from inside a string: outside after an odd count)
        if not len(depths):
            return bool((len(real) & 1) ^ inside), 0, _NO_BRACKET
        return bool((len(real) & 1) ^ inside), int(depths[-1]), int(depths.min())

    real = quotes[~escaped(chunk, data, quotes, 0)]
    even = outside(real, where, False)
    out, inside_even = case(real, even, False), case(real, even, True)
    inside_odd = inside_even
    first = int(quotes[0]) if len(quotes) else -1
    if first >= 0 and not chunk[:first].strip(b"\\"):  # its first quote follows a run from the chunk's start
        real = quotes[~escaped(chunk, data, quotes, 1)]
        inside_odd = case(real, outside(real, where, False), True)
    tail = len(chunk) - len(chunk.rstrip(b"\\"))
    return _Summary(len(chunk), tail, (out, inside_even, inside_odd))


def _chunks(stream: BinaryIO, bounds: Sequence[int], chunk_bytes: int) -> Iterator[bytes]:
    """The file's bytes from its start, in chunks ending at each of ``bounds`` and every ``chunk_bytes`` between."""
    offset = 0
    for bound in bounds:
        while offset < bound:
            chunk = stream.read(min(chunk_bytes, bound - offset))
            if not chunk:
                return
            offset += len(chunk)
            yield chunk


def _cut_from(
    stream: BinaryIO, pos: int, in_string: bool, carried: int, depth: int, chunk_bytes: int
) -> int | None:
    """The offset just past the first separating ``,`` at or after ``pos``, where the splitter's state is the one
    given (``carried``: the run of backslashes before ``pos``, inside a string; an empty element is not looked
    for). None: the array closes first or the file ends; ValueError: it closes with a fault."""
    scanner = ArrayScanner(inside=True, check=False)
    scanner.in_string, scanner.backslashes, scanner.depth = in_string, carried, depth
    stream.seek(pos)
    offset, step = pos, _FIRST_READ
    while True:
        chunk = stream.read(step)
        if not chunk:
            return None
        _, separators = scanner.scan(chunk)
        commas = separators[np.frombuffer(chunk, dtype=np.uint8)[separators] == ord(",")]
        if len(commas):
            return offset + int(commas[0]) + 1
        if scanner.closed:
            return None
        offset, step = offset + len(chunk), min(2 * step, chunk_bytes)


class _Fallback(Exception):
    """The first pass cannot give the state: the plan makes the one sequential pass."""


def record_cuts(
    path_stream: BinaryIO,
    cut_stream: BinaryIO,
    targets: Sequence[int],
    chunk_bytes: int = 4 << 20,
    threads: int | None = None,
) -> list[int] | None:
    """The cuts of the array in ``path_stream`` (from the file's start; ``cut_stream``: a second stream of the same
    file, for the second pass) at ``targets`` (ascending file offsets). None: the array is malformed before the
    last cut (its one part reads it and names the fault)."""
    if not targets:
        return []
    threads = threads or min(
        4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )
    try:
        return _two_pass(path_stream, cut_stream, targets, chunk_bytes, threads)
    except (_Fallback, ValueError):
        path_stream.seek(0)
        return sequential_cuts(path_stream, targets)


def _two_pass(
    stream: BinaryIO, cut_stream: BinaryIO, targets: Sequence[int], chunk_bytes: int, threads: int
) -> list[int]:
    bounds = sorted({max(0, t - 1) for t in targets})
    cuts: list[int] = []
    pending = deque(t for t in targets)
    in_string, depth, tail, offset = False, 0, 0, 0

    def at_bound() -> bool:
        """Cut the targets whose ``target - 1`` is ``offset``; False once there is nothing more to cut."""
        while pending and max(0, pending[0] - 1) <= offset:
            target = pending.popleft()
            if cuts and cuts[-1] >= target:
                continue
            if depth < 1:  # before the opening '[' (a target at 0 or 1), or closed
                raise _Fallback
            cut = _cut_from(cut_stream, offset, in_string, tail if in_string else 0, depth, chunk_bytes)
            if cut is None:  # the array closes (or the file ends) before another separator: no more cuts
                pending.clear()
                return False
            cuts.append(cut)
        return bool(pending)

    if not at_bound():
        return cuts
    with ThreadPoolExecutor(threads) as pool:
        inflight: deque[Future[_Summary]] = deque()
        chunks = _chunks(stream, bounds, chunk_bytes)
        try:
            while True:
                while len(inflight) < 2 * threads:
                    chunk = next(chunks, None)
                    if chunk is None:
                        break
                    inflight.append(pool.submit(_summary, chunk))
                if not inflight:
                    break
                summary = inflight.popleft().result()
                if summary.tail == summary.size:
                    raise _Fallback  # all backslashes: the run carried on is longer than one chunk tells
                ends_inside, change, lowest = summary.cases[0 if not in_string else 1 + (tail & 1)]
                if depth + lowest < 1:  # the array closes (or a bracket does not match) before the last cut
                    raise _Fallback
                in_string, depth, tail, offset = (
                    ends_inside,
                    depth + change,
                    summary.tail,
                    offset + summary.size,
                )
                if not at_bound():
                    return cuts
        finally:
            for future in inflight:
                future.cancel()
    return cuts


def sequential_cuts(stream: BinaryIO, targets: Sequence[int], chunk_bytes: int = 8 << 20) -> list[int] | None:
    """``record_cuts`` by one pass of the splitter over the file, a chunk in memory at a time, stopped once the last
    target is cut. None: the array is malformed before then."""
    cuts: list[int] = []
    left = list(targets)
    if not left:
        return cuts
    scanner, offset, i = ArrayScanner(), 0, 0
    while i < len(left):
        chunk = stream.read(chunk_bytes)
        if not chunk:
            break
        try:
            _, separators = scanner.scan(chunk)
        except ValueError:  # EmptyElement included
            return None
        if len(separators):
            data = np.frombuffer(chunk, dtype=np.uint8)
            commas = separators[data[separators] == ord(",")] + offset
            while i < len(left):
                if cuts and cuts[-1] >= left[i]:
                    i += 1
                    continue
                k = int(np.searchsorted(commas, left[i] - 1))
                if k == len(commas):
                    break
                cuts.append(int(commas[k]) + 1)
                i += 1
        offset += len(chunk)
    return cuts


#: The head of the file scanned exactly to learn its layout (``layout``), and the separators it must show.
_HEAD_BYTES = 4 << 20
_HEAD_SEPARATORS = 4


def layout(stream: BinaryIO, head_bytes: int = _HEAD_BYTES) -> bytes | None:
    """The bytes between records of a line-broken array (``b",\\n  {"`` as ``json.dump(indent=2)`` writes them, ``b",\\n{"``
    for one record a line), learnt from the file's head by the splitter itself: every separating ``,`` of the
    head is followed by them, they hold a newline, and they occur nowhere else in the head. None: the head shows
    no such bytes (records on one line, mixed layouts, fewer than four separators)."""
    stream.seek(0)
    head = stream.read(head_bytes)
    scanner = ArrayScanner(check=False)
    try:
        _, separators = scanner.scan(head)
    except ValueError:
        return None
    if scanner.start is None:  # no '[' in the head
        return None
    data = np.frombuffer(head, dtype=np.uint8)
    commas = separators[data[separators] == ord(",")]
    solid = np.flatnonzero(~SPACE[data])  # the head's bytes other than whitespace
    after = np.searchsorted(solid, commas + 1)
    shown = after < len(solid)  # the head holds the next record's first byte
    commas, ends = commas[shown].tolist(), solid[after[shown]].tolist()
    gaps = {head[p : q + 1] for p, q in zip(commas, ends, strict=True)}
    if len(commas) < _HEAD_SEPARATORS or len(gaps) != 1:
        return None
    (gap,) = gaps
    if gap[-1:] != b"{" or b"\n" not in gap:
        return None
    found, at = [], head.find(gap)
    while at >= 0:
        found.append(at)
        at = head.find(gap, at + 1)
    return gap if found == commas else None


def _find(stream: BinaryIO, pos: int, gap: bytes, chunk_bytes: int) -> int | None:
    """The offset of the first ``gap`` at or after ``pos``; None: there is none."""
    stream.seek(pos)
    step, held, base = _FIRST_READ, b"", pos  # held: the last bytes of the previous read, a gap may span them
    while True:
        chunk = stream.read(step)
        if not chunk:
            return None
        window = held + chunk
        at = window.find(gap)
        if at >= 0:
            return base + at
        held = window[max(0, len(window) - len(gap) + 1) :]
        base += len(window) - len(held)
        step = min(2 * step, chunk_bytes)


def guessed_cuts(
    stream: BinaryIO, targets: Sequence[int], chunk_bytes: int = 4 << 20, head_bytes: int | None = None
) -> tuple[list[int], list[int | None]] | None:
    """The cuts of ``record_cuts`` guessed from the file's layout without scanning it: just past the ``,`` of the
    first ``layout`` gap at or after each ``target - 1`` (a few kilobytes read a target), and each part's check:
    ``checks[i]`` the target whose cut ends part ``i`` (the last part's: the target after which no gap was found,
    None if every target was cut). A part's reader knows the splitter's state, so it checks that its range ends
    just after the first separating ``,`` at or after ``check - 1`` (the last part: that there is none): the cuts of
    a plan whose every part passed are ``record_cuts``'s (``weightprep.pipeline`` plans a file exactly and builds
    again otherwise). None: no layout to guess from."""
    gap = layout(stream, head_bytes or _HEAD_BYTES)
    if gap is None:
        return None
    cuts: list[int] = []
    checks: list[int | None] = []
    for target in targets:
        if cuts and cuts[-1] >= target:
            continue
        at = _find(stream, max(0, target - 1), gap, chunk_bytes)
        if at is None:
            checks.append(target)
            return cuts, checks
        cuts.append(at + 1)
        checks.append(target)
    checks.append(None)
    return cuts, checks
