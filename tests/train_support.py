"""Helpers for the trainer tests: tiny models from config objects, shard rows that follow the format contract,
shard directories on disk, and an independent reference loss (full logits, explicit per-token loop).

Everything is offline and CPU-sized. Rows are generated here rather than by ``weightprep build`` so the trainer
tests depend only on the documented shard format, not on the build pipeline's code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from weightprep.constants import (
    ATTENTION_MASK,
    FORMAT_NAME,
    FORMAT_VERSION,
    IGNORE_INDEX,
    INPUT_IDS,
    LABELS,
    MANIFEST_NAME,
    POSITION_IDS,
    SEQ_LENGTHS,
    WEIGHTS,
)

BOS, EOS, PAD = 0, 1, 2


def tiny_llama(
    vocab: int = 96, *, seed: int = 0, tie: bool = False, layers: int = 2, hidden: int = 32, **kw: Any
):
    """A random LlamaForCausalLM small enough for exact float32 checks on CPU (sdpa attention)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=kw.pop("max_position_embeddings", 512),
        tie_word_embeddings=tie,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        attn_implementation="sdpa",
        **kw,
    )
    return LlamaForCausalLM(cfg).eval()


def tiny_family(name: str, vocab: int = 96):
    """Tiny models whose LM heads differ: untied, tied, GPT-2 (Conv1D body, tied), bias (Phi), softcap (Gemma2),
    logits divided (Granite) or multiplied (Cohere) by a constant."""
    import transformers as tf

    torch.manual_seed(0)
    common = {"vocab_size": vocab, "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD}
    if name == "llama":
        return tiny_llama(vocab)
    if name == "qwen2-tied":
        cfg = tf.Qwen2Config(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True, **common,
        )  # fmt: skip
        return tf.Qwen2ForCausalLM(cfg).eval()
    if name == "gpt2":
        cfg = tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=256, **common)
        return tf.GPT2LMHeadModel(cfg).eval()
    if name == "phi-bias":
        cfg = tf.PhiConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=256, **common,
        )  # fmt: skip
        model = tf.PhiForCausalLM(cfg).eval()
        assert model.lm_head.bias is not None
        with torch.no_grad():
            model.lm_head.bias.normal_(0, 1.0)  # a bias large enough to matter
        return model
    if name == "gemma2-softcap":
        cfg = tf.Gemma2Config(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=256, final_logit_softcapping=1.5,
            attn_implementation="eager", **common,
        )  # fmt: skip
        return tf.Gemma2ForCausalLM(cfg).eval()
    if name == "granite-scaling":  # Granite divides its logits by logits_scaling
        cfg = tf.GraniteConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, logits_scaling=4.0, **common,
        )  # fmt: skip
        return tf.GraniteForCausalLM(cfg).eval()
    if name == "cohere-scale":  # Cohere multiplies its logits by logit_scale
        cfg = tf.CohereConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, logit_scale=2.5, **common,
        )  # fmt: skip
        return tf.CohereForCausalLM(cfg).eval()
    raise AssertionError(name)


def make_document(
    rng: np.random.Generator, length: int, vocab: int, *, zero_frac: float = 0.3
) -> dict[str, Any]:
    """One document: BOS, random body, EOS; random weights in [0.25, 3] with a weight-0 prompt span."""
    body = rng.integers(3, vocab, size=length - 2)
    ids = np.concatenate([[BOS], body, [EOS]]).astype(np.int32)
    weights = rng.uniform(0.25, 3.0, size=length).astype(np.float32)
    prompt = int(rng.integers(0, max(1, int(length * zero_frac)) + 1))
    weights[:prompt] = 0.0
    weights[0] = 0.0  # the first token of a document is never a target
    return {"ids": ids, "weights": weights}


def pack_rows(
    docs: list[list[dict[str, Any]]], seq_len: int, *, packed: bool = True, pad: int = PAD
) -> list[dict]:
    """Shard rows per the contract: each inner list becomes one row (packed) or must hold one doc (unpacked)."""
    rows = []
    for group in docs:
        ids, weights, pos, seg = [], [], [], []
        for doc in group:
            ids.extend(doc["ids"].tolist())
            weights.extend(doc["weights"].tolist())
            pos.extend(range(len(doc["ids"])))
            seg.append(len(doc["ids"]))
        used = len(ids)
        assert used <= seq_len, (used, seq_len)
        if used < seq_len:
            tail = seq_len - used
            ids.extend([pad] * tail)
            weights.extend([0.0] * tail)
            pos.extend(range(tail))
            seg.append(tail)
        w = np.asarray(weights, dtype=np.float32)
        ids_a = np.asarray(ids, dtype=np.int32)
        labels = np.where(w > 0, ids_a, IGNORE_INDEX).astype(np.int32)
        row = {
            INPUT_IDS: ids_a,
            LABELS: labels,
            WEIGHTS: w,
            POSITION_IDS: np.asarray(pos, dtype=np.int32),
            SEQ_LENGTHS: np.asarray(seg, dtype=np.int32),
        }
        if not packed:
            assert len(group) == 1
            mask = np.zeros(seq_len, dtype=np.int8)
            mask[:used] = 1
            row[ATTENTION_MASK] = mask
        rows.append(row)
    return rows


