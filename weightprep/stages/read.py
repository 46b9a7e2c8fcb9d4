"""Stage 1 — read: each kind of input file by its reader, every reader handing on ``Block``s of JSON lines, one
record a line, so validation is one code path whatever the file.

=================================  ==========================================  ================================
file                               reader                                      a record is named
=================================  ==========================================  ================================
``.jsonl``, ``.ndjson``, ``.json``  ``_Lines`` (below): blocks of whole lines   by line, from 1 (``a.jsonl:17``)
  holding JSON Lines
``.json`` holding one array         ``weightprep.stages.json_array``            by index, from 0 (``a.json: record 3``)
``.txt``, ``.md``                   ``weightprep.stages.text`` over ``_Lines``  by line, from 1
``.parquet``, ``.arrow``            ``weightprep.stages.columnar``              by row, from 0 (``a.parquet: row 3``)
=================================  ==========================================  ================================

Each but the columnar ones may be compressed (``.gz``, ``.zst``: ``_Decompressor``); ``file_kind`` tells the kind
from the name, and for ``.json`` from its first byte that is not whitespace (``[``: an array; anything else: JSON
Lines, as ``datasets`` writes ``.json``).

Memory is bounded whatever the file: each block is the next ``block_bytes`` of the (decompressed)
stream cut back to its last newline, tagged with the line number and byte offset it starts at, so
every later stage can name the exact line of a record. A line longer than ``max_line_bytes`` is
never held whole: the reader keeps its first bytes, skips to the next newline and hands it on as
a ``too_long`` block, which validate rejects. A UTF-8 byte order mark at the start of a file is
dropped; a missing final newline is supplied. The raw bytes of every file are hashed (SHA-256) and
counted on the way, for the manifest; nothing is read twice.

Inputs may be local paths or URLs (``weightprep.storage``: an object is read by range requests), files,
directories (their ``*.jsonl``, ``*.ndjson`` and ``*.json`` files, each also ``.gz``/``.zst``, and ``*.parquet``
files, not recursive, sorted by name; text files only when named or globbed, since a data directory's
``README.md`` or ``notes.txt`` documents it; a ``datasets.save_to_disk`` directory: its Arrow files) or quoted globs;
``expand_inputs`` resolves them, and the same file given twice is an error (its records would be counted twice).
"""

from __future__ import annotations

import functools
import glob
import io
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from weightprep import storage
from weightprep.batches import Block
from weightprep.errors import InputError, UsageError, is_columnar, is_compressed, kind_path
from weightprep.stages.columnar import COLUMNAR_SUFFIXES, check_schema, columnar_blocks, dataset_dir_files
from weightprep.stages.input_file import InputFile
from weightprep.stages.json_array import array_blocks
from weightprep.stages.text import SAMPLE_BY, TEXT_SUFFIXES, text_blocks

__all__ = [
    "InputFile", "read_blocks", "check_inputs", "expand_inputs", "file_kind", "first_record", "SUFFIXES", "HEAD_BYTES",
]

_COMPRESSED = ("", ".gz", ".zst")
_JSON_SUFFIXES = tuple(s + c for s in (".jsonl", ".ndjson", ".json") for c in _COMPRESSED)
_TEXT = tuple(s + c for s in TEXT_SUFFIXES for c in _COMPRESSED)
#: File names weightprep reads.
SUFFIXES = (*_JSON_SUFFIXES, *_TEXT, *COLUMNAR_SUFFIXES)
#: The files a directory input contributes: no text (a data directory's README.md or notes.txt is no data; name
#: text files, or glob them: ``'corpus/*.txt'``).
_DIR_SUFFIXES = (*_JSON_SUFFIXES, ".parquet")
#: Bytes read of a ``.json`` file to tell an array from JSON Lines.
_SNIFF_BYTES = 1 << 16
#: Bytes kept of a line that is too long to read whole (for the error and rejects.jsonl).
HEAD_BYTES = 1024
_BOM = b"\xef\xbb\xbf"


