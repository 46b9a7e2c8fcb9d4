"""The build: chains the stages and keeps the counts; no stage logic lives here.

    read -> validate -> [chat] -> [split] -> tokenize -> assemble -> mask -> filter -> pack -> write

``document_batch`` is the per-block work from validated records to filtered documents: a pure
function of its inputs, so blocks can be processed anywhere (another process, another machine)
and the rows come out the same. ``build`` streams blocks through it, packs and writes, and
returns the manifest. Invalid lines stop the build (``validate.on_invalid: error``, the default)
or go to rejects.jsonl (``skip``). Before publishing, the counts must satisfy the accounting
identity (``weightprep.accounting``). With a validation split (``weightprep.stages.split``) each split is
tokenized, packed and written on its own and the identity holds per split and in total. On any error the partial output is removed and the error
re-raised; the output path is left as it was.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from weightprep.accounting import check_accounting, final_counts
from weightprep.batches import Documents, Records, Reject, Rows
from weightprep.config import BuildConfig, config_to_dict
from weightprep.constants import FORMAT_NAME, FORMAT_VERSION, IGNORE_INDEX, PACKED_COLUMNS, UNPACKED_COLUMNS
from weightprep.errors import UsageError, is_columnar
from weightprep.overlap import BackgroundSink, background
from weightprep.stages.assemble import assemble
from weightprep.stages.chat import ChatRenderer, parse_role_weights, render_chats
from weightprep.stages.columnar import parse_columns
from weightprep.stages.filter import filter_documents
from weightprep.stages.mask import mask
from weightprep.stages.pack import Packer
from weightprep.stages.read import InputFile, check_inputs, expand_inputs, read_blocks
from weightprep.stages.rejects import REJECTS_NAME, RejectsWriter
from weightprep.stages.split import TRAIN, VALIDATION, count_cut, fraction_cut, split_records
from weightprep.stages.tokenize import FastokensPrefetch, PieceTokenizer
from weightprep.stages.validate import parse_block
from weightprep.stages.write import ShardWriter, prepare_output
from weightprep.tokenizer import (
    SpecialTokens,
    TokenizerFiles,
    load_tokenizer,
    special_tokens,
    tokenizer_location,
    tokenizer_summary,
    transformers_tokenizer,
)

__all__ = ["document_batch", "build", "ProgressFn"]

#: Called after each block with (bytes of input consumed so far, counts so far).
ProgressFn = Callable[[int, Counter], None]

_ADD_BOS = {"auto": None, "always": True, "never": False}


def document_batch(
    records: Records, tokenize: PieceTokenizer, specials: SpecialTokens, cfg: BuildConfig
) -> tuple[Documents, Counter[str]]:
    """Tokenize, assemble, mask and filter one batch of records; count what each step keeps and removes.

    Conversations arrive already tokenized by the chat stage (``ChatTokens``): their ids and weights are the
    document as they are (the template owns BOS/EOS); they join the pieces' documents in input order."""
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
        merged = Documents.concat([docs, chat_docs])
        docs = merged.take(np.argsort(merged.lines, kind="stable"))
    counts["weight_unlabeled_first"] += float(docs.weights[docs.offsets[:-1]].sum(dtype=np.float64))
    docs, dropped = filter_documents(mask(docs), cfg.max_length, cfg.filter.overlong)
    counts.update(dropped)
    return docs, counts


