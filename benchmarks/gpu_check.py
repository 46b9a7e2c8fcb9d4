"""Everything of ``weightprep train`` that only a GPU can show, in one command: one JSON file and a summary.

    python benchmarks/gpu_check.py --out gpu_check.json                  # one GPU, under 8 minutes on an H200
    python benchmarks/gpu_check.py --wheels DIR --out gpu_check.json     # install flash-attn etc. from wheels in DIR
    python benchmarks/gpu_check.py --cpu-smoke --out /tmp/smoke.json     # the same parts, tiny, on CPU (plumbing)

Parts (each timed, each failure recorded with its traceback, the others still run):

a. isolation: packed rows at micro-batch 4 through ``WeightedCollator()`` + ``weighted_lm_loss`` on the real
   flash-attention kernels (``flash_attention_2`` if flash-attn installs, else noted) and sdpa, bf16: each
   document's log-probs inside the batch vs the document alone; the same with position_ids only (the leak the
   varlen kwargs prevent) for scale.
b. TRL's Triton chunked log-prob kernel (the path ``weighted_lm_loss`` takes on CUDA) against a full-logits
   float32 reference, bf16 model, a vocabulary of several 32k tiles with a ragged last one: loss and gradients.
c. ``benchmarks/bench_train.py --device-run`` (trainer vs the seed recipe; goal >= 1.5x tokens/s, <= 0.5x memory).
d. ``benchmarks/plan_gpu_check.py`` (the plan vs ``torch.cuda.max_memory_allocated``; goal within 15%).
e. ``weightprep train`` on the sample shards with ``--precision bf16`` and ``--precision fp16`` (a GradScaler),
   a few steps each: finite losses, the scaler present for fp16, the device policy's choices.

flash-attn: installed with pip (from ``--wheels DIR`` when given: the device has no network); if no wheel
installs, the check says so and part (a) runs sdpa only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_data"


def install_flash_attn(wheels: Path | None) -> dict[str, Any]:
    """Try to make ``import flash_attn`` work; say how it went."""
    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None:
        return {"installed": True, "how": "already installed"}
    cmd = [sys.executable, "-m", "pip", "install", "-q", "flash-attn", "--no-build-isolation"]
    if wheels is not None:
        cmd += ["--no-index", "--find-links", str(wheels)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        ok = proc.returncode == 0 and subprocess.run([sys.executable, "-c", "import flash_attn"]).returncode == 0
        return {"installed": ok, "how": " ".join(cmd), "stderr": proc.stderr[-1500:]}
    except subprocess.TimeoutExpired:
        return {"installed": False, "how": " ".join(cmd), "stderr": "timed out after 180 s"}


def packed_rows(n_rows: int, seq_len: int, vocab: int, seed: int = 0) -> list[dict[str, Any]]:
    """Rows in the shard format: documents of 40-600 tokens (BOS .. EOS), weight-0 prompts, a pad tail."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_rows):
        ids, weights, pos, seg = [], [], [], []
        while True:
            n = int(rng.integers(max(8, seq_len // 50), max(9, seq_len // 3)))
            if len(ids) + n > seq_len - 8:
                break
            doc = [0, *rng.integers(3, vocab, size=n - 2).tolist(), 1]
            w = [0.0] * (n // 4) + rng.choice([0.5, 1.0, 2.0], size=n - n // 4).tolist()
            w[0] = 0.0
            ids += doc
            weights += w
            pos += list(range(n))
            seg.append(n)
        tail = seq_len - len(ids)
        ids += [2] * tail
        weights += [0.0] * tail
        pos += list(range(tail))
        seg.append(tail)
        w_a = np.asarray(weights, dtype=np.float32)
        ids_a = np.asarray(ids, dtype=np.int32)
        rows.append({"input_ids": ids_a, "labels": np.where(w_a > 0, ids_a, -100).astype(np.int32), "weights": w_a,
                     "position_ids": np.asarray(pos, dtype=np.int32), "seq_lengths": np.asarray(seg, dtype=np.int32)})  # fmt: skip
    return rows


def random_llama(vocab: int, hidden: int, layers: int, attn: str, device: str, dtype: Any) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
        num_attention_heads=max(4, hidden // 64), num_key_value_heads=max(2, hidden // 128),
        max_position_embeddings=8192, attn_implementation=attn, bos_token_id=0, eos_token_id=1, pad_token_id=2,
    )  # fmt: skip
    return LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()


def part_isolation(smoke: bool, flash: bool) -> dict[str, Any]:
    import torch

    from weightprep.train import WeightedCollator, weighted_lm_loss
    from weightprep.train.attention import VARLEN_KEYS

    device, dtype = ("cpu", torch.float32) if smoke else ("cuda", torch.bfloat16)
    seq_len, vocab = (128, 512) if smoke else (2048, 32000)
    rows = packed_rows(4, seq_len, vocab)
    collate = WeightedCollator()
    impls = ["sdpa"] + (["flash_attention_2"] if flash and not smoke else [])
    out: dict[str, Any] = {"micro_batch": 4, "seq_len": seq_len, "dtype": str(dtype), "documents": 0}
    for impl in impls:
        model = random_llama(vocab, 64 if smoke else 512, 2 if smoke else 4, impl, device, dtype)

        def to_dev(batch):
            return {k: (v.to(device) if isinstance(v, torch.Tensor) and k not in VARLEN_KEYS[:2] else v)
                    for k, v in batch.items()}  # fmt: skip

        with torch.no_grad():
            batch = collate(rows)
            for key in VARLEN_KEYS[:2]:
                batch[key] = batch[key].to(device)
            packed = weighted_lm_loss(model, to_dev(batch)).log_probs.float()
            worst, docs = 0.0, 0
            for b, row in enumerate(rows):
                start = 0
                for n in row["seq_lengths"].tolist()[:-1]:  # the last segment is the pad tail
                    doc = {k: row[k][start : start + n] for k in ("input_ids", "labels", "weights")}
                    doc["position_ids"] = row["position_ids"][start : start + n]
                    doc["seq_lengths"] = [n]
                    one = collate([doc])
                    for key in VARLEN_KEYS[:2]:
                        one[key] = one[key].to(device)
                    alone = weighted_lm_loss(model, to_dev(one)).log_probs.float()[0]
                    mask = alone != 0
                    worst = max(worst, (packed[b, start : start + n - 1] - alone)[mask].abs().max().item())
                    docs += 1
                    start += n
            # for scale: the model's own forward with position_ids only (no varlen kwargs, no mask)
            ids, pos = batch["input_ids"].to(device), batch["position_ids"].to(device)
            leak = model(input_ids=ids, position_ids=pos, use_cache=False).logits.float()
            iso = model(input_ids=ids, position_ids=pos, use_cache=False,
                        **{k: (batch[k].to(device) if k in VARLEN_KEYS[:2] else batch[k]) for k in VARLEN_KEYS}).logits.float()  # fmt: skip
        out[impl] = {
            "max_abs_logprob_diff_packed_vs_alone": worst,
            "max_abs_logit_diff_position_ids_only_vs_varlen": (leak - iso).abs().max().item(),
        }
        out["documents"] = docs
        del model
    out["flash_attention_2_checked"] = "flash_attention_2" in impls
    tol = 1e-4 if smoke else 0.1
    out["ok"] = all(out[i]["max_abs_logprob_diff_packed_vs_alone"] < tol for i in impls)
    return out


def part_triton(smoke: bool) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from weightprep.train import WeightedCollator, weighted_lm_loss

    device, dtype = ("cpu", torch.float32) if smoke else ("cuda", torch.bfloat16)
    vocab, hidden, seq_len = (1000, 64, 64) if smoke else (50257 + 32768, 1024, 2048)  # 3 tiles, ragged last
    model = random_llama(vocab, hidden, 2, "sdpa", device, dtype).train()
    rows = packed_rows(2 if smoke else 4, seq_len, vocab, seed=1)
    batch = {k: (v.to(device) if hasattr(v, "to") else v) for k, v in WeightedCollator()(rows).items()}
    out = weighted_lm_loss(model, batch)
    out.loss.backward()
    ours = {n: p.grad.float().clone() for n, p in model.named_parameters() if n in ("lm_head.weight",)}
    ours["layers.0.q"] = model.model.layers[0].self_attn.q_proj.weight.grad.float().clone()
    model.zero_grad()
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits.float()
    labels, weights = batch["labels"][:, 1:], batch["weights"][:, 1:]
    nll = F.cross_entropy(logits[:, :-1].reshape(-1, vocab), labels.reshape(-1), ignore_index=-100, reduction="none")
    w = torch.where(labels.reshape(-1) != -100, weights.reshape(-1), 0)
    ref = (nll * w).sum() / w.sum()
    ref.backward()
    refs = {"lm_head.weight": model.lm_head.weight.grad.float(),
            "layers.0.q": model.model.layers[0].self_attn.q_proj.weight.grad.float()}  # fmt: skip

    def rel(a, b):
        return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()

    result = {
        "device": device, "dtype": str(dtype), "vocab": vocab, "tokens": int(batch["input_ids"].numel()),
        "loss": out.loss.item(), "reference_loss": ref.item(), "loss_rel_diff": abs(out.loss.item() - ref.item()) / ref.item(),
        "grad_rel_diff": {k: rel(ours[k], refs[k]) for k in refs},
    }  # fmt: skip
    tol = 1e-5 if smoke else 2e-2
    result["ok"] = result["loss_rel_diff"] < tol and all(v < 10 * tol for v in result["grad_rel_diff"].values())
    return result


def run_script(args: list[str], timeout: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)
        return {"rc": proc.returncode, "seconds": time.perf_counter() - t0, "stdout": proc.stdout[-6000:],
                "stderr": proc.stderr[-3000:] if proc.returncode else ""}  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        return {"rc": None, "timed_out_after_s": timeout, "stdout": (exc.stdout or b"")[-3000:].decode(errors="replace")}


def part_trainer_vs_seed(smoke: bool, steps: int, tmp: Path) -> dict[str, Any]:
    out = tmp / "bench_train.json"
    args = [str(REPO / "benchmarks" / "bench_train.py"), "--json", str(out)]
    args += ["--steps", "2"] if smoke else ["--device-run", "--steps", str(steps)]
    result = run_script(args, timeout=300)
    if out.is_file():
        result["results"] = json.loads(out.read_text())
    return result


def part_plan(smoke: bool) -> dict[str, Any]:
    args = [str(REPO / "benchmarks" / "plan_gpu_check.py")] + (["--cpu-smoke"] if smoke else [])
    return run_script(args, timeout=240)


def part_precisions(smoke: bool, tmp: Path) -> dict[str, Any]:
    shards = tmp / "shards"
    build = run_script(["-m", "weightprep", "build", str(SAMPLE / "raw.jsonl"), "--out", str(shards), "--seq-len",
                        "512", "--overwrite"], timeout=120)  # fmt: skip
    result: dict[str, Any] = {"build_rc": build["rc"]}
    for precision in ("fp32",) if smoke else ("bf16", "fp16"):
        run_dir = tmp / f"run-{precision}"
        res = run_script(["-m", "weightprep", "train", str(shards), "--model", str(SAMPLE / "tiny-llama"),
                          "--output-dir", str(run_dir), "--max-steps", "6", "--lr", "1e-3", "--logging-steps", "1",
                          "--precision", precision, "--save-steps", "1000"], timeout=180)  # fmt: skip
        summary_file = run_dir / "weightprep_train.json"
        entry: dict[str, Any] = {"rc": res["rc"], "stderr": res.get("stderr", "")[-1500:]}
        if summary_file.is_file():
            entry["summary"] = json.loads(summary_file.read_text())
        state = sorted(run_dir.glob("checkpoint-*/trainer_state.json"))
        losses = [h["loss"] for h in json.loads(state[-1].read_text())["log_history"] if "loss" in h] if state else []
        entry["losses"] = losses
        entry["ok"] = res["rc"] == 0 and bool(losses) and all(x == x and abs(x) < 1e4 for x in losses)
        result[precision] = entry
    if not smoke:  # the fp16 trainer holds a GradScaler (accelerate's), the bf16 one none
        import torch
        from trl import SFTConfig

        from weightprep.tokenizer import load_tokenizer
        from weightprep.train import WeightedSFTTrainer, load_shards

        for precision in ("bf16", "fp16"):
            model = random_llama(4096, 256, 2, "sdpa", "cuda", torch.float32)
            args = SFTConfig(str(tmp / f"scaler-{precision}"), bf16=precision == "bf16", fp16=precision == "fp16",
                             report_to="none", max_steps=2, save_strategy="no")  # fmt: skip
            trainer = WeightedSFTTrainer(model, args=args, train_dataset=load_shards(shards),
                                         processing_class=load_tokenizer(None))  # fmt: skip
            trainer.train()
            result[precision]["grad_scaler"] = trainer.accelerator.scaler is not None
        result["ok"] = all(result[p]["ok"] for p in ("bf16", "fp16")) and result["fp16"]["grad_scaler"]
    else:
        result["ok"] = result["fp32"]["ok"]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    ap.add_argument("--wheels", type=Path, help="a folder of wheels (flash-attn, ...) to install from, offline")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU: checks the script's plumbing")
    ap.add_argument("--bench-steps", type=int, default=40, help="timed steps of part (c) per recipe")
    ap.add_argument("--parts", default="abcde", help="which parts to run")
    args = ap.parse_args()
    import torch

    smoke = args.cpu_smoke
    if not smoke and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --cpu-smoke to check the script on CPU")
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "smoke": smoke}
    if not smoke:
        props = torch.cuda.get_device_properties(0)
        report["gpu"] = {"name": props.name, "capability": f"{props.major}.{props.minor}",
                         "memory_gib": props.total_memory / 2**30, "torch": torch.__version__}  # fmt: skip
    flash = {"installed": False, "how": "not tried (--cpu-smoke)"} if smoke else install_flash_attn(args.wheels)
    report["flash_attn"] = flash
    parts = {
        "a_isolation": lambda: part_isolation(smoke, flash["installed"]),
        "b_triton_kernel": lambda: part_triton(smoke),
        "c_trainer_vs_seed": lambda: part_trainer_vs_seed(smoke, args.bench_steps, tmp),
        "d_plan_vs_measured": lambda: part_plan(smoke),
        "e_precisions": lambda: part_precisions(smoke, tmp),
    }
    with tempfile.TemporaryDirectory(prefix="wp-gpu-check-") as tmp_name:
        tmp = Path(tmp_name)
        for name, fn in parts.items():
            if name[0] not in args.parts:
                continue
            t0 = time.perf_counter()
            try:
                report[name] = fn()
            except Exception:  # record and go on: one broken part must not hide the others
                report[name] = {"ok": False, "error": traceback.format_exc()[-4000:]}
            report[name]["seconds"] = round(time.perf_counter() - t0, 1)
            args.out.write_text(json.dumps(report, indent=2, default=str))  # what is done survives a timeout
            print(f"{name}: ok={report[name].get('ok', report[name].get('rc') == 0)} ({report[name]['seconds']} s)",
                  flush=True)  # fmt: skip
    print(json.dumps({k: v for k, v in report.items() if k in ("gpu", "flash_attn")}, default=str))
    for key in ("a_isolation", "b_triton_kernel"):
        if key in report:
            print(key, json.dumps({k: v for k, v in report[key].items() if k != "error"}, default=str)[:800])
    for key in ("c_trainer_vs_seed", "d_plan_vs_measured"):
        if key in report:
            print(f"--- {key}\n{report[key].get('stdout', report[key].get('error', ''))[-2500:]}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