class _HashingReader(io.RawIOBase):
    """Passes reads through while hashing and counting the raw (compressed) bytes."""

    def __init__(self, raw: BinaryIO, record: InputFile) -> None:
        self._raw = raw
        self._record = record

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._raw.readinto(buffer)  # type: ignore[attr-defined]
        if n:
            self._record._hash.update(memoryview(buffer)[:n])
            self._record.size += n
        return n or 0


class _RangeReader(io.RawIOBase):
    """The next ``size`` bytes of ``raw``, then end of file (read by ``_HashingReader``; ``raw`` is closed by
    whoever opened it)."""

    def __init__(self, raw: BinaryIO, size: int) -> None:
        self._raw = raw
        self._left = size

    def readinto(self, buffer: Any) -> int:
        if self._left <= 0:
            return 0
        view = memoryview(buffer)[: self._left]
        n = self._raw.readinto(view)  # type: ignore[attr-defined]
        self._left -= n or 0
        return n or 0


class _Decompressor(io.RawIOBase):
    """Decompresses a stream of gzip members or zstd frames, as many as it holds, and, unlike
    ``zstandard.stream_reader``, raises ``EOFError`` when the input ends inside one, so a truncated file is never
    read as complete (zero bytes after a gzip member are padding, as ``gzip`` reads them). ``fed`` counts the
    compressed bytes consumed, ``made`` the bytes made of them: ``behind`` estimates from them the compressed bytes
    behind a decompressed offset, however far the buffers read ahead."""

    def __init__(self, raw: BinaryIO, kind: str) -> None:
        if kind == "gz":
            self._new: Any = functools.partial(zlib.decompressobj, wbits=31)  # 16 + MAX_WBITS: a gzip header
        else:
            try:
                import zstandard
            except ImportError:  # pragma: no cover - a declared dependency
                raise UsageError("reading .zst input needs zstandard: pip install zstandard") from None
            self._new = zstandard.ZstdDecompressor().decompressobj
        self._kind = kind
        self._dobj = self._new()
        self._raw = raw
        self._buf = memoryview(b"")
        self._input = b""  # compressed bytes read and not yet consumed
        self._in_frame = False
        self.fed = self.made = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._buf:
            if not self._input:
                self._input = self._raw.read(1 << 16)
                if not self._input:
                    if self._in_frame:
                        unit = "member" if self._kind == "gz" else "frame"
                        raise EOFError(f"{self._kind} stream ended before the end of its last {unit}")
                    return 0
            self._buf = memoryview(self._step())
        n = min(len(buffer), len(self._buf))
        buffer[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def _step(self) -> bytes:
        """One call of the decompressor on the input held (gzip: at most 1 MiB out of it, so that a line of
        hundreds of MB compressed to little is never made whole), keeping what it did not consume."""
        chunk = self._input
        if self._kind == "gz" and not self._in_frame and self.fed:  # after a member: padding, or the next one
            kept = chunk.lstrip(b"\x00")
            self.fed += len(chunk) - len(kept)
            chunk = self._input = kept
            if not chunk:
                return b""
        self._in_frame = True
        if self._kind == "gz":
            out = self._dobj.decompress(chunk, 1 << 20)
            rest = self._dobj.unused_data if self._dobj.eof else self._dobj.unconsumed_tail
        else:
            out = self._dobj.decompress(chunk)
            rest = self._dobj.unused_data if self._dobj.eof else b""
        self.fed += len(chunk) - len(rest)
        self.made += len(out)
        if self._dobj.eof:
            self._dobj, self._in_frame = self._new(), False
            if self._kind == "gz":  # zero padding already read is consumed with its member: counted in ``behind``
                kept = rest.lstrip(b"\x00")  # at this member's last block (else the file's last bytes never are)
                self.fed += len(rest) - len(kept)
                rest = kept
        self._input = rest
        return out

    def behind(self, end: int) -> int:
        """The compressed bytes behind decompressed offset ``end``: those consumed, in proportion."""
        return min(self.fed, self.fed * end // self.made) if self.made else self.fed


def file_kind(path: str) -> str:
    """``columnar``, ``text``, ``json_array`` or ``jsonl``: which reader reads ``path`` (see the module docstring)."""
    if is_columnar(path):
        return "columnar"
    named = kind_path(path)  # a presigned URL's kind is its path's
    plain = named[: -len(named.rsplit(".", 1)[-1]) - 1] if is_compressed(path) else named
    if plain.endswith(TEXT_SUFFIXES):
        return "text"
    if plain.endswith(".json") and _first_byte(path, _version(path)) == ord("["):
        return "json_array"
    return "jsonl"


def _version(path: str) -> tuple[int, int] | None:
    """A local file's (size, modification time): a file rewritten in the same process is looked at again."""
    if storage.is_url(path):
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns


@functools.lru_cache(maxsize=4096)
def _first_byte(path: str, version: tuple[int, int] | None) -> int | None:
    """The first byte of the (decompressed) file that is neither whitespace nor a byte order mark (None: none in its
    first bytes, or the file cannot be read: the reader then says why); ``version`` keys the cache."""
    try:
        with storage.open_input(path) as raw:
            head = raw.read(_SNIFF_BYTES)
        if kind_path(path).endswith(".gz"):  # the start of the first member: a partial member is no error here
            head = zlib.decompressobj(wbits=31).decompress(head, _SNIFF_BYTES)
        elif kind_path(path).endswith(".zst"):
            import zstandard

            head = zstandard.ZstdDecompressor().decompressobj().decompress(head)
    except (OSError, EOFError, zlib.error, UsageError):
        return None
    except Exception as exc:  # zstandard.ZstdError on a truncated head
        if type(exc).__module__.startswith("zstandard"):
            return None
        raise
    stripped = head.removeprefix(_BOM).lstrip(b" \t\r\n")
    return stripped[0] if stripped else None


#: Bytes read at most for a file's first record (``first_record``): a longer first record is not looked at.
FIRST_RECORD_BYTES = 1 << 20
#: Bytes ``first_record`` reads first, then four times as many until the record ends (an object in a store: each
#: read a range request, so a small record costs a few kilobytes, not a megabyte).
_FIRST_RECORD_READ = 1 << 12


def first_record(path: str) -> dict | None:
    """The first record of a plain (uncompressed) JSON Lines file or JSON array, as parsed JSON; None where there is
    none to read cheaply: another kind of file, a first record that is no object, is not valid JSON or does not end
    within the first ``FIRST_RECORD_BYTES``, or a file that cannot be read (the reader then says why). What the plan
    looks at to cut a file of conversations finer (``weightprep.distribute.plan``)."""
    kind = file_kind(path)
    if kind not in ("jsonl", "json_array") or is_compressed(path):
        return None
    head, want = b"", _FIRST_RECORD_READ
    try:
        with storage.open_input(path) as f:
            while True:
                head += f.read(want - len(head))
                record = _first_object(head, kind, complete=len(head) < want)  # a short read: the end
                if record is not _CUT or len(head) >= FIRST_RECORD_BYTES:
                    return None if record is _CUT else record
                want = min(4 * want, FIRST_RECORD_BYTES)
    except (OSError, UsageError):
        return None


_CUT = object()  # ``_first_object``: the record goes on past the bytes read


def _first_object(head: bytes, kind: str, complete: bool) -> Any:
    """The first record in ``head`` (the file's first bytes; ``complete``: all of it), None if it is not a JSON
    object, ``_CUT`` if more bytes might complete it."""
    head = head.removeprefix(_BOM).lstrip(b" \t\r\n")
    try:
        if kind == "json_array":  # its first byte is the "[" (file_kind); the first element is parsed alone
            text = head[1:].lstrip(b" \t\r\n").decode("utf-8", errors="replace")  # a cut character at the end only
            record = json.JSONDecoder().raw_decode(text)[0]
        else:
            line, newline, _ = head.partition(b"\n")
            complete = complete or bool(newline)  # the first line is all there
            record = json.loads(line)
    except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError is a ValueError), or nested too deep
        return None if complete else _CUT
    return record if isinstance(record, dict) else None


def expand_inputs(patterns: list[str] | tuple[str, ...]) -> list[str]:
    """Files to read for ``patterns``: files as given, directories' JSONL files, quoted globs; local paths or
    URLs (``s3://bucket/data/*.jsonl.zst``, ``hf://datasets/ORG/NAME/``: ``weightprep.storage``).

    >>> expand_inputs(["data/"])  # doctest: +SKIP
    ['data/a.jsonl', 'data/b.jsonl.gz']
    """
    paths: list[str] = []
    for p in patterns:
        if any(ch in p for ch in "*?[") and not storage.exists(p):
            matches = storage.glob(p) if storage.is_url(p) else sorted(
                m for m in glob.glob(p) if Path(m).is_file() or Path(m).is_dir()
            )
            if not matches:
                raise UsageError(f"no file matches {p!r}")
            paths.extend(expand_inputs(matches) if any(storage.isdir(m) for m in matches) else matches)
        elif storage.isdir(p) and (arrow := dataset_dir_files(p)) is not None:
            paths.extend(arrow)  # a datasets.save_to_disk directory: its Arrow files, in its order
        elif storage.isdir(p):
            found = [
                c for c in _files(p) if not c.rsplit("/", 1)[-1].startswith(".") and c.endswith(_DIR_SUFFIXES)
            ]
            if not found:
                raise UsageError(f"directory {p} holds no {', '.join('*' + s for s in _DIR_SUFFIXES)} files")
            paths.extend(found)
        else:
            paths.append(p)
    seen: dict[str, str] = {}
    for p in paths:
        key = p.rstrip("/") if storage.is_url(p) else os.path.realpath(p)
        if key in seen:
            raise UsageError(f"input {p} is given twice (also as {seen[key]}); its records would be counted twice")
        seen[key] = p
    return paths


def _files(directory: str) -> list[str]:
    """The files directly in a local directory or under a URL prefix, sorted by name."""
    if storage.is_url(directory):
        return storage.listdir(directory)
    return sorted(str(c) for c in Path(directory).iterdir() if c.is_file())


def check_inputs(paths: list[str], columns: dict[str, str] | None = None) -> None:
    """Fail before any work if an input is missing, not a file, of an unknown kind, or a Parquet/Arrow file whose
    columns (renamed by ``columns``, source -> target) hold no record or clash (``columnar.check_schema``)."""
    if not paths:
        raise UsageError("no input files given; usage: weightprep build FILE.jsonl [FILE.jsonl.gz ...] or a directory")
    for p in paths:
        if not storage.exists(p):
            raise UsageError(f"input file not found: {p}")
        if not storage.isfile(p):
            raise UsageError(f"input is not a regular file: {p}")
        if not kind_path(p).endswith(SUFFIXES):
            raise UsageError(
                f"{p}: expected a .jsonl/.ndjson/.json file (JSON Lines, or one JSON array of records), a .txt/.md "
                "file (plain text), each also .gz or .zst, a .parquet file or a datasets.save_to_disk directory"
            )
        if is_columnar(p):
            check_schema(p, columns or {})


def _open(record: InputFile, raw: BinaryIO) -> tuple[BinaryIO, _Decompressor | None]:
    """The file's (decompressed) stream, hashed and counted as it is read, and its decompressor (None: plain)."""
    hashed: Any = io.BufferedReader(_HashingReader(raw, record), buffer_size=1 << 20)
    if is_compressed(record.path):
        decompressor = _Decompressor(hashed, kind_path(record.path).rsplit(".", 1)[-1])
        return io.BufferedReader(decompressor, buffer_size=1 << 20), decompressor  # type: ignore[return-value]
    return hashed, None


def read_blocks(
    record: InputFile,
    block_bytes: int,
    max_line_bytes: int = 64 << 20,
    columns: dict[str, str] | None = None,
    *,
    start: int = 0,
    end: int | None = None,
    size: int | None = None,
    text_sample_by: str = "line",
    check: int | None = None,
) -> Iterator[Block]:
    """Yield ``Block``s of JSON lines, one record a line, read from ``record.path`` by the reader of its kind
    (``file_kind``); fills in its size, hash and record count (lines; an array's records; a columnar file's rows).
    Parquet and Arrow files give a block per batch of rows (``weightprep.stages.columnar``), their columns renamed
    by ``columns`` (source -> target); text files a record per line, paragraph or document (``text_sample_by``).

    ``start``/``end`` read only that byte range of a plain JSONL or text file (an input part,
    ``weightprep.distribute.plan``: it starts just after a newline) or of a plain JSON array (just after a
    separating ``,``: ``weightprep.stages.json_array``). Lines are then numbered from 1 (an array's records from 0)
    within the range, byte offsets stay those of the file, and size, hash and line count are the range's. ``size``:
    the whole file's size where the plan knows it (an object is then read to there without asking the store for
    it). ``check``: a JSON array's range whose cuts the plan guessed is checked against that target offset
    (``json_array.array_blocks``)."""
    kind = file_kind(record.path)
    if kind == "columnar":
        yield from columnar_blocks(record, max(64, block_bytes // 2048), columns or {}, size)
        return
    if text_sample_by not in SAMPLE_BY:
        raise ValueError(f"text_sample_by: expected one of {SAMPLE_BY}, got {text_sample_by!r}")
    ranged = bool(start or end is not None)
    if ranged and is_compressed(record.path):
        raise ValueError(f"{record.path}: a compressed file is read whole")
    ends_inside = False  # a JSON array's part before its last: it ends just after a separator
    # an object in a store is read by range requests of its part only (weightprep.storage); a local file is cut here
    with storage.open_input(record.path, start, end if end is not None else size) as raw:
        if ranged and kind == "json_array" and end is not None:
            whole = storage.size(record.path) if storage.is_url(record.path) else os.fstat(raw.fileno()).st_size
            ends_inside = end < whole
        if ranged and not storage.is_url(record.path):
            raw = _RangeReader(raw, (end if end is not None else os.fstat(raw.fileno()).st_size) - start)
        stream, decompressor = _open(record, raw)
        lines = _Lines(record, stream, block_bytes, max_line_bytes, start=start)
        if kind == "json_array":
            blocks = array_blocks(record.path, stream, block_bytes, max_line_bytes, lines.read_at,
                                  origin=start, inside=start > 0, ends_inside=ends_inside, check=check)  # fmt: skip
        elif kind == "text":
            blocks = text_blocks(lines.blocks(), text_sample_by, max_line_bytes)
        else:
            blocks = lines.blocks()
        try:
            yield from _behind(record, blocks, decompressor, start)
        finally:
            stream.close()
        if kind == "json_array":
            record.lines = lines.records
    # hash only complete once the stream is drained (the compressed trailer included)
    record.sha256 = record._hash.hexdigest()


def _behind(record: InputFile, blocks: Iterator[Block], decompressor: _Decompressor | None, start: int) -> Iterator[Block]:
    """The blocks, ``record.behind`` set before each is handed on."""
    top = 0
    for block in blocks:
        # a block ends where its last line does (a too-long line: past its newline)
        end = block.offset + (block.too_long + 1 if block.too_long else len(block.data))
        top = max(top, end)  # a text record's block can end before an earlier one's (its offset is its start's)
        if decompressor is not None:  # an estimate, whose ratio moves as members are read: kept rising
            record.behind = max(record.behind, decompressor.behind(top))
        else:  # the bytes read so far bound it: a supplied final newline is not in the file
            record.behind = min(top - start, record.size)
        yield block


def _head(parts: list[bytes]) -> bytes:
    """The first HEAD_BYTES of the concatenation of ``parts``, without concatenating them."""
    out, n = [], 0
    for p in parts:
        out.append(p[: HEAD_BYTES - n])
        n += len(out[-1])
        if n >= HEAD_BYTES:
            break
    return b"".join(out)


class _Lines:
    """The block cutter: ``pending`` holds the start of a line whose newline has not come yet."""

    def __init__(self, record: InputFile, stream: BinaryIO, block_bytes: int, max_line_bytes: int, start: int = 0) -> None:
        self.record, self.stream, self.max_line = record, stream, max_line_bytes
        self.start = start
        self.records = 0  # the records of a JSON array read through ``read_at``
        # reading at most max_line bytes at a time means a line inside one read is never too long
        self.step = max(1, min(block_bytes, max_line_bytes))
        self.line, self.offset = 1, start  # number and stream offset of the next line to hand on
        self.at_file_start = start == 0  # only there can a byte order mark be
        self.pending: list[bytes] = []
        self.pending_len = 0
        self.skipping = False  # inside a too-long line: only its head and length are kept
        self.head = b""

    def _read(self, size: int = 0) -> bytes:
        return self.read_at(size or self.step, self.line, self.offset + self.pending_len, "line")

    def read_at(self, size: int, line: int, offset: int, unit: str = "record") -> bytes:
        """The next ``size`` bytes of the stream; a corrupt or truncated file is an ``InputError`` at ``line`` (a
        JSON array's reader passes its record and counts it in ``records``: no read fails past its last)."""
        if unit == "record":
            self.records = line
        try:
            return self.stream.read(size)
        except (OSError, EOFError, zlib.error) as exc:  # corrupt or truncated compressed data
            kind = "compressed stream" if is_compressed(self.record.path) else "file"
            raise InputError(
                self.record.path,
                line,
                "<file>",
                f"the {kind} cannot be read past this {unit} ({type(exc).__name__}: {exc}); "
                "the file is truncated or corrupt: fetch or compress it again",
                reason="truncated_input",
                offset=offset,
            ) from None
        except Exception as exc:  # zstandard.ZstdError and the like
            if type(exc).__module__.startswith("zstandard"):
                raise InputError(
                    self.record.path, line, "<file>", f"corrupt zstd data ({exc})",
                    reason="truncated_input", offset=offset,
                ) from None
            raise

    def _too_long(self, length: int) -> Block:
        block = Block(self.record.path, self.line, 1, self.head, self.offset, too_long=length)
        self.line += 1
        self.offset += length + 1
        self.pending, self.pending_len, self.skipping, self.head = [], 0, False, b""
        return block

    def blocks(self) -> Iterator[Block]:
        """The blocks of whole lines (the caller closes the stream)."""
        chunk = self._read(max(self.step, len(_BOM)))  # the whole BOM, if any, in the first read
        if self.at_file_start and chunk.startswith(_BOM):
            chunk, self.offset = chunk[len(_BOM) :] or self._read(), len(_BOM)
        while chunk:
            yield from self._cut(chunk)
            chunk = self._read()
        if self.skipping:
            yield self._too_long(self.pending_len)
        elif self.pending_len:  # no final newline: supply one
            data = b"".join(self.pending) + b"\n"
            yield Block(self.record.path, self.line, 1, data, self.offset)
            self.line += 1
        self.record.lines = self.line - 1

    def _cut(self, chunk: bytes) -> Iterator[Block]:
        pos = 0
        if self.skipping or self.pending:
            nl = chunk.find(b"\n")
            if nl < 0:
                self.pending_len += len(chunk)
                if not self.skipping and self.pending_len > self.max_line:
                    self.head = _head([*self.pending, chunk])
                    self.pending, self.skipping = [], True
                elif not self.skipping:
                    self.pending.append(chunk)
                return
            if self.skipping or self.pending_len + nl > self.max_line:
                if not self.skipping:
                    self.head = _head([*self.pending, chunk])
                yield self._too_long(self.pending_len + nl)
                pos = nl + 1
        last = chunk.rfind(b"\n", pos)
        if last < 0:
            rest = chunk[pos:]
            if rest:
                self.pending.append(rest)
                self.pending_len += len(rest)
            return
        # one copy of the block's bytes at most: the pending start of its first line joined with a view of the chunk
        whole = pos == 0 and last + 1 == len(chunk)
        body = chunk if whole else memoryview(chunk)[pos : last + 1]
        data = b"".join([*self.pending, body]) if self.pending else body if whole else bytes(body)
        n = chunk.count(b"\n", pos, last + 1)
        yield Block(self.record.path, self.line, n, data, self.offset)
        self.line += n
        self.offset += len(data)
        rest = chunk[last + 1 :]
        self.pending, self.pending_len = ([rest], len(rest)) if rest else ([], 0)
