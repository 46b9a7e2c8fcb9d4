"""The columnar batches that flow between stages.

Every stage takes one of these and returns the next; all are flat NumPy arrays plus offsets
(CSR layout), so a batch of 10k documents is a handful of arrays, not 10k Python lists.

``Block`` (read) -> ``Records`` (validate) -> ``Documents`` (tokenize + assemble, mask, filter)
-> ``Rows`` (pack) -> Arrow shards (write). Invalid lines leave validate as ``Reject``s (strict
mode turns the first into an ``InputError``; ``--skip-invalid`` writes them to rejects.jsonl).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from weightprep.errors import InputError

__all__ = ["Block", "Reject", "Chat", "ChatTokens", "Records", "Documents", "Rows", "turn_code", "split_turn_code"]


@dataclass(frozen=True)
class Block:
    """Whole lines of one input file: ``data`` holds lines ``first_line .. first_line + n_lines - 1``.

    ``offset`` is the byte offset of ``data[0]`` in the (decompressed) stream. A line longer than
    the reader's limit arrives alone as a block with ``too_long`` set to its length in bytes and
    only its first bytes in ``data``: it was never held in memory whole.
    """

    path: str
    first_line: int
    n_lines: int
    data: bytes
    offset: int = 0
    too_long: int = 0


@dataclass(frozen=True)
class Reject:
    """An invalid line: where it is, why it was rejected, and its bytes (without the line ending).

    ``raw`` is the whole line, except for a ``line_too_long`` reject, whose ``raw`` holds only the
    line's first bytes and ``line_bytes`` its full length.
    """

    path: str
    line: int
    offset: int
    reason: str
    field: str
    problem: str
    raw: bytes
    line_bytes: int

    def error(self) -> InputError:
        """The strict-mode error for this line."""
        return InputError(self.path, self.line, self.field, self.problem, reason=self.reason, offset=self.offset)


class Chat(NamedTuple):
    """A validated conversation record, before the chat stage renders it (``raw``: the line, for a reject)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    template_kwargs: dict[str, Any] | None
    raw: bytes
    offset: int = 0

    @property
    def canonical(self) -> str:
        """The record as canonical JSON (sorted keys, no spaces): what the validation split hashes, known before the
        chat stage renders it (so the first pass of ``--validation-records`` renders nothing)."""
        return json.dumps(
            {"messages": self.messages, "tools": self.tools, "chat_template_kwargs": self.template_kwargs},
            sort_keys=True, ensure_ascii=False, separators=(",", ":"),
        )  # fmt: skip


#: A token's turn code packs its message's role (``roles[code >> 16 - 1]``) and index (``code & 0xFFFF - 1``).
_ROLE_SHIFT = 16


def turn_code(roles: list[str], role: str, message: int) -> int:
    """The code of message ``message`` with role ``role`` (the role gets the next code on first sight)."""
    if message >= (1 << _ROLE_SHIFT) - 1 or (role not in roles and len(roles) >= (1 << 14) - 1):
        return 0  # beyond what the code holds: shown as template text
    if role not in roles:
        roles.append(role)
    return ((roles.index(role) + 1) << _ROLE_SHIFT) | (message + 1)


def split_turn_code(code: int) -> tuple[int, int]:
    """(role index into the roles list, message index) of a non-zero turn code."""
    return (code >> _ROLE_SHIFT) - 1, (code & ((1 << _ROLE_SHIFT) - 1)) - 1


class TokenBatch(NamedTuple):
    """The ids, weights and turn codes of a batch of rendered conversations end to end (``ChatRenderer.tokens_batch``):
    the arrays that a conversation's ``ChatTokens`` are views of, so that a block's documents need not copy them
    again (``blocks._chat_documents``)."""

    ids: np.ndarray  # int32
    weights: np.ndarray  # float32
    turns: np.ndarray  # int32


