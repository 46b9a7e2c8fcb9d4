"""``weightprep train``: parse options (flags over an optional YAML file), check, then hand over to the trainer.

The same command runs on one CPU or GPU, and under ``torchrun --nproc-per-node N -m weightprep train ...`` or
``accelerate launch -m weightprep train ...`` (DDP by default, FSDP with ``--strategy fsdp``; gloo on CPU).
Checks that need no weights (shards, manifest, tokenizer fingerprint, vocabulary, length) run before the model
loads, so a mismatch costs seconds, not a model download.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from weightprep.commands._errors import reports_errors
from weightprep.commands._rerun import KeepsArguments, rerun_command
from weightprep.commands._storage import Location, as_location, storage_options
from weightprep.errors import ConfigError, UsageError
from weightprep.progress import Steps
from weightprep.redact import redact_record

__all__ = ["train", "run_training", "TrainOptions"]

TrainOptions = dict[str, Any]


@click.command("train", cls=KeepsArguments, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.argument("shards", required=False, type=Location(exists=False))
@click.option("--model", "model", help="Model directory or hub id (a transformers causal LM).")
@click.option(
    "--output-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where checkpoints, the final model (or LoRA adapter) and the tokenizer go.",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="YAML file with these options (keys as the flags, without --); flags given here override it. A build: "
    "section (a pipeline file's keys, plus inputs or sources) builds SHARDS first when they are missing or stale.",
)
@click.option(
    "--tokenizer", help="Tokenizer to save with the model [default: the model's, else the shards' tokenizer]."
)
@click.option(
    "--normalize",
    type=click.Choice(["weight", "tokens"]),
    default="weight",
    help="Loss denominator over the whole optimizer step: sum of weights (weighted mean) or number of supervised tokens.",
)
@click.option(
    "--micro-batch-size", type=click.IntRange(min=1), default=4, help="Rows per device per forward."
)
@click.option("--grad-accum", type=click.IntRange(min=1), default=1, help="Micro-batches per optimizer step.")
@click.option(
    "--lr",
    type=click.FloatRange(min=0),
    default=None,
    help="Peak learning rate [default: 2e-4 with LoRA, 2e-5 otherwise].",
)
@click.option(
    "--lr-scheduler",
    type=click.Choice(["cosine", "linear", "constant", "constant_with_warmup"]),
    default="cosine",
)
@click.option(
    "--warmup-ratio",
    type=click.FloatRange(min=0, max=1, max_open=True),
    default=0.03,
    help="Fraction of the steps spent warming up the learning rate.",
)
@click.option("--weight-decay", type=click.FloatRange(min=0), default=0.0)
@click.option(
    "--max-grad-norm", type=click.FloatRange(min=0), default=1.0, help="Gradient clipping (0: off)."
)
@click.option("--max-steps", type=int, default=-1, help="Optimizer steps; overrides --epochs when > 0.")
@click.option("--epochs", type=click.FloatRange(min=0), default=1.0)
@click.option(
    "--save-steps", type=click.IntRange(min=1), default=500, help="Checkpoint every N optimizer steps."
)
@click.option(
    "--save-total-limit", type=click.IntRange(min=1), default=None, help="Keep only the last N checkpoints."
)
@click.option("--logging-steps", type=click.IntRange(min=1), default=10)
@click.option(
    "--resume",
    is_flag=False,
    flag_value="last",
    default=None,
    help="Continue from the last checkpoint in --output-dir (`--resume`) or from the given checkpoint directory.",
)
@click.option("--seed", type=int, default=42)
@click.option("--lora-r", type=click.IntRange(min=0), default=0, help="LoRA rank; 0 trains all weights.")
@click.option(
    "--lora-alpha", type=click.FloatRange(min=0), default=None, help="LoRA alpha [default: 2 x rank]."
)
@click.option("--lora-dropout", type=click.FloatRange(min=0, max=1), default=0.05)
@click.option(
    "--lora-target-modules",
    default="all-linear",
    help="Comma-separated module names, or all-linear (never lm_head).",
)
@click.option(
    "--gradient-checkpointing/--no-gradient-checkpointing",
    default=None,
    help="Recompute activations in the backward [default: on with a GPU, off on CPU].",
)
@click.option(
    "--precision",
    type=click.Choice(["auto", "bf16", "fp16", "fp32"]),
    default="auto",
    help="auto: bf16 on a GPU of compute capability 8.0+ (A100, H100, RTX 30xx+), fp16 with a loss scaler on "
    "older GPUs (V100, T4), fp32 on CPU.",
)
@click.option(
    "--attn-implementation",
    type=click.Choice(["auto", "flash_attention_2", "flash_attention_3", "sdpa", "eager"]),
    default="auto",
    help="auto: flash_attention_2 on a GPU of compute capability 8.0+ with flash_attn installed, else sdpa.",
)
@click.option(
    "--strategy",
    type=click.Choice(["ddp", "fsdp"]),
    default="ddp",
    help="Multi-process strategy under torchrun/accelerate launch.",
)
@click.option(
    "--vocab-chunk",
    type=click.IntRange(min=256),
    default=None,
    help="Vocabulary columns per LM-head tile of the loss [default: 32768 on GPU, 2048 on CPU].",
)
@click.option(
    "--eval-shards",
    type=Location(exists=False),
    default=None,
    help="Another build to evaluate on (its validation split, or its validation_NAME splits per source, if it has "
    "them, else all its rows) [default: the validation split(s) of SHARDS, when the build made them].",
)
@click.option(
    "--eval-steps",
    type=click.IntRange(min=1),
    default=None,
    help="Evaluate every N optimizer steps (always once at the end when there is an evaluation set).",
)
@click.option("--eval-batch-size", type=click.IntRange(min=1), default=None, help="[default: --micro-batch-size]")
@click.option(
    "--load-best-model-at-end",
    is_flag=True,
    default=False,
    help="Keep the checkpoint with the lowest eval_loss as the final model (needs --eval-steps dividing --save-steps).",
)
@click.option(
    "--report-to",
    type=click.Choice(["none", "tensorboard", "wandb"]),
    default="none",
    help="Where transformers sends the logs (tensorboard: into OUTPUT_DIR/runs).",
)
@click.option("--dataloader-workers", type=click.IntRange(min=0), default=0)
@click.option(
    "--skip-memory-check",
    is_flag=True,
    default=False,
    help="Start even if `weightprep plan` predicts the setup will not fit in GPU memory.",
)
@storage_options
@click.pass_context
@reports_errors
def train(ctx: click.Context, **options: Any) -> None:
    """Train a causal LM on weightprep SHARDS with the weighted loss (never building the full logits)."""
    from weightprep.train.report import interrupted_message

    opts = resolve_options(ctx, options)
    section = opts.pop(_BUILD_SECTION, None)
    if section is not None:
        _build_for_run(section, opts)
    try:
        run_training(opts)
    except KeyboardInterrupt:
        if os.environ.get("RANK", "0") == "0":  # one message for a torchrun of many processes
            command = rerun_command("--resume", drop_with_value=("--resume",))
            click.echo(f"\n{interrupted_message(opts['output_dir'], opts['save_steps'], command)}", err=True)
        sys.exit(130)


def resolve_options(ctx: click.Context, options: dict[str, Any]) -> TrainOptions:
    """Defaults < ``--config`` file < flags given on the command line; unknown or ill-typed keys are errors."""
    config_file = options.pop("config_file", None)
    merged = dict(options)
    if config_file is not None:
        params = {p.name: p for p in ctx.command.params if p.name and p.name != "config_file"}
        from_file = _read_config(config_file, params, ctx)
        merged[_BUILD_SECTION] = from_file.pop(_BUILD_SECTION, None)
        for name, value in from_file.items():
            if ctx.get_parameter_source(name) in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP, None):
                merged[name] = value
    missing = [
        flag
        for flag, key in (("SHARDS", "shards"), ("--model", "model"), ("--output-dir", "output_dir"))
        if merged.get(key) in (None, "")
    ]
    if missing:
        raise UsageError(f"missing {', '.join(missing)}: give them on the command line or in --config")
    merged["shards"] = as_location(merged["shards"])  # a URL: a build in a store (weightprep.storage)
    merged["output_dir"] = Path(merged["output_dir"])
    return merged


def _read_config(path: Path, params: dict[str, click.Parameter], ctx: click.Context) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"{path}: cannot read YAML ({exc})") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            [f"top level: expected a mapping of option: value, got {type(data).__name__}"], source=str(path)
        )
    from weightprep.train.run_file import build_section

    problems: list[str] = []
    values: dict[str, Any] = {_BUILD_SECTION: build_section(data, str(path))}  # the run's build, if any
    for raw_key, value in data.items():
        key = str(raw_key).replace("-", "_")
        if key not in params:
            close = difflib.get_close_matches(key, list(params), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"{raw_key}: unknown key{hint}; known keys: {', '.join(sorted(params))}")
            continue
        param = params[key]
        if value is None:
            values[key] = None
            continue
        if isinstance(param, click.Option) and param.is_bool_flag and not isinstance(value, bool):
            problems.append(f"{raw_key}: expected true or false, got {value!r}")
            continue
        try:
            values[key] = param.type.convert(value, param, ctx)
        except click.BadParameter as exc:
            problems.append(f"{raw_key}: {exc.message}")
    if problems:
        raise ConfigError(problems, source=str(path))
    return values


#: Where ``resolve_options`` keeps a config file's ``build:`` section (``weightprep.train.run_file``).
_BUILD_SECTION = "build_section"


def _build_for_run(section: Any, opts: TrainOptions) -> None:
    """The shards of a one-file run: built (in this process) unless up to date; stale shards under torchrun are an
    error, since one process must build them."""
    from weightprep.commands.build import format_summary
    from weightprep.train.run_file import ensure_built, stale_reason

    note = lambda m: click.echo(f"note: {m}", err=True)  # noqa: E731
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        reason = stale_reason(section, opts["shards"])
        if reason is not None:
            raise UsageError(f"{reason}; under torchrun every process would build them: run weightprep train "
                             "--config FILE once in one process (it builds, then trains), then launch")  # fmt: skip
        return
    built: list[dict[str, Any]] = []

    def build(*args: Any, **kwargs: Any) -> Any:
        from weightprep.pipeline import build as run_build

        built.append(run_build(*args, **kwargs))
        return built[-1]

    if ensure_built(section, opts["shards"], note, build=build):
        click.echo(format_summary(built[0], str(opts["shards"]).rstrip("/")), err=True)


def run_training(opts: TrainOptions) -> dict[str, Any]:
    """Load, check, train, save. Returns a summary (steps, final loss, output dir)."""
    # Before anything can initialize CUDA: fragmentation-tolerant allocator, unless the user chose otherwise
    if "PYTORCH_CUDA_ALLOC_CONF" not in os.environ and "PYTORCH_ALLOC_CONF" not in os.environ:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch
    from transformers import AutoConfig

    from weightprep.tokenizer import local_path_problem
    from weightprep.train.data import check_model_compatibility, load_shards
    from weightprep.train.device import load_model, preflight_memory_check, resolve_device_policy
    from weightprep.train.report import progress_callback
    from weightprep.train.trainer import WeightedSFTTrainer

    model_id = str(opts["model"])
    if (problem := local_path_problem(model_id, "--model")) is not None:  # before the shards: a typo costs nothing
        raise UsageError(problem)
    steps = Steps(lambda line: click.echo(line, err=True))
    with steps(f"opening the shards {opts['shards']}"):
        shards = load_shards(opts["shards"])
    try:
        model_config = AutoConfig.from_pretrained(model_id)
    except Exception as exc:
        raise UsageError(f"could not load the config of model {model_id!r}: {exc}") from exc
    tokenizer = _load_tokenizer(opts.get("tokenizer"), model_id, shards.tokenizer)
    check_model_compatibility(shards, model_config, tokenizer)
    eval_set = _eval_set(opts, shards, model_config, tokenizer)
    lora = _lora_config(opts)

    if opts["strategy"] == "fsdp" and not torch.cuda.is_available():
        # accelerate builds its FSDP plugin only for GPU-like devices; on CPU it would silently run DDP
        raise UsageError(
            "--strategy fsdp needs GPUs: accelerate shards parameters only on GPU-like devices and would fall back "
            "to plain data parallelism on CPU; use --strategy ddp here (torchrun runs it with gloo)"
        )
    policy = resolve_device_policy(
        opts["precision"], opts["attn_implementation"], opts["gradient_checkpointing"], lora=lora is not None
    )
    plan = None
    if policy.use_cuda and not opts.get("skip_memory_check"):
        plan = preflight_memory_check(policy, shards, model_config, opts)
    with steps(f"loading the model {model_id}"):
        model = load_model(model_id, model_config, policy, fsdp=opts["strategy"] == "fsdp")
    model.config.use_cache = False

    args = _sft_config(opts, policy, model, has_eval=eval_set is not None, log=not sys.stderr.isatty())
    trainer = WeightedSFTTrainer(
        model,
        args=args,
        train_dataset=shards,
        eval_dataset=eval_set,
        processing_class=tokenizer,
        peft_config=lora,
        normalize=opts["normalize"],
        vocab_chunk=opts["vocab_chunk"],
        callbacks=[progress_callback()] if args.disable_tqdm else None,
    )
    resume = _resume_target(opts.get("resume"), Path(opts["output_dir"]))
    if trainer.is_world_process_zero():
        click.echo(_start_summary(opts, model_id, trainer, shards, policy, plan), err=True)
    result = trainer.train(resume_from_checkpoint=resume)
    eval_metrics = trainer.evaluate() if eval_set is not None else {}  # the final model's, logged too
    trainer.save_model(str(opts["output_dir"]))  # the adapter only, with LoRA; the tokenizer goes with it
    summary = {
        "output_dir": str(opts["output_dir"]),
        "global_step": trainer.state.global_step,
        "train_loss": float(result.training_loss),
        "normalize": opts["normalize"],
        "device": policy.device,
        "gpu": policy.gpu_name,
        "precision": policy.precision,
        "attn_implementation": policy.attn_implementation,
        "gradient_checkpointing": policy.gradient_checkpointing,
        "lora_r": opts["lora_r"],
        "processes": trainer.accelerator.num_processes,
        "shards": str(shards.path),
        "shards_tokenizer_fingerprint": shards.tokenizer.get("fingerprint"),
        "eval": {k: v for k, v in eval_metrics.items() if k.startswith("eval_")},
    }
    if trainer.is_world_process_zero():
        from weightprep.train.plot import plot_losses

        plot = plot_losses(trainer.state.log_history, Path(opts["output_dir"], "loss.png"), title=model_id)
        summary["loss_plot"] = str(plot) if plot else None
        Path(opts["output_dir"], "weightprep_train.json").write_text(json.dumps(redact_record(summary), indent=2) + "\n")
        click.echo(
            f"trained {summary['global_step']} steps, loss {summary['train_loss']:.4f} ({opts['normalize']}-normalized), "
            f"{policy.precision}, {policy.attn_implementation}, {summary['processes']} process(es); saved to "
            f"{summary['output_dir']}"
        )
    return summary


def _load_tokenizer(name: str | None, model_id: str, manifest_tok: dict[str, Any]) -> Any:
    from weightprep.tokenizer import load_tokenizer

    if name:
        return load_tokenizer(name)
    try:
        return load_tokenizer(model_id)
    except UsageError:
        shards_tok = manifest_tok.get("name_or_path")
        if not shards_tok:
            raise UsageError(
                f"model {model_id!r} has no tokenizer and the shards' manifest names none; pass --tokenizer"
            ) from None
        return load_tokenizer(shards_tok)


def _lora_config(opts: TrainOptions) -> Any:
    r = int(opts["lora_r"] or 0)
    if r == 0:
        return None
    from peft import LoraConfig

    targets_raw = str(opts["lora_target_modules"]).strip()
    targets: Any = (
        "all-linear"
        if targets_raw == "all-linear"
        else [t.strip() for t in targets_raw.split(",") if t.strip()]
    )
    if isinstance(targets, list) and "lm_head" in targets:
        raise UsageError(
            "--lora-target-modules must not include lm_head: the weighted loss reads lm_head.weight directly, so a "
            "LoRA adapter there would never train"
        )
    alpha = opts["lora_alpha"] if opts["lora_alpha"] is not None else 2 * r
    return LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=float(opts["lora_dropout"]),
        target_modules=targets,
        task_type="CAUSAL_LM",
    )


def _eval_set(opts: TrainOptions, shards: Any, model_config: Any, tokenizer: Any) -> Any:
    """The evaluation rows: ``--eval-shards`` (checked like the training shards), else the validation split (with
    sources, every ``validation_<name>`` split as one tagged set: see :func:`~weightprep.train.data.load_shards`)."""
    from weightprep.train.data import check_model_compatibility, load_shards

    eval_set = shards.validation
    if opts.get("eval_shards"):
        other = load_shards(opts["eval_shards"])
        check_model_compatibility(other, model_config, tokenizer)
        if other.tokenizer.get("fingerprint") != shards.tokenizer.get("fingerprint"):
            raise UsageError(
                f"--eval-shards {opts['eval_shards']} was built with another tokenizer than {shards.path} "
                "(fingerprints differ); build both with the model's tokenizer"
            )
        eval_set = other.validation if other.validation is not None else other.dataset
    if eval_set is None and (opts.get("eval_steps") or opts.get("load_best_model_at_end")):
        raise UsageError(
            f"--eval-steps / --load-best-model-at-end need an evaluation set: {shards.path} has no validation "
            "split; build one (`weightprep build ... --validation-fraction 0.05`) or pass --eval-shards DIR"
        )
    if opts.get("load_best_model_at_end"):
        if not opts.get("eval_steps"):
            raise UsageError("--load-best-model-at-end needs --eval-steps (the checkpoints to choose from)")
        if int(opts["save_steps"]) % int(opts["eval_steps"]):
            raise UsageError(
                f"--load-best-model-at-end: --save-steps {opts['save_steps']} must be a multiple of --eval-steps "
                f"{opts['eval_steps']}, so that every checkpoint has an eval_loss"
            )
    if opts.get("report_to") in ("tensorboard", "wandb"):
        from weightprep.train.device import package_installed

        package = {"tensorboard": "tensorboard", "wandb": "wandb"}[opts["report_to"]]
        if not package_installed(package):
            raise UsageError(f"--report-to {opts['report_to']} needs the {package} package: pip install {package}")
    return eval_set


def _start_summary(opts: TrainOptions, model_id: str, trainer: Any, shards: Any, policy: Any, plan: Any) -> str:
    from weightprep.train.report import optimizer_steps, start_summary

    params = list(trainer.model.parameters())
    processes = trainer.args.world_size
    rows = len(shards.dataset)
    return start_summary(
        model=model_id, parameters=sum(p.numel() for p in params),
        trainable=sum(p.numel() for p in params if p.requires_grad), lora_r=int(opts["lora_r"] or 0), rows=rows,
        seq_len=shards.seq_len, packed=shards.packed, manifest=shards.manifest,
        steps=optimizer_steps(rows, opts["micro_batch_size"], opts["grad_accum"], processes, opts["epochs"],
                              opts["max_steps"]),
        epochs=opts["epochs"], max_steps=opts["max_steps"], micro_batch=opts["micro_batch_size"],
        grad_accum=opts["grad_accum"], processes=processes, device=policy.device, gpu=policy.gpu_name,
        precision=policy.precision, attention=policy.attn_implementation,
        gradient_checkpointing=policy.gradient_checkpointing, normalize=opts["normalize"],
        memory=None if plan is None else (plan.estimate.total, plan.estimate.gpu_memory, plan.max_micro_batch),
    )  # fmt: skip


def _sft_config(opts: TrainOptions, policy: Any, model: Any, has_eval: bool = False, log: bool = False) -> Any:
    from trl import SFTConfig

    lr = opts["lr"] if opts["lr"] is not None else (2e-4 if opts["lora_r"] else 2e-5)
    extra: dict[str, Any] = {}
    if has_eval and opts.get("eval_steps"):
        extra.update(eval_strategy="steps", eval_steps=int(opts["eval_steps"]))
    if opts.get("load_best_model_at_end"):
        extra.update(load_best_model_at_end=True, metric_for_best_model="eval_loss", greater_is_better=False)
    if opts["strategy"] == "fsdp":
        layer_classes = sorted(getattr(model, "_no_split_modules", None) or [])
        extra["fsdp"] = True
        extra["fsdp_config"] = {
            "version": 2,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "transformer_layer_cls_to_wrap": layer_classes,
            "reshard_after_forward": True,
            # rank 0 loads the weights and broadcasts them while sharding (load_model builds the others on meta)
            "cpu_ram_efficient_loading": True,
        }
    # transformers >= 5.x: activation_checkpointing (gradient_checkpointing is its deprecated alias)
    if "activation_checkpointing" in SFTConfig.__dataclass_fields__:
        extra["activation_checkpointing"] = policy.gradient_checkpointing
    else:
        extra["gradient_checkpointing"] = policy.gradient_checkpointing
    return SFTConfig(
        output_dir=str(opts["output_dir"]),
        per_device_train_batch_size=opts["micro_batch_size"],
        gradient_accumulation_steps=opts["grad_accum"],
        learning_rate=lr,
        lr_scheduler_type=opts["lr_scheduler"],
        warmup_steps=float(opts["warmup_ratio"]) if opts["warmup_ratio"] < 1 else 0,
        weight_decay=opts["weight_decay"],
        max_grad_norm=opts["max_grad_norm"],
        max_steps=opts["max_steps"],
        num_train_epochs=opts["epochs"],
        save_strategy="steps",
        save_steps=opts["save_steps"],
        save_total_limit=opts["save_total_limit"],
        logging_steps=opts["logging_steps"],
        seed=opts["seed"],
        data_seed=opts["seed"],
        bf16=policy.precision == "bf16",
        fp16=policy.precision == "fp16",
        use_cpu=not policy.use_cuda,
        report_to=opts.get("report_to") or "none",
        per_device_eval_batch_size=opts.get("eval_batch_size") or opts["micro_batch_size"],
        dataloader_num_workers=opts["dataloader_workers"],
        ddp_find_unused_parameters=False,
        disable_tqdm=log,  # stderr is a log: plain lines (weightprep.train.report.progress_callback), not a bar
        **extra,
    )


def _resume_target(resume: str | None, output_dir: Path) -> str | bool | None:
    if resume is None:
        return None
    if resume == "last":
        from transformers.trainer_utils import get_last_checkpoint

        last = get_last_checkpoint(str(output_dir)) if output_dir.is_dir() else None
        if last is None:
            raise UsageError(
                f"--resume: no checkpoint-* directory in {output_dir}; train without --resume first"
            )
        return last
    path = Path(resume)
    if not (path / "trainer_state.json").is_file():
        raise UsageError(f"--resume {resume}: not a checkpoint directory (no trainer_state.json)")
    return str(path)
