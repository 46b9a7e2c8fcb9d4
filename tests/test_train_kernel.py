"""TRL's chunked log-prob kernel as ``weighted_lm_loss`` runs it, over several vocabulary and token tiles.

The Triton kernels (what every CUDA user runs) are driven on CPU through Triton's interpreter
(``TRITON_INTERPRET=1``, ``pip install triton``), in a subprocess (``tests/kernel_worker.py``); the torch fallback
(what CPU runs) in-process. Both against the full-logits reference: loss and every gradient, fp32 to ~1e-7, and
bf16/fp16 models within loose bounds. Vocabulary 300 in tiles of 128 (ragged last), token tiles of 37 (ragged).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import kernel_worker as kw
import pytest

HERE = Path(__file__).resolve().parent


def _check(out: dict) -> None:
    for family in kw.FAMILIES:
        r = out[family]
        assert r["same_params"] and r["finite"], family
        assert r["loss_diff"] < 1e-5, (family, r)
        assert r["grad_diff"] < 1e-6 * max(1.0, r["grad_scale"] * 10), (family, r)
    for dtype in ("bfloat16", "float16"):
        r = out[dtype]
        assert r["same_params"] and r["finite"], dtype
        assert r["loss_diff"] < 5e-3 * abs(r["ref"]), (dtype, r)
        assert r["grad_diff"] < 0.05 * r["grad_scale"], (dtype, r)
    # 5 runs; each: 3 vocabulary tiles x at least 2 token tiles, forward and backward
    assert out["kernel_calls"]["forward"] >= 5 * 3 * 2 and out["kernel_calls"]["backward"] >= 5 * 3 * 2


def test_torch_path_over_several_vocabulary_and_token_tiles(monkeypatch):
    _check(kw.run_all("torch", monkeypatch.setattr))


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed (pip install triton)")
def test_triton_kernels_in_the_interpreter_match_full_logits():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(HERE / "kernel_worker.py"), "triton"], capture_output=True, text=True,
                          timeout=600, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed (pip install triton)")
def test_the_plan_models_the_bytes_the_kernel_allocates():
    """``weighted_loss_bytes`` against the kernel's own allocations inside the real ``weighted_lm_loss``, on its
    Triton path (the kernels fold tiles in registers, so the torch tensors are all a GPU allocates). One CPU-only
    difference is added to the prediction: off CUDA, ``_addmm_fp32`` upcasts its bf16 operands (a tile and a weight or
    hidden chunk, fp32) where CUDA accumulates with ``out_dtype=float32``."""
    from weightprep.plan.estimate import weighted_loss_bytes

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(HERE / "kernel_worker.py"), "memory"], capture_output=True, text=True,
                          timeout=600, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for case, m in json.loads(proc.stdout.strip().splitlines()[-1]).items():
        n, h, v, vt = m["n"], m["hidden"], m["vocab"], m["chunk"]
        plan = weighted_loss_bytes(n, h, v, compute=m["compute"], hidden_dtype=m["hidden_dtype"],
                                   weight_dtype=m["weight_dtype"], head_trainable=case != "frozen-head", vocab_tile=vt)  # fmt: skip
        backward = plan["backward"]
        if m["compute"] != 4:  # the CPU-only upcasts, alive inside the tile loop (before the gradients' casts)
            grad_casts = plan["head_cast"] + (n * h * m["hidden_dtype"] if m["hidden_dtype"] != 4 else 0)
            backward = max(backward, backward - grad_casts + n * vt * 4 + max(vt, n) * h * 4)
        assert abs(plan["forward"] / m["forward"] - 1) < 0.02, (case, plan, m)
        assert abs(backward / m["backward"] - 1) < 0.02, (case, backward, m)
        if case != "frozen-head":  # the whole head's fp32 gradient, whatever the sharding
            assert m["backward"] > v * h * 4