def _chat_documents(chats: Records, counts: Counter[str]) -> Documents:
    """The documents of rendered conversations, counted as accepted tokens and weight."""
    rendered = chats.chats or []
    lengths = np.fromiter((len(c.ids) for c in rendered), dtype=np.int64, count=len(rendered))  # type: ignore[union-attr]
    offsets = np.zeros(len(rendered) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.concatenate([c.ids for c in rendered]) if rendered else np.zeros(0, np.int32)  # type: ignore[union-attr]
    weights = np.concatenate([c.weights for c in rendered]) if rendered else np.zeros(0, np.float32)  # type: ignore[union-attr]
    turns = np.concatenate([c.turns for c in rendered]) if rendered else np.zeros(0, np.int32)  # type: ignore[union-attr]
    counts.update(documents=len(rendered), chat_documents=len(rendered), tokens_accepted=len(ids))
    counts["empty_documents"] += int((lengths == 0).sum())
    counts["weight_accepted"] += float(weights.astype(np.float64).sum())
    return Documents(
        input_ids=ids.astype(np.int32), weights=weights.astype(np.float32), offsets=offsets, lines=chats.lines,
        turns=turns.astype(np.int32),
    )


def _count_rows(rows: Rows, counts: Counter[str]) -> None:
    counts["rows"] += len(rows)
    counts["documents_written"] += int(rows.documents.sum())
    counts["tokens"] += int(rows.real_tokens.sum())
    counts["supervised_tokens"] += int((rows.labels != IGNORE_INDEX).sum())
    counts["total_weight"] += float(rows.weights.sum(dtype=np.float64))


class _Chats:
    """The chat stage of a build: a renderer made at the first conversation (a pieces-only build needs no template)."""

    def __init__(self, tokenizer: Any, cfg: BuildConfig) -> None:
        self.tokenizer, self.cfg = tokenizer, cfg
        self._renderer: ChatRenderer | None = None
        #: the conversations' role names, by turn code (``batches.turn_code``), for the writer's turns file
        self.roles: list[str] = []

    def __call__(self, records: Records, rejects: list[Reject]) -> Records:
        if records.chats is None:
            return records
        if self._renderer is None:
            path = self.cfg.chat.template
            template = Path(path).read_text(encoding="utf-8") if path else None
            renderer = ChatRenderer(
                transformers_tokenizer(self.tokenizer), template, parse_role_weights(self.cfg.chat.role_weights),
                self.roles,
            )
            renderer.check()
            self._renderer = renderer
        return render_chats(records, self._renderer, rejects)


def _parsed_blocks(
    files: list[InputFile], cfg: BuildConfig, chats: _Chats
) -> Iterator[tuple[Records, list[Reject], int]]:
    """Validated records (conversations rendered) and, when skipping, rejects of every block, with the input bytes
    consumed so far. In strict mode the first bad line of the block, in input order, is raised."""
    skip = cfg.validate.on_invalid == "skip"
    done = 0
    for f in files:
        for block in read_blocks(f, cfg.read.block_bytes, cfg.read.max_line_bytes, parse_columns(cfg.read.columns)):
            rejects: list[Reject] = []
            records = chats(parse_block(block, rejects), rejects)
            if rejects:
                rejects.sort(key=lambda r: r.line)
                if not skip:
                    raise rejects[0].error()
            yield records, rejects, done + f.size
        done += f.size


def _validation_cut(files: list[InputFile], cfg: BuildConfig, chats: _Chats) -> int | None:
    """The key cut of the configured split (a first pass over the records for ``validation_records``)."""
    split = cfg.split
    if split.validation_fraction is not None:
        return fraction_cut(split.validation_fraction)
    if split.validation_records is not None:
        first_pass = [InputFile(f.path) for f in files]  # its own size/hash counters: the build's stay exact
        blocks = (records for records, _, _ in _parsed_blocks(first_pass, cfg, chats))
        return count_cut(blocks, split.validation_records, split.seed)
    return None


def build(
    inputs: list[str],
    out: str | Path,
    cfg: BuildConfig,
    *,
    tokenizer: Any = None,
    overwrite: bool = False,
    progress: ProgressFn | None = None,
    notify: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the whole pipeline from JSONL ``inputs`` to shards at ``out``; return the manifest.

    ``notify`` receives the notes worth telling the user (e.g. that fastokens could not run this tokenizer).

    Three threads overlap: read+validate (background), tokenize+assemble+mask+filter (this one),
    pack+write (background); see ``weightprep.overlap``. The rows do not depend on their timing.
    """
    from weightprep import __version__

    inputs = expand_inputs(inputs)
    check_inputs(inputs)
    if cfg.read.columns and (jsonl := [p for p in inputs if not is_columnar(p)]):
        raise UsageError(
            f"--columns renames the columns of Parquet/Arrow inputs; {jsonl[0]} is JSONL: give its records the "
            "field names pieces/messages/text/prompt+completion"
        )
    out_path = prepare_output(out, overwrite=overwrite, inputs=inputs)
    prefetch = None
    if tokenizer is None and cfg.tokenizer.backend != "hf" and not cfg.tokenizer.trust_remote_code:
        tok_dir = Path(tokenizer_location(cfg.tokenizer.name))
        if (tok_dir / "tokenizer.json").is_file():  # fastokens loads while the tokenizer itself does
            prefetch = FastokensPrefetch(tok_dir / "tokenizer.json")
    tok = tokenizer if tokenizer is not None else load_tokenizer(
        cfg.tokenizer.name, trust_remote_code=cfg.tokenizer.trust_remote_code, direct=True
    )
    specials = special_tokens(tok, add_bos=_ADD_BOS[cfg.tokenizer.add_bos])
    # the file fastokens read is what the tokenizer runs only where the build read it directly (TokenizerFiles)
    if prefetch is not None and not isinstance(tok, TokenizerFiles):
        prefetch.close()  # loaded through AutoTokenizer: the file need not be what runs, so it is not used
        prefetch = None
    tokenize = PieceTokenizer(tok, cfg.tokenizer.batch_size, cfg.tokenizer.backend, notify, prefetched=prefetch)
    seq_len, packed = cfg.pack.seq_len, cfg.pack.enabled
    files = [InputFile(p) for p in inputs]
    chats = _Chats(tok, cfg)
    cut = _validation_cut(files, cfg, chats)
    splits = (TRAIN, VALIDATION) if cut is not None else None
    packers = {
        name: Packer(seq_len, specials.pad, packed=packed, window=cfg.pack.window) for name in (splits or (None,))
    }
    writer = ShardWriter(
        out_path, seq_len, packed=packed, max_shard_bytes=cfg.write.max_shard_bytes, splits=splits,
        turn_roles=chats.roles,
    )
    rejects = RejectsWriter(writer.tmp) if cfg.validate.on_invalid == "skip" else None
    doc_counts = {name: Counter() for name in packers}  # updated by this thread only
    row_counts = {name: Counter() for name in packers}  # updated by the writer thread only

    def pack_and_write(item: tuple[str | None, Documents]) -> None:
        name, docs = item
        for rows in packers[name].add(docs):
            _count_rows(rows, row_counts[name])
            writer.write(rows, name)

    sink: BackgroundSink[tuple[str | None, Documents]] = BackgroundSink(pack_and_write)
    parsed = background(_parsed_blocks(files, cfg, chats))
    try:
        accepted: Counter[str] = Counter()
        for records, block_rejects, consumed in parsed:
            if rejects is not None and block_rejects:
                rejects.write(block_rejects)
            parts = {None: records} if cut is None else split_records(records, cut, cfg.split.seed)
            for name, part in parts.items():
                docs, batch_counts = document_batch(part, tokenize, specials, cfg)
                doc_counts[name].update(batch_counts)
                sink.put((name, docs))
            accepted["accepted"] += len(records)
            if progress is not None:
                progress(consumed, accepted)
        sink.close()
        for name, packer in packers.items():
            for rows in packer.flush():
                _count_rows(rows, row_counts[name])
                writer.write(rows, name)
        rejected: Counter[str] = Counter()
        if rejects is not None:
            rejects.close()
            rejected = rejects.counts
        all_counts: Counter[str] = Counter()
        per_split = {}
        for name in packers:
            split_counts = doc_counts[name].copy()
            split_counts.update(row_counts[name])
            all_counts.update(split_counts)
            if name is not None:
                per_split[name] = final_counts(split_counts, Counter(), seq_len)
        counts = final_counts(all_counts, rejected, seq_len)
        if counts["records"] == 0:
            raise UsageError(f"the input holds no records ({', '.join(inputs)}: empty or blank lines only)")
        check_accounting(counts)
        for split_counts in per_split.values():
            check_accounting(split_counts)
        manifest = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "weightprep_version": __version__,
            "config": config_to_dict(cfg),
            "tokenizer": {
                **tokenizer_summary(tok), "bos_added": specials.bos is not None, "pad_used": specials.pad,
                "backend": tokenize.backend,
            },
            "inputs": [f.as_manifest() for f in files],
            "columns": list(PACKED_COLUMNS if packed else UNPACKED_COLUMNS),
            "rejects_file": REJECTS_NAME if rejects is not None else None,
            "counts": counts,
            **({"splits": {name: {"counts": c} for name, c in per_split.items()}} if per_split else {}),
        }
        return writer.commit(manifest)
    except BaseException:
        parsed.close()  # stops and joins the read thread now, not when the traceback is collected
        tokenize.close()
        sink.cancel()
        if rejects is not None:
            rejects.close()
        writer.abort()
        raise

