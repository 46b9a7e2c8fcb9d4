"""Stage 1, plain text: ``.txt`` and ``.md`` files (and their ``.gz``/``.zst``) read as ``datasets``' ``text`` loader
reads them, each record a ``{"text": ...}`` language-modeling record (every token weighted 1).

``read.text_sample_by`` (``datasets``' ``sample_by``): ``line`` (the default) makes each line a record, its line
ending (``\\n`` or ``\\r\\n``) left out; ``paragraph`` makes each run of lines between empty lines one record, its
lines joined by ``\\n``; ``document`` makes the whole file one record (its lines joined by ``\\n``, ending with one). The lines come from the line reader
of ``weightprep.stages.read`` (blocks of whole lines, a line longer than ``read.max_line_bytes`` never held whole),
and each record goes on as one JSON line, so validation, rejects and counts are those of JSON Lines input.

Record numbers are line numbers: a record is named by the line it starts on (``wiki.txt:17``), and the lines it
does not start on go on as blank JSON lines, which are no record. Unlike ``datasets``, an empty line is no record
(``datasets`` makes it an empty text, a document of nothing but EOS to learn from), and a paragraph starts at its
first non-empty line (``datasets`` splits on ``"\\n\\n"``, so three newlines start the next paragraph with one).
A paragraph or document longer than ``read.max_line_bytes`` is rejected as ``line_too_long`` (its first bytes kept).
Bytes that are not UTF-8 make the record ``invalid_utf8``, as in JSON input.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from weightprep.batches import Block

__all__ = ["SAMPLE_BY", "TEXT_SUFFIXES", "text_blocks"]

#: How a text file is cut into records (``read.text_sample_by``), as ``datasets``' text loader names it.
SAMPLE_BY = ("line", "paragraph", "document")
#: The suffixes of plain-text inputs (before a compression suffix).
TEXT_SUFFIXES = (".txt", ".md")
_ENCODE = json.JSONEncoder(ensure_ascii=False).encode


def _json_line(text: bytes) -> bytes:
    """``{"text": TEXT}`` as one JSON line; bytes that are not UTF-8 stay as they are, so validation rejects them."""
    return b'{"text":' + _ENCODE(text.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape") + b"}"


def _lines(block: Block) -> list[bytes]:
    lines = block.data.split(b"\n")[: block.n_lines]
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


def text_blocks(lines: Iterator[Block], sample_by: str, max_bytes: int) -> Iterator[Block]:
    """Blocks of ``{"text"}`` JSON lines from blocks of text lines (``weightprep.stages.read``), one record per
    line, paragraph or document; a record's JSON line stands at the line it starts on, blank lines fill the rest."""
    if sample_by == "line":
        for block in lines:
            if block.too_long:
                yield block
                continue
            out = [_json_line(line) if line else b"" for line in _lines(block)]
            yield Block(block.path, block.first_line, block.n_lines, b"\n".join(out) + b"\n", block.offset)
        return
    record: list[bytes] = []  # the lines of the record being gathered
    size = 0
    first = 0  # line of the record's start (0: no record open)
    offset = 0
    too_long = 0
    out: list[bytes] = []  # lines of the next block, from line `start`
    start = None
    path = ""
    for block in lines:
        path = block.path
        if start is None:
            start = block.first_line
        numbered = [(block.first_line, block.data, block.too_long)] if block.too_long else [
            (block.first_line + i, line, 0) for i, line in enumerate(_lines(block))
        ]  # fmt: skip
        for number, line, long in numbered:
            if not long and not line and sample_by == "paragraph":
                if first:
                    yield from _flush(path, start, out, record, first, offset, too_long)
                    start, out, record, size, first, too_long = number, [], [], 0, 0, 0
                out.append(b"")
                continue
            if not first:
                first, offset = number, block.offset
            out.append(b"")  # the record's line, set when it is complete
            size += (long or len(line)) + 1
            if long or size > max_bytes:
                too_long = max(too_long, size)
                record = record[:1] if record else [line[:1024]]
            elif not too_long:
                record.append(line)
    if first:
        yield from _flush(path, start or 1, out, record, first, offset, too_long, final=sample_by == "document")
    elif out:
        yield Block(path, start or 1, len(out), b"\n".join(out) + b"\n")


def _flush(
    path: str, start: int, out: list[bytes], record: list[bytes], first: int, offset: int, too_long: int,
    final: bool = False,
) -> Iterator[Block]:  # fmt: skip
    """The lines from ``start`` through the record that starts at line ``first``; a too-long record alone."""
    at = first - start
    if too_long:
        if at:
            yield Block(path, start, at, b"\n".join(out[:at]) + b"\n")
        yield Block(path, first, 1, b"".join(record)[:1024], offset, too_long=too_long - 1)
        if len(out) - at > 1:
            yield Block(path, first + 1, len(out) - at - 1, b"\n" * (len(out) - at - 1))
        return
    text = b"\n".join(record) + (b"\n" if final else b"")
    out[at] = _json_line(text)
    yield Block(path, start, len(out), b"\n".join(out) + b"\n", offset)
