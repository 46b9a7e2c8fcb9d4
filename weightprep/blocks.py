"""The per-block work of a build: one block of input lines to filtered documents, and the counts of each step.

    read -> validate -> [chat] -> [split] -> tokenize -> assemble -> mask -> filter

``parsed_blocks`` reads and validates the blocks of one input part (conversations rendered by ``Chats``, the
chat stage); ``document_batch`` makes one block's records documents: a pure function of its inputs, so blocks
can be processed anywhere (another process, another machine) and the rows come out the same. Each step's counts
(``count_rows`` for the rows packed from them) feed the accounting identity (``weightprep.accounting``). The job
of one part (``weightprep.distribute.job``) chains them, packs and writes.
"""

from __future__ import annotations

import contextlib
import gc
from collections import Counter
from collections.abc import Iterator
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import numpy as np

from weightprep.batches import Documents, Records, Reject, Rows
from weightprep.config import BuildConfig
from weightprep.constants import IGNORE_INDEX
from weightprep.distribute.plan import InputPart
from weightprep.stages.assemble import assemble
from weightprep.stages.chat_templates import resolve_templates, template_sha256
from weightprep.stages.columns import parse_columns
from weightprep.stages.filter import filter_documents
from weightprep.stages.mask import first_tokens, mask
from weightprep.stages.read import InputFile, file_kind, read_blocks
from weightprep.stages.tokenize import PieceTokenizer
from weightprep.stages.validate import parse_block
from weightprep.tokenizer import SpecialTokens, chat_tokenizer
from weightprep.weights import parse_role_weights

if TYPE_CHECKING:
    from weightprep.stages.chat import ChatRenderer

__all__ = ["document_batch", "count_rows", "Chats", "parsed_blocks"]


def document_batch(
    records: Records, tokenize: PieceTokenizer, specials: SpecialTokens, cfg: BuildConfig, *, labels: bool = True
) -> tuple[Documents, Counter[str]]:
    """Tokenize, assemble, mask and filter one batch of records; count what each step keeps and removes.

    Conversations arrive already tokenized by the chat stage (``ChatTokens``): their ids and weights are the
    document as they are (the template owns BOS/EOS); they join the pieces' documents in input order.
    ``labels=False``: the documents' labels are left None, for a caller that packs them (the rows make them from
    ids and weights by the mask stage's rule), a third less to make and copy per token."""
    counts: Counter[str] = Counter(accepted=len(records))
    chat_docs = None
    if records.chats is not None:
        is_chat = np.fromiter((c is not None for c in records.chats), dtype=bool, count=len(records))
        chat_docs = _chat_documents(records.where(is_chat), counts)
        records = records.where(~is_chat)
    piece_ids, piece_offsets = tokenize(records)
    docs = assemble(records, piece_ids, piece_offsets, specials, cfg.assemble.eos_weight)
    counts.update(pieces=len(records.texts), piece_tokens=len(piece_ids), documents=len(docs))
    # accepted tokens and weight from the tokenizer's output, independently of assemble
    piece_lengths = np.diff(piece_offsets)
    content = np.add.reduceat(piece_lengths, records.piece_offsets[:-1]) if len(records) else piece_lengths[:0]
    counts["empty_documents"] += int((content == 0).sum())
    n_special = 1 + (specials.bos is not None)
    counts["tokens_accepted"] += len(piece_ids) + n_special * len(records)
    counts["weight_accepted"] += float(
        (records.piece_weights.astype(np.float32).astype(np.float64) * piece_lengths).sum()
        + float(np.float32(cfg.assemble.eos_weight)) * len(records)
    )
    if chat_docs is not None:
        # a block of conversations only (or already in input order) is not copied again: 4 arrays per token
        merged = Documents.concat([docs, chat_docs]) if len(docs) else chat_docs
        order = np.argsort(merged.lines, kind="stable")
        docs = merged if (order == np.arange(len(order))).all() else merged.take(order)
    counts["weight_unlabeled_first"] += float(docs.weights[first_tokens(docs)].sum(dtype=np.float64))
    # the documents were made here (assemble, the chat merge): mask unweights their first tokens in place
    docs, dropped = filter_documents(mask(docs, labels=labels, copy=False), cfg.max_length, cfg.filter.overlong)
    counts.update(dropped)
    return docs, counts


