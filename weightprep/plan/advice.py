"""What fits: the largest micro-batch, the accumulation that reaches a global batch, and advice.

``check_fits`` is what ``weightprep train`` calls before it loads anything::

    result = check_fits(model.config, seq_len=4096, micro_batch=8, gpus=2, gpu_memory=80 * 2**30)
    if not result.fits:
        raise SystemExit(format_advice(result))

``shards_settings`` reads a shard directory's manifest for the real sequence length, packing and
share of supervised tokens.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from weightprep import storage
from weightprep.constants import MANIFEST_NAME
from weightprep.errors import UsageError
from weightprep.manifest import build_setting, read_manifest
from weightprep.plan.estimate import GiB, MemoryEstimate, estimate_memory
from weightprep.plan.models import ModelShape, load_model_config, model_shape

__all__ = ["PlanResult", "check_fits", "format_advice", "largest_micro_batch", "parse_gpus", "shards_settings",
           "grad_accum_for"]

_GPU_RE = re.compile(r"^\s*(?:(\d+)\s*[x*]\s*)?(\d+(?:\.\d+)?)\s*(gib|gb|g|mib|mb|m)?\s*$", re.IGNORECASE)
MAX_MICRO_BATCH = 4096


def parse_gpus(spec: str) -> tuple[int, int]:
    """``"2x80GB"`` -> (2, 80 GiB in bytes). ``"80GB"`` is one GPU. GB and GiB both mean 2**30
    bytes: an "80GB" A100/H100 reports 79.1-80 GiB, so the marketing number is read as GiB."""
    m = _GPU_RE.match(spec or "")
    if not m:
        raise UsageError(f"--gpus {spec!r}: expected COUNTxSIZE such as 2x80GB, 8x141GB or 24GB")
    count = int(m.group(1) or 1)
    size = float(m.group(2))
    unit = (m.group(3) or "gb").lower()
    scale = 2**20 if unit.startswith("m") else GiB
    if count < 1 or size <= 0:
        raise UsageError(f"--gpus {spec!r}: count and size must be positive")
    return count, int(size * scale)


def grad_accum_for(global_batch_tokens: int | None, micro_batch: int, seq_len: int, gpus: int) -> int:
    """Micro-batches per optimizer step so that micro_batch x seq_len x gpus x accum >= global tokens."""
    if not global_batch_tokens:
        return 1
    return max(1, math.ceil(global_batch_tokens / (micro_batch * seq_len * gpus)))


@dataclass(frozen=True)
class PlanResult:
    """The estimate at the requested micro-batch, plus what fits.

    ``max_micro_batch`` is 0 when not even one row fits; ``grad_accum`` is the accumulation that
    reaches ``global_batch_tokens`` at ``max_micro_batch`` (or at the requested one if that fits).
    """

    estimate: MemoryEstimate
    max_micro_batch: int
    max_estimate: MemoryEstimate | None
    grad_accum: int | None
    global_batch_tokens: int | None
    suggestions: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return bool(self.estimate.fits)


def largest_micro_batch(model: Any, *, seq_len: int, gpu_memory: int, gpus: int = 1,
                        global_batch_tokens: int | None = None, **kwargs: Any) -> tuple[int, MemoryEstimate | None]:
    """Largest micro-batch (rows of ``seq_len``) whose estimate fits ``gpu_memory``, and its estimate.

    Memory grows monotonically with the micro-batch, so this doubles then bisects. Gradient
    accumulation (which keeps gradients alive through the forward) is recomputed for each candidate.
    """
    shape = model if isinstance(model, ModelShape) else model_shape(load_model_config(model))

    def est(b: int) -> MemoryEstimate:
        accum = grad_accum_for(global_batch_tokens, b, seq_len, gpus)
        return estimate_memory(shape, seq_len=seq_len, micro_batch=b, gpus=gpus, gpu_memory=gpu_memory,
                               grad_accum=accum, **kwargs)

    first = est(1)
    if not first.fits:
        return 0, None
    lo, lo_est, hi = 1, first, 2
    while hi <= MAX_MICRO_BATCH:
        e = est(hi)
        if not e.fits:
            break
        lo, lo_est, hi = hi, e, hi * 2
    else:
        return lo, lo_est
    while hi - lo > 1:
        mid = (lo + hi) // 2
        e = est(mid)
        if e.fits:
            lo, lo_est = mid, e
        else:
            hi = mid
    return lo, lo_est


def _detect_gpu_memory() -> tuple[int, int] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return torch.cuda.device_count(), torch.cuda.get_device_properties(0).total_memory


def check_fits(model_config: Any, seq_len: int, micro_batch: int, *, gpus: int | None = None,
               gpu_memory: int | None = None, global_batch_tokens: int | None = None,
               **kwargs: Any) -> PlanResult:
    """Estimate the requested setup, find the largest micro-batch that fits, and collect advice.

    ``gpu_memory`` (bytes per GPU) and ``gpus`` default to what torch sees on this machine; other
    keyword arguments go to :func:`estimate_memory` (``strategy``, ``dtype``, ``precision``,
    ``gradient_checkpointing``, ``lora_r``, ``loss``, ``supervised_fraction`` ...).
    """
    if gpu_memory is None or gpus is None:
        detected = _detect_gpu_memory()
        if detected is None and gpu_memory is None:
            raise UsageError("no CUDA device visible: pass the GPU size, e.g. gpu_memory=80 * 2**30 (--gpus 2x80GB)")
        if detected is not None:
            gpus = gpus if gpus is not None else detected[0]
            gpu_memory = gpu_memory if gpu_memory is not None else detected[1]
    gpus = gpus or 1
    shape = model_config if isinstance(model_config, ModelShape) else model_shape(load_model_config(model_config))
    accum = grad_accum_for(global_batch_tokens, micro_batch, seq_len, gpus)
    est = estimate_memory(shape, seq_len=seq_len, micro_batch=micro_batch, gpus=gpus, gpu_memory=gpu_memory,
                          grad_accum=kwargs.pop("grad_accum", accum), **kwargs)
    best, best_est = largest_micro_batch(shape, seq_len=seq_len, gpu_memory=gpu_memory, gpus=gpus,
                                         global_batch_tokens=global_batch_tokens, **kwargs)
    use_b = micro_batch if est.fits else best
    result = PlanResult(estimate=est, max_micro_batch=best, max_estimate=best_est,
                        grad_accum=grad_accum_for(global_batch_tokens, use_b, seq_len, gpus) if use_b else None,
                        global_batch_tokens=global_batch_tokens)
    return replace(result, suggestions=tuple(_suggestions(shape, result, kwargs)))


def _suggestions(shape: ModelShape, result: PlanResult, kwargs: dict[str, Any]) -> list[str]:
    """Concrete changes that make the setup fit, each checked with the estimator."""
    est = result.estimate
    s = est.settings
    if est.fits:
        return []
    out = []
    if result.max_micro_batch >= 1:
        out.append(f"--micro-batch {result.max_micro_batch}"
                   + (f" with gradient accumulation {result.grad_accum}" if result.grad_accum else ""))
    base = {k: s[k] for k in ("seq_len", "micro_batch", "gpus", "strategy", "dtype", "precision",
                              "gradient_checkpointing", "lora_r", "lora_targets", "loss", "loss_chunk_tokens",
                              "supervised_fraction", "grad_accum", "attention", "packed")}
    candidates = [
        ("--gradient-checkpointing", {"gradient_checkpointing": True}),
        ("weightprep's chunked loss (TRL's kernel) instead of full logits", {"loss": "weightprep"}),
        ("--strategy fsdp", {"strategy": "fsdp"}),
        ("--precision pure (bf16 weights and AdamW states)", {"precision": "pure"}),
        ("--lora-r 16", {"lora_r": 16}),
    ]
    for label, change in candidates:
        if all(base.get(k) == v for k, v in change.items()):
            continue
        if change.get("strategy") == "fsdp" and s["gpus"] < 2:
            continue
        if change.get("precision") and s["dtype"] == "fp32":
            continue
        alt = estimate_memory(shape, gpu_memory=est.gpu_memory, **(base | change))
        if alt.fits:
            out.append(f"{label}: {alt.total / GiB:.1f} GiB per GPU")
    return out


def format_advice(result: PlanResult) -> str:
    """A few lines for a human: the verdict, the largest micro-batch, the accumulation, the fixes."""
    est = result.estimate
    s = est.settings
    cap = est.gpu_memory or 0
    lines = [
        f"plan: {est.total / GiB:.1f} GiB per GPU of {cap / GiB:.0f} GiB for micro-batch {s['micro_batch']} x "
        f"{s['seq_len']} tokens ({'fits' if est.fits else 'does NOT fit'}; peak at {est.peak_phase})."
    ]
    if result.max_micro_batch == 0:
        lines.append("not even one row fits with these settings.")
    else:
        lines.append(f"largest micro-batch that fits: {result.max_micro_batch}"
                     + (f" ({result.max_estimate.total / GiB:.1f} GiB)" if result.max_estimate else ""))
    if result.global_batch_tokens and result.grad_accum:
        b = s["micro_batch"] if est.fits else result.max_micro_batch
        got = b * s["seq_len"] * s["gpus"] * result.grad_accum
        lines.append(f"gradient accumulation {result.grad_accum}: {b} x {s['seq_len']} x {s['gpus']} GPU(s) x "
                     f"{result.grad_accum} = {got:,} tokens per step (asked {result.global_batch_tokens:,})")
    if result.suggestions:
        lines.append("settings that fit:")
        lines.extend(f"  - {x}" for x in result.suggestions)
    return "\n".join(lines)


def shards_settings(shards: str | Path, *, storage_options: dict[str, Any] | str | None = None) -> dict[str, Any]:
    """``seq_len``, ``packed`` and ``supervised_fraction`` from a shard directory's manifest (a local directory or
    a URL; ``storage_options``: its fsspec options, as ``read_manifest`` takes them).

    Raises :class:`UsageError` if the manifest is missing or lacks the sequence length.
    """
    path = storage.join(shards, MANIFEST_NAME)
    manifest = read_manifest(shards, storage_options=storage_options)
    cfg = manifest.get("config") or {}
    seq_len = build_setting(cfg, "seq_len", ("pack", "seq_len"))
    if not isinstance(seq_len, int) or seq_len < 1:
        raise UsageError(f"{path}: config.seq_len (or config.pack.seq_len) missing or not a positive integer")
    packed = build_setting(cfg, "packed", ("pack", "enabled"))
    packed = True if packed is None else packed
    counts = manifest.get("counts") or {}
    out: dict[str, Any] = {"seq_len": seq_len, "packed": bool(packed)}
    rows, sup = counts.get("rows"), counts.get("supervised_tokens")
    if isinstance(rows, int) and rows > 0 and isinstance(sup, int) and sup > 0:
        out["supervised_fraction"] = min(1.0, sup / (rows * seq_len))
    return out
