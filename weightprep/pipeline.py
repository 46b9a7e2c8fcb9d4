"""The build's driver: plans the input parts, runs their jobs on an executor, merges them and publishes.

    plan parts -> per part: read -> validate -> [chat] -> [split] -> tokenize -> assemble -> mask -> filter
                   -> pack -> write  ->  merge (driver) -> publish

``build`` cuts the inputs into parts (``weightprep.distribute.plan``); an executor
(``weightprep.distribute.executors``) runs the job of each part (``weightprep.distribute.job.PartJob``, which
chains the per-block work of ``weightprep.blocks``) here, in worker processes or on Ray, and ``build`` merges their
results in part order (``weightprep.distribute.merge``) and returns the manifest. With ``--validation-records``
a first pass over the parts finds the validation cut (``_validation_cut``); ``resume_key`` is what a
``--resume``d build must share with the build it resumes.
Invalid lines stop the build (``validate.on_invalid: error``, the default)
or go to rejects.jsonl (``skip``). Before publishing, the counts must satisfy the accounting
identity (``weightprep.accounting``). With sources (``weightprep.sources``) the parts are mixed parts
(``plan.plan_mixed``, ``distribute.mixed``), fractional epochs add a pass (``_epoch_cuts``), each source's held-out
records are its own split and the identity is checked per source too (``sources.manifest_sources``). With a validation split (``weightprep.stages.split``) each split is
tokenized, packed and written on its own and the identity holds per split and in total. On any error the partial
output is removed and the error re-raised; the output path is left as it was. An interrupted build (Ctrl-C,
SIGKILL) leaves its finished parts in its temporary directory for ``--resume``; on Ctrl-C it raises
``BuildInterrupted``, which says how many and where. A later build given neither ``--resume`` nor ``--overwrite``
that finds them stops before any work (``LeftoverParts``): a plain rerun never throws finished parts away.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import shutil
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from weightprep import prefetch as early
from weightprep import storage
from weightprep.accounting import check_accounting, final_counts
from weightprep.config import BuildConfig, config_to_dict
from weightprep.constants import FORMAT_NAME, FORMAT_VERSION, PACKED_COLUMNS, UNPACKED_COLUMNS
from weightprep.distribute.executors import Executor, SerialExecutor, run_parts
from weightprep.distribute.job import ADD_BOS, EpochPass, KeyPass, PartJob, ProgressFn, Warmup
from weightprep.distribute.merge import merge_results
from weightprep.distribute.mixed import epoch_cuts_from, split_names
from weightprep.distribute.plan import InputPart, MixedPart, plan_mixed, plan_parts
from weightprep.errors import CUT_MISSED, BuildInterrupted, InputError, LeftoverParts, UsageError
from weightprep.sources import Source, check_source_names, manifest_sources
from weightprep.stages.chat_common import CHAT_REASONS
from weightprep.stages.chat_templates import TRAINING, manifest_chat, tokenizer_template
from weightprep.stages.columns import parse_columns
from weightprep.stages.publish import interrupted_builds, open_output, prepare_output
from weightprep.stages.read import check_inputs, expand_inputs
from weightprep.stages.rejects import REJECTS_NAME
from weightprep.stages.split import TRAIN, VALIDATION, cut_from_keys, fraction_cut
from weightprep.tokenizer import (
    TokenizerFiles,
    chat_tokenizer,
    load_tokenizer,
    special_tokens,
    tokenizer_location,
    tokenizer_summary,
)
from weightprep.weights import is_valid_weight

__all__ = ["build", "resume_key", "source_files"]


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
    sources: list[Source] | None = None,
    storage_options: dict[str, Any] | str | None = None,
    steps: Callable[[str], AbstractContextManager[None]] | None = None,
) -> dict[str, Any]:
    """Run the whole pipeline from JSONL ``inputs`` to shards at ``out``; return the manifest.

    ``sources`` (``weightprep.sources``; ``inputs`` then empty): several named sources, each with a weight and a
    number of epochs, mixed into one build (``plan.plan_mixed``, ``weightprep.distribute.mixed``), with a
    ``validation_NAME`` split per source and the manifest's ``sources`` numbers.

    The inputs are cut into parts (``weightprep.distribute.plan``, by ``read.part_bytes``); ``executor``
    (default: in this process) runs each part through the stages into its own shards, and the driver merges
    them in part order (``weightprep.distribute.merge``): the output does not depend on the executor or on how
    many workers it has. ``resume`` reuses the finished parts of a killed earlier build of the same plan.
    ``notify`` receives the notes worth telling the user (e.g. that fastokens could not run this tokenizer);
    ``steps(what)``, a context manager around each step before and after the parts' work (loading the tokenizer,
    a first pass over the records, merging, publishing), e.g. ``weightprep.progress.Steps``.

    Within a part three threads overlap: read+validate (background), tokenize+assemble+mask+filter,
    pack+write (background); see ``weightprep.overlap``. The rows do not depend on their timing.

    ``storage_options`` (a dict, or its JSON text) are the fsspec options of the URLs among ``inputs`` and ``out``
    (``weightprep.storage.session``: ``{"endpoint_url": ...}``, or per protocol ``{"s3": {...}}``), for this call
    only, its workers included; None: the process's (``storage.configure``, the command line's
    ``--storage-options``). Within the call each input object's listing or lookup is made once.
    """
    options = dict(tokenizer=tokenizer, overwrite=overwrite, progress=progress, notify=notify, executor=executor,
                   resume=resume, sources=sources, step=steps if steps is not None else lambda what: contextlib.nullcontext())
    with storage.session(storage_options):
        try:
            return _build(inputs, out, cfg, exact=False, **options)
        except InputError as exc:
            if exc.reason != CUT_MISSED:
                raise
            # a JSON array laid out otherwise than its head (plan_array.guessed_cuts): nothing was published
            _note(notify, f"{exc.path}: its records are not laid out throughout as in its first ones; planning its "
                          "parts exactly (a pass over the file) and building again")  # fmt: skip
            return _build(inputs, out, cfg, exact=True, **options)


@contextlib.contextmanager
def _closed_on_error(executor: Executor) -> Iterator[None]:
    """Close ``executor`` (the workers that ``warm`` started) where the step inside fails before it is started."""
    try:
        yield
    except BaseException:
        executor.close()
        raise


def _build(
    inputs: list[str],
    out: str | Path,
    cfg: BuildConfig,
    *,
    tokenizer: Any,
    overwrite: bool,
    progress: ProgressFn | None,
    notify: Callable[[str], None] | None,
    executor: Executor | None,
    resume: bool,
    sources: list[Source] | None,
    step: Callable[[str], AbstractContextManager[None]],
    exact: bool,
) -> dict[str, Any]:
    if sources is not None:
        if inputs:
            raise UsageError("give the inputs as sources (--source NAME=PATH) or as INPUTS, not both")
        by_source = source_files(sources, cfg)
        inputs = [p for files in by_source for p in files]
    else:
        inputs = expand_inputs(inputs)
        _check_files(inputs, cfg.read.columns)
    out_path = prepare_output(out, overwrite=overwrite, inputs=inputs, resume=resume)
    leftovers = _leftover_parts(out_path, overwrite=overwrite, resume=resume)
    executor = executor if executor is not None else SerialExecutor()
    by = cfg.read.text_sample_by
    if sources is None:  # the fields of a file's first record tell a file of conversations (--columns names them)
        parts: list[Any] = plan_parts(inputs, cfg.read.part_bytes, by, exact=exact, columns=parse_columns(cfg.read.columns))
    else:
        names = [parse_columns(s.columns if s.columns is not None else cfg.read.columns) for s in sources]
        parts = plan_mixed(by_source, cfg.read.part_bytes, by, exact=exact, columns=names)
    in_process = executor.in_process(len(parts))
    here = executor.in_driver(len(parts))  # this process runs parts too (all of them where in_process)
    prefetch = None
    if tokenizer is None:
        tok_file = Path(tokenizer_location(cfg.tokenizer.name)) / "tokenizer.json"
        started = early.take(tok_file)  # the command line's, begun before the build's imports
        if here and cfg.tokenizer.backend != "hf" and not cfg.tokenizer.trust_remote_code:
            if started is None and early.runs_as_is(tok_file):  # fastokens loads while the tokenizer itself does
                started = early.FastokensPrefetch(tok_file)
            prefetch = started  # else the workers load their own, and a load begun here ends unused
    from weightprep import __version__  # read at each build (a test sets another)

    warmup = None
    if tokenizer is None and not in_process:  # the workers start loading the tokenizer while this process does
        warmup = Warmup(cfg, uuid.uuid4().hex)
        executor.warm(warmup, len(parts))
    with _closed_on_error(executor):  # the workers that warm started, where the build ends before it starts them
        with step(f"loading the tokenizer {cfg.tokenizer.name or ''}".rstrip()):
            tok = tokenizer if tokenizer is not None else load_tokenizer(
                cfg.tokenizer.name, trust_remote_code=cfg.tokenizer.trust_remote_code, direct=True
            )
        # the file fastokens read is what the tokenizer runs only where the build read that file (TokenizerFiles;
        # not a snapshot of what transformers built, weightprep.tokenizer_snapshot)
        if prefetch is not None and not (isinstance(tok, TokenizerFiles) and tok.file == tok_file):
            prefetch.close()  # loaded through AutoTokenizer: the file need not be what runs, so it is not used
            prefetch = None
        summary = tokenizer_summary(tok)
        specials = special_tokens(tok, add_bos=ADD_BOS[cfg.tokenizer.add_bos])
        # the output's work directory: here, once (a part makes only its own directory in it); a prefix in a store for
        # a URL --out, which every worker writes its parts to (weightprep.stages.publish)
        with step("opening the output"):
            key = resume_key(cfg, inputs, tok, summary, __version__, sources, parts)
            output = open_output(out_path, key, resume=resume)
        if resume:
            _note(notify, _resume_note(_finished_parts(output.work_dir), len(parts), leftovers))
        # workers load the tokenizer themselves if None; they open the input objects with the metadata listed here
        job = PartJob(cfg, tokenizer, output.work_dir, sources=sources, known=storage.known_metadata(inputs),
                      worker_key=warmup.key if warmup is not None else None)
    if here:  # this process is a worker: it keeps the tokenizer it loaded (and the early fastokens load)
        job.adopt(tok, prefetch)
    try:
        with executor.start(job, len(parts)):  # one pool (or Ray cluster) for both passes
            with step("a first pass over the records (the validation split, fractional epochs)"):
                cut = _validation_cut(cfg, parts, executor, sources)
                epochs = {"epoch_cuts": _epoch_cuts(sources, parts, executor, cut)} if sources is not None else {}
            results = run_parts(executor, parts, progress, cut=cut, **epochs)
        for note in dict.fromkeys(n for r in results for n in r.get("notes", [])):
            if notify is not None:
                notify(note)
        if sources is not None:
            names = split_names(sources, cut is not None)
        else:
            names = (TRAIN, VALIDATION) if cut is not None else None
        with step("merging the parts"):
            merged = merge_results(
                parts, results, output.tmp, job.work_dir, names=names, skip=cfg.validate.on_invalid == "skip",
            )
        seq_len, packed = cfg.pack.seq_len, cfg.pack.enabled
        repeats = sources is not None
        per_split = {name: final_counts(c, Counter(), seq_len, repeats=repeats) for name, c in merged.counts.items() if name}
        counts = final_counts(merged.total, merged.rejected, seq_len, repeats=repeats)
        if counts["records"] == 0:
            raise UsageError(f"the input holds no records ({', '.join(inputs)}: empty or blank lines only)")
        check_accounting(counts)
        for split_counts in per_split.values():
            check_accounting(split_counts)
        backends = sorted({r["backend"] for r in results})
        if len(backends) > 1:
            raise UsageError(f"the workers tokenized with different backends ({', '.join(backends)}): pass --tokenizer-backend")
        templates = sorted({r["chat_template"] for r in results if r.get("chat_template")})
        if len(templates) > 1:  # the resume key covers the template: only a file changed during the build does this
            raise UsageError("the chat template changed while the build ran (its parts were rendered with different "
                             "texts): build again")
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
        if sources is not None:
            manifest["sources"] = manifest_sources(sources, by_source, results, merged.counts)
        if counts["chat_documents"] or any(reason in CHAT_REASONS for reason in counts["rejected"]):
            turns = counts["chat_training_template_turns"]
            manifest["chat"] = manifest_chat(
                chat_tokenizer(tok), cfg.chat.template, cfg.chat.history, turns,
                counts["chat_history_conversations"],
            )  # fmt: skip
        with step(f"publishing {out}"):
            return output.publish(
                merged.shards, manifest, seq_len=seq_len, packed=packed, turns=merged.turns, discard=job.work_dir
            )
    except Exception:
        output.abort()  # a failed build leaves nothing to resume: the input or the setup must change first
        raise
    except KeyboardInterrupt as exc:  # Ctrl-C: its finished parts stay for --resume, the killed ones' partial ones not
        job.discard_unfinished()
        finished = _finished_parts(output.work_dir)
        if not finished:  # nothing to resume: leave nothing behind
            output.abort()
            raise
        kept = str(output.work_dir).rsplit("/", 1)[0]  # the build's directory (prefix), whose parts/ they are
        raise BuildInterrupted(str(out), kept, finished, len(parts)) from exc
    except BaseException:  # killed otherwise: as Ctrl-C, without a word
        job.discard_unfinished()
        raise
    finally:
        if here:
            job.release()


def _note(notify: Callable[[str], None] | None, message: str) -> None:
    if notify is not None:
        notify(message)


#: A finished part's directory name (``PartJob``: ``NNNNN``, holding its ``result.json``).
_PART = re.compile(r"^\d{5}$")


def _finished_parts(work_dir: str | Path) -> int:
    """How many parts in a build's work directory (a local one, or a prefix in a store) have finished: their
    ``NNNNN/result.json`` exists (``PartJob`` writes it last, in a part's temporary directory renamed into place)."""
    if storage.is_url(work_dir):  # one listing, matched by name: the output's name is never a pattern
        rels = (url[len(str(work_dir)) + 1 :].split("/") for url in storage.find(str(work_dir)))
        return sum(1 for rel in rels if len(rel) == 2 and _PART.match(rel[0]) and rel[1] == PartJob.RESULT)
    directory = Path(work_dir)
    if not directory.is_dir():
        return 0
    return sum(1 for p in directory.iterdir() if _PART.match(p.name) and (p / PartJob.RESULT).is_file())


def _leftover_parts(out: str | Path, *, overwrite: bool, resume: bool) -> list[str]:
    """The interrupted builds to ``out`` that hold finished parts. Without ``--resume`` or ``--overwrite``, finding
    one is an error (``LeftoverParts``): the user chooses; one without a finished part is of no use and removed."""
    found = []
    for kept in map(str, interrupted_builds(out)):
        finished = _finished_parts(storage.join(kept, "parts"))
        if finished:
            found.append(kept)
            if not resume and not overwrite:
                raise LeftoverParts(str(out), kept, finished)
        elif not resume and not overwrite:
            storage.remove_tree(kept) if storage.is_url(kept) else shutil.rmtree(kept, ignore_errors=True)
    return found


def _resume_note(reused: int, total: int, leftovers: list[str]) -> str:
    """What ``--resume`` found: the parts it reuses and those left, or why it reuses none."""
    if reused:
        return f"--resume: {reused} of {total} part(s) finished by the interrupted build are reused; {total - reused} left to build"
    if leftovers:
        return (f"--resume: the interrupted build's parts ({', '.join(leftovers)}) were made from other inputs, "
                f"configuration or tokenizer: discarded; building all {total} part(s)")
    return f"--resume: no interrupted build of this output was found: building all {total} part(s)"


def _check_files(files: list[str], columns: str | None) -> None:
    """The inputs' checks before any work (``check_inputs``: a Parquet/Arrow file's columns as ``columns`` renames
    them)."""
    check_inputs(files, parse_columns(columns).records)


def source_files(sources: list[Source], cfg: BuildConfig) -> list[list[str]]:
    """Each source's files, checked before any work; a file in two sources is an error (read twice)."""
    if not sources:
        raise UsageError("no source given")
    check_source_names(sources)
    files = []
    for source in sources:
        if not is_valid_weight(source.weight * cfg.assemble.eos_weight):
            raise UsageError(
                f"source {source.name}: its weight {source.weight} times the EOS weight {cfg.assemble.eos_weight} is "
                "beyond float32's largest (the shards store weights as float32): lower one of them"
            )
        try:
            paths = expand_inputs(source.paths)
            columns = source.columns if source.columns is not None else cfg.read.columns
            _check_files(paths, columns)
        except UsageError as exc:
            raise UsageError(f"source {source.name}: {exc}") from None
        files.append(paths)
    expand_inputs([p for paths in files for p in paths])  # the same file in two sources
    return files


def _validation_cut(
    cfg: BuildConfig, parts: list[Any], executor: Executor, sources: list[Source] | None = None
) -> Any:
    """The key cut of the configured validation split (a first pass over the records for ``validation_records``);
    with sources, one per source (``N`` records held out of each)."""
    split = cfg.split
    if split.validation_fraction is not None:
        cut = fraction_cut(split.validation_fraction)
        return cut if sources is None else tuple(cut for _ in sources)
    if split.validation_records is None:
        return None
    try:
        results = run_parts(executor, parts, None, task=KeyPass())
    except InputError as exc:
        if cfg.validate.on_invalid == "error" and exc.reason != CUT_MISSED:
            # the first pass renders no conversation: one that the template refuses, on an earlier line, is found by
            # a pass that renders them (it raises the earliest bad line; parts after it are not run to their end)
            run_parts(executor, parts, None, task=KeyPass(render=True))
        raise
    if sources is not None:
        cuts = []
        for i, source in enumerate(sources):
            try:
                cuts.append(cut_from_keys(
                    sum(r["records"][i] for r in results), [k for r in results for k in r["keys"][i]],
                    split.validation_records,
                ))  # fmt: skip
            except UsageError as exc:
                raise UsageError(f"source {source.name}: {exc} (N records are held out of each source)") from None
        return tuple(cuts)
    return cut_from_keys(
        sum(r["records"] for r in results), [k for r in results for k in r["keys"]], split.validation_records
    )


def _epoch_cuts(sources: list[Source], parts: list[Any], executor: Executor, cut: Any) -> list[int | None] | None:
    """Each source's epoch cut (``distribute.mixed.epoch_cuts_from``): a pass over the parts where a source has
    fractional epochs, and a second, exact one for a source whose parts kept too few keys in the first."""
    if all(float(s.epochs).is_integer() for s in sources):
        return None
    first = run_parts(executor, parts, None, task=EpochPass(cut))
    cuts, again = epoch_cuts_from(sources, first)
    if again:  # each part's smallest round(f * N) keys: enough whatever their spread
        n = [math.floor((src.epochs % 1) * sum(r["records"][s] for r in first) + 0.5) if s in again else 0
             for s, src in enumerate(sources)]  # fmt: skip
        exact, _ = epoch_cuts_from(sources, run_parts(executor, parts, None, task=EpochPass(cut, n)))
        cuts = [exact[s] if s in again else c for s, c in enumerate(cuts)]
    return cuts


#: The files of a tokenizer directory that decide its ids or its chat template (``resume_key``).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                    "chat_template.json")


def _trl_version() -> str | None:
    try:
        import trl
    except ImportError:
        return None
    return str(trl.__version__)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()  # small files (hashlib.file_digest needs Python 3.11)


def resume_key(
    cfg: BuildConfig, inputs: list[str], tok: Any, summary: dict[str, Any], version: str,
    sources: list[Source] | None = None,
    parts: Sequence[InputPart | MixedPart] = (),
) -> str:
    """What a resumed build must share with the build it resumes, all that decides the bytes of a part: the
    configuration, the chat template's text (the ``chat.template`` file's, else the tokenizer's own), the tokenizer
    (its fingerprint, and the bytes of the files of its directory that decide its ids or its template),
    weightprep's version, the inputs unchanged (path, size and modification time, or an object's version: they
    are not read again), and the plan's ranges (a plan guessed from a JSON array's layout and the exact one
    differ where the guess missed)."""
    stats = [storage.stat_key(p) for p in inputs]
    directory = Path(str(tok.name_or_path))
    files = {name: _sha256(directory / name) for name in _TOKENIZER_FILES if (directory / name).is_file()}
    if cfg.chat.template and cfg.chat.template != TRAINING:
        template = _sha256(Path(cfg.chat.template))
    else:  # the tokenizer's own, or TRL's training template for it (which TRL's version decides)
        template = json.dumps([tokenizer_template(tok), _trl_version() if cfg.chat.template == TRAINING else None])
    text = json.dumps(
        {
            "config": config_to_dict(cfg),
            "chat_template": template,
            "tokenizer": summary.get("fingerprint"),
            "tokenizer_files": files,
            "version": version,
            "inputs": stats,
            "plan": [[s.file, s.start, s.end] for p in parts for s in getattr(p, "segments", (p,))],
            **({"sources": [s.as_manifest() for s in sources]} if sources is not None else {}),
        },
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()