class ChatTokens(NamedTuple):
    """A rendered conversation: its token ids and per-token weights (template specials included), each token's
    turn, and the record it came from (whose canonical JSON the validation split hashes). A conversation built
    as per-turn documents (``chat.history``) holds several documents, one after the other: ``offsets`` between
    them (None: one document); ``training``: how many of its weighted turns TRL's training template rendered
    (the template itself could not); ``sanitized``: how many control tokens of its strings were encoded as text
    (``--sanitize-control-tokens``); ``straddling``: how many of its tokens hold the end of a span of one weight
    and the start of a heavier one (a generation prompt's end and its answer's start) and so took the heavier
    weight. ``batch``: the batch's arrays that its own are ``[start, start + N)`` of (None: arrays of its own)."""

    ids: np.ndarray  # int32[N]
    weights: np.ndarray  # float32[N]
    source: Chat
    turns: np.ndarray  # int32[N], each token's turn code (``turn_code``; 0 outside every message)
    offsets: np.ndarray | None = None  # int64[D + 1], the documents of per-turn history
    training: int = 0
    sanitized: int = 0
    straddling: int = 0
    batch: TokenBatch | None = None
    start: int = 0

    @property
    def canonical(self) -> str:
        """The canonical JSON of the record it came from (``Chat.canonical``)."""
        return self.source.canonical


@dataclass(frozen=True)
class Records:
    """Validated records: piece ``p`` of record ``r`` is ``texts[piece_offsets[r] + p]``.

    A conversation record (``{"messages": ...}``) has no pieces; ``chats[r]`` holds it, a ``Chat`` from the validate
    stage, a ``ChatTokens`` once the chat stage has rendered and tokenized it. ``chats`` is None when the batch
    holds pieces only, else one entry per record (None for a pieces record).
    """

    path: str
    lines: np.ndarray  # int64[R], 1-based line of each record in ``path``
    texts: list[str]  # [P] piece texts, records' pieces in order
    piece_weights: np.ndarray  # float64[P]
    piece_offsets: np.ndarray  # int64[R + 1]
    chats: list[Chat | ChatTokens | None] | None = None

    def __len__(self) -> int:
        return len(self.lines)

    def where(self, keep: np.ndarray) -> Records:
        """The records where ``keep`` is true, in order."""
        index = np.flatnonzero(keep)
        counts = np.diff(self.piece_offsets)[index]
        offsets = np.zeros(len(index) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        starts = self.piece_offsets[index].tolist()
        pieces = [p for s, n in zip(starts, counts.tolist(), strict=True) for p in range(s, s + n)]
        chats = None
        if self.chats is not None:
            chats = [self.chats[i] for i in index.tolist()]
            chats = chats if any(c is not None for c in chats) else None
        return Records(
            path=self.path,
            lines=self.lines[index],
            texts=[self.texts[p] for p in pieces],
            piece_weights=self.piece_weights[np.asarray(pieces, dtype=np.int64)],
            piece_offsets=offsets,
            chats=chats,
        )


@dataclass(frozen=True)
class Documents:
    """Token-level documents: document ``d`` is ``input_ids[offsets[d]:offsets[d + 1]]``.

    ``labels`` is None until the mask stage has run.
    """

    input_ids: np.ndarray  # int32[N]
    weights: np.ndarray  # float32[N]
    offsets: np.ndarray  # int64[D + 1]
    lines: np.ndarray  # int64[D], line of the record each document came from
    labels: np.ndarray | None = None  # int32[N]
    turns: np.ndarray | None = None  # int32[N], chat turn codes (0: not in a message); None: no conversations

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def take(self, index: np.ndarray) -> Documents:
        """The documents at ``index`` (in that order), as a new batch."""
        index = np.asarray(index, dtype=np.int64)
        return self.segments(self.offsets[index], self.lengths[index], self.lines[index])

    def where(self, keep: np.ndarray) -> Documents:
        """The documents where ``keep`` is true, in order, as a new batch (``take`` of them, through a mask of the
        tokens instead of an index of them: an eighth of the memory to make and read)."""
        tokens = np.repeat(keep, self.lengths)
        lengths = self.lengths[keep]
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return Documents(
            input_ids=self.input_ids[tokens],
            weights=self.weights[tokens],
            offsets=offsets,
            lines=self.lines[keep],
            labels=None if self.labels is None else self.labels[tokens],
            turns=None if self.turns is None else self.turns[tokens],
        )

    def segments(self, starts: np.ndarray, lengths: np.ndarray, lines: np.ndarray) -> Documents:
        """A new batch whose document ``i`` is tokens ``starts[i] : starts[i] + lengths[i]`` of this one."""
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        gather = _ranges(np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64))
        return Documents(
            input_ids=self.input_ids[gather],
            weights=self.weights[gather],
            offsets=offsets,
            lines=np.asarray(lines, dtype=np.int64),
            labels=None if self.labels is None else self.labels[gather],
            turns=None if self.turns is None else self.turns[gather],
        )

    @staticmethod
    def concat(parts: list[Documents]) -> Documents:
        """One batch holding ``parts``' documents in order (``parts[0]`` itself where it is the only one)."""
        if len(parts) == 1:
            return parts[0]
        lengths = np.concatenate([p.lengths for p in parts])
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        has_labels = all(p.labels is not None for p in parts)
        return Documents(
            input_ids=np.concatenate([p.input_ids for p in parts]),
            weights=np.concatenate([p.weights for p in parts]),
            offsets=offsets,
            lines=np.concatenate([p.lines for p in parts]),
            labels=np.concatenate([p.labels for p in parts]) if has_labels else None,  # type: ignore[misc]
            turns=None if all(p.turns is None for p in parts) else np.concatenate(
                [p.turns if p.turns is not None else np.zeros(len(p.input_ids), np.int32) for p in parts]
            ),
        )

    @staticmethod
    def merge(parts: list[Documents], order: np.ndarray) -> Documents:
        """``Documents.concat(parts).take(order)`` (``order``: indices into the parts' documents, concatenated)
        without the concatenated copy: each part's tokens are scattered straight to their places in the result,
        one part at a time (so the index held is one part's, not the whole batch's)."""
        order = np.asarray(order, dtype=np.int64)
        all_lengths = np.concatenate([p.lengths for p in parts])
        lengths = all_lengths[order]
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        place = np.empty(len(order), dtype=np.int64)  # place[g]: the result's index of concatenated document g
        place[order] = np.arange(len(order), dtype=np.int64)
        total = int(offsets[-1])
        has_labels = all(p.labels is not None for p in parts)
        has_turns = any(p.turns is not None for p in parts)
        # the dtypes np.concatenate would give
        input_ids = np.empty(total, dtype=np.result_type(*(p.input_ids for p in parts)))
        weights = np.empty(total, dtype=np.result_type(*(p.weights for p in parts)))
        labels = np.empty(total, dtype=np.result_type(*(p.labels for p in parts))) if has_labels else None
        turn_types = [p.turns.dtype if p.turns is not None else np.int32 for p in parts]
        turns = np.zeros(total, dtype=np.result_type(*turn_types)) if has_turns else None  # none: zeros, as concat
        base = 0
        for p in parts:
            n = len(p)
            at = offsets[place[base : base + n]]
            scatter = _ranges(at, all_lengths[base : base + n])
            input_ids[scatter] = p.input_ids
            weights[scatter] = p.weights
            if labels is not None:
                labels[scatter] = p.labels
            if turns is not None and p.turns is not None:
                turns[scatter] = p.turns
            base += n
        lines = np.concatenate([p.lines for p in parts])[order]
        return Documents(input_ids=input_ids, weights=weights, offsets=offsets, lines=lines, labels=labels, turns=turns)


