"""Stage 2 — validate: parse a block of JSONL lines into checked ``Records`` (and ``Reject``s).

Fast path: the whole block goes through pyarrow's multi-threaded JSON parser with an explicit
schema (``pieces: list<struct<text: string, weight: double>>``, other keys ignored), and the
checks run on whole columns (nulls, empty lists, finite non-negative weights, UTF-8 texts).
Exact path: if the parser or any check fails, only that block is parsed again line by line with
the standard library, and ``check_line`` names each bad line's field and reason, e.g.
``raw.jsonl:17: pieces[2].weight: expected a finite number >= 0, found -1.0``. Strict mode raises
the first as an ``InputError``; given a ``rejects`` list, every bad line is appended to it instead.

The two paths accept exactly the same lines (the fuzz tests check it): a line is a JSON object
with a non-empty ``pieces`` list of ``{"text": string, "weight": finite number >= 0}`` (finite as
float32 too, the shards' type: ``weightprep.weights``); no coercion (``"1.0"`` and ``true`` are not
weights); texts must be valid Unicode (invalid UTF-8 bytes or an unpaired ``\\ud800`` escape are
rejected); ``pieces``, ``text`` and ``weight`` may not appear twice in their object (pyarrow refuses
that; other duplicate keys are metadata nobody reads and are let pass, as pyarrow does); other keys
and invalid bytes inside them are ignored. Nesting deeper than Python's ``json`` recursion limit is
judged by pyarrow alone (which has no such limit), so both paths agree on it too.
"""

from __future__ import annotations

import io
import json
import math
import re
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from weightprep.arrow import to_numpy
from weightprep.batches import Block, Chat, Records, Reject
from weightprep.stages.columns import Columns
from weightprep.weights import is_valid_weight, valid_weights, weight_overflow_note

__all__ = ["validate_record", "validate_messages", "check_line", "parse_block", "Invalid", "PIECES_SCHEMA", "REASONS"]

PIECES_SCHEMA = pa.schema(
    [
        pa.field("pieces", pa.list_(pa.struct([pa.field("text", pa.string()), pa.field("weight", pa.float64())]))),
        # typed null: a block holding any (non-null) "messages" fails the fast parse and goes to the exact path
        pa.field("messages", pa.null()),
        pa.field("text", pa.string()),
        pa.field("prompt", pa.string()),  # a message-list prompt fails the fast parse: the exact path takes it
        pa.field("completion", pa.string()),
        pa.field("prompt_weight", pa.float64()),
        pa.field("completion_weight", pa.float64()),
    ]
)
_PARSE = pa_json.ParseOptions(explicit_schema=PIECES_SCHEMA, unexpected_field_behavior="ignore")

_PIECE_HELP = 'a list of {"text": string, "weight": number >= 0} objects'
_SHAPES = (
    '"pieces" (a list of {"text", "weight"}), "messages" (a list of {"role", "content"[, "weight"]}), "text", '
    'or "prompt" + "completion"'
)
_FIRST_NON_SPACE = re.compile(rb"[^ \t\r\n]")
_SPACE = np.zeros(256, dtype=bool)
_SPACE[[ord(" "), ord("\t"), ord("\r"), ord("\n")]] = True

#: Every reason a line can be rejected for (the keys of the manifest's ``rejected`` counts).
REASONS = (
    "line_too_long",
    "invalid_utf8",
    "malformed_json",
    "too_deep",
    "duplicate_key",
    "not_an_object",
    "missing_field",
    "wrong_type",
    "empty_pieces",
    "bad_weight",
    "ambiguous_shape",
    "ambiguous_weight",
    "unknown_weight",
    "non_text_content",
)


class Invalid(NamedTuple):
    """Why a record is invalid: the field path, what is wrong with it, and the reason code."""

    field: str
    problem: str
    reason: str


class _Object(dict):
    """A parsed JSON object that remembers which keys it held more than once (last one wins)."""

    duplicates: frozenset[str] = frozenset()


