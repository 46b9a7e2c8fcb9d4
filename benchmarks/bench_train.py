"""Seed recipe vs ``weightprep train`` on the same documents: tokens/s and peak memory, with their ratios.

The seed recipe is the usual hand-written weighted SFT: every document padded to the maximum length (one per
row, with an attention mask), a plain ``transformers.Trainer`` whose ``compute_loss`` takes the full logits,
upcasts them to float32 and returns the per-token weighted ``.mean()``. weightprep: the same documents packed
best-fit-decreasing into rows of the same length, ``WeightedSFTTrainer`` (weighted loss on the supervised positions
only, tiled LM head, exact normalization). Both runs use the same model, row length, rows per micro-batch,
precision (bf16 on a GPU that has it, fp32 on CPU), gradient checkpointing (on with a GPU) and optimizer, so the
ratios measure padding, logits and loss, not settings.

Each run is a fresh process. tokens/s counts real (non-pad) tokens over the timed steps (after warm-up steps);
peak memory is ``torch.cuda.max_memory_allocated`` on GPU and the process's peak RSS on CPU (which includes the
interpreter and libraries, roughly 0.5-1 GB, in both runs alike).

    python benchmarks/bench_train.py                 # CPU: tiny random Llama, ~1-2 minutes
    python benchmarks/bench_train.py --device-run    # GPU: ~0.5B random Llama, bf16, seq-len 2048, ~5 minutes
    python benchmarks/bench_train.py --shards DIR    # documents from a `weightprep build` output instead
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from weightprep.constants import IGNORE_INDEX

PRESETS: dict[str, dict[str, Any]] = {
    # A model whose vocabulary matters (32k) yet quick on two CPU cores
    "cpu": dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=176, vocab=32000, seq_len=512,
                micro_batch=4, steps=6, warmup=2, docs=400),
    # ~0.54B parameters (Llama-3-sized 128k vocabulary, untied head), bf16, rows of 2048 tokens
    "device": dict(hidden=1024, layers=24, heads=16, kv_heads=8, intermediate=2816, vocab=128256, seq_len=2048,
                   micro_batch=8, steps=150, warmup=10, docs=12000),
}  # fmt: skip


# -- data -----------------------------------------------------------------------------------------------------------
def synthetic_documents(
    n: int, seq_len: int, vocab: int, seed: int = 0
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Instruction-like documents: a weight-0 prompt, a weight-1 answer (10% with a weight-2 span), EOS weight 1.

    Lengths are log-normal (median ``seq_len / 8``), so padding each to ``seq_len`` wastes what it wastes in practice.
    """
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(seq_len / 8), 0.8, size=n).astype(int), 8, seq_len)
    docs = []
    for length in lengths:
        ids = rng.integers(3, vocab, size=length).astype(np.int32)
        ids[0], ids[-1] = 0, 1  # BOS, EOS
        weights = np.ones(length, dtype=np.float32)
        prompt = int(length * rng.uniform(0.2, 0.6))
        weights[: max(prompt, 1)] = 0.0
        if rng.random() < 0.1 and length - prompt > 8:
            start = int(rng.integers(prompt, length - 4))
            weights[start : start + 4] = 2.0
        docs.append((ids, weights))
    return docs


def documents_from_shards(path: Path) -> tuple[list[tuple[np.ndarray, np.ndarray]], int, int]:
    """Documents (ids, weights) of a weightprep shard directory, its row length and the model vocabulary needed."""
    from weightprep.train import load_shards

    shards = load_shards(path)
    docs = []
    for row in shards.dataset.with_format("numpy"):
        start = 0
        for n in row["seq_lengths"]:
            w = row["weights"][start : start + n]
            if w.sum() > 0:  # a document; the pad tail has no weight at all
                docs.append((row["input_ids"][start : start + n].astype(np.int32), w.astype(np.float32)))
            start += int(n)
    return docs, shards.seq_len, int(shards.tokenizer.get("vocab_size") or 0)