#: a ``ChatTokens``' fields, read over a block's conversations without a Python loop
_IDS = attrgetter("ids")
_TRAINING, _SANITIZED, _STRADDLING = attrgetter("training"), attrgetter("sanitized"), attrgetter("straddling")


def _chat_documents(chats: Records, counts: Counter[str]) -> Documents:
    """The documents of rendered conversations, counted as accepted tokens and weight. A conversation built as
    per-turn documents is several; what they cost beyond its last one (which holds the conversation up to its
    last weighted turn once) is counted as ``chat_history_extra_tokens``."""
    rendered = chats.chats  # at least one: a block without conversations has chats None (Records.where)
    assert rendered
    history = [c.offsets for c in rendered if c.offsets is not None]  # type: ignore[union-attr]
    lines = chats.lines
    if history:
        parts = [[len(c.ids)] if c.offsets is None else np.diff(c.offsets) for c in rendered]  # type: ignore
        lines = np.repeat(lines, np.fromiter(map(len, parts), dtype=np.int64, count=len(parts)))
        lengths = np.concatenate(parts).astype(np.int64)
        counts.update(
            chat_history_conversations=len(history), chat_history_documents=sum(len(o) - 1 for o in history),
            chat_history_extra_tokens=sum(int(o[-2]) for o in history),
        )  # fmt: skip
    else:  # a document per conversation (the usual case: no list per conversation to join)
        lengths = np.fromiter(map(len, map(_IDS, rendered)), dtype=np.int64, count=len(rendered))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    counts.update(
        chat_training_template_turns=sum(map(_TRAINING, rendered)),
        chat_sanitized_control_tokens=sum(map(_SANITIZED, rendered)),
        chat_straddling_tokens=sum(map(_STRADDLING, rendered)),
    )
    ids, weights, turns = _joined(rendered)
    counts.update(documents=len(lengths), chat_documents=len(lengths), tokens_accepted=len(ids))
    counts["empty_documents"] += int((lengths == 0).sum())
    counts["weight_accepted"] += float(weights.sum(dtype=np.float64))
    return Documents(
        input_ids=ids.astype(np.int32, copy=False), weights=weights.astype(np.float32, copy=False), offsets=offsets,
        lines=lines, turns=turns.astype(np.int32, copy=False),
    )  # fmt: skip


