"""Stage 2, shapes: the record shapes other tools write, each turned into the canonical record by one converter,
recognized by its keys with no flag (docs/inputs.md has the table).

The canonical records are weightprep's own (``pieces``, ``messages``, ``text``, ``prompt`` + ``completion``:
``weightprep.stages.validate``). ``to_canonical`` returns one of them, or why the record cannot be one:

- **Alpaca** (``instruction``, ``input``, ``output``, optional ``system``, ``history``; LLaMA-Factory's
  ``AlpacaDatasetConverter``): ``messages`` = the system message (if ``system`` is a non-empty string), a user and
  an assistant message per ``[prompt, response]`` pair of ``history``, the user message
  ``"\\n".join([instruction, input])`` (each only if non-empty) and the assistant message ``output``.
- **ShareGPT** (``conversations``, or ``messages`` whose messages have ``from``/``value``; LLaMA-Factory's
  ``SharegptDatasetConverter``, FastChat's role names): ``human``/``user`` -> user, ``gpt``/``assistant``/
  ``chatgpt``/``bing``/``bard``/``model`` -> assistant, ``system`` -> system, ``observation``/``tool`` -> a
  ``tool`` message, ``function_call`` -> an assistant message whose ``tool_calls`` are its value, a JSON object
  ``{"name", "arguments"}`` or a list of them. ``system`` of the record becomes the first message unless the
  conversation starts with one (LLaMA-Factory's rule); ``tools``, a JSON string or a list, each tool wrapped as
  ``{"type": "function", "function": TOOL}`` unless it is already (as LLaMA-Factory's templates wrap them).
  Messages of ``role``/``content`` under ``conversations`` are read the same way (the role names above).
  ``tools`` as a JSON string is parsed and wrapped so beside ``messages`` too.
- **Hub chat sets** (HuggingFaceH4's ``ultrachat_200k``, ``no_robots``): ``messages`` beside a string ``prompt``
  (and ``prompt_id``) with no ``completion``: built from ``messages``, as TRL does; ``prompt`` is metadata.

Every message list (of any shape) is normalized by ``_messages``:

- ``content`` as a list of parts (OpenAI and transformers ``{"type": "text", "text": ...}``, LLaMA-Factory v1
  ``{"type": "text", "value": ...}``) is the concatenation of their texts; LLaMA-Factory v1's ``reasoning`` parts
  are the message's ``reasoning_content`` (concatenated) and its ``tool_call`` parts (JSON ``{"name",
  "arguments"}``) its ``tool_calls``, as its ``_to_hf_messages`` makes them. Any other part (an image, audio) is
  refused (``non_text_content``): this builds text, and a dropped part would silently change the conversation.
- The weight of a message, as the tools write it: ``weight`` (ours, axolotl: a number), ``loss_weight``
  (LLaMA-Factory v1: a number), ``train`` (axolotl: true/false), ``loss`` (ms-swift: true/false); true is 1 and
  false 0; null is no weight (the role's default). Two on one message are ``ambiguous_weight``. A key that looks
  like a weight but is none of these (``training``, ``loss_mask``, ``Weight``, ``train_detail`` ...) is refused
  (``unknown_weight``) rather than ignored: ignored, the message would train at its role's default -- what
  axolotl's ``"train": false`` did before this module -- and a warning is easily lost in a long build.

Other names (``--columns``: fields, message keys, roles) are applied first (``_renamed``). A record matching no
shape is ``missing_field``, naming the shapes whose keys it comes closest to and the keys it
has. Conversion is skipped (the record returned as it is) for records already canonical with plain messages.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from weightprep.stages.columns import Columns
from weightprep.stages.validate import Invalid, _kind, _weight_problem

__all__ = ["to_canonical", "closest_shapes", "is_conversation", "Converted", "SHAPE_KEYS", "WEIGHT_KEYS"]

#: The keys that make each shape, for the message of a record that has none.
SHAPE_KEYS = {
    "pieces": ("pieces",),
    "messages": ("messages",),
    "text": ("text",),
    "prompt/completion": ("prompt", "completion"),
    "Alpaca": ("instruction", "output"),
    "ShareGPT": ("conversations",),
}
#: The per-message weight keys read, and how each is written (a number, or a boolean for 1/0).
WEIGHT_KEYS = {"weight": "number", "loss_weight": "number", "train": "boolean", "loss": "boolean"}
#: Keys that look like a per-message weight but are none of WEIGHT_KEYS: refused, never silently ignored.
_WEIGHT_LIKE = frozenset(
    {"training", "trainable", "train_on", "weights", "loss_mask", "label_mask", "mask", "loss_scale", "no_loss",
     "ignore_loss", "train_detail"}
)  # fmt: skip
_SQUASHED = {k.replace("_", ""): k for k in WEIGHT_KEYS}
_SHAREGPT_ROLES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant",
    "model": "assistant",
    "system": "system",
    "observation": "tool", "tool": "tool",
    "function_call": "assistant",
}  # fmt: skip
_CANONICAL = ("pieces", "messages", "text", "prompt", "completion")


def to_canonical(obj: dict, columns: Columns | None = None) -> dict | Invalid:
    """The canonical record ``obj`` stands for (``obj`` itself where it already is one), or why there is none;
    its fields, message keys and roles first named as ``columns`` maps them (``weightprep.stages.columns``)."""
    if columns:
        renamed = _renamed(obj, columns)
        if isinstance(renamed, Invalid):
            return renamed
        obj = renamed
    has = {k for k in obj if obj[k] is not None}
    if "conversations" in has:
        if has & set(_CANONICAL):
            other = sorted(has & set(_CANONICAL))[0]
            return Invalid("<record>", f"holds 'conversations' (ShareGPT) and {other!r}; keep one", "ambiguous_shape")
        return _sharegpt(obj, "conversations")
    messages = obj.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[0], dict) and "role" not in messages[0] and (
        "from" in messages[0] or "value" in messages[0]
    ):
        return _sharegpt(obj, "messages")
    if {"instruction", "output"} <= has:
        if has & set(_CANONICAL):
            other = sorted(has & set(_CANONICAL))[0]
            return Invalid("<record>", f"holds 'instruction' + 'output' (Alpaca) and {other!r}; keep one",
                           "ambiguous_shape")  # fmt: skip
        return _alpaca(obj)
    if "messages" in has and isinstance(obj.get("prompt"), str) and "completion" not in has:
        obj = _copy(obj, {k: v for k, v in obj.items() if k not in ("prompt", "prompt_id")})  # the Hub's layout
    for key in ("messages", "prompt", "completion"):
        if isinstance(obj.get(key), list):
            converted = _messages(obj[key], key)
            if isinstance(converted, Invalid):
                return converted
            if converted is not obj[key]:
                obj = _copy(obj, {**obj, key: converted})
    if isinstance(obj.get("tools"), str) and has & {"messages", "prompt"}:  # tools as a JSON string, as ShareGPT's
        tools = _tools(obj["tools"])
        if isinstance(tools, Invalid):
            return tools
        obj = _copy(obj, {**obj, "tools": tools})
    return obj


def is_conversation(obj: dict, columns: Columns | None = None) -> bool:
    """Whether record ``obj`` is built as a conversation, through the chat template: its canonical record
    (``to_canonical``) holds a message list (``messages``, a conversational ``prompt``: Alpaca and ShareGPT too)."""
    canonical = to_canonical(obj, columns)
    return isinstance(canonical, dict) and any(isinstance(canonical.get(k), list) for k in ("messages", "prompt"))


def _rename(obj: dict, mapping: dict[str, str], where: str, how: str) -> dict | Invalid:
    """``obj`` with its keys renamed by ``mapping``; two keys that would get one name are refused, never last one
    wins (the same rule as for a Parquet file's columns)."""
    if not any(k in mapping for k in obj):
        return obj
    names: dict[str, str] = {}
    for key in obj:
        name = mapping.get(key, key)
        if name in names:
            held = [names[name], key]
            renamed = [f"{how}{name}={k}" for k in held if k != name]
            return Invalid(f"{where}{name}", f"{' and '.join(map(repr, held))} would both be {name!r} (renamed by "
                           f"--columns {', '.join(renamed)}); one would silently replace the other: keep one",
                           "duplicate_key")  # fmt: skip
        names[name] = key
    return _copy(obj, {mapping.get(k, k): v for k, v in obj.items()})


def _renamed(obj: dict, columns: Columns) -> dict | Invalid:
    """``obj`` with the names ``columns`` gives: its fields, then the keys and roles of each message of its lists."""
    obj = _rename(obj, columns.records, "", "")
    if isinstance(obj, Invalid) or not (columns.message or columns.roles):
        return obj
    for key in ("messages", "conversations", "prompt", "completion"):
        messages = obj.get(key)
        if not isinstance(messages, list):
            continue
        out = []
        for i, m in enumerate(messages):
            if isinstance(m, dict):
                m = _rename(m, columns.message, f"{key}[{i}].", "message.")
                if isinstance(m, Invalid):
                    return m
                for field in ("role", "from"):
                    if isinstance(m.get(field), str) and m[field] in columns.roles:
                        m = _copy(m, {**m, field: columns.roles[m[field]]})
            out.append(m)
        obj = _copy(obj, {**obj, key: out})
    return obj


class Converted(dict):
    """A canonical record converted from another shape, which knows the field of the original that each of its
    messages came from (``names[i]``: ``conversations[3]``, ``history[0][1]``, ``system``), so that a problem found
    in the canonical record names the field the user wrote."""

    def __init__(self, items: dict, names: list[str]) -> None:
        super().__init__(items)
        self.names = names

    def original_field(self, field: str) -> str:
        """``messages[2].content`` -> ``conversations[2].value`` (ShareGPT), ``output`` (Alpaca), ..."""
        head, sep, rest = field.partition("]")
        if not head.startswith("messages[") or not head[9:].isdigit() or int(head[9:]) >= len(self.names):
            return field
        name = self.names[int(head[9:])]
        sharegpt = name.endswith("]") and not name.startswith("history")
        if rest in (".content", ".role") and not sharegpt:  # the whole string: Alpaca's field, a system string
            return name
        return name + {".content": ".value", ".role": ".from"}.get(rest, rest) if sharegpt else name + rest


def _copy(original: dict, items: dict) -> dict:
    """``items`` as a dict of ``original``'s type, with the keys it held twice (``validate``'s duplicate checks)."""
    out = type(original)(items)
    if hasattr(original, "duplicates"):
        out.duplicates = original.duplicates  # type: ignore[attr-defined]
    return out


def closest_shapes(obj: dict) -> str:
    """The shapes whose keys ``obj``'s keys come closest to (shared keys, then keys spelled alike), and its keys:
    the tail of the message of a record that matches no shape."""
    keys = [k for k in obj if isinstance(k, str)]
    scores = []
    for shape, wanted in SHAPE_KEYS.items():
        shared = [k for k in wanted if k in obj]
        alike = [(k, m[0]) for k in wanted if k not in obj for m in [difflib.get_close_matches(k, keys, 1, 0.75)] if m]
        if shared or alike:
            scores.append((len(shared) + len(alike), shape, shared, alike))
    held = f"the record's keys: {', '.join(map(repr, keys)) or 'none'}"
    if not scores:
        return held
    best = max(s[0] for s in scores)
    notes = []
    for _, shape, shared, alike in (s for s in scores if s[0] == best):
        parts = [f"has {', '.join(shared)}"] if shared else []
        parts += [f"{got!r} for {want!r}?" for want, got in alike]
        missing = [k for k in SHAPE_KEYS[shape] if k not in obj and all(k != w for w, _ in alike)]
        if missing:
            parts.append(f"lacks {', '.join(missing)}")
        notes.append(f"{shape} ({'; '.join(parts)})")
    return f"closest: {' or '.join(notes)}; {held}"


def _alpaca(obj: dict) -> dict | Invalid:
    for key in ("instruction", "input", "output", "system"):
        if obj.get(key) is not None and not isinstance(obj[key], str):
            return Invalid(key, f"expected a string (an Alpaca record), found {_kind(obj[key])}", "wrong_type")
    messages: list[dict[str, Any]] = [{"role": "system", "content": obj["system"]}] if obj.get("system") else []
    history = obj.get("history")
    if history is not None:
        if not isinstance(history, list):
            return Invalid("history", f"expected a list of [prompt, response] pairs, found {_kind(history)}", "wrong_type")
        for i, pair in enumerate(history):
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
                return Invalid(f"history[{i}]", f"expected a [prompt, response] pair of strings, found {_kind(pair)}",
                               "wrong_type")  # fmt: skip
            messages += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    query = "\n".join(q for q in (obj.get("instruction"), obj.get("input")) if q)
    messages += [{"role": "user", "content": query}, {"role": "assistant", "content": obj["output"]}]
    names = (["system"] if obj.get("system") else []) + [f"history[{i}][{j}]" for i in range(len(history or ())) for j in (0, 1)]
    return Converted({"messages": messages}, [*names, "instruction", "output"])


def _tool_calls(value: Any, where: str) -> list[dict[str, Any]] | Invalid:
    """A ShareGPT ``function_call`` value (JSON of ``{"name", "arguments"}`` or a list of them) as ``tool_calls``."""
    how = 'a function_call\'s value is JSON of {"name": ..., "arguments": ...} or a list of them'
    try:
        calls = json.loads(value) if isinstance(value, str) else None
    except json.JSONDecodeError as exc:
        return Invalid(where, f"{how}; not JSON ({exc.msg} at column {exc.colno})", "wrong_type")
    calls = [calls] if isinstance(calls, dict) else calls
    if not isinstance(calls, list) or not calls or not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in calls):
        return Invalid(where, f"{how}; found {_kind(value)}", "wrong_type")
    return [{"type": "function", "function": {"name": c["name"], "arguments": c.get("arguments", {})}} for c in calls]


