"""Stage 1, JSON arrays: a ``.json`` file holding one array of records (``[{...}, {...}]``, as LLaMA-Factory and many
Hub repositories ship their data), streamed in bounded memory and handed on as blocks of JSON lines, one record a
line, so the records go through exactly the validation of JSON Lines input.

The splitter never parses a record. It scans each chunk of the stream with NumPy for the bytes that shape the
array: the quotes that open and close strings (a quote preceded by an odd run of backslashes is escaped), and,
outside strings, brackets and commas. The depth of nesting is the running sum of brackets; a comma at depth 1 ends
a record, and so does the ``]`` that closes the array. In the block handed on, each of those separators becomes the
record's newline and every newline inside a record (pretty-printed JSON) a tab, so a record is one line of
exactly the bytes it spans in the file: a line's byte offset is the record's, and the pyarrow fast path and the
exact path of ``weightprep.stages.validate`` read the lines as they read JSON Lines. A tab is whitespace between
tokens, as the newline was, and a control byte inside a string, where a raw newline is too (invalid JSON): Python's
json and pyarrow refuse both alike, so such a record is rejected, never read as something else, and the splitter
never needs to know whether a newline is inside a string (one ``bytes.replace``, not a pass over its positions).

Records are numbered from 0 as in the array (``data[412]``, ``jq '.[412]'``); errors read ``data.json: record
412: messages[1].weight: ...``. State crossing a chunk (inside a string, an odd backslash run, the depth) is
carried, so every byte is scanned once; memory holds a block and the record being read, and a record longer than
``max_line_bytes`` is skipped past (its first bytes kept for the reject), never held whole. What breaks the array
itself -- an empty element (``,,`` or a trailing comma), bytes after the closing ``]``, a file that ends inside the
array -- stops the read with an ``InputError`` naming the record, as a truncated compressed file does: nothing after
it can be numbered.

Cost: a ``bytes.replace`` of the newlines, a few NumPy comparisons over each chunk and one ``flatnonzero`` (the
quotes, brackets and commas together: about 3.5% of a pretty-printed array's bytes), the rest over those
positions; below the parse of the records (figures in docs/inputs.md).

Parts. Where a record starts is known for sure only by scanning from the start, so a large (uncompressed) array is
cut into input parts (``weightprep.distribute.plan``) just past the first separating ``,`` at or after each target
offset (JSON Lines is cut just past a newline by the same rule): guessed from the layout of the file's head and
checked by the parts' readers (``check``, below), or found by a scan at plan time (``weightprep.distribute.plan_array``:
the state of this splitter at each target offset, then the splitter on to the separator). A part is then a byte range that starts just after a ``,`` (or
at the file's start) and ends just after a ``,`` (or at the file's end): ``array_blocks(..., inside=True)`` reads
it as the array's elements from there (the scanner starts at depth 1, past the ``[``), ``ends_inside=True`` as a
range that stops after a separator rather than at the closing ``]``. Its records are numbered from 0 within the
part, as a JSON Lines part numbers its lines from 1; ``plan.line_bases`` makes them the file's. A malformed array
whose brackets do not balance is not cut (the plan's scan stops there): its one part reads it and names the fault.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np

from weightprep.batches import Block
from weightprep.errors import CUT_MISSED, InputError

__all__ = ["SPACE", "ArrayScanner", "Scratch", "array_blocks", "depth_changes", "escaped", "outside", "structure"]

_QUOTE, _BACKSLASH, _COMMA = ord('"'), ord("\\"), ord(",")
#: JSON's whitespace, by byte value.
SPACE = np.zeros(256, dtype=bool)
SPACE[[ord(" "), ord("\t"), ord("\r"), ord("\n")]] = True
#: What every raw newline becomes in the blocks: whitespace between tokens, a control byte (refused) inside a string.
_NEWLINE_AS = b"\t"


class EmptyElement(ValueError):
    """An empty element of the array: the ``index``-th separator of the chunk ends it."""

    def __init__(self, index: int) -> None:
        super().__init__("an empty element (two commas in a row, or a comma before ']')")
        self.index = index


class ArrayScanner:
    """The splitter's state across chunks. ``scan`` returns the chunk as it goes into blocks (newlines turned into
    tabs, separators into newlines: a work array, overwritten by the next scan) and the positions of the
    separators that end records; ``start`` is set to the position just after the opening ``[`` in the chunk that
    holds it."""

    def __init__(self, inside: bool = False, check: bool = True) -> None:
        self.check = check  # refuse empty elements (the plan, which only looks for separators, does not)
        self.in_string = False
        self.backslashes = 0  # the run of backslashes that ends the stream so far (inside a string)
        # inside: the stream starts just after a separating ',' of the array (an input part's range)
        self.depth = 1 if inside else 0
        self.opened = inside
        self.closed = False
        self.start: int | None = None
        self.last_solid = ord(",") if inside else -1  # the last byte so far that is not whitespace
        self.scratch = Scratch()

    def scan(self, chunk: bytes) -> tuple[np.ndarray, np.ndarray]:
        data = np.frombuffer(chunk, dtype=np.uint8)
        out = self.scratch.output(chunk)
        self.start = None
        if self.closed:
            if not SPACE[data].all():
                raise ValueError("bytes after the array's closing ']'; a file holds one array")
            return out, np.zeros(0, dtype=np.int64)
        # the quotes, brackets and commas: comparisons over the chunk and one flatnonzero (``marks``); the
        # rest over those positions only: the quotes that open and close strings, and the count of them before each
        # other mark, which says whether it is inside a string
        marks = self.scratch.marks(data)
        byte = data[marks]
        is_quote = byte == _QUOTE
        at_quote = np.flatnonzero(is_quote)
        skip = escaped(chunk, data, marks[at_quote], self.backslashes)
        real = is_quote
        if skip.any():
            real = is_quote.copy()
            real[at_quote[skip]] = False
        count = np.cumsum(real)  # real quotes up to each mark: before it, for a mark that is no quote
        carried, was_inside = self._carry(chunk), self.in_string
        self.in_string = bool(((int(count[-1]) if len(count) else 0) + was_inside) % 2)
        self.backslashes = carried if self.in_string else 0
        inside = ((count + was_inside) & 1).astype(bool)
        shape = ~(is_quote | inside)  # the brackets and commas outside strings
        where = marks[shape]
        delta = _changes(byte[shape])
        comma = delta == 0
        after = self.depth + np.cumsum(delta)
        before = after - delta
        if not self.opened and len(where):
            self.opened, self.start = True, int(where[0]) + 1  # the sniffed '[' (weightprep.stages.read.file_kind)
        zero = np.flatnonzero(after == 0)
        if len(zero):  # the array closes: by ']', and only whitespace may follow
            k = int(zero[0])
            if data[where[k]] != ord("]"):
                raise ValueError(f"unbalanced brackets: a '{chr(data[where[k]])}' closes the array")
            if not SPACE[data[int(where[k]) + 1 :]].all():
                raise ValueError("bytes after the array's closing ']'; a file holds one array")
            self.closed = True
            where, comma, before, after = where[: k + 1], comma[: k + 1], before[: k + 1], after[: k + 1]
        ends = (before == 1) & (comma | (after == 0))
        self.depth = int(after[-1]) if len(after) else self.depth
        separators = where[ends]
        if self.opened and self.check:
            self._check_elements(data, separators)
        out[separators] = ord("\n")
        return out, separators

    def _check_elements(self, data: np.ndarray, separators: np.ndarray) -> None:
        """Refuse an empty element: a separator whose last byte before it, whitespace aside, is the one before it
        (a ',' or the opening '['; nothing else can be: a deeper ',' or '[' leaves the depth above 1). The last
        such byte of the chunk is carried."""
        before = data[np.maximum(separators - 1, 0)]
        # most separators follow a '}', ']', '"' or a digit: only those after whitespace or a mark are walked back
        suspect = SPACE[before] | (before == ord(",")) | (before == ord("[")) | (separators == 0)
        for i in np.flatnonzero(suspect).tolist():
            p = int(separators[i])
            q = p - 1
            while q >= 0 and SPACE[data[q]]:
                q -= 1
            solid = self.last_solid if q < 0 else int(data[q])
            if solid in (ord(","), ord("[")) and not (solid == ord("[") and data[p] == ord("]")):
                raise EmptyElement(i)
        q = len(data) - 1
        while q >= 0 and SPACE[data[q]]:
            q -= 1
        if q >= 0:
            self.last_solid = int(data[q])

    def _carry(self, chunk: bytes) -> int:
        """The run of backslashes that ends this chunk (added to the carried one if it spans the chunk)."""
        run = len(chunk) - len(chunk.rstrip(b"\\"))
        return run + (self.backslashes if run == len(chunk) else 0)


def escaped(chunk: bytes, data: np.ndarray, quotes: np.ndarray, carried: int) -> np.ndarray:
    """Whether each of ``quotes`` (positions of '"' in ``chunk``, ``data`` its bytes) is escaped: an odd run of
    backslashes just before it, ``carried`` (the run that ends the stream before the chunk) included where the run
    reaches the chunk's start. Only the quotes right after a backslash are walked back (few: JSON escapes quotes
    inside strings only), all of them a byte at a time together, the last few long runs one by one."""
    out = np.zeros(len(quotes), dtype=bool)
    if not len(quotes):
        return out
    before = data[quotes - 1]  # (a quote at 0 wraps around to the last byte: set apart)
    if quotes[0] == 0:
        out[0], before[0] = carried % 2 == 1, 0
    walk = np.flatnonzero(before == _BACKSLASH)
    if not len(walk):
        return out
    runs = np.ones(len(walk), dtype=np.int64)  # the backslash just before each
    live = np.arange(len(walk))
    for back in range(2, 18):
        if not len(live):
            break
        at = quotes[walk[live]] - back
        starts = at < 0  # the run reaches the chunk's start
        runs[live[starts]] += carried
        live, at = live[~starts], at[~starts]
        live = live[data[at] == _BACKSLASH]
        runs[live] += 1
    for i in live.tolist():  # runs longer than 16 (rare): on to their start
        q = int(quotes[walk[i]]) - int(runs[i]) - 1
        while q >= 0 and chunk[q] == _BACKSLASH:
            runs[i], q = runs[i] + 1, q - 1
        runs[i] += carried if q < 0 else 0
    out[walk] = runs % 2 == 1
    return out


class Scratch:
    """Work arrays for a chunk's byte masks, kept from chunk to chunk: in a worker every array of a megabyte or more
    is a fresh mapping (``weightprep.heap.bound_heap``), and a fresh 8 MiB mask costs more in page faults
    than the comparison that fills it. One per thread."""

    def __init__(self) -> None:
        self.mask = np.zeros(0, dtype=bool)
        self.other = np.zeros(0, dtype=bool)
        self.bytes = np.zeros(0, dtype=np.uint8)
        self.out = np.zeros(0, dtype=np.uint8)

    def output(self, chunk: bytes) -> np.ndarray:
        """``chunk`` with its newlines as tabs, in the output work array (``bytes.replace`` and a copy: half the time
        of a copy and a masked write)."""
        if len(self.out) < len(chunk):
            self.out = np.empty(len(chunk), dtype=np.uint8)
        out = self.out[: len(chunk)]
        out[:] = np.frombuffer(chunk.replace(b"\n", _NEWLINE_AS), dtype=np.uint8)
        return out

    def get(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """A bool and a uint8 array of ``n`` items (their contents undefined)."""
        if len(self.mask) < n:
            self.mask, self.bytes = np.empty(n, dtype=bool), np.empty(n, dtype=np.uint8)
        return self.mask[:n], self.bytes[:n]

    def find(self, data: np.ndarray, byte: int) -> np.ndarray:
        """The positions of ``byte`` in ``data``."""
        mask, _ = self.get(len(data))
        return np.flatnonzero(np.equal(data, byte, out=mask))

    def marks(self, data: np.ndarray) -> np.ndarray:
        """The positions of the quotes, brackets and commas in ``data``: one ``flatnonzero`` (a pass of its own each
        cost more than the comparisons that make the mask; the brackets as in ``structure``)."""
        mask, work = self.get(len(data))
        if len(self.other) < len(data):
            self.other = np.empty(len(data), dtype=bool)
        other = self.other[: len(data)]
        np.bitwise_or(data, 0x20, out=work)
        np.subtract(work, ord("{"), out=work)
        np.bitwise_and(work, 0xFD, out=work)
        np.equal(work, 0, out=mask)
        for byte in (_QUOTE, _COMMA):
            np.logical_or(mask, np.equal(data, byte, out=other), out=mask)
        return np.flatnonzero(mask)


def outside(real: np.ndarray, positions: np.ndarray, in_string: bool) -> np.ndarray:
    """Whether each of ``positions`` (none a quote) is outside strings: an even count of ``real`` quotes before it,
    counting the state the chunk starts in."""
    return ((np.searchsorted(real, positions) + in_string) & 1) == 0


def structure(data: np.ndarray, scratch: Scratch) -> np.ndarray:
    """The positions of the brackets in ``data`` (the plan's chunk summary): ``| 0x20`` makes '[' '{' and ']' '}',
    which differ in bit 1 only; in place in ``scratch``."""
    mask, work = scratch.get(len(data))
    np.bitwise_or(data, 0x20, out=work)
    np.subtract(work, ord("{"), out=work)
    np.bitwise_and(work, 0xFD, out=work)
    np.equal(work, 0, out=mask)
    return np.flatnonzero(mask)


def depth_changes(data: np.ndarray, where: np.ndarray) -> np.ndarray:
    """The change of depth at each of ``where`` (a bracket or a comma): +1 opens, -1 closes, 0 a comma."""
    return _changes(data[where])


def _changes(byte: np.ndarray) -> np.ndarray:
    """``depth_changes`` of these bytes."""
    return np.where(byte == _COMMA, 0, np.where((byte | 0x20) == ord("{"), 1, -1)).astype(np.int64)


def array_blocks(
    path: str, stream: BinaryIO, block_bytes: int, max_record_bytes: int, read: Any, *,
    origin: int = 0, inside: bool = False, ends_inside: bool = False, check: int | None = None,
) -> Iterator[Block]:
    """Blocks of the records of the JSON array in ``stream``, one record a line, numbered from 0 (``Block``'s
    ``first_line`` is the record's index, its ``offset`` the file offset of the record's first byte). ``read(n, record, offset)``
    reads the stream, turning a decompression error into an ``InputError``; the stream starts at the file's start
    (a byte order mark, if any, is whitespace to the scanner: it precedes the opening bracket), or, for an input
    part (``inside``), at file offset ``origin``, just after a separating ``,``; ``ends_inside``: the stream ends
    just after one (a part before the file's last), not at the closing ``]``. ``check``: the plan guessed the
    part's range (``plan_array.guessed_cuts``): it must end just after the first separating ``,`` at or after
    ``check - 1`` (the file's last part: there must be none); where it does not, an ``InputError`` of reason
    ``CUT_MISSED`` (the build plans the file exactly and builds again)."""
    scanner = ArrayScanner(inside)
    record = 0  # index of the next record to hand on (within the part)
    offset = origin  # file offset of the next byte to read
    begin = origin  # file offset of that record's first byte
    pending: list[bytes] = []
    pending_len = 0
    head = b""  # the first bytes of a record too long to hold (then pending is empty)
    skipping = False
    step = max(1, min(block_bytes, max_record_bytes))
    checked: int | None = None  # with check: the file offset of the first separating ',' at or after check - 1

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
        if check is not None and checked is None and len(separators):
            commas = separators[np.frombuffer(chunk, dtype=np.uint8)[separators] == _COMMA] + offset
            at = int(np.searchsorted(commas, check - 1))
            checked = int(commas[at]) if at < len(commas) else None
        lo = 0
        if scanner.start is not None:
            lo, begin = scanner.start, offset + scanner.start
        if not scanner.opened:  # whitespace (and a BOM) before '['
            offset += len(chunk)
            begin = offset
            continue
        body = memoryview(out)[lo:]  # (views of the scanner's work array: copied by the join, or kept below)
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
                pending.append(bytes(body))
        offset += len(chunk)
    if not scanner.opened:
        raise fail("no '[' opens the array")
    ended = not scanner.closed and scanner.depth == 1 and not scanner.in_string and not pending_len and not skipping
    if check is not None and ((checked != offset - 1 or not ended) if ends_inside else checked is not None):
        raise InputError(path, record, "<json>", f"the plan's guessed cut at byte {offset} is not the first record "
                         f"boundary at or after byte {check - 1}", reason=CUT_MISSED, offset=begin)  # fmt: skip
    if ends_inside:  # a part's range: it ends just after a separator, as the plan cut it
        if not ended:
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