def _ranges(starts: np.ndarray, lengths: np.ndarray, dtype: Any = np.int64, out: np.ndarray | None = None) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for each (s, n), without a Python loop (as ``dtype``: one that holds
    every value, e.g. int32 for positions within rows; into ``out``, of that dtype and ``lengths.sum()`` long, if
    given)."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=dtype)
    ends = np.cumsum(lengths)
    if out is None:
        step = np.ones(total, dtype=dtype)
    else:
        step = out
        step.fill(1)
    nonempty = lengths > 0
    first = (ends - lengths)[nonempty]
    # at each range's first slot, jump from the previous range's last value to this start
    prev_last = np.concatenate([[0], (starts + lengths - 1)[nonempty][:-1]])
    step[first] = starts[nonempty] - prev_last
    step[0] = starts[nonempty][0]
    return np.cumsum(step, out=step)  # in place: one index array allocated, not two


@dataclass(frozen=True)
class Rows:
    """Fixed-length output rows (``[n, seq_len]`` arrays) and each row's segment lengths."""

    input_ids: np.ndarray  # int32[n, L]
    labels: np.ndarray  # int32[n, L]
    weights: np.ndarray  # float32[n, L]
    position_ids: np.ndarray  # int32[n, L]
    seq_lengths: list[np.ndarray]  # n arrays of int32, each summing to L
    real_tokens: np.ndarray  # int64[n], tokens before the pad tail
    documents: np.ndarray  # int64[n], documents in each row
    attention_mask: np.ndarray | None = None  # int8[n, L], unpacked rows only
    turns: np.ndarray | None = None  # int32[n, L], chat turn codes (not a shard column: the turns file)

    def __len__(self) -> int:
        return len(self.input_ids)
