"""The job of one input part: read, validate, [chat], [split], tokenize, ..., pack and write it, in a worker.

``PartJob`` is what executors (``weightprep.distribute.executors``) ship to their workers, once per build: it
streams the blocks of one part (``weightprep.distribute.plan``) through the per-block work
(``weightprep.blocks``), packs and writes that part's shards under the build's work directory, and returns its
counts for the driver's merge (``weightprep.distribute.merge``). Each worker process keeps its state (the
tokenizer, loaded once, and the chat stage) in a registry keyed by the job's ``worker_key``, shared by the job's
variants (``with_options``) and by ``KeyPass``, the key-only first pass of ``--validation-records``.

Within a part three threads overlap: read+validate (background), tokenize+assemble+mask+filter,
pack+write (background); see ``weightprep.overlap``. The rows do not depend on their timing.

A build with sources (``weightprep.sources``) runs ``MixedPart``s instead: their job is
``weightprep.distribute.mixed.run_mixed``, and ``EpochPass`` is the pass that finds each source's epoch cut.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import shutil
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weightprep import storage
from weightprep.batches import Documents, Rows
from weightprep.blocks import Chats, count_rows, document_batch, parsed_blocks
from weightprep.config import BuildConfig
from weightprep.distribute.mixed import mixed_keys, part_epoch_keys, run_mixed, segment_of
from weightprep.distribute.plan import InputPart, MixedPart
from weightprep.errors import BackendMismatch, InputError
from weightprep.heap import bound_heap
from weightprep.overlap import BackgroundSink, background
from weightprep.prefetch import FastokensPrefetch
from weightprep.stages.pack import Packer
from weightprep.stages.read import InputFile
from weightprep.stages.rejects import REJECTS_NAME, RejectsWriter
from weightprep.stages.split import TRAIN, VALIDATION, smallest_keys, split_records
from weightprep.stages.tokenize import PieceTokenizer
from weightprep.stages.write import ShardWriter
from weightprep.tokenizer import load_tokenizer, set_tokenizer_threads, special_tokens

__all__ = ["PartJob", "KeyPass", "EpochPass", "Warmup", "Worker", "ProgressFn", "ADD_BOS"]

#: Called after each block with (bytes of input consumed so far, counts so far: records ``accepted``, ``tokens``).
ProgressFn = Callable[[int, Counter], None]

#: ``tokenizer.add_bos`` as ``special_tokens`` takes it.
ADD_BOS = {"auto": None, "always": True, "never": False}


class Worker:
    """What one process keeps between the parts it runs: the tokenizer (loaded once), its special tokens,
    the piece tokenizer and the chat stage."""

    def __init__(self, tok: Any, cfg: BuildConfig, prefetch: FastokensPrefetch | None = None) -> None:
        bound_heap()
        self.tok = tok
        self.specials = special_tokens(tok, add_bos=ADD_BOS[cfg.tokenizer.add_bos])
        self.notes: list[str] = []
        self.tokenize = PieceTokenizer(tok, cfg.tokenizer.batch_size, cfg.tokenizer.backend, self.notes.append, prefetched=prefetch)
        self.chats = Chats(tok, cfg, self.tokenize)
        #: role names of every chat stage's turn codes (the plain one's and each source's share one list)
        self.roles = self.chats.roles
        self._source_chats: list[Chats] | None = None
        # what is alive now (the modules, torch's among them, and the tokenizer) leaves the collector's generations
        # until close: each full collection during the parts scans only what they allocate (the dicts of parsed
        # conversations set them off; scanning the imports cost ~1 s of 20,000 conversations)
        gc.freeze()

    def source_chats(self, cfgs: list[BuildConfig], sources: list[Any]) -> list[Chats]:
        """The chat stage of each source (``weightprep.distribute.mixed``): its role weights, its weight."""
        if self._source_chats is None:
            self._source_chats = [
                Chats(self.tok, c, self.tokenize, roles=self.roles, scale=s.weight) for c, s in zip(cfgs, sources, strict=True)
            ]
        return self._source_chats

    def close(self) -> None:
        self.tokenize.close()
        gc.unfreeze()


_WORKERS: dict[str, Worker] = {}  # per process, by PartJob.worker_key


@dataclass(frozen=True)
class Warmup:
    """What a worker process does before the build's job reaches it (``Executor.warm``): load the tokenizer of
    ``cfg`` and make its state, under the ``key`` that the build's job will have (``PartJob(worker_key=...)``), so
    that its first part finds it. A load that fails here leaves no state: the part loads again, and reports why."""

    cfg: BuildConfig
    key: str

    def __call__(self, threads: int | None) -> None:
        if threads is not None:
            set_tokenizer_threads(threads)
        try:
            tok = load_tokenizer(self.cfg.tokenizer.name, trust_remote_code=self.cfg.tokenizer.trust_remote_code, direct=True)
            _WORKERS[self.key] = Worker(tok, self.cfg)
        except Exception:  # noqa: BLE001 (the same load, made by the part, raises it where it is reported)
            _WORKERS.pop(self.key, None)


def _located_error(exc: InputError | BackendMismatch) -> dict[str, Any]:
    """An error at a line of the part, as its result carries it (``run_parts`` raises it, renumbered)."""
    where = {"path": exc.path, "line": exc.line, "field": exc.field, "problem": exc.problem}
    if isinstance(exc, BackendMismatch):
        return {**where, "type": "backend_mismatch"}
    return {**where, "type": "input", "reason": exc.reason, "offset": exc.offset}


class PartJob:
    """The per-part work of one build, as executors ship it to worker processes (picklable; a worker loads the
    tokenizer once, at its first part). ``job(part)`` returns the part's result (``weightprep.distribute.merge``):
    its counts, rejects, shards and input statistics, written under ``work_dir/NNNNN/`` and renamed there whole,
    so a retried or resumed part is either there complete or not at all. The first pass of ``--validation-records``
    is another task on the same workers (``KeyPass``).

    A bad line in strict mode is returned as the result's ``error`` (lines counted within the part), not raised:
    the driver reports the earliest one in input order."""

    RESULT = "result.json"

    def __init__(
        self, cfg: BuildConfig, tokenizer: Any, work_dir: Path | str, cut: Any = None, *,
        threads: int | None = None, storage_options: dict[str, Any] | None = None, sources: list[Any] | None = None,
        known: dict[str, dict[str, Any]] | None = None, worker_key: str | None = None,
    ) -> None:
        self.cfg, self.tokenizer, self.work_dir, self.cut, self.threads = cfg, tokenizer, work_dir, cut, threads
        #: the build's storage options (its session's: build(storage_options=...) or --storage-options), which the
        #: workers' reads and writes of URLs use too
        self.storage_options = storage_options if storage_options is not None else storage.current_options()
        #: the build's sources (``weightprep.sources``; its parts are then ``MixedPart``s and ``cut`` one per source)
        self.sources = sources
        #: per source, the epoch cut of its fractional epochs (None: whole epochs; ``EpochPass``)
        self.epoch_cuts: list[int | None] | None = None
        #: the driver's metadata of the input objects (their listing's): a worker opens them without asking again
        self.known = known or {}
        #: its variants (with_options) share the worker state; a ``Warmup``'s key where one made it
        self.worker_key = worker_key if worker_key is not None else uuid.uuid4().hex
        #: the driver's working directory: relative input paths are relative to it on every worker too
        self.cwd = os.getcwd()

    def with_options(self, **changes: Any) -> PartJob:
        job = copy.copy(self)
        for k, v in changes.items():
            setattr(job, k, v)
        return job

    def worker(self) -> Worker:
        """This process's worker state (made at the first part)."""
        state = _WORKERS.get(self.worker_key)
        if state is None:
            if self.threads is not None:
                set_tokenizer_threads(self.threads)
            tok = self.tokenizer if self.tokenizer is not None else load_tokenizer(
                self.cfg.tokenizer.name, trust_remote_code=self.cfg.tokenizer.trust_remote_code, direct=True
            )
            state = _WORKERS[self.worker_key] = Worker(tok, self.cfg)
        return state

    def adopt(self, tok: Any, prefetch: FastokensPrefetch | None = None) -> None:
        """Make the driver's process a worker of this job with the tokenizer it loaded (its parts run here)."""
        _WORKERS[self.worker_key] = Worker(tok, self.cfg, prefetch)

    def release(self) -> None:
        """Close and forget this process's worker state of the job (the driver's, at the end of its build)."""
        state = _WORKERS.pop(self.worker_key, None)
        if state is not None:
            state.close()

    def __call__(self, part: InputPart | MixedPart, progress: ProgressFn | None = None) -> dict[str, Any]:
        # a session, not configure(): run in the driver's process (serial), the part leaves its options as they were
        with storage.session(self.storage_options, self.known):
            return self._call(part, progress)

    def _call(self, part: InputPart | MixedPart, progress: ProgressFn | None) -> dict[str, Any]:
        if storage.is_url(self.work_dir):
            return self._call_store(part, progress)
        final = self.work_dir / f"{part.index:05d}"
        if (final / self.RESULT).is_file():  # finished by an earlier attempt or build (--resume)
            return {**json.loads((final / self.RESULT).read_text()), "reused": True}
        tmp = self.work_dir / f"{part.index:05d}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        # not parents=True: a worker still running after its build removed its directory must not create it again
        tmp.mkdir()
        try:
            result = self._run(part, tmp, progress)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if result.get("error") is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            return result
        (tmp / self.RESULT).write_text(json.dumps(result, sort_keys=True))
        try:
            tmp.rename(final)
        except OSError:  # another attempt of this part finished first: its result is the same
            shutil.rmtree(tmp, ignore_errors=True)
        return result

    def _call_store(self, part: InputPart | MixedPart, progress: ProgressFn | None) -> dict[str, Any]:
        """A part of a build whose work directory is a prefix in an object store (no shared disk): run into a local
        scratch directory, uploaded with its ``result.json`` last (``weightprep.stages.publish``)."""
        from weightprep.stages.publish import read_result, upload_part

        final = storage.join(self.work_dir, f"{part.index:05d}")
        done = read_result(final)
        if done is not None:  # finished by an earlier attempt or build (--resume)
            return {**done, "reused": True}
        scratch = Path(tempfile.mkdtemp(prefix=f"weightprep-part-{part.index:05d}-"))
        try:
            result = self._run(part, scratch, progress)
            if result.get("error") is None:
                (scratch / self.RESULT).write_text(json.dumps(result, sort_keys=True))
                upload_part(scratch, final)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return result

    def discard_unfinished(self) -> None:
        """Remove what parts that did not finish left in ``work_dir`` (their workers were killed); the finished
        ones stay, for ``--resume``. (In a store, an unfinished part's objects are overwritten by its next run.)"""
        if storage.is_url(self.work_dir):
            return
        for partial in self.work_dir.glob("*.tmp-*"):
            shutil.rmtree(partial, ignore_errors=True)

    def _run(self, part: InputPart | MixedPart, tmp: Path, progress: ProgressFn | None) -> dict[str, Any]:
        if isinstance(part, MixedPart):
            try:
                return run_mixed(self, part, tmp, progress)
            except (InputError, BackendMismatch) as exc:
                return {"index": part.index, "error": {**_located_error(exc), "segment": segment_of(part, exc.path)}}
        cfg, state = self.cfg, self.worker()
        seq_len, packed = cfg.pack.seq_len, cfg.pack.enabled
        names = (TRAIN, VALIDATION) if self.cut is not None else None
        # each split's rows in arrays reused from chunk to chunk: three sets in turn, a chunk made while the one
        # before waits for the writer's thread (a queue of one) and the one before that is written
        packers = {
            name: Packer(seq_len, state.specials.pad, packed=packed, window=cfg.pack.window, reuse=3)
            for name in (names or (None,))
        }
        writer = ShardWriter(
            tmp, seq_len, packed=packed, max_shard_bytes=cfg.write.max_shard_bytes, splits=names, turn_roles=state.chats.roles
        )
        rejects = RejectsWriter(tmp) if cfg.validate.on_invalid == "skip" else None
        doc_counts = {name: Counter() for name in packers}  # updated by this thread only
        row_counts = {name: Counter() for name in packers}  # updated by the writer thread only

        def write(item: tuple[Rows, str | None]) -> None:
            rows, name = item
            count_rows(rows, row_counts[name])
            writer.write(rows, name)

        # a chunk of rows is written (its own thread: the IPC write holds no lock) while the next is made, after
        # the last block too, where one window's rows are made and written with nothing else left to do
        writing: BackgroundSink[tuple[Rows, str | None]] = BackgroundSink(write, depth=1)

        def pack_and_write(item: tuple[str | None, Documents]) -> None:
            name, docs = item
            for rows in packers[name].add(docs):
                writing.put((rows, name))

        record = InputFile(part.path)
        sink: BackgroundSink[tuple[str | None, Documents]] = BackgroundSink(pack_and_write)
        parsed = background(parsed_blocks(part, record, cfg, state.chats))
        try:
            accepted: Counter[str] = Counter()
            for records, block_rejects, consumed in parsed:
                if rejects is not None and block_rejects:
                    rejects.write(block_rejects)
                subsets = {None: records} if self.cut is None else split_records(records, self.cut, cfg.split.seed)
                for name, subset in subsets.items():
                    # rows get their labels from ids and weights (``rows_from_bins``): none are made for the queue
                    docs, batch_counts = document_batch(subset, state.tokenize, state.specials, cfg, labels=False)
                    doc_counts[name].update(batch_counts)
                    accepted["tokens"] += batch_counts["tokens_accepted"]
                    sink.put((name, docs))
                accepted["accepted"] += len(records)
                if progress is not None:
                    progress(consumed, accepted)
            sink.close()
            for name, packer in packers.items():
                for rows in packer.flush():
                    writing.put((rows, name))
            writing.close()
            written = writer.close()
            if rejects is not None:
                rejects.close()
        except BaseException as exc:
            parsed.close()  # stops and joins the read thread now, not when the traceback is collected
            sink.cancel()
            writing.cancel()
            writer.abort()
            if rejects is not None:
                rejects.close()
            if isinstance(exc, (InputError, BackendMismatch)):
                return {"index": part.index, "error": _located_error(exc)}
            raise
        counts = {}
        for name in packers:
            merged = doc_counts[name].copy()
            merged.update(row_counts[name])
            counts[name or ""] = dict(merged)
        return {
            "index": part.index,
            "error": None,
            "counts": counts,
            "rejected": dict(rejects.counts) if rejects is not None else {},
            "rejects_file": REJECTS_NAME if rejects is not None and rejects.counts else None,
            "input": {"bytes": record.size, "lines": record.lines, "sha256": record.sha256},
            "written": written,
            "backend": state.tokenize.backend,
            "chat_template": state.chats.template_sha256,
            "notes": list(dict.fromkeys(state.notes)),
        }