def _tools(tools: Any) -> list[Any] | None | Invalid:
    """A ShareGPT record's ``tools`` (a JSON string or a list; "" is none), each wrapped as a function tool."""
    if isinstance(tools, str):
        if not tools.strip():
            return None
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as exc:
            return Invalid("tools", f"a JSON string of tools that is not JSON ({exc.msg} at column {exc.colno})",
                           "wrong_type")  # fmt: skip
    if tools is None:
        return None
    tools = [tools] if isinstance(tools, dict) else tools
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        return Invalid("tools", f"expected a list of tool objects (or a JSON string of one), found {_kind(tools)}",
                       "wrong_type")  # fmt: skip
    return [t if t.get("type") == "function" and "function" in t else {"type": "function", "function": t} for t in tools]


def _sharegpt(obj: dict, key: str) -> dict | Invalid:
    conversation = obj[key]
    if not isinstance(conversation, list):
        return Invalid(key, f'expected a list of {{"from", "value"}} objects, found {_kind(conversation)}', "wrong_type")
    messages: list[dict[str, Any]] = []
    for i, m in enumerate(conversation):
        where = f"{key}[{i}]"
        if not isinstance(m, dict):
            return Invalid(where, f'expected an object {{"from": ..., "value": ...}}, found {_kind(m)}', "wrong_type")
        if "from" in m and "role" in m:  # two speakers: which one is meant cannot be told
            return Invalid(where, 'holds both "from" (ShareGPT) and "role"; keep one', "ambiguous_shape")
        # ShareGPT's from/value, or role/content under its list's name (some Hub sets write "conversations" so)
        role_key, value_key = ("from", "value") if "from" in m or "role" not in m else ("role", "content")
        speaker = m.get(role_key)
        if not isinstance(speaker, str) or speaker not in _SHAREGPT_ROLES:  # (a list is no key: unhashable)
            found = "missing" if speaker is None else f"unknown role {_kind(speaker)}"
            return Invalid(f"{where}.{role_key}", f"{found}; expected one of {', '.join(_SHAREGPT_ROLES)}",
                           "missing_field" if speaker is None else "wrong_type")  # fmt: skip
        rest = {k: v for k, v in m.items() if k not in (role_key, value_key)}
        value = m.get(value_key)
        if speaker == "function_call":
            calls = _tool_calls(value, f"{where}.{value_key}")
            if isinstance(calls, Invalid):
                return calls
            messages.append({"role": "assistant", **rest, "tool_calls": calls})
        elif value is None and m.get("tool_calls"):  # an OpenAI tool-call message
            messages.append({"role": _SHAREGPT_ROLES[speaker], **rest})
        elif not isinstance(value, str) and not (value_key == "content" and isinstance(value, list)):
            found = "missing" if value is None else f"found {_kind(value)}"
            return Invalid(f"{where}.{value_key}", f"expected a string; {found}",
                           "missing_field" if value is None else "wrong_type")  # fmt: skip
        else:
            messages.append({"role": _SHAREGPT_ROLES[speaker], "content": value, **rest})
    system = obj.get("system")
    if system is not None and not isinstance(system, str):
        return Invalid("system", f"expected a string, found {_kind(system)}", "wrong_type")
    names = [f"{key}[{i}]" for i in range(len(messages))]
    if system and not (messages and messages[0]["role"] == "system"):
        messages.insert(0, {"role": "system", "content": system})
        names.insert(0, "system")
    out = Converted({"messages": messages}, names)
    tools = _tools(obj.get("tools"))
    if isinstance(tools, Invalid):
        return tools
    if tools is not None:
        out["tools"] = tools
    if obj.get("chat_template_kwargs") is not None:
        out["chat_template_kwargs"] = obj["chat_template_kwargs"]
    converted = _messages(messages, "messages")
    if isinstance(converted, Invalid):  # named after the record's own list
        return converted._replace(field=out.original_field(converted.field))
    out["messages"] = converted
    return out


