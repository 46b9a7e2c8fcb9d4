"""``weightprep build``: JSONL pieces -> packed (or padded) Arrow shards, with a summary of what was done."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from weightprep import storage
from weightprep.accounting import dropped_warnings
from weightprep.commands._ending import end_at_once
from weightprep.commands._errors import reports_errors
from weightprep.commands._rerun import KeepsArguments, rerun_command
from weightprep.commands._storage import storage_options
from weightprep.config import load_config, load_sources
from weightprep.errors import BuildInterrupted, LeftoverParts, UsageError
from weightprep.heap import bound_heap
from weightprep.progress import Steps, build_progress
from weightprep.tokenizer import SAMPLE_TOKENIZER_DIR, set_tokenizer_threads, tokenizer_location

if TYPE_CHECKING:
    from weightprep.sources import Source

__all__ = ["build", "format_summary", "composition_lines"]


#: Width of the composition bar of the summary, in characters.
_BAR = 30


def composition_lines(sources: list[dict[str, Any]]) -> list[str]:
    """The sources of a build as a table with a bar of each one's share of the train split's weight."""
    if not sources:
        return []
    name_w = max(6, *(len(s["name"]) for s in sources))
    lines = [f"  sources: {'name':<{name_w}} {'weight':>7} {'epochs':>6} {'records':>9} {'repeated':>9} {'tokens':>12} "
             f"{'supervised':>12} {'weight share':>12}"]  # fmt: skip
    for src in sources:
        bar = "█" * round(_BAR * src["weight_share"])
        lines.append(
            f"           {src['name']:<{name_w}} {src['weight']:>7g} {src['epochs']:>6g} {src['records']:>9,} "
            f"{src['repeats']:>9,} {src['tokens']:>12,} {src['supervised_tokens']:>12,} "
            f"{100 * src['weight_share']:>11.1f}% {bar}"
        )
    return lines


def format_summary(manifest: dict[str, Any], out: str, *, built: bool = True) -> str:
    """The few lines printed after a build (``built``: ``wrote OUT/: ...``), and by ``inspect`` (``OUT/: ...``)."""
    c = manifest["counts"]
    cfg = manifest["config"]
    shards = manifest.get("shards", [])
    size = sum(s["bytes"] for s in shards)
    mode = "packed" if cfg["pack"]["enabled"] else "unpacked"
    dropped = ", ".join(f"{k} {v:,}" for k, v in c["dropped"].items() if v) or "none"
    # manifests before the overlong policy "split" was renamed "chunk" count split / split_parts
    chunked, chunks = c.get("chunked", c.get("split", 0)), c.get("chunks", c.get("split_parts", 0))
    lines = [
        f"{'wrote ' if built else ''}{out}/: {len(shards)} shard(s), {c['rows']:,} {mode} rows of {cfg['pack']['seq_len']} tokens, {size / 1e6:.1f} MB",
        f"  records {c['records']:,} -> documents {c['documents']:,} -> written {c['documents_written']:,}",
        *(
            [f"  rejected {sum(rejected.values()):,} ({', '.join(f'{k} {v:,}' for k, v in rejected.items())}): see {out}/{manifest['rejects_file']}"]
            if (rejected := c.get("rejected")) else []
        ),
        f"  tokens {c['tokens']:,} (supervised {c['supervised_tokens']:,}, total weight {c['total_weight']:,.1f}), "
        f"pad {c['pad_tokens']:,}, fill {100 * c['fill_ratio']:.2f}%",
        f"  dropped: {dropped}; truncated {c['truncated']:,}; chunked {chunked:,} into {chunks:,} chunks",
        *(
            [f"  chat: {n:,} conversation(s) as {c['chat_history_documents']:,} per-turn documents, "
             f"{c['chat_history_extra_tokens']:,} tokens of repeated context"]
            if (n := c.get("chat_history_conversations")) else []
        ),  # fmt: skip
        *(
            [f"  warning: per-turn documents repeat their context: {extra:,} extra tokens for {c['tokens']:,}; "
             + _training_alternative(manifest.get("chat") or {})]
            if (extra := c.get("chat_history_extra_tokens", 0)) and extra >= c.get("tokens", 0) // 2 else []
        ),
        *(
            [f"  warning: {n:,} control token(s) in the records were encoded as text (--sanitize-control-tokens): "
             "the model sees text pieces where inference sees one token"]
            if (n := c.get("chat_sanitized_control_tokens")) else []
        ),  # fmt: skip
        *(
            [f"  warning: {n:,} token(s) hold the end of a generation prompt (or another span of lower weight) and "
             "the start of an answer, and carry the answer's weight, as transformers' assistant_masks marks them "
             "(manifest counts.chat_straddling_tokens)"]
            if (n := c.get("chat_straddling_tokens")) else []
        ),  # fmt: skip
        *(
            f"  {name}: {sc['records']:,} records, {sc['documents_written']:,} documents, {sc['rows']:,} rows, "
            f"{sc['tokens']:,} tokens (supervised {sc['supervised_tokens']:,}), fill {100 * sc['fill_ratio']:.2f}%"
            for name, split in (manifest.get("splits") or {}).items()
            for sc in (split["counts"],)
        ),
        *composition_lines(manifest.get("sources") or []),
        f"  tokenizer {manifest['tokenizer']['name_or_path']} (fingerprint {manifest['tokenizer']['fingerprint'][:12]}, "
        f"tokenized by {manifest['tokenizer'].get('backend', 'hf')})",
    ]
    return "\n".join(lines)


def _training_alternative(chat: dict[str, Any]) -> str:
    """What renders each conversation once instead of per-turn documents (the manifest's ``training_alternative``;
    a manifest without it names the flag in general)."""
    if "training_alternative" not in chat:
        return "--chat-template training renders each conversation once where TRL has a training template"
    source = chat["training_alternative"]
    if source is None:
        return ("no training template renders them once: TRL has none for this chat template, or is not installed "
                "(pip install 'weightprep[train]')")  # fmt: skip
    return f"--chat-template training renders each conversation once ({source.removeprefix('training: ')})"


def _load_early(tokenizer: str | None, pipeline_file: str | None, backend: str | None, remote_code: bool) -> None:
    """Start fastokens' load of the tokenizer's file before the build's imports (``weightprep.prefetch``), where the
    options alone say which file the build reads: ``--tokenizer`` (a directory holding ``tokenizer.json``), or the
    bundled one when neither it nor a pipeline file (which may name another) is given."""
    if backend == "hf" or remote_code or (tokenizer is None and pipeline_file is not None):
        return
    from weightprep import prefetch

    path = Path(tokenizer_location(tokenizer)) / "tokenizer.json"  # the directory the build will read
    prefetch.start(path)
    # a build that ends before it takes the load (an error first) leaves none behind in this process
    click.get_current_context().call_on_close(lambda: prefetch.take(path))


#: a file's first bytes that name a message list, ShareGPT's or Alpaca's fields (``_start_workers_early``'s guess of
#: a file of conversations: ``shapes.is_conversation`` decides)
_MESSAGES = (b'"messages"', b'"conversations"', b'"instruction"')


def _start_workers_early(inputs: tuple[str, ...], workers: int | None, part_bytes: int | None) -> None:
    """Start the fork server of the build's worker processes now (``executors.prestart``), before this process's
    imports, where the inputs alone make a plan of several parts likely: local JSON files larger, together, than a
    part (``--part-bytes``), or than two parts of conversations (``plan.chat_part_bytes``) where the first file's
    first bytes name a message list (``_MESSAGES``). A guess, not the plan (which reads the first record): where it
    is wrong a process waits unused, or the pool's processes are spawned once the parts are planned, as without
    it."""
    from weightprep.config import ReadConfig
    from weightprep.distribute import executors
    from weightprep.distribute.plan import chat_part_bytes

    def prestart(chat: bool) -> None:
        if executors.prestart(chat):  # stopped with the command (and waited for: no process left behind)
            context = click.get_current_context(silent=True)
            if context is not None:
                context.call_on_close(executors.stop_prestarted)

    if workers == 1 or executors._cpus() < 2 or not inputs:
        return
    paths = [Path(p) for p in inputs]
    if not all(p.suffix in (".jsonl", ".ndjson", ".json") and p.is_file() for p in paths):
        return  # a URL, a directory, a glob, a compressed or columnar file: left to the plan
    size = sum(p.stat().st_size for p in paths)
    part = part_bytes or ReadConfig.part_bytes
    if size > part or len(paths) > 1:
        prestart(chat=False)
    elif size > chat_part_bytes(part):
        with paths[0].open("rb") as f:
            head = f.read(1 << 16)
        if any(name in head for name in _MESSAGES):
            prestart(chat=True)


def _sources(inputs: tuple[str, ...], specs: tuple[str, ...], pipeline_file: str | None) -> list[Source] | None:
    """The build's sources (``--source`` or the pipeline file's ``sources:``), None for a plain build of INPUTS;
    every problem before any work."""
    declared = load_sources(pipeline_file)
    if specs and declared is not None:
        raise UsageError(f"sources are given both by --source and in {pipeline_file}'s sources:; give them in one place")
    from weightprep.sources import check_source_names, parse_source_option

    sources = [parse_source_option(spec) for spec in specs] if specs else declared
    if sources is None:
        if not inputs:
            raise UsageError("no input given; usage: weightprep build INPUT... or weightprep build --source NAME=PATH ...")
        return None
    if inputs:
        raise UsageError(
            f"INPUTS ({' '.join(inputs)}) and sources are both given: declare every input as a source "
            "(--source NAME=PATH) or give INPUTS alone"
        )
    check_source_names(sources)
    return sources


@click.command("build", cls=KeepsArguments)
@click.argument("inputs", nargs=-1)
@click.option(
    "--source",
    "source_specs",
    multiple=True,
    metavar="NAME=PATH[,weight=W][,epochs=E]",
    help="A named source (repeatable, instead of INPUTS): PATH a file, directory, quoted glob or URL; its token "
    "weights times W (default 1), its records repeated E times (a float > 0, default 1). Sources are mixed before "
    "packing; with a validation split each gets its own, validation_NAME. Also a pipeline file's sources: list.",
)
@click.option(
    "--out", "-o", default="shards", show_default=True,
    help="Output directory for the shards, or a URL (s3://bucket/prefix, gs://..., memory://...).",
)
@click.option("--pipeline", "pipeline_file", type=click.Path(dir_okay=False), help="Pipeline YAML (pipelines/*.yaml).")
@click.option("--tokenizer", help="Tokenizer directory or hub id (default: the bundled sample tokenizer).")
@click.option("--seq-len", type=int, help="Row length in tokens [pack.seq_len, default 2048].")
@click.option("--packed/--unpacked", default=None, help="Pack documents into rows, or one padded document per row.")
@click.option(
    "--overlong",
    # "split" is the old name of "chunk", accepted with a deprecation note (config.RENAMED_VALUES)
    type=click.Choice(["drop", "truncate", "chunk", "split"]),
    metavar="[drop|truncate|chunk]",
    help="Policy for documents over max length.",
)
@click.option("--max-length", type=int, help="Longest document kept whole [filter.max_length, default seq-len].")
@click.option("--eos-weight", type=float, help="Weight of each document's EOS token [default 1.0].")
@click.option("--add-bos", type=click.Choice(["auto", "always", "never"]), help="Prepend BOS [default auto].")
@click.option("--window", type=int, help="Documents per best-fit-decreasing packing window.")
@click.option("--max-shard-bytes", type=int, help="Upper bound on one shard's size in bytes.")
@click.option(
    "--tokenizer-backend",
    type=click.Choice(["auto", "fastokens", "hf"]),
    help="auto (default): fastokens where it loads the tokenizer and agrees with tokenizers, else tokenizers; "
    "hf: tokenizers always [tokenizer.backend].",
)
@click.option("--trust-remote-code", is_flag=True, default=None, help="Allow custom tokenizer code from the hub.")
@click.option(
    "--skip-invalid",
    is_flag=True,
    default=None,
    help="Quarantine invalid records in OUT/rejects.jsonl instead of stopping at the first [validate.on_invalid].",
)
@click.option("--max-line-bytes", type=int, help="Longest input line; longer ones are invalid [read.max_line_bytes, 64 MiB].")
@click.option(
    "--text-sample-by",
    type=click.Choice(["line", "paragraph", "document"]),
    help="Plain-text inputs (.txt, .md): a record per line, per paragraph or per file [read.text_sample_by, line].",
)
@click.option(
    "--validation-fraction",
    type=float,
    help="Hold out this share of the records (by a hash of each record) as a validation split [split.validation_fraction].",
)
@click.option("--validation-records", type=int, help="Hold out this many records instead [split.validation_records].")
@click.option("--split-seed", type=int, help="Seed of the record hash that assigns the splits [split.seed, default 0].")
@click.option(
    "--chat-template",
    type=click.Path(dir_okay=False),
    help="Jinja chat template for chat records (default: the tokenizer's own), or 'training': the training "
    "template TRL maps the tokenizer's template to, as SFTTrainer trains on it (needs "
    "pip install 'weightprep[train]') [chat.template].",
)
@click.option(
    "--chat-history",
    type=click.Choice(["auto", "full", "per-turn"]),
    help="full: one document per conversation; per-turn: one per weighted message, rendered as inference "
    "sees the conversation up to it; auto (default): full where the template keeps earlier turns as they "
    "were, else per-turn [chat.history].",
)
@click.option(
    "--role-weights",
    help="Default weights of chat messages by role, e.g. assistant=1,tool=0.5 (others 0) [chat.role_weights].",
)
@click.option(
    "--sanitize-control-tokens",
    is_flag=True,
    help="Encode turn control tokens found in chat contents (<|im_end|>, ...) as plain text, as apply_chat_template("
    "sanitize_control_tokens=True) does, instead of rejecting the conversation [chat.sanitize_control_tokens].",
)
@click.option(
    "--columns",
    help="Other names of record fields, message keys and roles, TARGET=SOURCE,...: --columns "
    "prompt=question,completion=answer or messages=dialog,message.role=speaker,role.user=USER (docs/inputs.md).",
)
@click.option(
    "--dataset-info",
    metavar="FILE:NAME",
    help="Read entry NAME of a LLaMA-Factory dataset_info.json as the --columns mapping it stands for (formatting, "
    "columns, tags; added to --columns if both are given; docs/inputs.md).",
)
@click.option("--overwrite", is_flag=True, help="Replace the output directory (an earlier build) if it exists.")
@click.option(
    "--executor",
    type=click.Choice(["local", "ray", "serial"]),
    default="local",
    show_default=True,
    help="Who runs the input parts: local workers (this process and worker processes), Ray actors (pip install "
    "'weightprep[ray]'), or this process alone. The output does not depend on it.",
)
@click.option("--workers", type=click.IntRange(min=1), help="Local workers, this process one of them, or Ray actors (default: one per core).")
@click.option("--ray-address", help="Ray cluster to run on (default: RAY_ADDRESS; none: a local Ray cluster).")
@click.option("--part-bytes", type=click.IntRange(min=1), help="Cut plain JSONL files into parts of about this size [read.part_bytes, 256 MiB].")
@click.option("--split-bytes", type=click.IntRange(min=1), hidden=True, help="Deprecated: --part-bytes.")
@click.option(
    "--resume", is_flag=True, help="Reuse the finished parts of an interrupted build of the same inputs and configuration."
)
@click.option(
    "--num-proc",
    type=click.IntRange(min=1),
    help="Tokenizer threads (default: every core). The output does not depend on it.",
)
@storage_options
@reports_errors
def build(
    inputs: tuple[str, ...],
    out: str,
    pipeline_file: str | None,
    overwrite: bool,
    num_proc: int | None,
    executor: str,
    workers: int | None,
    ray_address: str | None,
    resume: bool,
    source_specs: tuple[str, ...],
    **flags: Any,
) -> None:
    """Tokenize, weight, mask, pack and write INPUTS as Arrow shards.

    INPUTS are .jsonl/.ndjson/.json files (JSON Lines, or one JSON array of records), .txt/.md plain text,
    each also .gz or .zst, .parquet files, datasets.save_to_disk directories, directories (their JSON and
    .parquet files, sorted) or quoted globs; local paths or URLs (s3://, gs://, az://, hf://datasets/...,
    https://). Records in the shapes of other tools (Alpaca, ShareGPT, ...) are read as they are: docs/inputs.md."""
    bound_heap()  # before any thread starts (fastokens' load, below): weightprep.heap
    set_tokenizer_threads(num_proc)
    # a build does no linear algebra: numpy's OpenBLAS need not start a spinning thread per core at its import
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    _load_early(flags["tokenizer"], pipeline_file, flags["tokenizer_backend"], flags["trust_remote_code"])
    if executor == "local" and not resume and not source_specs and pipeline_file is None:
        _start_workers_early(inputs, workers, flags["part_bytes"] or flags["split_bytes"])
    from weightprep.distribute.executors import make_executor
    from weightprep.pipeline import build as run_build
    from weightprep.pipeline import source_files
    from weightprep.stages.read import expand_inputs

    if flags["dataset_info"] is not None:
        from weightprep.stages.dataset_info import dataset_info_columns

        flags["columns"] = ",".join(filter(None, [dataset_info_columns(flags["dataset_info"]), flags["columns"]])) or None
    overrides = {
        "tokenizer.name": flags["tokenizer"],
        "tokenizer.add_bos": flags["add_bos"],
        "tokenizer.trust_remote_code": flags["trust_remote_code"],
        "tokenizer.backend": flags["tokenizer_backend"],
        "pack.seq_len": flags["seq_len"],
        "pack.enabled": flags["packed"],
        "pack.window": flags["window"],
        "filter.overlong": flags["overlong"],
        "filter.max_length": flags["max_length"],
        "assemble.eos_weight": flags["eos_weight"],
        "write.max_shard_bytes": flags["max_shard_bytes"],
        "read.max_line_bytes": flags["max_line_bytes"],
        "read.text_sample_by": flags["text_sample_by"],
        "validate.on_invalid": "skip" if flags["skip_invalid"] else None,
        "split.validation_fraction": flags["validation_fraction"],
        "split.validation_records": flags["validation_records"],
        "split.seed": flags["split_seed"],
        "read.columns": flags["columns"],
        "read.part_bytes": flags["part_bytes"] if flags["part_bytes"] is not None else flags["split_bytes"],
        "chat.template": flags["chat_template"],
        "chat.role_weights": flags["role_weights"],
        "chat.sanitize_control_tokens": True if flags["sanitize_control_tokens"] else None,
        "chat.history": flags["chat_history"],
    }
    if flags["split_bytes"] is not None:
        click.echo("note: --split-bytes is deprecated: use --part-bytes", err=True)
    with warnings.catch_warnings(record=True) as deprecated:
        warnings.simplefilter("always", FutureWarning)
        cfg = load_config(pipeline_file, overrides)
    for note in dict.fromkeys(str(w.message) for w in deprecated if issubclass(w.category, FutureWarning)):
        click.echo(f"note: {note}", err=True)
    note = lambda m: click.echo(f"note: {m}", err=True)  # noqa: E731
    steps = Steps(lambda m: click.echo(m, err=True))
    # one storage session for the listing here and the build's: each input object is listed or looked up once
    sources = _sources(inputs, source_specs, pipeline_file)
    with storage.session():
        with steps("listing the inputs"):
            paths = expand_inputs(inputs) if sources is None else [p for files in source_files(sources, cfg) for p in files]
            total = sum(storage.size(p) for p in paths if storage.isfile(p))
        if cfg.tokenizer.name is None:
            click.echo(
                f"note: no --tokenizer given: using the bundled sample tokenizer ({SAMPLE_TOKENIZER_DIR}),\n"
                "      a small byte-level BPE for trying weightprep out. For training, pass your model's tokenizer:\n"
                "      --tokenizer meta-llama/Llama-3.2-1B (a hub id) or --tokenizer /path/to/model_dir",
                err=True,
            )
        try:
            with build_progress(total, lambda m: click.echo(m, err=True)) as update:
                manifest = run_build(
                    paths if sources is None else [], out, cfg, overwrite=overwrite,
                    progress=lambda consumed, counts: update(consumed, records=counts["accepted"], tokens=counts["tokens"]),
                    notify=note, executor=make_executor(executor, workers, ray_address), resume=resume,
                    sources=sources, steps=steps,
                )
        except LeftoverParts as exc:
            click.echo(f"error: {exc}\n  to reuse them: {rerun_command('--resume')}\n"
                       f"  to discard them: {rerun_command('--overwrite', drop=('--resume',))}", err=True)
            sys.exit(exc.exit_code)
        except BuildInterrupted as exc:
            click.echo(
                f"interrupted: {exc.finished} of {exc.total} part(s) had finished; they are kept in {exc.kept} "
                f"(nothing was written to {exc.out})\n  to continue: {rerun_command('--resume')}", err=True,
            )
            sys.exit(130)
    for warning in dropped_warnings(manifest["counts"], cfg.max_length):
        click.echo(f"warning: {warning}", err=True)
    click.echo(format_summary(manifest, out.rstrip("/")))
    end_at_once()  # a command line's build: its process ends without the interpreter's teardown (commands._ending)