def random_rows(
    seed: int,
    n_rows: int,
    seq_len: int,
    vocab: int,
    *,
    packed: bool = True,
    docs_per_row: tuple[int, int] = (1, 4),
) -> list[dict]:
    """``n_rows`` rows of random documents, unequal in length, supervised count and weights."""
    rng = np.random.default_rng(seed)
    groups = []
    for _ in range(n_rows):
        n_docs = int(rng.integers(docs_per_row[0], docs_per_row[1] + 1)) if packed else 1
        budget = int(rng.integers(seq_len // 2, seq_len + 1))
        lengths = []
        for i in range(n_docs):
            remaining = budget - sum(lengths)
            if remaining < 4:
                break
            lengths.append(remaining if i == n_docs - 1 else int(rng.integers(4, max(5, remaining // 2 + 1))))
        groups.append([make_document(rng, n, vocab) for n in lengths])
    return pack_rows(groups, seq_len, packed=packed)


def write_shards(
    out: Path,
    rows: list[dict],
    seq_len: int,
    *,
    packed: bool = True,
    tokenizer: dict | None = None,
    validation_rows: list[dict] | None = None,
    **manifest: Any,
) -> Path:
    """Write ``rows`` as a shard directory (datasets ``save_to_disk`` + manifest), fixed-size list features; with
    ``validation_rows``, a DatasetDict of a ``train`` and a ``validation`` split."""
    import datasets

    fixed = {
        INPUT_IDS: datasets.List(datasets.Value("int32"), length=seq_len),
        LABELS: datasets.List(datasets.Value("int32"), length=seq_len),
        WEIGHTS: datasets.List(datasets.Value("float32"), length=seq_len),
        POSITION_IDS: datasets.List(datasets.Value("int32"), length=seq_len),
        SEQ_LENGTHS: datasets.List(datasets.Value("int32")),
    }
    if not packed:
        fixed[ATTENTION_MASK] = datasets.List(datasets.Value("int8"), length=seq_len)
    def table(part: list[dict]) -> Any:
        columns = {name: [np.asarray(r[name]).tolist() for r in part] for name in fixed}
        return datasets.Dataset.from_dict(columns, features=datasets.Features(fixed))

    if validation_rows is None:
        table(rows).save_to_disk(str(out))
    else:
        datasets.DatasetDict({"train": table(rows), "validation": table(validation_rows)}).save_to_disk(str(out))
    body = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "weightprep_version": "test",
        "config": {"seq_len": seq_len, "packed": packed},
        "tokenizer": tokenizer
        or {"name_or_path": "test", "fingerprint": None, "vocab_size": 96, "eos_token_id": EOS},
        "counts": {"rows": len(rows)},
    }
    body.update(manifest)
    (Path(out) / MANIFEST_NAME).write_text(json.dumps(body, indent=2))
    return Path(out)


def reference_loss(model, batch: dict[str, torch.Tensor], normalize: str) -> torch.Tensor:
    """Independent reference: full logits from the model's ordinary forward, then a per-token Python loop."""
    kwargs = {"input_ids": batch[INPUT_IDS], "use_cache": False}
    if ATTENTION_MASK in batch:
        kwargs[ATTENTION_MASK] = batch[ATTENTION_MASK]
    kwargs[POSITION_IDS] = batch[POSITION_IDS]
    logits = model(**kwargs).logits.float()
    num = torch.zeros((), dtype=torch.float64)
    den = torch.zeros((), dtype=torch.float64)
    labels, weights = batch[LABELS], batch[WEIGHTS]
    for b in range(labels.shape[0]):
        for t in range(1, labels.shape[1]):
            y, w = int(labels[b, t]), float(weights[b, t])
            if y == IGNORE_INDEX or w <= 0:
                continue
            nll = -torch.log_softmax(logits[b, t - 1], dim=-1)[y]
            num = num + w * nll.double()
            den = den + (w if normalize == "weight" else 1.0)
    return (num / den).float()


def one_step_grads(
    shards_dir: str | Path,
    *,
    batch_size: int,
    grad_accum: int,
    normalize: str,
    out_dir: str | Path,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Gradients of one optimizer step of ``WeightedSFTTrainer`` (taken just before the optimizer step).

    Runs in this process, or in each process of a torchrun/accelerate launch (then the gradients are the
    synchronized ones). Clipping is off so the gradients are the raw ones.
    """
    from transformers import TrainerCallback
    from trl import SFTConfig

    from weightprep.tokenizer import load_tokenizer
    from weightprep.train import WeightedSFTTrainer, load_shards

    captured: dict[str, torch.Tensor] = {}

    class Capture(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            captured.update(
                {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            )

    args = SFTConfig(
        output_dir=str(out_dir),
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=grad_accum,
        max_steps=1,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        bf16=False,
        use_cpu=True,
        activation_checkpointing=False,
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        disable_tqdm=True,
        seed=seed,
    )
    shards = load_shards(shards_dir)
    model = tiny_llama(VOCAB_FOR_STEPS, seed=seed)
    trainer = WeightedSFTTrainer(
        model,
        args=args,
        train_dataset=shards,
        processing_class=load_tokenizer(None),
        normalize=normalize,
        callbacks=[Capture()],
    )
    trainer.train()
    assert captured, "no optimizer step happened"
    return captured


#: Model vocabulary of the accumulation/DDP equivalence runs (rows from ``random_rows(..., vocab=96)``).
VOCAB_FOR_STEPS = 96


def peak_allocated_bytes(fn) -> tuple[int, object]:
    """Run ``fn()`` under torch's profiler and return (peak bytes allocated during it, its result).

    The profiler records every allocation and free of the CPU allocator in order, so the running sum of their
    sizes is the memory held by tensors created inside ``fn`` at each moment: an exact, allocator-level peak,
    independent of RSS noise, other processes, and the allocator's caching.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    held = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        held += event.nbytes()
        peak = max(peak, held)
    return peak, result


def end_distributed_worker() -> None:
    """End a torchrun worker here, not in the interpreter's teardown: there, torch 2.13's gloo group (still referenced
    by FSDP2's device mesh or the trainer after destroy_process_group) aborts a rank now and then on a loaded machine
    with "terminate called without an active exception", after every result is written (seen in CI)."""
    import os
    import sys

    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
