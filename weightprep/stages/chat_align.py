"""Step 5 of the chat stage: the characters' weights and turn codes put on their tokens, many documents at once.

A token takes the largest weight of its characters, and the turn code of the first character of that weight (a
token with no characters: weight 0, turn 0). Most tokens hold characters of one weight; one that starts before a
change of weight and ends after it (the ``\\n\\n`` of Qwen3.5's ``<think>\\n`` prompt and an answer's ``\\n</think>``,
ERNIE's ``Assistant: `` prompt and an answer's ``It`` as `` It``) is a token of the answer's, as transformers'
``assistant_masks`` marks it (every token that holds a character of a generation block) and as LLaMA-Factory's
render comparison counts it. ``straddling`` counts, per document, the tokens that took a larger weight than their
first character's, so that the build can say so. Two BOS at a document's start mean the template wrote one more
than the model sees at inference (``double_bos``): ``ChatRenderer.align`` turns that into an error;
``ChatRenderer.tokens_batch`` aligns a whole batch's documents in one call and asks ``align`` only about the
documents found wrong.

The documents come end to end: characters ``[char_base[d], char_base[d + 1])`` and tokens ``[tok_base[d],
tok_base[d + 1])`` are document ``d``'s, a token's ``(start, end)`` counted from its document's first character.
Each document's spans go forwards (both span sources guarantee it: ``TokenSpans`` by construction, tokenizers'
offsets once ``_check_offsets`` passed), so the spans shifted by ``char_base`` go forwards over the whole block,
and one ``searchsorted`` finds, for every change of weight, the first token that ends after it: of the tokens
that reach past the change it starts first, so some token straddles the change iff that one does. (Not the last
token that starts at or before the change: ``"A"`` merged with the first bytes of ``"東"`` starts before it, and
the token of the other bytes of ``"東"`` starts at it.) Only where one does, two more ``searchsorted`` find every
token with a change inside it, and one ``maximum.reduceat`` over those tokens' characters their largest weight. Where a document starts with another weight than the one
before it ends with, no token crosses that change: each document's tokens lie within its characters. Cost: a few
NumPy passes over the block's characters and tokens, ~3 µs a document, where a call per document cost ~40 µs.

Example: ``"Hi!"`` with weights ``[0, 1, 1]`` and tokens ``H`` ``i!`` -> token weights ``[0, 1]``; tokens
``Hi`` ``!`` -> ``[1, 1]``, ``Hi`` straddling the change at character 1 (one straddling token).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Aligned", "align_tokens"]


class Aligned(NamedTuple):
    """Per token: ``weights`` (float32) and ``turns`` (int32). Per document: how many of its tokens took a larger
    weight than their first character's (``straddling``, int64) and whether it starts with two BOS
    (``double_bos``)."""

    weights: np.ndarray
    turns: np.ndarray
    straddling: np.ndarray
    double_bos: np.ndarray

    def bad(self) -> np.ndarray:
        """The documents that cannot be aligned (``double_bos``)."""
        return self.double_bos


def align_tokens(
    char_base: np.ndarray, char_w: np.ndarray, char_turns: np.ndarray, tok_base: np.ndarray, ids: np.ndarray,
    starts: np.ndarray, ends: np.ndarray, bos: int | None, *, within: bool = False,
) -> Aligned:  # fmt: skip
    """The tokens' weights and turns of documents end to end (module docstring): ``char_base`` and ``tok_base``
    (int64[D + 1]) cut ``char_w``/``char_turns`` and ``ids``/``starts``/``ends`` into documents. ``within``: no
    token ends past its document's last character (``TokenSpans``' spans), so none is clipped there."""
    n_docs = len(char_base) - 1
    counts = np.diff(tok_base)
    shift = np.repeat(char_base[:-1], counts)  # each token's document's first character
    g_starts = np.asarray(starts, dtype=np.int64) + shift
    g_ends = np.asarray(ends, dtype=np.int64) + shift
    if not within:
        g_ends = np.minimum(g_ends, np.repeat(char_base[1:], counts))  # within its document
    double_bos = np.zeros(n_docs, dtype=bool)
    if bos is not None:
        two = np.flatnonzero(counts > 1)
        lead = tok_base[two]
        double_bos[two] = (ids[lead] == bos) & (ids[lead + 1] == bos)
    char_w = np.asarray(char_w, dtype=np.float32)
    char_turns = np.asarray(char_turns, dtype=np.int32)
    has_chars = g_ends > g_starts
    if has_chars.all():  # every token starts on a character of its document: that character's
        weights, turns = char_w[g_starts], char_turns[g_starts]
    else:
        # each token's first character; one past a document's last (an empty document, or a token with no
        # characters at its end) reads the padding: weight 0, turn 0, as a token with no characters gets anyway
        length = np.diff(char_base)
        safe = np.minimum(g_starts, np.repeat(np.maximum(char_base[1:] - 1, char_base[:-1]), counts))
        safe = np.where(np.repeat(length > 0, counts), safe, len(char_w))
        padded_w = np.concatenate([char_w, np.zeros(1, np.float32)])
        padded_t = np.concatenate([char_turns, np.zeros(1, np.int32)])
        weights = np.where(has_chars, padded_w[safe], np.float32(0)).astype(np.float32, copy=False)
        turns = padded_t[safe]
    straddling = np.zeros(n_docs, dtype=np.int64)
    # first character of each new weight (a document's first character may count as one: no token crosses it)
    changes = np.flatnonzero(char_w[1:] != char_w[:-1]) + 1  # (weights are finite: as np.diff(char_w) != 0)
    if len(changes) and len(ids):
        k = np.minimum(np.searchsorted(g_ends, changes, side="right"), len(ids) - 1)
        if ((g_starts[k] < changes) & (g_ends[k] > changes)).any():
            # the tokens with a change strictly inside them: start < change < end
            across = np.flatnonzero(
                np.searchsorted(changes, g_ends, side="left")
                > np.searchsorted(changes, g_starts, side="right")
            )
            top, turn = _heaviest(char_w, char_turns, g_starts[across], g_ends[across])
            doc = np.searchsorted(tok_base, across[top > weights[across]], side="right") - 1  # their documents
            straddling = np.bincount(doc, minlength=n_docs).astype(np.int64)
            weights[across], turns[across] = top, turn
    return Aligned(weights, turns, straddling, double_bos)


def _heaviest(
    char_w: np.ndarray, char_turns: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The largest weight of the characters ``[starts[t], ends[t])`` of a few tokens (each with at least two), and
    the turn of the first character of that weight: their characters gathered end to end, one
    ``maximum.reduceat`` over them, one comparison; cost proportional to those tokens' characters."""
    lengths = ends - starts
    group = np.cumsum(lengths) - lengths  # where each token's characters start in the gathered array
    owner = np.repeat(np.arange(len(starts)), lengths)
    at = np.arange(int(lengths.sum())) - group[owner] + starts[owner]
    values = char_w[at]
    top = np.maximum.reduceat(values, group)
    hits = np.flatnonzero(values == top[owner])
    first = np.searchsorted(owner[hits], np.arange(len(starts)))  # each token's first character of its weight
    return top, char_turns[at[hits[first]]]