def write_datasets(docs, seq_len: int, out: Path, rows_needed: int, pad: int = 2) -> dict[str, Any]:
    """``out/packed`` (weightprep shards, best-fit-decreasing) and ``out/padded`` (one document per row), each
    cut to the ``rows_needed`` rows the runs consume (fill is reported over all rows)."""
    import datasets

    from weightprep.constants import FORMAT_NAME, FORMAT_VERSION, MANIFEST_NAME
    from weightprep.stages.pack import best_fit_decreasing

    def row(parts):
        ids = np.full(seq_len, pad, np.int32)
        w = np.zeros(seq_len, np.float32)
        pos = np.zeros(seq_len, np.int32)
        seg, at = [], 0
        for d_ids, d_w in parts:
            n = len(d_ids)
            ids[at : at + n], w[at : at + n], pos[at : at + n] = d_ids, d_w, np.arange(n)
            seg.append(n)
            at += n
        if at < seq_len:
            pos[at:] = np.arange(seq_len - at)
            seg.append(seq_len - at)
        labels = np.where(w > 0, ids, IGNORE_INDEX).astype(np.int32)
        return {"input_ids": ids, "labels": labels, "weights": w, "position_ids": pos,
                "seq_lengths": np.asarray(seg, np.int32), "real": at}  # fmt: skip

    bins = best_fit_decreasing(np.array([len(d[0]) for d in docs]), seq_len)
    packed = [row([docs[i] for i in b]) for b in bins]
    padded = [row([d]) for d in docs]
    for r, d in zip(padded, docs, strict=True):
        r["attention_mask"] = (np.arange(seq_len) < len(d[0])).astype(np.int8)
    stats = {}
    for name, rows in (("packed", packed), ("padded", padded)):
        stats[name] = {"rows": len(rows), "real_tokens": int(sum(r["real"] for r in rows))}
        rows = rows[:rows_needed]
        cols = {k: np.stack([r[k] for r in rows]) for k in rows[0] if k != "seq_lengths"}
        cols["seq_lengths"] = [r["seq_lengths"].tolist() for r in rows]
        datasets.Dataset.from_dict(cols).save_to_disk(str(out / name))
    manifest = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "weightprep_version": "bench",
                "config": {"seq_len": seq_len, "packed": True}, "tokenizer": {}, "counts": stats["packed"]}  # fmt: skip
    (out / "packed" / MANIFEST_NAME).write_text(json.dumps(manifest))
    return stats


# -- one run (child process) --------------------------------------------------------------------------------------
def run_one(which: str, data: Path, cfg: dict[str, Any], result_path: Path) -> None:
    import torch
    from torch.utils.data import SequentialSampler
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    from weightprep.train import WeightedCollator, WeightedSFTTrainer, load_shards
    from weightprep.train.device import choose_precision
    from weightprep.train.trainer import peak_memory

    cuda = torch.cuda.is_available()
    # by compute capability (is_bf16_supported() counts emulation): fp16 would need a scaler the seed lacks
    bf16 = cuda and choose_precision("auto", torch.cuda.get_device_capability()) == "bf16"
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], num_hidden_layers=cfg["layers"],
            num_attention_heads=cfg["heads"], num_key_value_heads=cfg["kv_heads"],
            intermediate_size=cfg["intermediate"], max_position_embeddings=max(2048, cfg["seq_len"]),
            tie_word_embeddings=False, attn_implementation="sdpa", use_cache=False,
        )
    )  # fmt: skip
    n_params = sum(p.numel() for p in model.parameters())
    total_steps = cfg["warmup"] + cfg["steps"]
    common = dict(
        output_dir=str(result_path.parent / f"run-{which}"), per_device_train_batch_size=cfg["micro_batch"],
        gradient_accumulation_steps=1, max_steps=total_steps, learning_rate=1e-4, lr_scheduler_type="constant",
        bf16=bf16, use_cpu=not cuda, save_strategy="no", report_to="none", logging_steps=10**6, disable_tqdm=True,
        activation_checkpointing=cuda, dataloader_num_workers=0, seed=0,
    )  # fmt: skip
    real_per_batch: list[int] = []
    marks: dict[str, float] = {}

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if state.global_step == cfg["warmup"]:
                if cuda:
                    torch.cuda.synchronize()
                marks["start"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if state.global_step == total_steps:
                if cuda:
                    torch.cuda.synchronize()
                marks["end"] = time.perf_counter()

    def counting(collate):
        def wrapped(rows):
            real_per_batch.append(int(sum(r["real"] for r in rows)))
            return collate(rows)

        return wrapped

    if which == "seed":
        import datasets

        ds = datasets.load_from_disk(str(data / "padded"))

        def stack(rows):
            batch = {k: torch.as_tensor(np.stack([np.asarray(r[k]) for r in rows])) for k in
                     ("input_ids", "labels", "weights", "attention_mask")}  # fmt: skip
            for k in ("input_ids", "labels", "attention_mask"):
                batch[k] = batch[k].long()
            return batch

        class SeedTrainer(Trainer):
            """The usual hand-written weighted loss: full logits in float32, weighted per-token mean."""

            def _get_train_sampler(self, *a, **k):
                return SequentialSampler(self.train_dataset)

            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                weights, labels = inputs.pop("weights"), inputs.pop("labels")
                logits = model(**inputs, use_cache=False).logits.float()
                nll = torch.nn.functional.cross_entropy(
                    logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1),
                    reduction="none", ignore_index=IGNORE_INDEX,
                )  # fmt: skip
                loss = (nll * weights[:, 1:].reshape(-1)).mean()
                return (loss, logits) if return_outputs else loss

        trainer = SeedTrainer(
            model=model, args=TrainingArguments(remove_unused_columns=False, **common), train_dataset=ds,
            data_collator=counting(stack), callbacks=[Timer()],
        )  # fmt: skip
    else:
        from trl import SFTConfig

        from weightprep.tokenizer import load_tokenizer

        class BenchTrainer(WeightedSFTTrainer):
            def _get_train_sampler(self, *a, **k):
                return SequentialSampler(self.train_dataset)

            def _set_signature_columns_if_needed(self):  # keep the benchmark's `real` count for the collator
                super()._set_signature_columns_if_needed()
                if "real" not in self._signature_columns:
                    self._signature_columns.append("real")

        shards = load_shards(data / "packed")
        trainer = BenchTrainer(
            model, args=SFTConfig(**common), train_dataset=shards, processing_class=load_tokenizer(None),
            data_collator=counting(WeightedCollator(packed=True)), callbacks=[Timer()],
        )  # fmt: skip
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    timed = real_per_batch[cfg["warmup"] : total_steps]
    seconds = marks["end"] - marks["start"]
    result = {
        "which": which, "params": n_params, "device": "cuda" if cuda else "cpu", "bf16": bf16,
        "timed_steps": cfg["steps"], "real_tokens": sum(timed), "seconds": seconds,
        "tokens_per_second": sum(timed) / seconds,
        "peak_memory_gib": peak_memory(torch.device("cuda" if cuda else "cpu"))[1],
        "final_loss": float(trainer.state.log_history[-1].get("train_loss", float("nan"))),
    }  # fmt: skip
    result_path.write_text(json.dumps(result))