def _needs_work(m: Any) -> bool:
    if not isinstance(m, dict):
        return False
    if isinstance(m.get("content"), list) or m.get("weight", 0) is None:
        return True
    return any(k not in _PLAIN_KEYS and _weight_key(k) for k in m)  # (no set made: a message has few keys)


#: a message's keys that are not weight-like, or the canonical weight itself (``_needs_work`` asks about the others)
_PLAIN_KEYS = frozenset({"role", "content", "weight"})


def _weight_key(key: Any) -> bool:
    """A key that is, or looks like, a per-message weight."""
    if not isinstance(key, str):
        return False
    return key in WEIGHT_KEYS or key in _WEIGHT_LIKE or key.lower().replace("-", "").replace("_", "") in _SQUASHED


def _messages(messages: list, name: str) -> list | Invalid:
    """``messages`` with content parts joined and weights as ``weight`` (see the module docstring); the same list
    where there is nothing to do. Other problems are left to ``weightprep.stages.validate``."""
    if not any(_needs_work(m) for m in messages):
        return messages
    out = []
    for i, m in enumerate(messages):
        if not _needs_work(m):
            out.append(m)
            continue
        where = f"{name}[{i}]"
        m = _copy(m, m)
        if isinstance(m.get("content"), list):
            parts = _parts(m["content"], f"{where}.content")
            if isinstance(parts, Invalid):
                return parts
            text, reasoning, calls = parts
            for key, value in (("reasoning_content", reasoning), ("tool_calls", calls)):
                if value and m.get(key) is not None:
                    return Invalid(f"{where}.{key}", f"given both as the message's key and as content parts of type "
                                   f"{'reasoning' if key == 'reasoning_content' else 'tool_call'}; keep one",
                                   "ambiguous_shape")  # fmt: skip
                if value:
                    m[key] = value
            m["content"] = text
        given = [k for k in m if _weight_key(k)]
        unknown = [k for k in given if k not in WEIGHT_KEYS]
        if unknown:
            key = unknown[0]
            why = ("a message's weight by character spans (axolotl's train_detail) is not read: write the record as "
                   "pieces" if key == "train_detail" else
                   f"use one of {', '.join(WEIGHT_KEYS)} (train and loss true/false), or remove the key")  # fmt: skip
            return Invalid(f"{where}.{key}", f"looks like a weight, which weightprep does not read: the message would "
                           f"train at its role's default; {why}", "unknown_weight")  # fmt: skip
        present = [k for k in given if m[k] is not None]
        if len(present) > 1:
            return Invalid(where, f"holds {' and '.join(map(repr, present))}: two weights for one message; keep one",
                           "ambiguous_weight")  # fmt: skip
        for k in given:
            value = m.pop(k)
            if value is None:
                continue
            if WEIGHT_KEYS[k] == "boolean":
                if not isinstance(value, bool):
                    return Invalid(f"{where}.{k}", f"expected true or false, found {_kind(value)}", "wrong_type")
                value = 1.0 if value else 0.0
            else:
                problem = _weight_problem(f"{where}.{k}", value)
                if problem is not None:
                    return problem
            m["weight"] = value
        out.append(m)
    return out


