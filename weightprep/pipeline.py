"""The build: chains the stages and keeps the counts; no stage logic lives here.

    plan splits -> per split: read -> validate -> [chat] -> [split] -> tokenize -> assemble -> mask -> filter
                   -> pack -> write  ->  merge (driver) -> publish

``document_batch`` is the per-block work from validated records to filtered documents: a pure
function of its inputs, so blocks can be processed anywhere (another process, another machine)
and the rows come out the same. ``SplitJob`` streams the blocks of one input split
(``weightprep.distribute.plan``) through it, packs and writes that split's shards, and returns its counts;
an executor (``weightprep.distribute.executors``) runs the jobs here, in worker processes or on Ray, and
``build`` merges their results in split order (``weightprep.distribute.merge``) and returns the manifest.
Invalid lines stop the build (``validate.on_invalid: error``, the default)
or go to rejects.jsonl (``skip``). Before publishing, the counts must satisfy the accounting
identity (``weightprep.accounting``). With a validation split (``weightprep.stages.split``) each split is
tokenized, packed and written on its own and the identity holds per split and in total. On any error the partial
output is removed and the error re-raised; the output path is left as it was. An interrupted build (Ctrl-C,
SIGKILL) leaves its finished splits in its temporary directory for ``--resume``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from weightprep.accounting import check_accounting, final_counts
from weightprep.batches import Documents, Records, Reject, Rows
from weightprep.config import BuildConfig, config_to_dict
from weightprep.constants import FORMAT_NAME, FORMAT_VERSION, IGNORE_INDEX, PACKED_COLUMNS, UNPACKED_COLUMNS
from weightprep.distribute.executors import Executor, SerialExecutor, run_splits
from weightprep.distribute.merge import merge_results
from weightprep.distribute.plan import InputSplit, plan_splits
from weightprep.errors import BackendMismatch, InputError, UsageError, is_columnar
from weightprep.overlap import BackgroundSink, background
from weightprep.stages.assemble import assemble
from weightprep.stages.chat import CHAT_REASONS, ChatRenderer, parse_role_weights, render_chats
from weightprep.stages.chat_templates import manifest_chat, resolve_templates
from weightprep.stages.columnar import parse_columns
from weightprep.stages.filter import filter_documents
from weightprep.stages.mask import mask
from weightprep.stages.pack import Packer
from weightprep.stages.read import InputFile, check_inputs, expand_inputs, read_blocks
from weightprep.stages.rejects import REJECTS_NAME, RejectsWriter
from weightprep.stages.split import (
    TRAIN,
    VALIDATION,
    cut_from_keys,
    fraction_cut,
    smallest_keys,
    split_records,
)
from weightprep.stages.tokenize import FastokensPrefetch, PieceTokenizer
from weightprep.stages.validate import parse_block
from weightprep.stages.write import Output, ShardWriter, prepare_output
from weightprep.tokenizer import (
    SpecialTokens,
    TokenizerFiles,
    load_tokenizer,
    set_tokenizer_threads,
    special_tokens,
    tokenizer_location,
    tokenizer_summary,
    transformers_tokenizer,
)

__all__ = ["document_batch", "build", "SplitJob", "ProgressFn"]

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
    """The documents of rendered conversations, counted as accepted tokens and weight. A conversation built as
    per-turn documents is several; what they cost beyond its last one (which holds the conversation up to its
    last weighted turn once) is counted as ``chat_history_extra_tokens``."""
    rendered = chats.chats or []
    parts = [[len(c.ids)] if c.offsets is None else np.diff(c.offsets) for c in rendered]  # type: ignore
    per_conversation = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
    lengths = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    for c in rendered:
        if c.offsets is not None:  # type: ignore[union-attr]
            counts["chat_history_conversations"] += 1
            counts["chat_history_documents"] += len(c.offsets) - 1  # type: ignore[union-attr]
            counts["chat_history_extra_tokens"] += int(c.offsets[-2])  # type: ignore[union-attr]
            counts["chat_training_template_turns"] += c.training  # type: ignore[union-attr]
    ids = np.concatenate([c.ids for c in rendered]) if rendered else np.zeros(0, np.int32)  # type: ignore[union-attr]
    weights = np.concatenate([c.weights for c in rendered]) if rendered else np.zeros(0, np.float32)  # type: ignore[union-attr]
    turns = np.concatenate([c.turns for c in rendered]) if rendered else np.zeros(0, np.int32)  # type: ignore[union-attr]
    counts.update(documents=len(lengths), chat_documents=len(lengths), tokens_accepted=len(ids))
    counts["empty_documents"] += int((lengths == 0).sum())
    counts["weight_accepted"] += float(weights.astype(np.float64).sum())
    return Documents(
        input_ids=ids.astype(np.int32), weights=weights.astype(np.float32), offsets=offsets,
        lines=np.repeat(chats.lines, per_conversation), turns=turns.astype(np.int32),
    )  # fmt: skip


def _count_rows(rows: Rows, counts: Counter[str]) -> None:
    counts["rows"] += len(rows)
    counts["documents_written"] += int(rows.documents.sum())
    counts["tokens"] += int(rows.real_tokens.sum())
    counts["supervised_tokens"] += int((rows.labels != IGNORE_INDEX).sum())
    counts["total_weight"] += float(rows.weights.sum(dtype=np.float64))


class _Chats:
    """The chat stage of a build: a renderer made at the first conversation (a pieces-only build needs no template)."""

    def __init__(self, tokenizer: Any, cfg: BuildConfig, tokenize: PieceTokenizer) -> None:
        self.tokenizer, self.cfg, self.tokenize = tokenizer, cfg, tokenize
        self._renderer: ChatRenderer | None = None
        #: the conversations' role names, by turn code (``batches.turn_code``), for the writer's turns file
        self.roles: list[str] = []

    def __call__(self, records: Records, rejects: list[Reject]) -> Records:
        if records.chats is None:
            return records
        if self._renderer is None:
            tok = transformers_tokenizer(self.tokenizer)
            chosen = resolve_templates(tok, self.cfg.chat.template)
            weights, history = parse_role_weights(self.cfg.chat.role_weights), self.cfg.chat.history
            renderer = ChatRenderer(
                tok, chosen.template, weights, self.roles, self.tokenize, chosen.path, history=history,
                original=chosen.original, training=chosen.training,
            )  # fmt: skip
            renderer.check()
            self._renderer = renderer
        return render_chats(records, self._renderer, rejects)


def _parsed_blocks(
    split: InputSplit, record: InputFile, cfg: BuildConfig, chats: _Chats
) -> Iterator[tuple[Records, list[Reject], int]]:
    """Validated records (conversations rendered) and, when skipping, rejects of every block of ``split``, with the
    input bytes consumed so far. In strict mode the first bad line of the block, in input order, is raised."""
    skip = cfg.validate.on_invalid == "skip"
    columns = parse_columns(cfg.read.columns)
    window = {} if split.whole else {"start": split.start, "end": split.end}
    for block in read_blocks(record, cfg.read.block_bytes, cfg.read.max_line_bytes, columns, **window):
        rejects: list[Reject] = []
        records = chats(parse_block(block, rejects), rejects)
        if rejects:
            rejects.sort(key=lambda r: r.line)
            if not skip:
                raise rejects[0].error()
        yield records, rejects, record.size


class _Worker:
    """What one process keeps between the splits it runs: the tokenizer (loaded once), its special tokens,
    the piece tokenizer and the chat stage."""

    def __init__(self, tok: Any, cfg: BuildConfig, prefetch: FastokensPrefetch | None = None) -> None:
        self.tok = tok
        self.specials = special_tokens(tok, add_bos=_ADD_BOS[cfg.tokenizer.add_bos])
        self.notes: list[str] = []
        self.tokenize = PieceTokenizer(tok, cfg.tokenizer.batch_size, cfg.tokenizer.backend, self.notes.append, prefetched=prefetch)
        self.chats = _Chats(tok, cfg, self.tokenize)

    def close(self) -> None:
        self.tokenize.close()


_WORKERS: dict[str, _Worker] = {}  # per process, by SplitJob.tokenizer_key


def _located_error(exc: InputError | BackendMismatch) -> dict[str, Any]:
    """An error at a line of the split, as its result carries it (``run_splits`` raises it, renumbered)."""
    where = {"path": exc.path, "line": exc.line, "field": exc.field, "problem": exc.problem}
    if isinstance(exc, BackendMismatch):
        return {**where, "type": "backend_mismatch"}
    return {**where, "type": "input", "reason": exc.reason, "offset": exc.offset}


class SplitJob:
    """The per-split work of one build, as executors ship it to worker processes (picklable; a worker loads the
    tokenizer once, at its first split). ``job(split)`` returns the split's result (``weightprep.distribute.merge``):
    its counts, rejects, shards and input statistics, written under ``work_dir/NNNNN/`` and renamed there whole,
    so a retried or resumed split is either there complete or not at all. With ``first_pass`` it only returns the
    split's record count and smallest split keys (``--validation-records``).

    A bad line in strict mode is returned as the result's ``error`` (lines counted within the split), not raised:
    the driver reports the earliest one in input order."""

    RESULT = "result.json"

    def __init__(
        self, cfg: BuildConfig, tokenizer: Any, work_dir: Path, cut: int | None = None, *, first_pass: bool = False,
        threads: int | None = None,
    ) -> None:
        self.cfg, self.tokenizer, self.work_dir, self.cut, self.first_pass = cfg, tokenizer, work_dir, cut, first_pass
        self.threads = threads
        self.tokenizer_key = uuid.uuid4().hex  # its variants (with_options) share the worker state
        #: the driver's working directory: relative input paths are relative to it on every worker too
        self.cwd = os.getcwd()

    def with_options(self, **changes: Any) -> SplitJob:
        job = copy.copy(self)
        for k, v in changes.items():
            setattr(job, k, v)
        return job

    def worker(self) -> _Worker:
        """This process's worker state (made at the first split)."""
        state = _WORKERS.get(self.tokenizer_key)
        if state is None:
            if self.threads is not None:
                set_tokenizer_threads(self.threads)
            tok = self.tokenizer if self.tokenizer is not None else load_tokenizer(
                self.cfg.tokenizer.name, trust_remote_code=self.cfg.tokenizer.trust_remote_code, direct=True
            )
            state = _WORKERS[self.tokenizer_key] = _Worker(tok, self.cfg)
        return state

    def __call__(self, split: InputSplit, progress: ProgressFn | None = None) -> dict[str, Any]:
        if self.first_pass:
            return self._keys(split)
        final = self.work_dir / f"{split.index:05d}"
        if (final / self.RESULT).is_file():  # finished by an earlier attempt or build (--resume)
            return {**json.loads((final / self.RESULT).read_text()), "reused": True}
        tmp = self.work_dir / f"{split.index:05d}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        try:
            result = self._run(split, tmp, progress)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if result.get("error") is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            return result
        (tmp / self.RESULT).write_text(json.dumps(result, sort_keys=True))
        try:
            tmp.rename(final)
        except OSError:  # another attempt of this split finished first: its result is the same
            shutil.rmtree(tmp, ignore_errors=True)
        return result

    def _keys(self, split: InputSplit) -> dict[str, Any]:
        state, split_cfg = self.worker(), self.cfg.split
        record = InputFile(split.path)
        try:
            blocks = (records for records, _, _ in _parsed_blocks(split, record, self.cfg, state.chats))
            total, keys = smallest_keys(blocks, split_cfg.validation_records or 0, split_cfg.seed)
        except (InputError, BackendMismatch) as exc:
            return {"index": split.index, "error": _located_error(exc)}
        return {"index": split.index, "records": total, "keys": keys.tolist(), "input": {"lines": record.lines}}

    def _run(self, split: InputSplit, tmp: Path, progress: ProgressFn | None) -> dict[str, Any]:
        cfg, state = self.cfg, self.worker()
        seq_len, packed = cfg.pack.seq_len, cfg.pack.enabled
        names = (TRAIN, VALIDATION) if self.cut is not None else None
        packers = {name: Packer(seq_len, state.specials.pad, packed=packed, window=cfg.pack.window) for name in (names or (None,))}
        writer = ShardWriter(
            tmp, seq_len, packed=packed, max_shard_bytes=cfg.write.max_shard_bytes, splits=names, turn_roles=state.chats.roles
        )
        rejects = RejectsWriter(tmp) if cfg.validate.on_invalid == "skip" else None
        doc_counts = {name: Counter() for name in packers}  # updated by this thread only
        row_counts = {name: Counter() for name in packers}  # updated by the writer thread only

        def pack_and_write(item: tuple[str | None, Documents]) -> None:
            name, docs = item
            for rows in packers[name].add(docs):
                _count_rows(rows, row_counts[name])
                writer.write(rows, name)

        record = InputFile(split.path)
        sink: BackgroundSink[tuple[str | None, Documents]] = BackgroundSink(pack_and_write)
        parsed = background(_parsed_blocks(split, record, cfg, state.chats))
        try:
            accepted: Counter[str] = Counter()
            for records, block_rejects, consumed in parsed:
                if rejects is not None and block_rejects:
                    rejects.write(block_rejects)
                parts = {None: records} if self.cut is None else split_records(records, self.cut, cfg.split.seed)
                for name, part in parts.items():
                    docs, batch_counts = document_batch(part, state.tokenize, state.specials, cfg)
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
            written = writer.close()
            if rejects is not None:
                rejects.close()
        except BaseException as exc:
            parsed.close()  # stops and joins the read thread now, not when the traceback is collected
            sink.cancel()
            writer.abort()
            if rejects is not None:
                rejects.close()
            if isinstance(exc, (InputError, BackendMismatch)):
                return {"index": split.index, "error": _located_error(exc)}
            raise
        counts = {}
        for name in packers:
            merged = doc_counts[name].copy()
            merged.update(row_counts[name])
            counts[name or ""] = dict(merged)
        return {
            "index": split.index,
            "error": None,
            "counts": counts,
            "rejected": dict(rejects.counts) if rejects is not None else {},
            "rejects_file": REJECTS_NAME if rejects is not None and rejects.counts else None,
            "input": {"bytes": record.size, "lines": record.lines, "sha256": record.sha256},
            "written": written,
            "backend": state.tokenize.backend,
            "notes": list(dict.fromkeys(state.notes)),
        }