# -- driver ---------------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device-run", action="store_true", help="the ~0.5B GPU preset (bf16, seq-len 2048)")
    parser.add_argument("--shards", type=Path, help="take the documents from a `weightprep build` output")
    parser.add_argument("--steps", type=int, help="timed steps per run (after the warm-up steps)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--_child", nargs=3, metavar=("WHICH", "DATA", "RESULT"), help=argparse.SUPPRESS)
    parser.add_argument("--_cfg", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._child:
        which, data, result = args._child
        run_one(which, Path(data), json.loads(args._cfg), Path(result))
        return

    cfg = dict(PRESETS["device" if args.device_run else "cpu"])
    if args.steps:
        cfg["steps"] = args.steps
    with tempfile.TemporaryDirectory(prefix="wp-bench-") as tmp:
        tmp_path = Path(tmp)
        if args.shards:
            docs, cfg["seq_len"], vocab = documents_from_shards(args.shards)
            cfg["vocab"] = max(cfg["vocab"], vocab)
        else:
            docs = synthetic_documents(cfg["docs"], cfg["seq_len"], cfg["vocab"])
        need_rows = (cfg["warmup"] + cfg["steps"]) * cfg["micro_batch"]
        stats = write_datasets(docs, cfg["seq_len"], tmp_path, need_rows)
        for name in ("packed", "padded"):
            if stats[name]["rows"] < need_rows:
                sys.exit(
                    f"{name}: {stats[name]['rows']} rows < {need_rows} needed; lower --steps or add documents"
                )
        print(f"config: {json.dumps(cfg)}")
        for name, s in stats.items():
            fill = s["real_tokens"] / (s["rows"] * cfg["seq_len"])
            print(f"  {name}: {s['rows']} rows of {cfg['seq_len']}, fill {100 * fill:.1f}%")
        results = {}
        for which in ("seed", "weightprep"):
            out = tmp_path / f"{which}.json"
            cmd = [
                sys.executable,
                __file__,
                "--_child",
                which,
                str(tmp_path),
                str(out),
                "--_cfg",
                json.dumps(cfg),
            ]
            env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF",
                                                                           "expandable_segments:True")}  # fmt: skip
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                print(proc.stdout[-2000:], proc.stderr[-6000:], file=sys.stderr)
                results[which] = {"which": which, "error": f"exit {proc.returncode}"}
                continue
            results[which] = json.loads(out.read_text())
            print(f"  {which}: done in {time.perf_counter() - t0:.0f} s")
    report(results, cfg)
    if args.json:
        args.json.write_text(json.dumps({"config": cfg, "results": results}, indent=2))


def report(results: dict[str, dict[str, Any]], cfg: dict[str, Any]) -> None:
    seed, ours = results.get("seed", {}), results.get("weightprep", {})
    any_ok = seed if "tokens_per_second" in seed else ours
    mem_kind = "max_memory_allocated" if any_ok.get("device") == "cuda" else "peak RSS"
    print(f"\n{any_ok.get('params', 0) / 1e6:.1f}M params, {any_ok.get('device', '?')}, "
          f"bf16={any_ok.get('bf16')}, rows {cfg['micro_batch']} x {cfg['seq_len']}, {cfg['steps']} timed steps")  # fmt: skip
    print(f"{'recipe':<12} {'tokens/s':>12} {'peak GiB (' + mem_kind + ')':>34} {'final loss':>11}")
    for name, r in (("seed", seed), ("weightprep", ours)):
        if "error" in r or not r:
            print(f"{name:<12} {'failed: ' + r.get('error', 'not run'):>12}")
            continue
        print(
            f"{name:<12} {r['tokens_per_second']:>12.1f} {r['peak_memory_gib']:>34.3f} {r['final_loss']:>11.4f}"
        )
    print(
        "(final loss: each recipe's own normalization; the seed's .mean() divides by every position, pads included)"
    )
    if "tokens_per_second" in seed and "tokens_per_second" in ours:
        print(f"ratios weightprep / seed: tokens/s {ours['tokens_per_second'] / seed['tokens_per_second']:.2f}x, "
              f"peak memory {ours['peak_memory_gib'] / seed['peak_memory_gib']:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
