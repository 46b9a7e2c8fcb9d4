"""Stage 1 — read: stream JSONL (or .jsonl.gz) files as blocks of whole lines.

Memory is bounded by ``block_bytes`` whatever the file size: each block is the next
``block_bytes`` of the (decompressed) stream cut back to its last newline, tagged with the line
number it starts at, so every later stage can name the exact line of a record. The raw bytes of
every file are hashed (SHA-256) and counted on the way, for the manifest; nothing is read twice.
"""

from __future__ import annotations

import gzip
import hashlib
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from weightprep.batches import Block
from weightprep.errors import UsageError

__all__ = ["InputFile", "read_blocks", "check_inputs"]


@dataclass
class InputFile:
    """One input file; ``size`` and ``sha256`` are filled as it is read."""

    path: str
    size: int = 0
    sha256: str = ""
    lines: int = 0
    _hash: hashlib._Hash = field(default_factory=hashlib.sha256, repr=False)

    def as_manifest(self) -> dict[str, object]:
        return {"path": self.path, "bytes": self.size, "sha256": self.sha256, "lines": self.lines}


class _HashingReader(io.RawIOBase):
    """Passes reads through while hashing and counting the raw (compressed) bytes."""

    def __init__(self, raw: BinaryIO, record: InputFile) -> None:
        self._raw = raw
        self._record = record

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray) -> int:  # type: ignore[override]
        n = self._raw.readinto(buffer)  # type: ignore[attr-defined]
        if n:
            self._record._hash.update(memoryview(buffer)[:n])
            self._record.size += n
        return n or 0


def check_inputs(paths: list[str]) -> None:
    """Fail before any work if an input is missing, a directory, or of an unknown kind."""
    if not paths:
        raise UsageError("no input files given; usage: weightprep build FILE.jsonl [FILE.jsonl.gz ...]")
    for p in paths:
        path = Path(p)
        if not path.exists():
            raise UsageError(f"input file not found: {p}")
        if not path.is_file():
            raise UsageError(f"input is not a file: {p}")
        if not (p.endswith(".jsonl") or p.endswith(".jsonl.gz") or p.endswith(".json") or p.endswith(".ndjson")):
            raise UsageError(f"{p}: expected a .jsonl or .jsonl.gz file (one JSON object per line)")


def _open(record: InputFile, raw: BinaryIO) -> BinaryIO:
    hashed = io.BufferedReader(_HashingReader(raw, record), buffer_size=1 << 20)
    if record.path.endswith(".gz"):
        return gzip.GzipFile(fileobj=hashed, mode="rb")  # type: ignore[return-value]
    return hashed  # type: ignore[return-value]


def read_blocks(record: InputFile, block_bytes: int) -> Iterator[Block]:
    """Yield ``Block``s of whole lines of ``record.path``; fills in its size, hash and line count."""
    with open(record.path, "rb") as raw:
        yield from _blocks(record, _open(record, raw), block_bytes)
    # hash only complete once the stream is drained (the gzip trailer included)
    record.sha256 = record._hash.hexdigest()


def _blocks(record: InputFile, stream: BinaryIO, block_bytes: int) -> Iterator[Block]:
    line = 1
    carry = b""
    try:
        while True:
            try:
                chunk = stream.read(block_bytes)
            except (OSError, EOFError) as exc:  # corrupt gzip, truncated file
                raise UsageError(f"{record.path}: cannot read past line {line}: {exc}") from None
            if not chunk:
                break
            data = carry + chunk if carry else chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0:  # no newline yet: a line longer than a block, keep reading
                carry = data
                continue
            block, carry = data[:cut], data[cut:]
            n = block.count(b"\n")
            yield Block(record.path, line, n, block)
            line += n
        if carry.strip():
            yield Block(record.path, line, 1, carry + b"\n")
            line += 1
    finally:
        stream.close()
    record.lines = line - 1
