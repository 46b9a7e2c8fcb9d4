"""``--dataset-info FILE:NAME``: an entry of LLaMA-Factory's ``dataset_info.json`` read as the ``--columns`` mapping
(``weightprep.stages.columns``) it stands for, so a dataset described for LLaMA-Factory builds with no translation.

An entry names its ``formatting`` (``alpaca``, the default, or ``sharegpt``), its ``columns`` (the record's fields)
and, for ShareGPT, its ``tags`` (the message keys and role values). LLaMA-Factory's defaults
(``data/README.md``; ``src/llamafactory/data/parser.py``) are weightprep's own names, so only what differs from them
becomes a mapping:

==============================================  ================================================================
entry                                           ``--columns``
==============================================  ================================================================
alpaca ``prompt``, ``query``, ``response``,     ``instruction=``, ``input=``, ``output=``, ``history=``,
``history``, ``system``, ``tools``              ``system=``, ``tools=`` (each where the column is named otherwise)
alpaca, ``prompt`` and no ``response``         ``text=COLUMN``: pre-training text, one ``{"text"}`` record each
(``wiki_demo``, ``c4_demo``, ``refinedweb``)    (LLaMA-Factory's ``pt`` stage reads only that column)
sharegpt, tags ``from``/``value`` (default)     ``conversations=COLUMN`` (``messages``, default ``conversations``);
                                                a role tag other than ``human``, ``gpt``, ``system``,
                                                ``observation``, ``function_call``: ``role.user=TAG``, ...
sharegpt, other tags (``role``/``content``)     ``messages=COLUMN``, ``message.role=ROLE_TAG``,
                                                ``message.content=CONTENT_TAG``; every role tag that is not the
                                                canonical role: ``role.user=TAG`` (LLaMA-Factory's default
                                                ``human`` included), ``role.assistant=``, ``role.system=``,
                                                ``role.tool=`` (``observation_tag``), ``role.function_call=``
==============================================  ================================================================

Refused, naming why: an entry that is not there (the names there are listed), another ``formatting``, a preference
entry (``ranking``, ``chosen``/``rejected``, ``kto_tag``: weightprep builds supervised data) and media columns
(``images``, ``videos``, ``audios``: a text tool). ``file_name`` and the hub fields are not read: the inputs are
given as ever.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from weightprep.errors import UsageError

__all__ = ["dataset_info_columns"]

#: alpaca columns -> weightprep's record fields (LLaMA-Factory's defaults are these names, history/system/tools none)
_ALPACA = {"prompt": "instruction", "query": "input", "response": "output", "history": "history", "system": "system",
           "tools": "tools"}  # fmt: skip
#: ShareGPT role tags, LLaMA-Factory's default value, and the role weightprep gives a message so tagged
_ROLE_TAGS = {
    "user_tag": ("human", "user"),
    "assistant_tag": ("gpt", "assistant"),
    "system_tag": ("system", "system"),
    "observation_tag": ("observation", "tool"),
    "function_tag": ("function_call", "function_call"),
}
_REFUSED = {
    "images": "media columns (a text tool)", "videos": "media columns (a text tool)",
    "audios": "media columns (a text tool)", "chosen": "a preference dataset (weightprep builds supervised data)",
    "rejected": "a preference dataset (weightprep builds supervised data)",
    "kto_tag": "a KTO dataset (weightprep builds supervised data)",
}  # fmt: skip


def dataset_info_columns(spec: str) -> str:
    """The ``--columns`` mapping of ``FILE:NAME``: entry ``NAME`` of the ``dataset_info.json`` file ``FILE`` (see
    the module docstring).

    >>> dataset_info_columns("data/dataset_info.json:glaive_toolcall_en_demo")  # doctest: +SKIP
    ''
    """
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise UsageError(f"--dataset-info: expected FILE:NAME (a dataset_info.json and one of its entries), got {spec!r}")
    try:
        info = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"--dataset-info: cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--dataset-info: {path} is not JSON ({exc})") from None
    if not isinstance(info, dict) or not isinstance(info.get(name), dict):
        names = ", ".join(sorted(info)) if isinstance(info, dict) else "none: the file holds no mapping"
        raise UsageError(f"--dataset-info: {path} has no entry {name!r}; its entries: {names}")
    return ",".join(_mapping(f"{path}:{name}", info[name]))


def _mapping(where: str, entry: dict[str, Any]) -> list[str]:
    formatting = entry.get("formatting", "alpaca")
    columns = entry.get("columns") or {}
    tags = entry.get("tags") or {}
    if not isinstance(columns, dict) or not isinstance(tags, dict):
        raise UsageError(f"--dataset-info {where}: 'columns' and 'tags' must be mappings")
    refused = ["ranking"] * bool(entry.get("ranking")) + [key for key in _REFUSED if columns.get(key)]
    if refused:
        why = _REFUSED.get(refused[0], _REFUSED["chosen"])
        raise UsageError(f"--dataset-info {where}: {', '.join(refused)}: {why} is not supported")
    if formatting == "alpaca" and columns.get("prompt") and not columns.get("response"):
        # a prompt and no response: pre-training text (wiki_demo, c4_demo, refinedweb ...: LLaMA-Factory's pt stage)
        return [f"text={columns['prompt']}"] if columns["prompt"] != "text" else []
    if formatting == "alpaca":
        return [f"{_ALPACA[key]}={col}" for key, col in columns.items() if key in _ALPACA and col and col != _ALPACA[key]]
    if formatting != "sharegpt":
        raise UsageError(f"--dataset-info {where}: formatting {formatting!r}: expected 'alpaca' or 'sharegpt'")
    out: list[str] = []
    extra = [f"{key}={columns[key]}" for key in ("system", "tools") if columns.get(key) and columns[key] != key]
    role_key, content_key = tags.get("role_tag", "from"), tags.get("content_tag", "value")
    column = columns.get("messages") or "conversations"
    if (role_key, content_key) == ("from", "value"):  # ShareGPT as weightprep reads it: only other names mapped
        if column != "conversations":
            out.append(f"conversations={column}")
        roles = {tag: tags.get(tag, default) for tag, (default, _) in _ROLE_TAGS.items()}
        out += [f"role.{_ROLE_TAGS[tag][1]}={value}" for tag, value in roles.items() if value != _ROLE_TAGS[tag][0]]
        return out + extra
    if column != "messages":
        out.append(f"messages={column}")
    out += [f"message.{key}={value}" for key, value in (("role", role_key), ("content", content_key)) if value != key]
    for tag, (default, role) in _ROLE_TAGS.items():
        value = tags.get(tag, default)
        if value != role:
            out.append(f"role.{role}={value}")
    return out + extra
