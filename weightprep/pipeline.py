"""The build: chains the stages and keeps the counts; no stage logic lives here.

    read -> validate -> [split] -> tokenize -> assemble -> mask -> filter -> pack -> write

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
from weightprep.errors import UsageError
from weightprep.overlap import BackgroundSink, background
from weightprep.stages.assemble import assemble
from weightprep.stages.filter import filter_documents
from weightprep.stages.mask import mask
from weightprep.stages.pack import Packer
from weightprep.stages.read import InputFile, check_inputs, expand_inputs, read_blocks
from weightprep.stages.rejects import REJECTS_NAME, RejectsWriter
from weightprep.stages.split import TRAIN, VALIDATION, count_cut, fraction_cut, split_records
from weightprep.stages.tokenize import PieceTokenizer
from weightprep.stages.validate import parse_block
from weightprep.stages.write import ShardWriter, prepare_output
from weightprep.tokenizer import SpecialTokens, load_tokenizer, special_tokens, tokenizer_summary

__all__ = ["document_batch", "build", "ProgressFn"]

#: Called after each block with (bytes of input consumed so far, counts so far).
ProgressFn = Callable[[int, Counter], None]

_ADD_BOS = {"auto": None, "always": True, "never": False}


def document_batch(
    records: Records, tokenize: PieceTokenizer, specials: SpecialTokens, cfg: BuildConfig
) -> tuple[Documents, Counter[str]]:
    """Tokenize, assemble, mask and filter one batch of records; count what each step keeps and removes."""
    piece_ids, piece_offsets = tokenize(records.texts)
    docs = assemble(records, piece_ids, piece_offsets, specials, cfg.assemble.eos_weight)
    counts: Counter[str] = Counter(accepted=len(records), pieces=len(records.texts), piece_tokens=len(piece_ids))
    counts["documents"] += len(docs)
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
    counts["weight_unlabeled_first"] += float(docs.weights[docs.offsets[:-1]].sum(dtype=np.float64))
    docs, dropped = filter_documents(mask(docs), cfg.max_length, cfg.filter.overlong)
    counts.update(dropped)
    return docs, counts


def _count_rows(rows: Rows, counts: Counter[str]) -> None:
    counts["rows"] += len(rows)
    counts["documents_written"] += int(rows.documents.sum())
    counts["tokens"] += int(rows.real_tokens.sum())
    counts["supervised_tokens"] += int((rows.labels != IGNORE_INDEX).sum())
    counts["total_weight"] += float(rows.weights.sum(dtype=np.float64))


def _parsed_blocks(files: list[InputFile], cfg: BuildConfig) -> Iterator[tuple[Records, list[Reject], int]]:
    """Validated records (and, when skipping, rejects) of every block, with the input bytes consumed so far."""
    skip = cfg.validate.on_invalid == "skip"
    done = 0
    for f in files:
        for block in read_blocks(f, cfg.read.block_bytes, cfg.read.max_line_bytes):
            rejects: list[Reject] = []
            yield parse_block(block, rejects if skip else None), rejects, done + f.size
        done += f.size


def _validation_cut(files: list[InputFile], cfg: BuildConfig) -> int | None:
    """The key cut of the configured split (a first pass over the records for ``validation_records``)."""
    split = cfg.split
    if split.validation_fraction is not None:
        return fraction_cut(split.validation_fraction)
    if split.validation_records is not None:
        first_pass = [InputFile(f.path) for f in files]  # its own size/hash counters: the build's stay exact
        blocks = (records for records, _, _ in _parsed_blocks(first_pass, cfg))
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
) -> dict[str, Any]:
    """Run the whole pipeline from JSONL ``inputs`` to shards at ``out``; return the manifest.

    Three threads overlap: read+validate (background), tokenize+assemble+mask+filter (this one),
    pack+write (background); see ``weightprep.overlap``. The rows do not depend on their timing.
    """
    from weightprep import __version__

    inputs = expand_inputs(inputs)
    check_inputs(inputs)
    out_path = prepare_output(out, overwrite=overwrite, inputs=inputs)
    tok = tokenizer if tokenizer is not None else load_tokenizer(
        cfg.tokenizer.name, trust_remote_code=cfg.tokenizer.trust_remote_code
    )
    specials = special_tokens(tok, add_bos=_ADD_BOS[cfg.tokenizer.add_bos])
    tokenize = PieceTokenizer(tok, cfg.tokenizer.batch_size)
    seq_len, packed = cfg.pack.seq_len, cfg.pack.enabled
    files = [InputFile(p) for p in inputs]
    cut = _validation_cut(files, cfg)
    splits = (TRAIN, VALIDATION) if cut is not None else None
    packers = {
        name: Packer(seq_len, specials.pad, packed=packed, window=cfg.pack.window) for name in (splits or (None,))
    }
    writer = ShardWriter(
        out_path, seq_len, packed=packed, max_shard_bytes=cfg.write.max_shard_bytes, splits=splits
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
    parsed = background(_parsed_blocks(files, cfg))
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
            "tokenizer": {**tokenizer_summary(tok), "bos_added": specials.bos is not None, "pad_used": specials.pad},
            "inputs": [f.as_manifest() for f in files],
            "columns": list(PACKED_COLUMNS if packed else UNPACKED_COLUMNS),
            "rejects_file": REJECTS_NAME if rejects is not None else None,
            "counts": counts,
            **({"splits": {name: {"counts": c} for name, c in per_split.items()}} if per_split else {}),
        }
        return writer.commit(manifest)
    except BaseException:
        parsed.close()  # stops and joins the read thread now, not when the traceback is collected
        sink.cancel()
        if rejects is not None:
            rejects.close()
        writer.abort()
        raise

