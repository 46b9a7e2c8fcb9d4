"""Each token's own text, as it appears in the decoded document: incremental detokenization.

Decoding tokens one by one is wrong for most tokenizers: SentencePiece's decoder drops the word-start space of a
lone ``▁word``, and a byte-level or byte-fallback token can hold part of a UTF-8 character. The text of token
``i`` is instead ``decode(ids[p:i+1])[len(decode(ids[p:r])):]`` over a short context ``ids[p:r]`` of the tokens
before it (the scheme of streaming decoders such as vLLM's and transformers' ``TextStreamer``). A token whose
text is not complete yet (it ends inside a character) is grouped with the next ones until it is, so that the
groups' texts concatenate to ``decode(ids)``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["token_groups"]

#: tokens of left context for each decode: enough for any decoder's word-start and byte rules
_CONTEXT = 6


def token_groups(tok: Any, ids: list[int]) -> list[tuple[int, int, str]]:
    """``(start, end, text)`` for consecutive groups of ``ids`` (usually one token each) whose texts, joined,
    are ``tok.decode(ids)``. Special tokens are kept."""

    def decode(part: list[int]) -> str:
        return tok.decode(part, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    groups: list[tuple[int, int, str]] = []
    start = 0  # first token of the pending group
    context = 0  # first token of the decode context
    before = ""  # decode(ids[context:start])
    for i in range(len(ids)):
        now = decode(ids[context : i + 1])
        if now.endswith("\ufffd") and i + 1 < len(ids) and i + 1 - start < 8:
            continue  # inside a character: wait for the rest of its bytes
        if not now.startswith(before):  # the context itself decodes differently: decode the whole prefix
            before, now = decode(ids[:start]), decode(ids[: i + 1])
        groups.append((start, i + 1, now[len(before) :]))
        start = i + 1
        context = max(0, start - _CONTEXT)
        before = decode(ids[context:start])
    text = "".join(g[2] for g in groups)
    full = decode(ids)
    if text != full:  # a decoder with effects beyond the context: fall back to exact prefix differences
        groups, prev = [], ""
        for i in range(len(ids)):
            now = decode(ids[: i + 1])
            if now.startswith(prev) and (not now.endswith("\ufffd") or i + 1 == len(ids)):
                groups.append((groups[-1][1] if groups else 0, i + 1, now[len(prev) :]))
                prev = now
        if not groups or groups[-1][1] != len(ids) or "".join(g[2] for g in groups) != full:
            groups = [(0, len(ids), full)]
    return groups