def build(
    inputs: list[str],
    out: str | Path,
    cfg: BuildConfig,
    *,
    tokenizer: Any = None,
    overwrite: bool = False,
    progress: ProgressFn | None = None,
    notify: Callable[[str], None] | None = None,
    executor: Executor | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Run the whole pipeline from JSONL ``inputs`` to shards at ``out``; return the manifest.

    The inputs are cut into splits (``weightprep.distribute.plan``, by ``read.split_bytes``); ``executor``
    (default: in this process) runs each split through the stages into its own shards, and the driver merges
    them in split order (``weightprep.distribute.merge``): the output does not depend on the executor or on how
    many workers it has. ``resume`` reuses the finished splits of a killed earlier build of the same plan.
    ``notify`` receives the notes worth telling the user (e.g. that fastokens could not run this tokenizer).

    Within a split three threads overlap: read+validate (background), tokenize+assemble+mask+filter,
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
    out_path = prepare_output(out, overwrite=overwrite, inputs=inputs, resume=resume)
    executor = executor if executor is not None else SerialExecutor()
    splits = plan_splits(inputs, cfg.read.split_bytes)
    in_process = executor.in_process(len(splits))
    prefetch = None
    if in_process and tokenizer is None and cfg.tokenizer.backend != "hf" and not cfg.tokenizer.trust_remote_code:
        tok_dir = Path(tokenizer_location(cfg.tokenizer.name))
        if (tok_dir / "tokenizer.json").is_file():  # fastokens loads while the tokenizer itself does
            prefetch = FastokensPrefetch(tok_dir / "tokenizer.json")
    tok = tokenizer if tokenizer is not None else load_tokenizer(
        cfg.tokenizer.name, trust_remote_code=cfg.tokenizer.trust_remote_code, direct=True
    )
    # the file fastokens read is what the tokenizer runs only where the build read it directly (TokenizerFiles)
    if prefetch is not None and not isinstance(tok, TokenizerFiles):
        prefetch.close()  # loaded through AutoTokenizer: the file need not be what runs, so it is not used
        prefetch = None
    summary = tokenizer_summary(tok)
    specials = special_tokens(tok, add_bos=_ADD_BOS[cfg.tokenizer.add_bos])
    output = Output(out_path, resume_key(cfg, inputs, summary, __version__), resume=resume)
    job = SplitJob(cfg, tokenizer, output.tmp.absolute() / "splits")  # workers load it themselves if None
    local: _Worker | None = None
    if in_process:  # this process is the worker: it keeps the tokenizer it loaded (and the early fastokens load)
        local = _WORKERS[job.tokenizer_key] = _Worker(tok, cfg, prefetch)
    try:
        cut = _validation_cut(cfg, splits, job, executor)
        job = job.with_options(cut=cut)
        results = run_splits(executor, job, splits, progress)
        for note in dict.fromkeys(n for r in results for n in r.get("notes", [])):
            if notify is not None:
                notify(note)
        merged = merge_results(
            splits, results, output.tmp, job.work_dir, names=(TRAIN, VALIDATION) if cut is not None else None,
            skip=cfg.validate.on_invalid == "skip",
        )
        seq_len, packed = cfg.pack.seq_len, cfg.pack.enabled
        per_split = {name: final_counts(c, Counter(), seq_len) for name, c in merged.counts.items() if name}
        counts = final_counts(merged.total, merged.rejected, seq_len)
        if counts["records"] == 0:
            raise UsageError(f"the input holds no records ({', '.join(inputs)}: empty or blank lines only)")
        check_accounting(counts)
        for split_counts in per_split.values():
            check_accounting(split_counts)
        backends = sorted({r["backend"] for r in results})
        if len(backends) > 1:
            raise UsageError(f"the workers tokenized with different backends ({', '.join(backends)}): pass --tokenizer-backend")
        manifest = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "weightprep_version": __version__,
            "config": config_to_dict(cfg),
            "tokenizer": {**summary, "bos_added": specials.bos is not None, "pad_used": specials.pad, "backend": backends[0]},
            "inputs": merged.inputs,
            "columns": list(PACKED_COLUMNS if packed else UNPACKED_COLUMNS),
            "rejects_file": REJECTS_NAME if cfg.validate.on_invalid == "skip" else None,
            "counts": counts,
            **({"splits": {name: {"counts": c} for name, c in per_split.items()}} if per_split else {}),
        }
        if counts["chat_documents"] or any(reason in CHAT_REASONS for reason in counts["rejected"]):
            turns = counts["chat_training_template_turns"]
            chat = manifest_chat(transformers_tokenizer(tok), cfg.chat.template, cfg.chat.history, turns)
            manifest["chat"] = chat
        return output.publish(
            merged.shards, manifest, seq_len=seq_len, packed=packed, turns=merged.turns, discard=job.work_dir
        )
    except Exception:
        output.abort()  # a failed build leaves nothing to resume: the input or the setup must change first
        raise
    finally:  # an interrupted build (Ctrl-C, a kill) leaves its finished splits for --resume
        if local is not None:
            local.close()
            _WORKERS.pop(job.tokenizer_key, None)


def _validation_cut(cfg: BuildConfig, splits: list[InputSplit], job: SplitJob, executor: Executor) -> int | None:
    """The key cut of the configured validation split (a first pass over the records for ``validation_records``)."""
    split = cfg.split
    if split.validation_fraction is not None:
        return fraction_cut(split.validation_fraction)
    if split.validation_records is not None:
        results = run_splits(executor, job.with_options(first_pass=True), splits, None)
        return cut_from_keys(
            sum(r["records"] for r in results), [k for r in results for k in r["keys"]], split.validation_records
        )
    return None


def resume_key(cfg: BuildConfig, inputs: list[str], tokenizer: dict[str, Any], version: str) -> str:
    """What a resumed build must share with the build it resumes: configuration, tokenizer, weightprep's
    version, and the inputs unchanged (path, size and modification time)."""
    stats = [[os.path.abspath(p), os.stat(p).st_size, os.stat(p).st_mtime_ns] for p in inputs]
    text = json.dumps(
        {"config": config_to_dict(cfg), "tokenizer": tokenizer.get("fingerprint"), "version": version, "inputs": stats},
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()
