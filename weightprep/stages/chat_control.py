"""Stage 2a, step 6 — the turn-token rule: which of a template's control tokens a record's strings may hold.

Control tokens are transformers' (``_get_control_tokens``: the special added tokens, and the added tokens the
template's literal text holds). A **turn token** is one the template writes at a turn's boundary, found by
rendering probe conversations (``turn_structure``), never by where a string appears in the template's text:

- the first control tokens of each system, user or tool turn (its role header: as many as the user's header has)
  and the last ones of the turn (its end: as many as the user's turn ends with);
- the first control tokens of an assistant's generation prompt (its role header, as many as the user's, and only
  those the turn starts with: after a role header written as text, Laguna's ``<assistant>\n``, a prefilled
  ``</think>`` is no header) and every control token after an assistant's content (its end of turn);
- the tokenizer's BOS, EOS, pad and unknown tokens, and the special tokens the template never writes.

Everything else the template writes (a reasoning or tool-call marker in a preamble, a default system prompt, tool
instructions, a prefilled ``<think>`` after the assistant's header) is an **in-turn marker**: a token in any
content, as ``apply_chat_template`` tokenizes it. A turn token in a record's string opens or closes a turn
(``control_token_in_content``; or, with ``--sanitize-control-tokens``, encoded as text).

A turn's span is ``[lcp(P_k, S), lcp(P_{k+1}, S))`` of the whole render ``S`` of a probe (``P_k`` the render of
its first ``k`` messages), so templates that append an opener after every render (Command R7B) or write a
message differently once another follows are read too. Shapes are tried without tools, then with one probe tool
(templates that need ``tools``: Hermes 3 tool_use, Phi-4-mini); a template that renders none keeps every
control token a turn token.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from weightprep.batches import Chat

__all__ = [
    "PROBE_SHAPES", "PROBE_TOOLS", "SEPARATOR", "Render", "control_token_list", "first_turn_token", "record_strings",
    "string_values", "template_literal_text", "token_pattern", "turn_structure",
]  # fmt: skip

#: The conversations whose rendering tells a template's turn structure from its in-turn markers: two turns then
#: one, with and without a system message (which some refuse).
PROBE_SHAPES = (
    ("system", "user", "assistant", "user", "assistant"), ("user", "assistant", "user", "assistant"),
    ("system", "user", "assistant"), ("user", "assistant"),
)  # fmt: skip
#: The tool of the probes for templates that refuse a conversation without ``tools``.
PROBE_TOOLS = [{"type": "function", "function": {
    "name": "weightprep_probe", "description": "probe",
    "parameters": {"type": "object", "properties": {"x": {"type": "string", "description": "probe"}}, "required": []},
}}]  # fmt: skip

#: ``render(messages, k, generation, tools)``: the first ``k`` messages rendered (raises ``Exception`` where the
#: template fails).
Render = Callable[[list[dict[str, Any]], int, bool, Any], str]


def control_token_list(tok: Any, template: str) -> tuple[str, ...]:
    """transformers' control tokens of ``template`` (what ``apply_chat_template(..., sanitize_control_tokens=True)``
    encodes as text): the special added tokens, and the added tokens the template's literal text holds (whitespace
    tokens aside), or those of ``chat_control_tokens`` where the tokenizer lists them. The same rule where the
    tokenizer lacks ``_get_control_tokens`` (transformers < 5, ``TokenizerFiles``)."""
    if hasattr(tok, "_get_control_tokens"):
        return tuple(dict.fromkeys(tok._get_control_tokens(template)))
    added = getattr(tok, "added_tokens_decoder", {}).values()
    listed = getattr(tok, "chat_control_tokens", None)
    if listed is not None:
        return tuple(dict.fromkeys(t.content for t in added if t.special or t.content in set(listed)))
    written = template_literal_text(template)
    return tuple(dict.fromkeys(
        t.content for t in added if t.special or (t.content in written and not t.content.isspace())
    ))  # fmt: skip


def template_literal_text(template: str) -> str:
    """The literal strings of ``template`` (transformers' ``_get_template_literal_text``; its source where that is
    missing): a token found there is one the template writes."""
    from weightprep.stages.chat_jinja import template_utils

    literal = getattr(template_utils(), "_get_template_literal_text", None)
    return literal(template) if literal is not None else template  # type: ignore[no-any-return]


def token_pattern(tokens: tuple[str, ...]) -> re.Pattern[str]:
    """A regex of ``tokens``, longest first (a token before the tokens it contains); never matches if empty."""
    return re.compile("|".join(map(re.escape, sorted(set(tokens), key=len, reverse=True))) or "(?!)")


def _strings(value: Any, field: str) -> Iterator[tuple[str, str]]:
    """Every string in ``value`` with its field, as ``mark_control_tokens`` visits them (dict keys are not)."""
    if isinstance(value, str):
        yield field, value
    elif isinstance(value, dict):
        for key, v in value.items():
            yield from _strings(v, f"{field}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _strings(v, f"{field}[{i}]")


SEPARATOR = "\x00"


def string_values(value: Any, out: list[str]) -> None:
    """The strings ``_strings`` finds in ``value``, without their fields, appended to ``out``."""
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            if type(v) is str:  # a message's role and content: no call each
                out.append(v)
            else:
                string_values(v, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            string_values(v, out)


def record_strings(chat: Chat, messages: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
    """The strings of a conversation that reach its template, with their fields (``messages[2].content``)."""
    for i, m in enumerate(messages):
        yield from _strings(m, f"messages[{i}]")
    yield from _strings(chat.tools, "tools")
    yield from _strings(chat.template_kwargs, "chat_template_kwargs")


def first_turn_token(
    turn: re.Pattern[str], chat: Chat, messages: list[dict[str, Any]], joinable: bool, strings: list[str] | None = None
) -> tuple[str, re.Match[str]] | None:
    """The first string of the record (what ``apply_chat_template(..., sanitize_control_tokens=True)`` would mark:
    every string of the messages, tools and ``chat_template_kwargs``) that holds a turn token (``turn``), with its
    field; None where none does. ``joinable``: no turn token holds ``SEPARATOR``, so one search of all the strings
    joined by it tells whether any holds one (the common case: none does). ``strings``: the messages' strings,
    gathered already (``string_values(messages)``)."""
    if joinable:
        if strings is None:
            strings = []
            string_values(messages, strings)
        found = list(strings)
        for value in (chat.tools, chat.template_kwargs):
            string_values(value, found)
        if not turn.search(SEPARATOR.join(found)):
            return None
    for field, value in record_strings(chat, messages):
        if hit := turn.search(value):
            return field, hit
    return None


def _lcp(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def turn_structure(render: Render, control: tuple[str, ...], fixed: set[str | None]) -> set[str]:
    """The control tokens of ``control`` that the template (``render``) writes at a turn's boundary in the probe
    conversations (module docstring); every one of them where it renders no probe. ``fixed`` (BOS, EOS, pad,
    unknown: turn tokens whatever the template) that open a span are not counted in its header (``<s>`` before
    Mistral's ``[SYSTEM_PROMPT]``)."""
    pattern = token_pattern(control)

    def head(text: str) -> list[str]:
        """The control tokens of ``text`` after the leading BOS (and such) that some templates write first."""
        found = pattern.findall(text)
        skip = next((j for j, t in enumerate(found) if t not in fixed), len(found))
        return found[skip:]

    def leading(text: str) -> int:
        """How many control tokens ``text`` starts with (whitespace between them, BOS and such not counted): a
        role header's, where the header is not text (Laguna's ``<assistant>\n`` before a prefilled ``</think>``)."""
        found, pos = [], 0
        for m in pattern.finditer(text):
            if text[pos : m.start()].strip():
                break
            found.append(m.group())
            pos = m.end()
        return len(found) - next((j for j, t in enumerate(found) if t not in fixed), len(found))

    read: list[tuple] = []
    headers: list[int] = []
    trailers: list[int] = []
    for tools in (None, PROBE_TOOLS):
        for shape in PROBE_SHAPES:
            messages = [{"role": r, "content": f"\ue000weightprep-control-probe-{k}\ue000"} for k, r in enumerate(shape)]
            try:
                text = render(messages, len(messages), False, tools)
                prompts = {k: render(messages, k, True, tools) for k, r in enumerate(shape) if r == "assistant"}
            except Exception:
                continue
            bounds = [0]  # templates that refuse an empty conversation: the preamble is the first turn's
            for k in range(len(messages)):
                try:
                    bounds[k] = _lcp(render(messages, k, False, tools), text)
                except Exception:  # a prefix it refuses (Nemotron Nano v2's lone system message): the turn
                    if k:  # before ends with its content
                        bounds[k] = text.find(messages[k - 1]["content"]) + len(messages[k - 1]["content"])
                bounds.append(0)
            bounds[-1] = len(text)
            for m in pattern.finditer(text):  # a boundary inside a token (``<|`` of ``<|user|>``, ``<|end|>``)
                for k, b in enumerate(bounds):  # is at its start
                    if m.start() < b < m.end():
                        bounds[k] = m.start()
            for k in range(1, len(bounds)):
                bounds[k] = max(bounds[k], bounds[k - 1])
            turns = [text[bounds[k] : bounds[k + 1]] for k in range(len(messages))]
            ats = [turn.find(m["content"]) for turn, m in zip(turns, messages, strict=True)]
            if min(ats) < 0:
                continue  # a template that rewrites the probe's turns: its structure is not read from this shape
            # a role header has as many control tokens for every role (Llama-3's two, Cohere's two, ChatML's one):
            # the user's tells how much of the generation prompt is the assistant's, the rest (DeepSeek-R1's
            # prefilled <think>) is in the turn. The fewest over the shapes: a template that injects a system turn
            # where there is none (Qwen3.8, Nemotron 3) writes it into the first user turn of a shape without one
            user = max(k for k, r in enumerate(shape) if r == "user")
            headers.append(max(1, len(head(turns[user][: ats[user]]))))
            trailers.append(max(1, len(pattern.findall(turns[user][ats[user] + len(messages[user]["content"]) :]))))
            prompts[-1] = text
            read.append((messages, bounds, prompts, turns, ats))
        if read:
            break
    if not read:
        return set(control)
    header, trailer = min(headers), min(trailers)
    # what follows the last message is the turn's end, unless the template appends more after every render
    # (Command R7B's response opener): then the ends of assistant turns that another message follows tell it
    inner = any(m["role"] == "assistant" for messages, *_ in read for m in messages[:-1])
    found: set[str] = set()
    for messages, bounds, prompts, turns, ats in read:
        preamble = head(prompts[-1][: bounds[0]])  # what is written before the first turn:
        found.update(preamble[:header])  # a turn of its own (a default system prompt), its tokens
        found.update(preamble[-trailer:] if preamble else ())  # in between in-turn ones (Hermes 3's <tool_call>)
        for k, m in enumerate(messages):
            turn, at = turns[k], ats[k]
            after = pattern.findall(turn[at + len(m["content"]) :])
            if m["role"] != "assistant":
                found.update(head(turn[:at])[:header])
                found.update(after[-trailer:] if after else ())
                continue
            start = bounds[k]
            # the role header: the control tokens that both the generation prompt and the turn start with (not
            # a prefilled <think> that the turn lacks, nor a <|START_RESPONSE|> that the prompt lacks)
            written, prompted = head(turn[:at]), head(prompts[k][start:])
            common = next((j for j, (a, b) in enumerate(zip(written, prompted, strict=False)) if a != b), min(len(written), len(prompted)))
            found.update(written[: min(common, header, leading(turn[:at]))])
            if k < len(messages) - 1 or not inner:
                found.update(after)
    return found
