"""Stage 2 — validate: parse a block of JSONL lines into checked ``Records``.

Fast path: the whole block goes through pyarrow's multi-threaded JSON parser with an explicit
schema (``pieces: list<struct<text: string, weight: double>>``, other keys ignored), and the
checks run on whole columns (nulls, empty lists, finite non-negative weights).
Exact path: if the parser or any check fails, only that block is parsed again line by line with
the standard library, and ``validate_record`` names the first bad line and field, e.g.
``raw.jsonl:17: pieces[2].weight: expected a finite number >= 0, found -1.0``.
"""

from __future__ import annotations

import io
import json
import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from weightprep.batches import Block, Records
from weightprep.errors import InputError

__all__ = ["validate_record", "parse_block", "PIECES_SCHEMA"]

PIECES_SCHEMA = pa.schema(
    [pa.field("pieces", pa.list_(pa.struct([pa.field("text", pa.string()), pa.field("weight", pa.float64())])))]
)
_PARSE = pa_json.ParseOptions(explicit_schema=PIECES_SCHEMA, unexpected_field_behavior="ignore")

_PIECE_HELP = 'a list of {"text": string, "weight": number >= 0} objects'


def _kind(value: Any) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}
    kind = names.get(type(value), "number" if isinstance(value, (int, float)) else type(value).__name__)
    shown = repr(value) if not isinstance(value, (dict, list)) else ""
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return f"{kind} {shown}".rstrip()


def validate_record(obj: Any) -> tuple[str, str] | None:
    """Return ``(field, problem)`` for the first problem of a parsed record, or None if it is valid."""
    if not isinstance(obj, dict):
        return "<record>", f"expected a JSON object with a 'pieces' key, found {_kind(obj)}"
    if "pieces" not in obj:
        return "pieces", f"missing; expected {_PIECE_HELP}"
    pieces = obj["pieces"]
    if not isinstance(pieces, list):
        return "pieces", f"expected {_PIECE_HELP}, found {_kind(pieces)}"
    if not pieces:
        return "pieces", "empty list; a record needs at least one piece"
    for i, piece in enumerate(pieces):
        where = f"pieces[{i}]"
        if not isinstance(piece, dict):
            return where, f'expected an object {{"text": ..., "weight": ...}}, found {_kind(piece)}'
        if "text" not in piece:
            return f"{where}.text", "missing; expected a string"
        if not isinstance(piece["text"], str):
            return f"{where}.text", f"expected a string, found {_kind(piece['text'])}"
        if "weight" not in piece:
            return f"{where}.weight", "missing; expected a finite number >= 0"
        w = piece["weight"]
        if isinstance(w, bool) or not isinstance(w, (int, float)):
            return f"{where}.weight", f"expected a finite number >= 0, found {_kind(w)}"
        if not math.isfinite(w) or w < 0:
            return f"{where}.weight", f"expected a finite number >= 0, found {w!r}"
    return None


def parse_block(block: Block) -> Records:
    """Parse and check ``block``; raise ``InputError`` naming the first bad line and field."""
    records = _parse_fast(block)
    return records if records is not None else _parse_exact(block)


def _parse_fast(block: Block) -> Records | None:
    """Columnar parse and checks; None when anything is off (the exact path then explains it)."""
    try:
        table = pa_json.read_json(
            io.BytesIO(block.data),
            read_options=pa_json.ReadOptions(block_size=max(len(block.data), 1 << 16) + 1),
            parse_options=_PARSE,
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != block.n_lines:  # blank lines shift rows against lines
        return None
    pieces = table.column("pieces").combine_chunks()
    if pieces.null_count:
        return None
    offsets = pieces.offsets.to_numpy().astype(np.int64)
    offsets -= offsets[0]
    if len(offsets) > 1 and (np.diff(offsets) == 0).any():
        return None
    structs = pieces.flatten()
    text, weight = structs.field("text"), structs.field("weight")
    if structs.null_count or text.null_count or weight.null_count:
        return None
    weights = weight.to_numpy(zero_copy_only=False)
    if not (np.isfinite(weights).all() and (weights >= 0).all()):
        return None
    lines = np.arange(block.first_line, block.first_line + block.n_lines, dtype=np.int64)
    return Records(block.path, lines, text.to_pylist(), weights.astype(np.float64), offsets)


def _parse_exact(block: Block) -> Records:
    """Line-by-line parse with exact error locations; skips blank lines."""
    lines: list[int] = []
    texts: list[str] = []
    weights: list[float] = []
    offsets = [0]
    for i, raw in enumerate(block.data.split(b"\n")[: block.n_lines]):
        line_no = block.first_line + i
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except UnicodeDecodeError as exc:
            raise InputError(block.path, line_no, "<line>", f"not valid UTF-8 at byte {exc.start}") from None
        except json.JSONDecodeError as exc:
            raise InputError(
                block.path, line_no, "<json>", f"malformed JSON: {exc.msg} at column {exc.colno}"
            ) from None
        problem = validate_record(obj)
        if problem is not None:
            raise InputError(block.path, line_no, *problem)
        lines.append(line_no)
        for piece in obj["pieces"]:
            texts.append(piece["text"])
            weights.append(float(piece["weight"]))
        offsets.append(len(texts))
    return Records(
        block.path,
        np.asarray(lines, dtype=np.int64),
        texts,
        np.asarray(weights, dtype=np.float64),
        np.asarray(offsets, dtype=np.int64),
    )
