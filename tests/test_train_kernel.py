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
