"""Quarantine: with ``--skip-invalid``, every invalid line goes to ``rejects.jsonl`` in the output.

One JSON object per rejected line, in input order (file, then line), so a rerun writes the same
bytes::

    {"source": "raw.jsonl", "line": 4, "byte_offset": 180, "reason": "bad_weight",
     "field": "pieces[1].weight", "problem": "expected a finite number >= 0, found -0.5",
     "original": "{\\"pieces\\": [...]}"}

A row of a Parquet or Arrow input has ``"row"`` (from 0) in place of ``line`` and ``byte_offset``, and its
``original`` is the row as JSON; a record of a JSON array has ``"record"`` (its index, from 0) in place of ``line``,
its ``byte_offset`` is just past the ``[`` or ``,`` before it, and its ``original`` is the record with its newlines
as tabs (with the whitespace before it). A text file's record is the ``{"text"}`` object it
became. ``original`` is the line verbatim as a string, without its line ending (``\\n`` or ``\\r\\n``).
A line that is not valid UTF-8 has ``original_base64`` (its exact bytes, base64) instead, so
nothing is lost or altered. A ``line_too_long`` reject keeps only the first bytes of the line
(``original_truncated: true``, ``line_bytes`` its full length); the rest was never read into memory.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from pathlib import Path
from typing import IO, Any

from weightprep.batches import Reject
from weightprep.errors import record_unit
from weightprep.redact import redact

__all__ = ["REJECTS_NAME", "RejectsWriter", "reject_as_json"]

#: File name of the quarantine inside the output directory.
REJECTS_NAME = "rejects.jsonl"


def reject_as_json(reject: Reject) -> dict[str, Any]:
    """The rejects.jsonl object of one reject (see the module docstring)."""
    unit = record_unit(reject.path)
    where = {"row": reject.line} if unit == "row" else {unit: reject.line, "byte_offset": reject.offset}
    entry: dict[str, Any] = {
        "source": redact(reject.path),  # what a file is called, never its URL's secrets
        **where,
        "reason": reject.reason,
        "field": reject.field,
        "problem": reject.problem,
    }
    try:
        entry["original"] = reject.raw.decode("utf-8")
    except UnicodeDecodeError:
        entry["original_base64"] = base64.b64encode(reject.raw).decode("ascii")
    if reject.line_bytes != len(reject.raw):
        entry["original_truncated"] = True
        entry["line_bytes"] = reject.line_bytes
    return entry


class RejectsWriter:
    """Appends rejects to ``directory/rejects.jsonl`` and counts them by reason."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / REJECTS_NAME
        self._file: IO[str] | None = self.path.open("w", encoding="utf-8", newline="\n")
        self.counts: Counter[str] = Counter()

    def write(self, rejects: list[Reject]) -> None:
        assert self._file is not None, "write after close"
        for r in rejects:
            self._file.write(json.dumps(reject_as_json(r), ensure_ascii=False) + "\n")
            self.counts[r.reason] += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