def _joined(rendered: list[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ids, weights and turns of rendered conversations end to end: where they lie end to end in their batch's
    arrays already (``ChatTokens.batch``: the usual case, one batch a block), those arrays' slices, copied only to
    join several."""
    runs: list[tuple[Any, int, int]] = []  # (batch or a conversation's ChatTokens, start, end)
    for c in rendered:
        b = c.batch
        if b is not None and runs and runs[-1][0] is b and runs[-1][2] == c.start:
            runs[-1] = (b, runs[-1][1], c.start + len(c.ids))
        else:
            runs.append((c, 0, len(c.ids)) if b is None else (b, c.start, c.start + len(c.ids)))
    if len(runs) == 1:
        whole, a, b = runs[0]
        return whole.ids[a:b], whole.weights[a:b], whole.turns[a:b]
    return (
        np.concatenate([r.ids[a:b] for r, a, b in runs]), np.concatenate([r.weights[a:b] for r, a, b in runs]),
        np.concatenate([r.turns[a:b] for r, a, b in runs]),
    )  # fmt: skip


def count_rows(rows: Rows, counts: Counter[str]) -> None:
    """Count packed rows: rows, documents, real and supervised tokens, weight (the written side of the identity)."""
    counts["rows"] += len(rows)
    counts["documents_written"] += int(rows.documents.sum())
    counts["tokens"] += int(rows.real_tokens.sum())
    counts["supervised_tokens"] += int((rows.labels != IGNORE_INDEX).sum())
    counts["total_weight"] += float(rows.weights.sum(dtype=np.float64))


class Chats:
    """The chat stage of a build: a renderer made at the first conversation (a pieces-only build needs no template)."""

    def __init__(
        self, tokenizer: Any, cfg: BuildConfig, tokenize: PieceTokenizer, *, roles: list[str] | None = None,
        scale: float = 1.0,
    ) -> None:
        self.tokenizer, self.cfg, self.tokenize = tokenizer, cfg, tokenize
        self._renderer: ChatRenderer | None = None
        #: the conversations' role names, by turn code (``batches.turn_code``), for the writer's turns file (one
        #: list for the chat stages of every source of a build: their codes share the turns file)
        self.roles: list[str] = roles if roles is not None else []
        #: the source's weight (``weightprep.sources``), applied to message weights before their float32 cast
        self.scale = scale

    @property
    def template_sha256(self) -> str | None:
        """SHA-256 of the template text the conversations were rendered with (None: no conversation yet)."""
        return None if self._renderer is None else template_sha256(self._renderer.template)

    def __call__(self, records: Records, rejects: list[Reject]) -> Records:
        if records.chats is None:
            return records
        # imported at the first conversation: a build of pieces never loads the chat stage (nor jinja2)
        from weightprep.stages.chat import ChatRenderer, render_chats

        if self._renderer is None:
            tok = chat_tokenizer(self.tokenizer, full=self.cfg.chat.sanitize_control_tokens)
            chosen = resolve_templates(tok, self.cfg.chat.template)
            weights, history = parse_role_weights(self.cfg.chat.role_weights), self.cfg.chat.history
            renderer = ChatRenderer(
                tok, chosen.template, weights, self.roles, self.tokenize, chosen.path, history=history,
                original=chosen.original, training=chosen.training,
                sanitize_control_tokens=self.cfg.chat.sanitize_control_tokens, scale=self.scale,
            )  # fmt: skip
            renderer.check()
            self._renderer = renderer
        return render_chats(records, self._renderer, rejects)


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """The cyclic garbage collector paused while one block is parsed and its conversations rendered.

    Parsing a block line by line and rendering its conversations makes millions of short-lived containers (JSON
    objects, messages, template contexts, tuples); each few hundred of them start a collection that walks every
    container still alive, the block's records included, and the older generations again and again: ~10% of a
    chat build. Reference counting frees them as they go; what survives the block (its records) is collected, or
    kept, at the first allocation after it, once. A caller that had paused the collector keeps it paused."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def parsed_blocks(
    part: InputPart, record: InputFile, cfg: BuildConfig, chats: Chats | None
) -> Iterator[tuple[Records, list[Reject], int]]:
    """Validated records (conversations rendered by ``chats``; None: left as they are) and, when skipping, rejects
    of every block of ``part``, with the input bytes behind the block (``InputFile.behind``: of the part, without
    what the buffered readers have read ahead). In strict mode the first bad line of the block, in input order, is
    raised."""
    skip = cfg.validate.on_invalid == "skip"
    columns = parse_columns(cfg.read.columns)
    # a whole file's size is known from the plan: an object is then opened without another metadata request
    window = {"size": part.end} if part.whole else {"start": part.start, "end": part.end, "check": part.check}
    read = cfg.read
    # a columnar file's reader renames its columns; message keys and roles are renamed in validation, as for JSON
    inside = columns.inside() if file_kind(record.path) == "columnar" else columns
    for block in read_blocks(record, read.block_bytes, read.max_line_bytes, columns.records,
                             text_sample_by=read.text_sample_by, **window):  # fmt: skip
        consumed = record.behind
        rejects: list[Reject] = []
        with collection_paused():  # line by line (conversations, other tools' shapes), a Python object per value
            records = parse_block(block, rejects, inside)
            if chats is not None:
                records = chats(records, rejects)
        if rejects:
            rejects.sort(key=lambda r: r.line)
            if not skip:
                raise rejects[0].error()
        yield records, rejects, consumed