@dataclass(frozen=True)
class KeyPass:
    """The first pass of ``--validation-records``, a task run on the build's workers (``Executor.map(task=...)``):
    ``KeyPass()(job, part)`` returns the part's record count and smallest split keys. The keys need no tokenizer
    and no conversation rendered, so none is (``render`` renders them anyway, to find a conversation the template
    refuses). A bad line is returned as the result's ``error``, as ``PartJob`` returns it."""

    render: bool = False

    def __call__(self, job: PartJob, part: InputPart | MixedPart) -> dict[str, Any]:
        with storage.session(job.storage_options, job.known):
            if isinstance(part, MixedPart):
                try:
                    return mixed_keys(job, part, self.render)
                except (InputError, BackendMismatch) as exc:
                    error = {**_located_error(exc), "segment": segment_of(part, exc.path)}
                    return {"index": part.index, "error": error}
            return self._keys(job, part)

    def _keys(self, job: PartJob, part: InputPart) -> dict[str, Any]:
        split_cfg = job.cfg.split
        chats = job.worker().chats if self.render else None
        record = InputFile(part.path)
        try:
            blocks = (records for records, _, _ in parsed_blocks(part, record, job.cfg, chats))
            total, keys = smallest_keys(blocks, split_cfg.validation_records or 0, split_cfg.seed)
        except (InputError, BackendMismatch) as exc:
            return {"index": part.index, "error": _located_error(exc)}
        return {"index": part.index, "records": total, "keys": keys.tolist(), "input": {"lines": record.lines}}


@dataclass(frozen=True)
class EpochPass:
    """The pass of a build with sources of fractional epochs, run before the build's (``Executor.map(task=...)``):
    ``EpochPass(cut, n)(job, part)`` returns, per source, the part's count of training records and its smallest
    epoch keys (``weightprep.distribute.mixed.part_epoch_keys``); a bad line as the result's ``error``."""

    cut: Any = None
    n: Any = None

    def __call__(self, job: PartJob, part: MixedPart) -> dict[str, Any]:
        with storage.session(job.storage_options, job.known):
            try:
                return part_epoch_keys(job, part, self.cut, self.n)
            except (InputError, BackendMismatch) as exc:
                return {"index": part.index, "error": {**_located_error(exc), "segment": segment_of(part, exc.path)}}
