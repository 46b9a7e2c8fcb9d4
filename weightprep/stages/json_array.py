"""Stage 1, JSON arrays: a ``.json`` file holding one array of records (``[{...}, {...}]``, as LLaMA-Factory and many
Hub repositories ship their data), streamed in bounded memory and handed on as blocks of JSON lines, one record a
line, so the records go through exactly the validation of JSON Lines input.

The splitter never parses a record. It scans each chunk of the stream with NumPy for the bytes that shape the
array: the quotes that open and close strings (a quote preceded by an odd run of backslashes is escaped), and,
outside strings, brackets and commas. The depth of nesting is the running sum of brackets; a comma at depth 1 ends
a record, and so does the ``]`` that closes the array. In the block handed on, each of those separators becomes the
record's newline and every newline inside a record (pretty-printed JSON) a space, so a record is one line of
exactly the bytes it spans in the file: a line's byte offset is the record's, and the pyarrow fast path and the
exact path of ``weightprep.stages.validate`` read the lines as they read JSON Lines. A raw newline inside a string
(invalid JSON) becomes the control byte 0x1f, which both parsers refuse as well: the record is rejected, never read
as something else.

Records are numbered from 0 as in the array (``data[412]``, ``jq '.[412]'``); errors read ``data.json: record
412: messages[1].weight: ...``. State crossing a chunk (inside a string, an odd backslash run, the depth) is
carried, so every byte is scanned once; memory holds a block and the record being read, and a record longer than
``max_line_bytes`` is skipped past (its first bytes kept for the reject), never held whole. What breaks the array
itself -- an empty element (``,,`` or a trailing comma), bytes after the closing ``]``, a file that ends inside the
array -- stops the read with an ``InputError`` naming the record, as a truncated compressed file does: nothing after
it can be numbered.

Cost: a few NumPy passes over each chunk (about 1 GB/s on one core), far below the parse of the records.

Parts. Where a record starts is known only by scanning from the start, so a large (uncompressed) array is cut into
input parts (``weightprep.distribute.plan``) by one scan at plan time, ``record_cuts``: the same splitter over
the file, keeping, for each target offset, the offset just past the first separating ``,`` at or after it (JSON
Lines is cut just past a newline by the same rule). A part is then a byte range that starts just after a ``,`` (or
at the file's start) and ends just after a ``,`` (or at the file's end): ``array_blocks(..., inside=True)`` reads
it as the array's elements from there (the scanner starts at depth 1, past the ``[``), ``ends_inside=True`` as a
range that stops after a separator rather than at the closing ``]``. Its records are numbered from 0 within the
part, as a JSON Lines part numbers its lines from 1; ``plan.line_bases`` makes them the file's. A malformed array
is not cut (the plan's scan stops at the first fault): its one part reads it and names the fault.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

import numpy as np

from weightprep.batches import Block
from weightprep.errors import InputError

__all__ = ["ArrayScanner", "array_blocks", "record_cuts"]

_QUOTE, _NEWLINE, _OPEN, _CLOSE, _COMMA = 1, 3, 4, 5, 6
_TABLE = bytearray(256)
for _byte, _code in (('"', _QUOTE), ("\n", _NEWLINE), ("{", _OPEN), ("[", _OPEN), ("}", _CLOSE), ("]", _CLOSE),
                     (",", _COMMA)):  # fmt: skip
    _TABLE[ord(_byte)] = _code
#: bytes.translate's table: each byte to its mark code (0: not a mark).
_MARKS = bytes(_TABLE)
_SPACE = np.zeros(256, dtype=bool)
_SPACE[[ord(" "), ord("\t"), ord("\r"), ord("\n")]] = True
#: What a raw newline inside a string becomes: a control byte that Python's json and pyarrow both refuse there.
_IN_STRING_NEWLINE = 0x1F


class EmptyElement(ValueError):
    """An empty element of the array: the ``index``-th separator of the chunk ends it."""

    def __init__(self, index: int) -> None:
        super().__init__("an empty element (two commas in a row, or a comma before ']')")
        self.index = index


class ArrayScanner:
    """The splitter's state across chunks. ``scan`` returns the chunk as it goes into blocks (newlines turned into
    spaces, separators into newlines) and the positions of the separators that end records; ``start`` is set to
    the position just after the opening ``[`` in the chunk that holds it."""

    def __init__(self, inside: bool = False) -> None:
        self.in_string = False
        self.backslashes = 0  # the run of backslashes that ends the stream so far (inside a string)
        # inside: the stream starts just after a separating ',' of the array (an input part's range)
        self.depth = 1 if inside else 0
        self.opened = inside
        self.closed = False
        self.start: int | None = None
        self.last_solid = ord(",") if inside else -1  # the last byte so far that is not whitespace

    def scan(self, chunk: bytes) -> tuple[np.ndarray, np.ndarray]:
        data = np.frombuffer(chunk, dtype=np.uint8)
        out = data.copy()
        self.start = None
        if self.closed:
            if not _SPACE[data].all():
                raise ValueError("bytes after the array's closing ']'; a file holds one array")
            return out, np.zeros(0, dtype=np.int64)
        # every byte that shapes the array, by one table lookup a byte (bytes.translate: C speed)
        codes = np.frombuffer(chunk.translate(_MARKS), dtype=np.uint8)
        marks = np.flatnonzero(codes.view(bool))
        kinds = codes[marks]
        is_quote = kinds == _QUOTE
        quotes = marks[is_quote]
        if len(quotes):
            is_quote[np.flatnonzero(is_quote)[self._escaped(chunk, data, quotes)]] = False
        carried = self._carry(chunk)
        # a mark is inside a string when an odd number of real quotes precede it (counting the carried state)
        before_quotes = np.cumsum(is_quote) - is_quote
        inside = (before_quotes + self.in_string) % 2 == 1
        self.in_string = bool((int(is_quote.sum()) + self.in_string) % 2)
        self.backslashes = carried if self.in_string else 0
        newline = kinds == _NEWLINE
        out[marks[newline]] = np.where(inside[newline], _IN_STRING_NEWLINE, ord(" "))
        structural = ~inside & (kinds >= _OPEN)
        where, kind = marks[structural], kinds[structural]
        delta = np.where(kind == _OPEN, 1, np.where(kind == _CLOSE, -1, 0)).astype(np.int64)
        after = self.depth + np.cumsum(delta)
        before = after - delta
        if not self.opened and len(where):
            self.opened, self.start = True, int(where[0]) + 1  # the sniffed '[' (weightprep.stages.read.file_kind)
        zero = np.flatnonzero(after == 0)
        if len(zero):  # the array closes: by ']', and only whitespace may follow
            k = int(zero[0])
            if data[where[k]] != ord("]"):
                raise ValueError(f"unbalanced brackets: a '{chr(data[where[k]])}' closes the array")
            if not _SPACE[data[int(where[k]) + 1 :]].all():
                raise ValueError("bytes after the array's closing ']'; a file holds one array")
            self.closed = True
            where, kind, before, after = where[: k + 1], kind[: k + 1], before[: k + 1], after[: k + 1]
        ends = (before == 1) & ((kind == _COMMA) | (after == 0))
        self.depth = int(after[-1]) if len(after) else self.depth
        separators = where[ends]
        if self.opened:
            self._check_elements(data, separators)
        out[separators] = ord("\n")
        return out, separators

    def _check_elements(self, data: np.ndarray, separators: np.ndarray) -> None:
        """Refuse an empty element: a separator whose last byte before it, whitespace aside, is the one before it
        (a ',' or the opening '['; nothing else can be: a deeper ',' or '[' leaves the depth above 1). The last
        such byte of the chunk is carried."""
        before = data[np.maximum(separators - 1, 0)]
        # most separators follow a '}', ']', '"' or a digit: only those after whitespace or a mark are walked back
        suspect = _SPACE[before] | (before == ord(",")) | (before == ord("[")) | (separators == 0)
        for i in np.flatnonzero(suspect).tolist():
            p = int(separators[i])
            q = p - 1
            while q >= 0 and _SPACE[data[q]]:
                q -= 1
            solid = self.last_solid if q < 0 else int(data[q])
            if solid in (ord(","), ord("[")) and not (solid == ord("[") and data[p] == ord("]")):
                raise EmptyElement(i)
        q = len(data) - 1
        while q >= 0 and _SPACE[data[q]]:
            q -= 1
        if q >= 0:
            self.last_solid = int(data[q])

    def _escaped(self, chunk: bytes, data: np.ndarray, quotes: np.ndarray) -> np.ndarray:
        """Whether each quote is escaped: an odd run of backslashes just before it (the carried run included). Only
        the quotes right after a backslash are walked back (few: JSON escapes quotes inside strings only)."""
        escaped = np.zeros(len(quotes), dtype=bool)
        after_slash = data[np.maximum(quotes - 1, 0)] == ord("\\")
        after_slash[quotes == 0] = self.backslashes % 2 == 1
        for i in np.flatnonzero(after_slash).tolist():
            q, run = int(quotes[i]) - 1, 0
            while q >= 0 and chunk[q] == 0x5C:
                run, q = run + 1, q - 1
            escaped[i] = (run + (self.backslashes if q < 0 else 0)) % 2 == 1
        return escaped

    def _carry(self, chunk: bytes) -> int:
        """The run of backslashes that ends this chunk (added to the carried one if it spans the chunk)."""
        run = len(chunk) - len(chunk.rstrip(b"\\"))
        return run + (self.backslashes if run == len(chunk) else 0)


def array_blocks(
    path: str, stream: BinaryIO, block_bytes: int, max_record_bytes: int, read: Any, *,
    origin: int = 0, inside: bool = False, ends_inside: bool = False,
) -> Iterator[Block]:
    """Blocks of the records of the JSON array in ``stream``, one record a line, numbered from 0 (``Block``'s
    ``first_line`` is the record's index, its ``offset`` the file offset of the record's first byte). ``read(n, record, offset)``
    reads the stream, turning a decompression error into an ``InputError``; the stream starts at the file's start
    (a byte order mark, if any, is whitespace to the scanner: it precedes the opening bracket), or, for an input
    part (``inside``), at file offset ``origin``, just after a separating ``,``; ``ends_inside``: the stream ends
    just after one (a part before the file's last), not at the closing ``]``."""
    scanner = ArrayScanner(inside)
    record = 0  # index of the next record to hand on (within the part)
    offset = origin  # file offset of the next byte to read
    begin = origin  # file offset of that record's first byte
    pending: list[bytes] = []
    pending_len = 0
    head = b""  # the first bytes of a record too long to hold (then pending is empty)
    skipping = False
    step = max(1, min(block_bytes, max_record_bytes))

    def fail(problem: str) -> InputError:
        return InputError(path, record, "<json>", f"malformed JSON array: {problem}", reason="malformed_json", offset=begin)

    while True:
        chunk = read(step, record, begin)
        if not chunk:
            break
        try:
            out, separators = scanner.scan(chunk)
        except EmptyElement as exc:
            record += exc.index
            raise fail(str(exc)) from None
        except ValueError as exc:
            raise fail(str(exc)) from None
        lo = 0
        if scanner.start is not None:
            lo, begin = scanner.start, offset + scanner.start
        if not scanner.opened:  # whitespace (and a BOM) before '['
            offset += len(chunk)
            begin = offset
            continue
        body = memoryview(out)[lo:]  # (views: the block's bytes are copied once, by the join below)
        separators = separators - lo
        if len(separators):
            last = int(separators[-1]) + 1
            if skipping:  # the too-long record ends at the first separator
                first = int(separators[0]) + 1
                yield Block(path, record, 1, head, begin, too_long=pending_len + first - 1)
                record, begin, skipping, head, pending, pending_len = record + 1, begin + pending_len + first, False, b"", [], 0
                body, separators, last = body[first:], separators[1:] - first, last - first
            if len(separators):
                data = b"".join([*pending, body[:last]])
                empty = record == 0 and scanner.closed and len(separators) == 1 and not data.strip()  # '[ ]'
                if not empty:  # each record's newline: its separator, after the bytes pending before this chunk
                    ends = separators + (len(data) - last)
                    yield from _checked(path, record, data, ends, begin, max_record_bytes)
                    record += len(separators)
                begin += len(data)
                pending, pending_len = [], 0
                body = body[last:]
        if body and not scanner.closed:  # (after the closing ']': whitespace, checked by the scanner)
            pending_len += len(body)
            if skipping:
                pass
            elif pending_len > max_record_bytes:
                head = b"".join([*pending, body])[:1024]
                pending, skipping = [], True
            else:
                pending.append(body)
        offset += len(chunk)
    if not scanner.opened:
        raise fail("no '[' opens the array")
    if ends_inside:  # a part's range: it ends just after a separator, as the plan cut it
        if scanner.closed or scanner.depth != 1 or scanner.in_string or pending_len or skipping:
            raise fail("the part does not end after a record as planned; the file changed during the build")
        return
    if not scanner.closed:
        raise fail(f"the file ends inside the array (record {record} is not closed by ',' or ']'); it is truncated")


def _checked(path: str, record: int, data: bytes, ends: np.ndarray, offset: int, max_bytes: int) -> Iterator[Block]:
    """The block of the record lines in ``data`` (``ends``: their newlines), records longer than ``max_bytes`` cut
    out."""
    n = len(ends)
    starts = np.concatenate([[0], ends[:-1] + 1])
    lengths = ends - starts
    if (lengths > max_bytes).any():  # a long record inside one read: handed on alone, as the line reader does
        lo = 0
        for i in np.flatnonzero(lengths > max_bytes).tolist():
            if i > lo:
                yield Block(path, record + lo, i - lo, data[starts[lo] : starts[i]], offset + int(starts[lo]))
            yield Block(path, record + i, 1, data[starts[i] : starts[i] + 1024], offset + int(starts[i]),
                        too_long=int(lengths[i]))  # fmt: skip
            lo = i + 1
        if lo < n:
            yield Block(path, record + lo, n - lo, data[starts[lo] :], offset + int(starts[lo]))
        return
    yield Block(path, record, n, data, offset)


def record_cuts(stream: BinaryIO, targets: Sequence[int], chunk_bytes: int = 8 << 20) -> list[int] | None:
    """The cuts of the array in ``stream`` (from the file's start) into input parts: for each of ``targets``
    (ascending file offsets), the offset just past the first separating ``,`` at or after ``target - 1``, skipping
    a target that an earlier cut already passed (the rule ``weightprep.distribute.plan`` cuts JSON Lines by, a
    newline there). One pass of the splitter, a chunk in memory at a time, stopped once the last target is cut.
    None: the array is malformed before then (it is then read whole, and its reader names the fault)."""
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
