"""``weightprep plan``: print the per-GPU memory table, the verdict and what fits.

    weightprep plan --model llama-3-8b --seq-len 4096 --gpus 2x80GB --strategy fsdp --micro-batch 4
"""

from __future__ import annotations

from pathlib import Path

import click

from weightprep.commands._storage import Location, storage_options
from weightprep.plan.advice import check_fits, format_advice, parse_gpus, shards_settings
from weightprep.plan.estimate import DEFAULT_LOSS_CHUNK_TOKENS, GiB, MemoryEstimate
from weightprep.plan.presets import PRESETS

__all__ = ["plan", "render_table"]


def _gib(n: int) -> str:
    return f"{n / GiB:,.2f}"


def render_table(est: MemoryEstimate, title: str) -> object:
    """A rich Table of the estimate: one row per term with its size and what of it is alive at the peak."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column("term")
    table.add_column("size GiB", justify="right")
    table.add_column("at peak GiB", justify="right")
    table.add_column("formula", overflow="fold")
    for t in est.terms:
        if t.used:
            table.add_row(t.label, _gib(t.size), _gib(t.at_peak), t.formula)
        else:
            table.add_row(f"[dim]{t.label} (alternative)[/dim]", f"[dim]{_gib(t.size)}[/dim]", "[dim]-[/dim]",
                          f"[dim]{t.formula}[/dim]")
    table.add_section()
    cap = est.gpu_memory
    verdict = "" if cap is None else ("fits" if est.fits else "DOES NOT FIT")
    table.add_row("[bold]total[/bold]", f"[bold]{_gib(est.total)}[/bold]", f"[bold]{_gib(est.total)}[/bold]",
                  f"peak at {est.peak_phase}; allocator peak {_gib(est.peak_allocated)} GiB")
    if cap is not None:
        style = "green" if est.fits else "red"
        table.add_row(f"[{style}]verdict[/{style}]", f"{_gib(cap)}", f"{est.total / cap:.0%}",
                      f"[{style}]{verdict}[/{style}] on a {cap / GiB:.0f} GiB GPU")
    return table


@click.command("plan")
@click.option("--model", "model", required=True,
              help=f"Local model dir, its config.json, a hub id (config only) or a preset, offline: {', '.join(PRESETS)}.")
@click.option("--seq-len", type=int, default=None, help="Tokens per row (taken from --shards when given).")
@click.option("--shards", type=Location(exists=False), default=None,
              help="Shard directory or URL (s3://bucket/shards): read seq_len, packing and the supervised share from "
                   "its manifest.")
@click.option("--gpus", default="1x80GB", show_default=True, help="COUNTxSIZE, e.g. 2x80GB.")
@click.option("--micro-batch", type=int, default=1, show_default=True, help="Rows per GPU per forward.")
@click.option("--global-batch-tokens", type=int, default=None,
              help="Tokens per optimizer step over all GPUs; sets gradient accumulation.")
@click.option("--strategy", type=click.Choice(["ddp", "fsdp"]), default="ddp", show_default=True)
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True,
              help="Compute dtype; bf16/fp16 mean autocast.")
@click.option("--precision", type=click.Choice(["mixed", "pure"]), default="mixed", show_default=True,
              help="mixed: fp32 weights + autocast (Trainer bf16=True on an fp32 model); pure: bf16 weights.")
@click.option("--gradient-checkpointing/--no-gradient-checkpointing", default=True, show_default=True)
@click.option("--lora-r", type=int, default=None, help="LoRA rank (adapters on all linear layers).")
@click.option("--lora-targets", default="all-linear", show_default=True,
              help="Comma-separated module names (q_proj,v_proj) or all-linear.")
@click.option("--loss", type=click.Choice(["weightprep", "full"]), default="weightprep", show_default=True,
              help="weightprep's chunked weighted loss, or the full-logits recipe.")
@click.option("--loss-chunk", type=int, default=DEFAULT_LOSS_CHUNK_TOKENS, show_default=True,
              help="Tokens per chunk of the chunked loss.")
@click.option("--attention", type=click.Choice(["sdpa", "flash", "eager"]), default="sdpa", show_default=True)
@storage_options
def plan(model: str, seq_len: int | None, shards: str | Path | None, gpus: str, micro_batch: int,
         global_batch_tokens: int | None, strategy: str, dtype: str, precision: str, gradient_checkpointing: bool,
         lora_r: int | None, lora_targets: str, loss: str, loss_chunk: int, attention: str) -> None:
    """Estimate GPU memory per device before training: a table per term, the verdict, what fits."""
    from rich.console import Console

    from weightprep.errors import WeightprepError

    console = Console(width=160)
    try:
        extra: dict[str, object] = {}
        if shards:
            found = shards_settings(shards)
            if seq_len is not None and seq_len != found["seq_len"]:
                console.print(f"[yellow]--seq-len {seq_len} ignored: the shards have rows of {found['seq_len']}[/yellow]")
            seq_len = found["seq_len"]
            extra["packed"] = found["packed"]
            if "supervised_fraction" in found:
                extra["supervised_fraction"] = found["supervised_fraction"]
        if seq_len is None:
            raise click.UsageError("give --seq-len or --shards")
        n, size = parse_gpus(gpus)
        targets: object = "all-linear" if lora_targets == "all-linear" else tuple(
            x.strip() for x in lora_targets.split(",") if x.strip())
        result = check_fits(model, seq_len, micro_batch, gpus=n, gpu_memory=size,
                            global_batch_tokens=global_batch_tokens, strategy=strategy, dtype=dtype,
                            precision=precision, gradient_checkpointing=gradient_checkpointing, lora_r=lora_r,
                            lora_targets=targets, loss=loss, loss_chunk_tokens=loss_chunk, attention=attention,
                            **extra)
    except WeightprepError as exc:
        raise click.ClickException(str(exc)) from exc
    est = result.estimate
    s = est.settings
    title = (f"{model} ({est.model_type}, {est.params / 1e9:.2f}B params, {est.trainable_params / 1e9:.3f}B trainable)"
             f" | {n} GPU x {size / GiB:.0f} GiB, {strategy}, {dtype} {precision if dtype != 'fp32' else ''}"
             f" | micro-batch {micro_batch} x {seq_len} | checkpointing {'on' if gradient_checkpointing else 'off'}"
             f" | loss {loss}" + (f" | LoRA r={lora_r}" if lora_r else "")
             + (f" | supervised {s['supervised_fraction']:.0%}" if s["supervised_fraction"] < 1 else ""))
    console.print(render_table(est, "per GPU: " + title))
    console.print("totals per choice: " + "; ".join(f"{k}: {v / GiB:.1f} GiB" for k, v in est.alternatives.items()))
    console.print(format_advice(result), highlight=False)
    if not est.fits:
        raise SystemExit(1)
