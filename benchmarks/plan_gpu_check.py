"""Plan vs measured: ``torch.cuda.max_memory_allocated`` of real training steps vs ``estimate_memory``.

    python benchmarks/plan_gpu_check.py              # one GPU, ~0.55B Llama-style model, a few minutes
    python benchmarks/plan_gpu_check.py --cpu-smoke  # tiny config on CPU, checks the script runs

For each configuration: build the random-init model from the ``llama-0.5b-bench`` preset (no
download), run 3 optimizer steps (AdamW fused, states created at step 1) with the full-logits recipe
or ``weightprep.train.weighted_lm_loss`` (TRL's chunked log-prob kernel, on its Triton path on a GPU), and
compare the peak with the plan's ``peak_allocated`` (which excludes the CUDA context and fragmentation, as
``max_memory_allocated`` does). Prints a table with the ratio plan / measured; the goal is within 15%.
On CPU the peak comes from the op-boundary tracker, and the kernel takes its torch path (fp32 tiles), which
the plan does not model: the smoke's weightprep rows check only that the script runs (tests/test_plan.py
measures the Triton path on CPU, in Triton's interpreter).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from weightprep.constants import INPUT_IDS, LABELS, POSITION_IDS, WEIGHTS
from weightprep.plan import estimate_memory
from weightprep.plan.presets import PRESETS
from weightprep.train import weighted_lm_loss

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from memory_recipes import LiveTensorTracker, full_logits_loss  # noqa: E402  (the seed recipe, shared with tests)

# (label, precision, gradient checkpointing, loss, micro-batch)
CONFIGS = [
    ("mixed, ckpt, weightprep loss", "mixed", True, "weightprep", 8),
    ("mixed, ckpt, full logits", "mixed", True, "full", 8),
    ("mixed, no ckpt, weightprep loss", "mixed", False, "weightprep", 4),
    ("pure bf16, ckpt, full logits", "pure", True, "full", 8),
]


def run_one(cfg_fields: dict, precision: str, ckpt: bool, loss: str, batch: int, seq_len: int, device: str,
            steps: int) -> int:
    """Train ``steps`` steps; return the peak bytes of the step (on CPU: the tracker's peak)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(**{k: v for k, v in cfg_fields.items() if k != "model_type"})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    if precision == "pure":
        model = model.to(torch.bfloat16)
    model.to(device).train()
    if ckpt:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers 5 (gradient_* is its deprecated alias)
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device == "cuda")
    ids = torch.randint(0, cfg.vocab_size, (batch, seq_len), device=device)
    quarter = seq_len // 4  # four packed documents per row
    pos = torch.arange(seq_len, device=device).remainder(quarter).repeat(batch, 1)
    weights = torch.rand(batch, seq_len, device=device)
    weights[:, ::5] = 0
    labels = ids.clone()
    labels[weights == 0] = -100
    batch_dict = {INPUT_IDS: ids, LABELS: labels, WEIGHTS: weights, POSITION_IDS: pos}
    dev_type = "cuda" if device == "cuda" else "cpu"
    tracker = LiveTensorTracker([*model.parameters()]) if device == "cpu" else None
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    for _ in range(steps):
        with tracker if tracker is not None else _null():
            with torch.autocast(dev_type, dtype=torch.bfloat16):
                if loss == "full":
                    out = full_logits_loss(model, ids, labels, weights, pos)
                else:
                    out = weighted_lm_loss(model, batch_dict).loss
            out.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    # the tracker excludes the weights; add them back to compare with the plan's allocator peak
    return tracker.peak + sum(p.numel() * p.element_size() for p in model.parameters())


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny config on CPU: checks that the script runs")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    fields = dict(PRESETS["llama-0.5b-bench"])
    seq_len, device, scale = args.seq_len, "cuda", 1
    if args.cpu_smoke:
        fields.update(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=1024)
        seq_len, device, scale = 128, "cpu", 4
    elif not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --cpu-smoke")
    else:
        import os

        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    print(f"model: {fields['num_hidden_layers']} layers, hidden {fields['hidden_size']}, vocab {fields['vocab_size']}, "
          f"seq_len {seq_len}, device {device}")
    print(f"{'configuration':34} {'micro-batch':>11} {'plan GiB':>9} {'measured GiB':>13} {'plan/measured':>14} {'s':>6}")
    for label, precision, ckpt, loss, batch in CONFIGS:
        batch = max(1, batch // scale)
        est = estimate_memory(fields, seq_len=seq_len, micro_batch=batch, dtype="bf16", precision=precision,
                              gradient_checkpointing=ckpt, loss=loss)
        t0 = time.perf_counter()
        measured = run_one(fields, precision, ckpt, loss, batch, seq_len, device, args.steps)
        secs = time.perf_counter() - t0
        if device == "cuda":
            torch.cuda.empty_cache()
        print(f"{label:34} {batch:>11} {est.peak_allocated / 2**30:>9.3f} {measured / 2**30:>13.3f} "
              f"{est.peak_allocated / measured:>14.2f} {secs:>6.1f}", flush=True)


if __name__ == "__main__":
    main()