def _object(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        obj.duplicates = frozenset(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
    return obj


_DECODER = json.JSONDecoder(object_pairs_hook=_object)
#: the same decoder without the hook (no Python call per object), for a line that looks like a plain conversation:
#: its keys are counted in its text instead (``_KEYS``), and a line with as many as its objects hold repeats none
_PLAIN_DECODER = json.JSONDecoder()
_PLAIN_SCAN = _PLAIN_DECODER.scan_once
#: where a key ends: a quote, then a colon. Inside a string a quote is escaped, so this finds every key and, at
#: most, more (an escaped quote before a colon in a string): never fewer than the keys written
_KEYS = re.compile(r'"[ \t\n\r]*:')


def _kind(value: Any) -> str:
    names = {dict: "object", _Object: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}
    kind = names.get(type(value), "number" if isinstance(value, (int, float)) else type(value).__name__)
    shown = repr(value) if not isinstance(value, (dict, list)) else ""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        shown = f"{str(value)[:12]}... ({len(str(value))} digits)"
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return f"{kind} {shown}".rstrip()


def _duplicated(obj: Any, keys: tuple[str, ...]) -> str | None:
    dups = getattr(obj, "duplicates", None)
    return next((k for k in keys if k in dups), None) if dups else None


def _weight_problem(where: str, w: Any) -> Invalid | None:
    if isinstance(w, bool) or not isinstance(w, (int, float)):
        return Invalid(where, f"expected a finite number >= 0, found {_kind(w)}", "wrong_type")
    try:
        value = float(w)
    except OverflowError:  # an integer too large for a float
        value = math.inf
    if not is_valid_weight(value):
        found = _kind(w).removeprefix("number ") + weight_overflow_note(value)
        return Invalid(where, f"expected a finite number >= 0, found {found}", "bad_weight")
    return None


def _text_problem(where: str, text: Any) -> Invalid | None:
    if not isinstance(text, str):
        return Invalid(where, f"expected a string, found {_kind(text)}", "wrong_type")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = text[exc.start]
            what = f"an invalid UTF-8 byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else (
                f"an unpaired surrogate \\u{ord(bad):04x}"
            )
            return Invalid(where, f"not valid Unicode text: {what} at character {exc.start}", "invalid_utf8")
    return None


def _unicode_problem(where: str, value: Any) -> Invalid | None:
    """Invalid Unicode anywhere in a nested value that reaches the chat template."""
    if isinstance(value, str):
        return _text_problem(where, value)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        problem = _unicode_problem(f"{where}.{key}" if isinstance(key, str) else f"{where}[{key}]", item)
        if problem is not None:
            return problem
    return None


def validate_messages(obj: dict) -> Invalid | None:
    """The first problem of a chat record ``{"messages": [...], "tools"?: [...], "chat_template_kwargs"?: {...}}``."""
    if _duplicated(obj, ("messages", "tools", "chat_template_kwargs")):
        key = _duplicated(obj, ("messages", "tools", "chat_template_kwargs"))
        return Invalid(key, "key given more than once in the record; keep one", "duplicate_key")
    problem = _messages_problem(obj["messages"], "messages")
    return problem if problem is not None else _chat_extras_problem(obj)


def _messages_problem(messages: Any, name: str, *, allow_empty: bool = False) -> Invalid | None:
    """The first problem of a list of chat messages at field ``name``."""
    if not isinstance(messages, list):
        return Invalid(name, f"expected a list of {{\"role\", \"content\"}} objects, found {_kind(messages)}", "wrong_type")
    if not messages and not allow_empty:
        return Invalid(name, "empty list; a conversation needs at least one message", "empty_pieces")
    for i, m in enumerate(messages):
        where = f"{name}[{i}]"
        if not isinstance(m, dict):
            return Invalid(where, f'expected an object {{"role": ..., "content": ...}}, found {_kind(m)}', "wrong_type")
        dup = _duplicated(m, ("role", "content", "weight"))
        if dup:
            return Invalid(f"{where}.{dup}", "key given more than once in the message; keep one", "duplicate_key")
        if "role" not in m:
            return Invalid(f"{where}.role", "missing; expected a string such as \"user\" or \"assistant\"", "missing_field")
        if not isinstance(m["role"], str) or not m["role"]:
            return Invalid(f"{where}.role", f"expected a non-empty string, found {_kind(m['role'])}", "wrong_type")
        content = m.get("content")
        if content is None and not m.get("tool_calls"):
            return Invalid(f"{where}.content", "missing; expected a string (only a message with tool_calls may omit it)", "missing_field")
        if content is not None:
            problem = _text_problem(f"{where}.content", content)
            if problem is not None:
                return problem
        if "weight" in m:
            problem = _weight_problem(f"{where}.weight", m["weight"])
            if problem is not None:
                return problem
        for key, value in m.items():
            if key not in ("role", "content", "weight"):
                problem = _unicode_problem(f"{where}.{key}", value)
                if problem is not None:
                    return problem
    return None


def _chat_extras_problem(obj: dict) -> Invalid | None:
    tools = obj.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        return Invalid("tools", f"expected a list of tool (JSON schema) objects, found {_kind(tools)}", "wrong_type")
    kwargs = obj.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        return Invalid("chat_template_kwargs", f"expected an object, found {_kind(kwargs)}", "wrong_type")
    for key in ("tools", "chat_template_kwargs"):
        problem = _unicode_problem(key, obj.get(key))
        if problem is not None:
            return problem
    return None


def _shape(obj: dict) -> str | Invalid:
    """Which accepted shape ``obj`` has: ``pieces``, ``messages``, ``text`` or ``prompt/completion``.

    A key whose value is null does not count; ``"pieces": null`` alone is a pieces record (rejected as such)."""
    others = [k for k in ("messages", "text") if obj.get(k) is not None]
    if obj.get("prompt") is not None or obj.get("completion") is not None:
        others.append("prompt/completion")
    shapes = (["pieces"] if "pieces" in obj and (obj["pieces"] is not None or not others) else []) + others
    if len(shapes) > 1:
        return Invalid(
            "<record>", f"holds {' and '.join(map(repr, shapes))}; a record has exactly one of {_SHAPES}", "ambiguous_shape"
        )
    if not shapes:
        from weightprep.stages.shapes import closest_shapes

        return Invalid("pieces", f"missing; expected {_SHAPES}, or a shape of another tool (docs/inputs.md); "
                       f"{closest_shapes(obj)}", "missing_field")  # fmt: skip
    return shapes[0]


def _prompt_completion_problem(obj: dict) -> Invalid | None:
    dup = _duplicated(obj, ("prompt", "completion", "prompt_weight", "completion_weight"))
    if dup:
        return Invalid(dup, "key given more than once in the record; keep one", "duplicate_key")
    for key in ("prompt", "completion"):
        if obj.get(key) is None:
            other = "completion" if key == "prompt" else "prompt"
            return Invalid(key, f"missing; a record with {other!r} needs both prompt and completion", "missing_field")
    for key in ("prompt_weight", "completion_weight"):
        if obj.get(key) is not None:
            problem = _weight_problem(key, obj[key])
            if problem is not None:
                return problem
    prompt, completion = obj["prompt"], obj["completion"]
    if isinstance(prompt, str) and isinstance(completion, str):
        return _text_problem("prompt", prompt) or _text_problem("completion", completion)
    if isinstance(prompt, list) and isinstance(completion, list):  # a conversation, TRL's conversational form
        return (
            _messages_problem(prompt, "prompt", allow_empty=True)
            or _messages_problem(completion, "completion")
            or _chat_extras_problem(obj)
        )
    return Invalid(
        "completion" if isinstance(prompt, (str, list)) else "prompt",
        f"prompt and completion must both be strings or both message lists; found {_kind(prompt)} and "
        f"{_kind(completion)}",
        "wrong_type",
    )


def record_content(obj: dict) -> list[tuple[str, float]] | Chat:
    """A valid record as its pieces (``text`` and string ``prompt``/``completion`` forms included) or its
    conversation (``messages``, or message-list ``prompt``/``completion``: prompt messages at ``prompt_weight``,
    default 0, unless they carry their own; completion messages at their own weight, else ``completion_weight``,
    else the role's default)."""
    shape = _shape(obj)
    if shape == "pieces":
        return [(p["text"], float(p["weight"])) for p in obj["pieces"]]
    if shape == "text":
        return [(obj["text"], 1.0)]
    if shape == "messages":
        return Chat(obj["messages"], obj.get("tools"), obj.get("chat_template_kwargs"), b"")
    pw = obj.get("prompt_weight")
    cw = obj.get("completion_weight")
    if isinstance(obj["prompt"], str):
        return [(obj["prompt"], 0.0 if pw is None else float(pw)), (obj["completion"], 1.0 if cw is None else float(cw))]
    prompt = [m if "weight" in m else {**m, "weight": 0.0 if pw is None else float(pw)} for m in obj["prompt"]]
    completion = [m if "weight" in m or cw is None else {**m, "weight": float(cw)} for m in obj["completion"]]
    return Chat([*prompt, *completion], obj.get("tools"), obj.get("chat_template_kwargs"), b"")


def validate_record(obj: Any) -> Invalid | None:
    """The first problem of a parsed record, or None if it is valid.

    >>> validate_record({"pieces": [{"text": "a", "weight": -1}]})
    Invalid(field='pieces[0].weight', problem='expected a finite number >= 0, found -1', reason='bad_weight')
    """
    if not isinstance(obj, dict):
        return Invalid("<record>", f"expected a JSON object with {_SHAPES}, found {_kind(obj)}", "not_an_object")
    shape = _shape(obj)
    if isinstance(shape, Invalid):
        return shape
    if shape == "messages":
        return validate_messages(obj)
    if shape == "text":
        if _duplicated(obj, ("text",)):
            return Invalid("text", "key given more than once in the record; keep one", "duplicate_key")
        return _text_problem("text", obj["text"])
    if shape == "prompt/completion":
        return _prompt_completion_problem(obj)
    if _duplicated(obj, ("pieces",)):
        return Invalid("pieces", "key given more than once in the record; keep one", "duplicate_key")
    pieces = obj["pieces"]
    if not isinstance(pieces, list):
        return Invalid("pieces", f"expected {_PIECE_HELP}, found {_kind(pieces)}", "wrong_type")
    if not pieces:
        return Invalid("pieces", "empty list; a record needs at least one piece", "empty_pieces")
    for i, piece in enumerate(pieces):
        where = f"pieces[{i}]"
        if not isinstance(piece, dict):
            return Invalid(where, f'expected an object {{"text": ..., "weight": ...}}, found {_kind(piece)}', "wrong_type")
        dup = _duplicated(piece, ("text", "weight"))
        if dup:
            return Invalid(f"{where}.{dup}", "key given more than once in the piece; keep one", "duplicate_key")
        if "text" not in piece:
            return Invalid(f"{where}.text", "missing; expected a string", "missing_field")
        problem = _text_problem(f"{where}.text", piece["text"])
        if problem is not None:
            return problem
        if "weight" not in piece:
            return Invalid(f"{where}.weight", "missing; expected a finite number >= 0", "missing_field")
        problem = _weight_problem(f"{where}.weight", piece["weight"])
        if problem is not None:
            return problem
    return None


def check_line(
    raw: bytes, columns: Columns | None = None
) -> tuple[list[tuple[str, float]] | Chat | None, Invalid | None]:
    """Parse one line (without its newline) exactly: its pieces as (text, weight) pairs, or its conversation
    (a ``Chat``), or why not; its fields, message keys and roles named as ``columns`` maps them."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        # invalid bytes become lone surrogates: rejected if they land in a text, ignored in metadata
        text = raw.decode("utf-8", "surrogateescape")
    if not columns and text.startswith('{"messages"'):  # the usual chat line, without the hook (``_PLAIN_DECODER``)
        try:  # its scanner itself: ``decode`` is it and two searches for the whitespace around the value
            plain, end = _PLAIN_SCAN(text, 0)
        except (StopIteration, json.JSONDecodeError, RecursionError):
            plain = None  # the exact path says why
        else:
            if end != len(text) and text[end:].strip(" \t\n\r"):
                plain = None  # more than the value: the exact path says what
        chat = _plain_chat(plain, raw, text) if type(plain) is dict else None
        if chat is not None:
            return chat, None
    try:
        # one decoder for every line (``json.loads`` makes one per call); a leading BOM refused as json.loads does
        obj = _DECODER.decode(text) if not text.startswith("\ufeff") else json.loads(text, object_pairs_hook=_object)
    except json.JSONDecodeError as exc:
        where = f"column {exc.colno}" if exc.msg.endswith(" at") else f"at column {exc.colno}"  # "starting at"
        return None, Invalid("<json>", f"malformed JSON: {exc.msg} {where}", "malformed_json")
    except RecursionError:
        return _check_deep(raw)
    if not columns:
        chat = _plain_chat(obj, raw)
        if chat is not None:
            return chat, None
    if isinstance(obj, dict):
        from weightprep.stages.shapes import to_canonical  # (shapes builds on this module's checks)

        obj = to_canonical(obj, columns)
        if isinstance(obj, Invalid):
            return None, obj
    problem = validate_record(obj)
    if problem is not None:  # named as the record has it, where it was converted from another shape
        return None, problem._replace(field=obj.original_field(problem.field)) if hasattr(obj, "original_field") else problem
    content = record_content(obj)
    return (content._replace(raw=raw) if isinstance(content, Chat) else content), None


def _plain_chat(obj: Any, raw: bytes, text: str | None = None) -> Chat | None:
    """The conversation of a record that is ``{"messages": [...]}`` alone, each message ``{"role", "content"}`` of
    two strings or those and a ``weight`` number, each key once, all valid; None for any other record, which the
    general path (``to_canonical``, ``validate_record``, ``record_content``) then takes. For such a record that path
    converts nothing and finds no problem, so this is its answer, in one pass over the messages (the usual chat
    record: ~20 µs of its ~30 µs of checks). ``obj`` parsed by ``_DECODER`` (its objects know their repeated keys),
    or by ``_PLAIN_DECODER`` from ``text``, its line: then its keys, counted in the line (``_KEYS``, only once all
    else holds), must be as many as its objects hold, none repeated."""
    hooked = text is None
    kind = _Object if hooked else dict
    if type(obj) is not kind or len(obj) != 1 or (hooked and obj.duplicates):
        return None
    messages = obj.get("messages")
    if type(messages) is not list or not messages:
        return None
    held = 1  # the keys of the objects: the record's one, then each message's
    for m in messages:
        if type(m) is not kind or (hooked and m.duplicates):
            return None
        held += len(m)
        role, content = m.get("role"), m.get("content")
        if type(role) is not str or not role or type(content) is not str:
            return None
        if len(m) != 2 and (len(m) != 3 or "weight" not in m or _weight_problem("", m["weight"]) is not None):
            return None
        if not content.isascii() and _text_problem("", content) is not None:
            return None
    if not hooked and len(_KEYS.findall(text)) != held:  # a key repeated (or an escaped quote before a colon)
        return None
    return Chat(messages, None, None, raw)


def _check_deep(raw: bytes) -> tuple[list[tuple[str, float]] | None, Invalid | None]:
    """A line nested too deep for Python's json: pyarrow (no recursion limit) decides, as on the fast path."""
    records = _parse_fast(Block("<line>", 1, 1, raw + b"\n"))
    if records is None or len(records) != 1:
        return None, Invalid(
            "<json>", "nested too deeply to check, and not a valid record by the columnar parser either", "too_deep"
        )
    return list(zip(records.texts, records.piece_weights.tolist(), strict=True)), None


def parse_block(block: Block, rejects: list[Reject] | None = None, columns: Columns | None = None) -> Records:
    """Parse and check ``block``, its records' names mapped by ``columns`` (``weightprep.stages.columns``; then
    line by line: the columnar parser reads the canonical names only).

    Strict (``rejects`` is None): raise ``InputError`` naming the first bad line and field.
    Lenient: append every bad line to ``rejects`` and return the valid records.
    """
    if block.too_long:
        found = [_too_long(block)]
        records = _records(block.path, [], [], [], [0])
    else:
        fast = None if columns else _parse_fast(block)
        if fast is not None:
            return fast
        records, found = _parse_exact(block, columns)
    if found and rejects is None:
        raise found[0].error()
    if rejects is not None:
        rejects.extend(found)
    return records


def _too_long(block: Block) -> Reject:
    return Reject(
        block.path, block.first_line, block.offset, "line_too_long", "<line>",
        f"line of {block.too_long:,} bytes is longer than read.max_line_bytes; split the record or raise the limit "
        "(--max-line-bytes)",
        block.data, block.too_long,
    )


def _nonblank_lines(block: Block) -> np.ndarray:
    """Line numbers of the block's lines that hold more than spaces, tabs and carriage returns."""
    data = np.frombuffer(block.data, dtype=np.uint8)
    ends = np.flatnonzero(data == ord("\n"))[: block.n_lines]
    solid = np.concatenate([[0], np.cumsum(~_SPACE[data], dtype=np.int64)])
    starts = np.concatenate([[0], ends[:-1] + 1])
    keep = solid[ends] - solid[starts] > 0
    return np.flatnonzero(keep).astype(np.int64) + block.first_line


def _parse_fast(block: Block) -> Records | None:
    """Columnar parse and checks; None when anything is off (the exact path then explains it)."""
    first = _FIRST_NON_SPACE.search(block.data)
    if first is None or block.data[first.start()] != ord("{"):
        return None  # pyarrow crashes (SIGSEGV) on a block whose first value is `null`; only objects go to it
    try:
        table = pa_json.read_json(
            io.BytesIO(block.data),
            read_options=pa_json.ReadOptions(block_size=max(len(block.data), 1 << 16) + 1),
            parse_options=_PARSE,
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows == block.n_lines:
        lines = np.arange(block.first_line, block.first_line + block.n_lines, dtype=np.int64)
    else:  # blank lines give no row; each other line must give exactly one
        lines = _nonblank_lines(block)
        if len(lines) != table.num_rows:
            return None
    pieces = table.column("pieces").combine_chunks()
    if pieces.null_count:
        return _fast_other_shapes(block.path, lines, table)
    if any(table.column(k).null_count != table.num_rows for k in ("text", "prompt", "completion")):
        return None  # a pieces record with another shape too: the exact path rejects it as ambiguous
    offsets = to_numpy(pieces.offsets).astype(np.int64)
    first = int(offsets[0])
    offsets -= first
    if len(offsets) > 1 and (np.diff(offsets) == 0).any():
        return None
    # the pieces' structs as a slice of the list's values (``flatten`` copies them; no list is null here)
    structs = pieces.values.slice(first, int(offsets[-1]))
    text, weight = structs.field("text"), structs.field("weight")
    if structs.null_count or text.null_count or weight.null_count:
        return None
    weights = to_numpy(weight)  # float64 by the schema (a cast would import pyarrow.compute: ~0.04 s)
    if not valid_weights(weights).all():
        return None
    try:
        texts = text.to_pylist()  # decodes every text: invalid UTF-8 raises here
    except UnicodeDecodeError:
        return None
    return Records(block.path, lines, texts, weights.astype(np.float64), offsets)


def _fast_other_shapes(path: str, lines: np.ndarray, table: pa.Table) -> Records | None:
    """The fast path for blocks with ``text`` and string ``prompt``/``completion`` records (and pieces)."""
    cols = {name: table.column(name).combine_chunks() for name in table.column_names}
    has = {name: ~np.asarray(cols[name].is_null()) for name in ("pieces", "text", "prompt", "completion")}
    pc = has["prompt"] | has["completion"]
    shapes = has["pieces"].astype(int) + has["text"] + pc
    if (shapes != 1).any() or (pc & ~(has["prompt"] & has["completion"])).any():
        return None  # ambiguous, missing or half a pair: the exact path says which
    weights_of = {}
    for key, default in (("prompt_weight", 0.0), ("completion_weight", 1.0)):
        null = np.asarray(cols[key].is_null())
        w = np.where(null, default, cols[key].to_numpy(zero_copy_only=False).astype(np.float64))
        if (pc & ~valid_weights(w)).any():
            return None
        weights_of[key] = w
    try:
        text_col, prompt_col, completion_col = (cols[k].to_pylist() for k in ("text", "prompt", "completion"))
        piece_rows = cols["pieces"].to_pylist()
    except UnicodeDecodeError:
        return None
    texts: list[str] = []
    weights: list[float] = []
    offsets = [0]
    for r in range(len(lines)):
        if has["text"][r]:
            texts.append(text_col[r])
            weights.append(1.0)
        elif pc[r]:
            texts += (prompt_col[r], completion_col[r])
            weights += (float(weights_of["prompt_weight"][r]), float(weights_of["completion_weight"][r]))
        else:
            row = piece_rows[r]
            if not row or any(p is None or p["text"] is None or p["weight"] is None for p in row):
                return None
            for p in row:
                texts.append(p["text"])
                weights.append(float(p["weight"]))
        offsets.append(len(texts))
    if not valid_weights(weights).all():  # the pieces' weights (the others are checked above), all at once
        return None
    return _records(path, lines.tolist(), texts, weights, offsets)


def _records(
    path: str, lines: list[int], texts: list[str], weights: list[float], offsets: list[int],
    chats: list[Chat | None] | None = None,
) -> Records:  # fmt: skip
    return Records(
        path,
        np.asarray(lines, dtype=np.int64),
        texts,
        np.asarray(weights, dtype=np.float64),
        np.asarray(offsets, dtype=np.int64),
        chats if chats and any(c is not None for c in chats) else None,
    )


def _parse_exact(block: Block, columns: Columns | None = None) -> tuple[Records, list[Reject]]:
    """Line-by-line parse with exact error locations; skips blank lines."""
    lines: list[int] = []
    texts: list[str] = []
    weights: list[float] = []
    offsets = [0]
    chats: list[Chat | None] = []
    rejects: list[Reject] = []
    offset = block.offset
    for i, raw in enumerate(block.data.split(b"\n")[: block.n_lines]):
        line_no, line_offset = block.first_line + i, offset
        offset += len(raw) + 1
        if not raw.strip(b" \t\r"):
            continue
        pieces, problem = check_line(raw, columns)
        if problem is not None:
            bare = raw[:-1] if raw.endswith(b"\r") else raw
            rejects.append(Reject(block.path, line_no, line_offset, problem.reason, problem.field, problem.problem, bare, len(bare)))
            continue
        assert pieces is not None
        lines.append(line_no)
        if isinstance(pieces, Chat):
            bare = raw[:-1] if raw.endswith(b"\r") else raw
            chats.append(Chat(pieces.messages, pieces.tools, pieces.template_kwargs, bare, line_offset))
        else:
            chats.append(None)
            for t, w in pieces:
                texts.append(t)
                weights.append(w)
        offsets.append(len(texts))
    return _records(block.path, lines, texts, weights, offsets, chats), rejects
