"""The record of one input file as it is read: its size, hash, record count and progress (``InputFile``), filled by
the reader of its kind (``weightprep.stages.read``, ``weightprep.stages.columnar``) and kept apart from them so
that no reader imports another."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

__all__ = ["InputFile"]


@dataclass
class InputFile:
    """One input file; ``size``, ``sha256`` and ``lines`` are filled as it is read. ``behind``: the bytes of the
    file behind the last block handed on, read-ahead left out (a compressed file's: the compressed bytes that the
    decompressor has consumed, in proportion to the decompressed bytes handed on of those it has made; a columnar
    file's: its share of rows or batches) -- what a mixed part's share of its source and progress are counted in."""

    path: str
    size: int = 0
    sha256: str = ""
    lines: int = 0
    behind: int = 0
    _hash: Any = field(default_factory=hashlib.sha256, repr=False)
