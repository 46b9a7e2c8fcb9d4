"""Step 5 of the chat stage: the characters' weights and turn codes put on their tokens, many documents at once.

A token takes the largest weight of its characters, and the turn code of the first character of that weight (a
token with no characters, such as an added EOS after the text: weight 0, and the turn of its place, clipped to its
document's last character). Most tokens hold characters of one weight; one that starts before a change of weight
and ends after it (the ``\\n\\n`` of Qwen3.5's ``<think>\\n`` prompt and an answer's ``\\n</think>``, ERNIE's
``Assistant: `` prompt and an answer's ``It`` as `` It``) is a token of the answer's, as transformers'
``assistant_masks`` marks it (every token that holds a character of a generation block) and as LLaMA-Factory's
render comparison counts it. ``straddling`` counts, per document, the tokens that took a larger weight than their
first character's, so that the build can say so. Two BOS at a document's start mean the template wrote one more
than the model sees at inference (``double_bos``): ``ChatRenderer.align`` turns that into an error;
``ChatRenderer.tokens_batch`` aligns a run of documents in one call and asks ``align`` only about the documents
found wrong.

The characters come as runs (``Runs``): a run is where one weight and turn go on, so a conversation is a few runs
(each message's prompt and answer), not an array per character; ``char_runs`` makes them of per-character arrays
where a renderer has those. The documents come end to end: characters ``[char_base[d], char_base[d + 1])`` and
tokens ``[tok_base[d], tok_base[d + 1])`` are document ``d``'s, a token's ``(start, end)`` counted among all the
documents' characters (``TokenSpans.runs`` gives them so). Each document's spans go forwards (both span sources
guarantee it: ``TokenSpans`` by construction, tokenizers' offsets once ``_check_offsets`` passed), and so do the
spans over the whole run of documents. The run of each token's first character is a count: one ``searchsorted``
finds, for each run, the first token that starts in it, and each run's weight and turn are repeated over its
tokens (``np.repeat``: ~1 ns a token, where a cumulative count of the runs started and a gather through it took
~5). One more ``searchsorted`` finds, for every change of weight, the first token that ends after it: of the
tokens that reach past the change it starts first, so some token straddles the change iff that one does. (Not the
last token that starts at or before the change: ``"A"`` merged with the first bytes of ``"東"`` starts before it,
and the token of the other bytes of ``"東"`` starts at it.) Only where one does, two more ``searchsorted`` find
every token with a change inside it, and one ``maximum.reduceat`` over those tokens' runs their largest weight.
Where a document starts with another weight than the one before it ends with, no token crosses that change: each
document's tokens lie within its characters. Cost: a few NumPy passes over the tokens and a pass over the runs,
~2 µs a document, where a call per document cost ~40 µs.

Example: ``"Hi!"`` with weights ``[0, 1, 1]`` (runs: ``0`` from 0, ``1`` from 1) and tokens ``H`` ``i!`` -> token
weights ``[0, 1]``; tokens ``Hi`` ``!`` -> ``[1, 1]``, ``Hi`` straddling the change at character 1 (one
straddling token).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

__all__ = ["Aligned", "Runs", "align_runs", "align_tokens", "char_runs", "run_chars"]


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


class Runs(NamedTuple):
    """A document's characters as runs of one weight and turn code: run ``j`` holds the characters from
    ``starts[j]`` up to ``starts[j + 1]`` (the last up to the document's end), each of weight ``weights[j]`` and turn
    ``turns[j]``. The runs of a document with characters start at 0 and go forwards; a run may hold no character
    (a start repeated, or the document's end), and two side by side may hold the same weight and turn (what a
    template's cuts give). A run's weight is the very float32 its characters have (``-0.0`` is not ``0.0``: the
    shards keep the bits)."""

    starts: Any  # int64[R] (an array, or a list of ints: the cut renders' runs, never copied into an array alone)
    weights: Any  # float32[R] (or a list of floats, each taken as float32)
    turns: Any  # int32[R] (or a list of ints)


def char_runs(char_w: np.ndarray, char_turns: np.ndarray) -> Runs:
    """The runs of one document's characters, from their weights and turn codes: a run starts where either changes
    (the weights' bits: ``-0.0`` after ``0.0`` is another run)."""
    w = np.asarray(char_w, dtype=np.float32)
    t = np.asarray(char_turns, dtype=np.int32)
    if not len(w):
        return Runs(np.zeros(0, dtype=np.int64), w[:0], t[:0])
    bits = w.view(np.uint32)
    starts = np.flatnonzero(np.concatenate([[True], (bits[1:] != bits[:-1]) | (t[1:] != t[:-1])]))
    return Runs(starts.astype(np.int64, copy=False), w[starts], t[starts])


def run_chars(runs: Runs, length: int) -> tuple[np.ndarray, np.ndarray]:
    """``char_runs`` undone: each of ``length`` characters' weight and turn code."""
    counts = np.diff(np.append(np.asarray(runs.starts, dtype=np.int64), length))
    return (
        np.repeat(np.asarray(runs.weights, dtype=np.float32), counts),
        np.repeat(np.asarray(runs.turns, dtype=np.int32), counts),
    )


def align_tokens(
    char_base: np.ndarray, char_w: np.ndarray, char_turns: np.ndarray, tok_base: np.ndarray, ids: np.ndarray,
    starts: np.ndarray, ends: np.ndarray, bos: int | None, *, within: bool = False,
) -> Aligned:  # fmt: skip
    """``align_runs`` of documents given a weight and turn code per character (``char_w``, ``char_turns``: the
    documents' characters end to end, ``char_base`` cuts them)."""
    shift = np.repeat(char_base[:-1], np.diff(tok_base))  # each token's document's first character
    runs = char_runs(char_w, char_turns)
    return align_runs(
        char_base, runs, tok_base, ids, np.asarray(starts) + shift, np.asarray(ends) + shift, bos, within=within
    )  # fmt: skip


def align_runs(
    char_base: np.ndarray, runs: Runs, tok_base: np.ndarray, ids: np.ndarray, starts: np.ndarray, ends: np.ndarray,
    bos: int | None, *, within: bool = False,
) -> Aligned:  # fmt: skip
    """The tokens' weights and turns of documents end to end (module docstring): ``char_base`` and ``tok_base``
    (int64[D + 1]) cut the characters and ``ids``/``starts``/``ends`` into documents, a token's ``(start, end)``
    counted among all the documents' characters; ``runs`` are the runs of those characters (a run may go on into
    the next document). ``within``: no token ends past its document's last character (``TokenSpans``' spans), so
    none is clipped there."""
    n_docs = len(char_base) - 1
    counts = np.diff(tok_base)
    g_starts = np.asarray(starts, dtype=np.int64)
    g_ends = np.asarray(ends, dtype=np.int64)
    if not within:
        g_ends = np.minimum(g_ends, np.repeat(char_base[1:], counts))  # within its document
    double_bos = np.zeros(n_docs, dtype=bool)
    if bos is not None:
        two = np.flatnonzero(counts > 1)
        lead = tok_base[two]
        double_bos[two] = (ids[lead] == bos) & (ids[lead + 1] == bos)
    run_starts = np.asarray(runs.starts, dtype=np.int64)
    run_w = np.asarray(runs.weights, dtype=np.float32)
    run_t = np.asarray(runs.turns, dtype=np.int32)
    held = run_starts < np.append(run_starts[1:], char_base[-1])
    if not held.all():  # runs that hold no character (a message the template writes nothing for)
        run_starts, run_w, run_t = run_starts[held], run_w[held], run_t[held]
    n = len(g_starts)
    straddling = np.zeros(n_docs, dtype=np.int64)
    if not len(run_starts):  # no characters: no token has any
        return Aligned(np.zeros(n, dtype=np.float32), np.zeros(n, dtype=np.int32), straddling, double_bos)
    # each run's first token: the first that starts on or after it (the spans go forwards over the block)
    bounds = np.searchsorted(g_starts, run_starts, side="left")
    has_chars = g_ends > g_starts
    if has_chars.all():
        # every token starts on a character of its document, so in a run (the runs start at its first character):
        # each run's weight and turn repeated over the tokens that start in it
        per_run = np.diff(bounds, append=n)
        weights, turns = np.repeat(run_w, per_run), np.repeat(run_t, per_run)
    else:
        # the run of each token's first character: the runs that start at or before it, counted through the tokens,
        # less one
        found = np.bincount(bounds, minlength=n + 1)
        first = np.cumsum(found[:n]) - 1
        # a token with no characters (an added EOS after the text): weight 0, and the turn of its place, clipped to
        # its document's last character (turn 0 in an empty document)
        none = np.flatnonzero(~has_chars)
        doc = np.searchsorted(tok_base, none, side="right") - 1
        place = np.minimum(g_starts[none], char_base[doc + 1] - 1)
        first[none] = np.searchsorted(run_starts, place, side="right") - 1
        weights, turns = run_w[first], run_t[first]
        weights[none] = 0
        turns[none] = np.where(char_base[doc + 1] > char_base[doc], turns[none], 0)
    # the first character of each new weight (a document's first character may count as one: no token crosses it)
    changes = run_starts[1:][run_w[1:] != run_w[:-1]]  # (weights are finite: as np.diff(run_w) != 0)
    if len(changes) and n:
        k = np.minimum(np.searchsorted(g_ends, changes, side="right"), n - 1)
        if ((g_starts[k] < changes) & (g_ends[k] > changes)).any():
            # the tokens with a change strictly inside them: start < change < end
            across = np.flatnonzero(
                np.searchsorted(changes, g_ends, side="left")
                > np.searchsorted(changes, g_starts, side="right")
            )
            last = np.searchsorted(run_starts, g_ends[across] - 1, side="right")  # one past each one's last run
            starting = np.searchsorted(run_starts, g_starts[across], side="right") - 1  # the run each starts in
            top, turn = _heaviest(run_w, run_t, starting, last)
            doc = np.searchsorted(tok_base, across[top > weights[across]], side="right") - 1  # their documents
            straddling = np.bincount(doc, minlength=n_docs).astype(np.int64)
            weights[across], turns[across] = top, turn
    return Aligned(weights, turns, straddling, double_bos)


def _heaviest(
    run_w: np.ndarray, run_t: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The largest weight of the runs ``[starts[t], ends[t])`` of a few tokens (each across at least two), and
    the turn of the first run of that weight: their runs gathered end to end, one ``maximum.reduceat`` over them,
    one comparison; cost proportional to those tokens' runs."""
    lengths = ends - starts
    group = np.cumsum(lengths) - lengths  # where each token's runs start in the gathered array
    owner = np.repeat(np.arange(len(starts)), lengths)
    at = np.arange(int(lengths.sum())) - group[owner] + starts[owner]
    values = run_w[at]
    top = np.maximum.reduceat(values, group)
    hits = np.flatnonzero(values == top[owner])
    first = np.searchsorted(owner[hits], np.arange(len(starts)))  # each token's first run of its weight
    return top, run_t[at[hits[first]]]
