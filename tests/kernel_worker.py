"""Runs ``weighted_lm_loss`` through TRL's chunked log-prob kernel against the full-logits reference; prints JSON.

    python tests/kernel_worker.py triton   # the Triton kernels, in Triton's CPU interpreter (TRITON_INTERPRET=1)
    python tests/kernel_worker.py torch    # the kernel's torch fallback (what CPU runs by default)

    python tests/kernel_worker.py memory   # bytes the kernel allocates (Triton path, interpreter), for the plan

``tests/test_train_kernel.py`` runs the torch mode in-process, the others in a subprocess.
A separate process because the interpreter must be switched on before ``triton`` and TRL's kernel module are first
imported. The Triton path is forced by replacing ``trl.kernels.chunked_logprob._use_triton`` (True only on
CUDA/XPU otherwise), so the real ``_forward_kernel`` / ``_backward_kernel`` run, tile by tile. The vocabulary (300)
spans three tiles of 128 with a ragged last one, and the token tile is cut to 37 rows so several token tiles run
too, the last ragged; LM heads: Llama (untied), Phi (bias) and Gemma-2 (softcap).
"""

from __future__ import annotations

import json
import os
import sys

if __name__ == "__main__" and sys.argv[1:] in (["triton"], ["memory"]):
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported

sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402
import train_support as ts  # noqa: E402
import trl.kernels.chunked_logprob as ck  # noqa: E402

from weightprep.train import WeightedCollator, weighted_lm_loss  # noqa: E402

VOCAB, CHUNK, TOKEN_TILE = 300, 128, 37
FAMILIES = ("llama", "phi-bias", "gemma2-softcap")


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}


def run(family: str, dtype: torch.dtype) -> dict[str, float]:
    model = ts.tiny_family(family, VOCAB)
    batch = WeightedCollator()(ts.random_rows(5, 3, 64, VOCAB, packed=False))
    model.zero_grad()
    ref = ts.reference_loss(model, batch, "weight")
    ref.backward()
    ref_grads = _grads(model)
    model = model.to(dtype)
    model.zero_grad()
    ours = weighted_lm_loss(model, batch, normalize="weight", vocab_chunk=CHUNK).loss
    ours.backward()
    grads = _grads(model)
    diff = max(float((grads[n] - g).abs().max()) for n, g in ref_grads.items())
    scale = max(float(g.abs().max()) for g in ref_grads.values())
    return {
        "loss": ours.item(), "ref": ref.item(), "loss_diff": abs(ours.item() - ref.item()), "grad_diff": diff,
        "grad_scale": scale, "finite": bool(torch.isfinite(ours)) and all(bool(torch.isfinite(g).all()) for g in grads.values()),
        "same_params": sorted(grads) == sorted(ref_grads),
    }  # fmt: skip


class _Counting:
    """Counts the launches (``kernel[grid](...)``) or calls (``tile_fn(...)``) of one kernel function."""

    def __init__(self, fn, calls: dict[str, int], name: str) -> None:
        self.fn, self.calls, self.name = fn, calls, name

    def __getitem__(self, grid):
        self.calls[self.name] += 1
        return self.fn[grid]

    def __call__(self, *args, **kwargs):
        self.calls[self.name] += 1
        return self.fn(*args, **kwargs)


def run_all(mode: str, patch) -> dict:
    """Every case, with ``patch(module, name, value)`` setting the kernel's token tile and, for ``triton``, forcing
    the Triton kernels; counts the kernel launches so a test can tell that the intended path ran, tile by tile."""
    calls = {"forward": 0, "backward": 0}
    patch(ck, "TOKEN_CHUNK_SIZE", TOKEN_TILE)
    if mode == "triton":
        patch(ck, "_use_triton", lambda device: True)
    names = {"forward": "_forward_kernel" if mode == "triton" else "_forward_tile",
             "backward": "_backward_kernel" if mode == "triton" else "_backward_tile"}  # fmt: skip
    for key, name in names.items():
        patch(ck, name, _Counting(getattr(ck, name), calls, key))
    out: dict = {family: run(family, torch.float32) for family in FAMILIES}
    for dtype in (torch.bfloat16, torch.float16):
        out[str(dtype).removeprefix("torch.")] = run("llama", dtype)
    out["kernel_calls"] = calls
    return out


def kernel_memory(case: str) -> dict[str, int]:
    """Bytes the kernel allocates inside the real ``weighted_lm_loss``, forward and backward (peak of new storages,
    tracked per op), for one case: ``fp32``, ``bf16`` (bf16 weights), ``mixed`` (fp32 weights under bf16
    autocast) or ``frozen-head`` (fp32, LM head not trained, as under LoRA). Returns the measurement and what the
    kernel saw, for ``weightprep.plan.estimate.weighted_loss_bytes``."""
    from memory_recipes import LiveTensorTracker, triton_path_in_interpreter

    model = ts.tiny_llama(3000, hidden=64)
    if case == "bf16":
        model = model.to(torch.bfloat16)
    if case == "frozen-head":
        model.lm_head.weight.requires_grad_(False)
    batch = WeightedCollator()(ts.random_rows(9, 3, 80, 3000, packed=False))
    seen: dict[str, int] = {}
    fn = ck.ChunkedLogProbFunction
    forward, backward = fn.forward, fn.backward

    def tracked(name, inner):
        def run(ctx, *args):
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            if name == "backward":
                tensors += [t for t in ctx.saved_tensors if t is not None]
            with LiveTensorTracker(tensors) as tracker:
                out = inner(ctx, *args)
            seen[name] = tracker.peak
            if name == "forward":
                h, w = args[0], args[1]
                seen.update(n=h.shape[0], hidden=h.shape[1], vocab=w.shape[0], hidden_dtype=h.element_size(),
                            weight_dtype=w.element_size(), chunk=args[5])  # fmt: skip
            return out

        return staticmethod(run)

    fn.forward, fn.backward = tracked("forward", forward), tracked("backward", backward)
    try:
        with triton_path_in_interpreter():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case == "mixed"):
                loss = weighted_lm_loss(model, batch, vocab_chunk=1024).loss
            loss.backward()
    finally:
        fn.forward, fn.backward = staticmethod(forward), staticmethod(backward)
    seen["compute"] = 2 if case in ("bf16", "mixed") else 4
    return seen


if __name__ == "__main__":
    if sys.argv[1:2] == ["memory"]:
        print(json.dumps({case: kernel_memory(case) for case in ("fp32", "bf16", "mixed", "frozen-head")}))
    else:
        print(json.dumps(run_all(sys.argv[1], setattr)))
