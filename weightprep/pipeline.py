"""The build: chains the stages and keeps the counts; no stage logic lives here.

    read -> validate -> tokenize -> assemble -> mask -> filter -> pack -> write

``document_batch`` is the per-block work from validated records to filtered documents: a pure
function of its inputs, so blocks can be processed anywhere (another process, another machine)
and the rows come out the same. ``build`` streams blocks through it, packs and writes, and
returns the manifest. On any error the partial output is removed and the error re-raised.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from weightprep.batches import Documents, Records, Rows
from weightprep.config import BuildConfig, config_to_dict
from weightprep.constants import FORMAT_NAME, FORMAT_VERSION, IGNORE_INDEX, PACKED_COLUMNS, UNPACKED_COLUMNS
from weightprep.overlap import BackgroundSink, background
from weightprep.stages.assemble import assemble
from weightprep.stages.filter import filter_documents
from weightprep.stages.mask import mask
from weightprep.stages.pack import Packer
from weightprep.stages.read import InputFile, check_inputs, read_blocks
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
    """Tokenize, assemble, mask and filter one batch of records."""
    piece_ids, piece_offsets = tokenize(records.texts)
    docs = assemble(records, piece_ids, piece_offsets, specials, cfg.assemble.eos_weight)
    counts: Counter[str] = Counter(records=len(records), pieces=len(records.texts), piece_tokens=len(piece_ids))
    counts["documents"] += len(docs)
    docs, dropped = filter_documents(mask(docs), cfg.max_length, cfg.filter.overlong)
    counts.update(dropped)
    return docs, counts


def _count_rows(rows: Rows, counts: Counter[str]) -> None:
    counts["rows"] += len(rows)
    counts["documents_written"] += int(rows.documents.sum())
    counts["tokens"] += int(rows.real_tokens.sum())
    counts["supervised_tokens"] += int((rows.labels != IGNORE_INDEX).sum())
    counts["total_weight"] += float(rows.weights.sum(dtype=np.float64))


def _parsed_blocks(files: list[InputFile], cfg: BuildConfig) -> Iterator[tuple[Records, int]]:
    """Validated records of every block of every file, with the input bytes consumed so far."""
    done = 0
    for f in files:
        for block in read_blocks(f, cfg.read.block_bytes):
            yield parse_block(block), done + f.size
        done += f.size


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

    check_inputs(inputs)
    out_path = prepare_output(out, overwrite=overwrite)
    tok = tokenizer if tokenizer is not None else load_tokenizer(
        cfg.tokenizer.name, trust_remote_code=cfg.tokenizer.trust_remote_code
    )
    specials = special_tokens(tok, add_bos=_ADD_BOS[cfg.tokenizer.add_bos])
    tokenize = PieceTokenizer(tok, cfg.tokenizer.batch_size)
    seq_len, packed = cfg.pack.seq_len, cfg.pack.enabled
    packer = Packer(seq_len, specials.pad, packed=packed, window=cfg.pack.window)
    writer = ShardWriter(out_path, seq_len, packed=packed, max_shard_bytes=cfg.write.max_shard_bytes)
    files = [InputFile(p) for p in inputs]
    doc_counts: Counter[str] = Counter()  # updated by this thread only
    row_counts: Counter[str] = Counter()  # updated by the writer thread only

    def pack_and_write(docs: Documents) -> None:
        for rows in packer.add(docs):
            _count_rows(rows, row_counts)
            writer.write(rows)

    sink: BackgroundSink[Documents] = BackgroundSink(pack_and_write)
    try:
        for records, consumed in background(_parsed_blocks(files, cfg)):
            docs, batch_counts = document_batch(records, tokenize, specials, cfg)
            doc_counts.update(batch_counts)
            sink.put(docs)
            if progress is not None:
                progress(consumed, doc_counts)
        sink.close()
        for rows in packer.flush():
            _count_rows(rows, row_counts)
            writer.write(rows)
        manifest = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "weightprep_version": __version__,
            "config": config_to_dict(cfg),
            "tokenizer": {**tokenizer_summary(tok), "bos_added": specials.bos is not None, "pad_used": specials.pad},
            "inputs": [f.as_manifest() for f in files],
            "columns": list(PACKED_COLUMNS if packed else UNPACKED_COLUMNS),
            "counts": _final_counts(doc_counts + row_counts, seq_len),
        }
        return writer.commit(manifest)
    except BaseException:
        sink.cancel()
        writer.abort()
        raise


def _final_counts(counts: Counter[str], seq_len: int) -> dict[str, Any]:
    rows = counts["rows"]
    result: dict[str, Any] = {
        "records": counts["records"],
        "pieces": counts["pieces"],
        "piece_tokens": counts["piece_tokens"],
        "documents": counts["documents"],
        "documents_written": counts["documents_written"],
        "dropped": {k.removeprefix("dropped_"): counts[k] for k in ("dropped_overlong", "dropped_unsupervised")},
        "truncated": counts["truncated"],
        "split": counts["split"],
        "split_parts": counts["split_parts"],
        "rows": rows,
        "tokens": counts["tokens"],
        "pad_tokens": rows * seq_len - counts["tokens"],
        "supervised_tokens": counts["supervised_tokens"],
        "total_weight": round(counts["total_weight"], 6),
        "fill_ratio": round(counts["tokens"] / (rows * seq_len), 6) if rows else 0.0,
    }
    return result