def _parts(parts: list, where: str) -> tuple[str, str, list[dict[str, Any]]] | Invalid:
    """A content given as a list of parts: the texts of its ``text`` parts, of its ``reasoning`` parts (each
    concatenated), and the calls of its ``tool_call`` parts, in order (LLaMA-Factory v1's ``_to_hf_messages``)."""
    texts, reasoning, calls = [], [], []
    for j, part in enumerate(parts):
        at = f"{where}[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            return Invalid(at, f'expected a part {{"type": "text", "text": ...}}, found {_kind(part)}', "wrong_type")
        if part["type"] not in ("text", "reasoning", "tool_call"):
            return Invalid(f"{at}.type", f"a {part['type']!r} part: weightprep builds text only, and would not drop it "
                           "silently; remove the part (or the record)", "non_text_content")  # fmt: skip
        key = "text" if "text" in part else "value"
        if not isinstance(part.get(key), str):
            return Invalid(f"{at}.{key}", f"expected a string, found {_kind(part.get(key))}", "wrong_type")
        if part["type"] == "tool_call":
            call = _tool_calls(part[key], f"{at}.{key}")
            if isinstance(call, Invalid):
                return call
            calls.extend(call)
        else:
            (texts if part["type"] == "text" else reasoning).append(part[key])
    return "".join(texts), "".join(reasoning), calls
