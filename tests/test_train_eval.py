"""Weighted evaluation: eval_loss over the whole held-out set against an independent reference, per-bucket losses
that recombine into it, both normalizations, and a CLI run that evaluates every --eval-steps and draws loss.png.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import train_support as ts
from click.testing import CliRunner

from weightprep.errors import UsageError
from weightprep.train import WeightedCollator
from weightprep.train.evaluate import MAX_DISTINCT, WeightBuckets

REPO = Path(__file__).resolve().parent.parent
SEQ = 32
VOCAB = ts.VOCAB_FOR_STEPS


def _rows_with_weights(seed: int, n: int, choices: list[float] | None) -> list[dict]:
    rows = ts.random_rows(seed, n, SEQ, VOCAB)
    if choices is not None:  # few distinct weights, as real data has: 0.5 / 1 / 2.5
        rng = np.random.default_rng(seed)
        for r in rows:
            keep = r["weights"] > 0
            r["weights"] = np.where(keep, rng.choice(choices, size=SEQ), 0.0).astype(np.float32)
    return rows


def _reference(model, rows: list[dict], normalize: str) -> tuple[float, dict[float, tuple[float, float]]]:
    """Whole-set loss and per-weight (numerator, denominator) by an explicit loop over full-logits log-softmax."""
    batch = WeightedCollator()(rows)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
    per_weight: dict[float, list[float]] = {}
    for b in range(len(rows)):
        for t in range(1, SEQ):
            y, w = int(batch["labels"][b, t]), float(batch["weights"][b, t])
            if y == -100 or w <= 0:
                continue
            nll = -torch.log_softmax(logits[b, t - 1].double(), -1)[y].item()
            num, den = per_weight.setdefault(w, [0.0, 0.0])
            per_weight[w] = [num + w * nll, den + (w if normalize == "weight" else 1.0)]
    total = sum(v[0] for v in per_weight.values()) / sum(v[1] for v in per_weight.values())
    return total, {w: (v[0], v[1]) for w, v in per_weight.items()}


def _trainer(tmp_path, train_rows, eval_rows, normalize, eval_batch=3):
    from trl import SFTConfig

    from weightprep.tokenizer import load_tokenizer
    from weightprep.train import WeightedSFTTrainer, load_shards

    shards = load_shards(ts.write_shards(tmp_path / "s", train_rows, SEQ, validation_rows=eval_rows))
    assert shards.validation is not None and len(shards.validation) == len(eval_rows)
    args = SFTConfig(
        output_dir=str(tmp_path / "o"), use_cpu=True, bf16=False, report_to="none", activation_checkpointing=False,
        per_device_eval_batch_size=eval_batch,
    )  # fmt: skip
    model = ts.tiny_llama(VOCAB, seed=5)
    trainer = WeightedSFTTrainer(
        model, args=args, train_dataset=shards, eval_dataset=shards.validation,
        processing_class=load_tokenizer(None), normalize=normalize,
    )  # fmt: skip
    return trainer, model


@pytest.mark.parametrize("normalize", ["weight", "tokens"])
def test_eval_loss_and_buckets_equal_the_reference(tmp_path, normalize):
    eval_rows = _rows_with_weights(11, 7, [0.5, 1.0, 2.5])  # 7 rows in batches of 3: a ragged last batch
    trainer, model = _trainer(tmp_path, ts.random_rows(1, 4, SEQ, VOCAB), eval_rows, normalize)
    metrics = trainer.evaluate()
    total, per_weight = _reference(model, eval_rows, normalize)
    assert abs(metrics["eval_loss"] - total) < 1e-5, (metrics["eval_loss"], total)
    assert sorted(per_weight) == [0.5, 1.0, 2.5]
    for w, (num, den) in per_weight.items():
        assert abs(metrics[f"eval_loss_w={w:g}"] - num / den) < 1e-5
    # the buckets recombine into the total with their denominators' shares
    den_total = sum(d for _, d in per_weight.values())
    recombined = sum(metrics[f"eval_loss_w={w:g}"] * d / den_total for w, (_, d) in per_weight.items())
    assert abs(recombined - metrics["eval_loss"]) < 1e-6
    assert metrics["eval_supervised_tokens"] == sum(
        int(((r["labels"][1:] != -100) & (r["weights"][1:] > 0)).sum()) for r in eval_rows
    )
    assert metrics["eval_tokens_per_second"] > 0 and "eval_runtime" in metrics


def test_eval_loss_does_not_depend_on_the_eval_batch_size(tmp_path):
    eval_rows = _rows_with_weights(12, 6, None)
    a, _ = _trainer(tmp_path / "a", ts.random_rows(1, 2, SEQ, VOCAB), eval_rows, "weight", eval_batch=1)
    b, _ = _trainer(tmp_path / "b", ts.random_rows(1, 2, SEQ, VOCAB), eval_rows, "weight", eval_batch=6)
    ma, mb = a.evaluate(), b.evaluate()
    assert abs(ma["eval_loss"] - mb["eval_loss"]) < 1e-6
    # the rows' weights are drawn uniformly: more than 8 distinct, so quantile bins
    bins = [k for k in ma if k.startswith("eval_loss_w=")]
    assert 2 <= len(bins) <= 4 and all("-" in k for k in bins), bins
    assert bins == [k for k in mb if k.startswith("eval_loss_w=")]


def test_weight_buckets():
    few = WeightBuckets.from_weights(np.array([2.5, 0.5, 1, 1, 0.5]))
    assert few.names == ("0.5", "1", "2.5")
    assert few.index(torch.tensor([0.5, 1.0, 2.5, 1.0], dtype=torch.float64)).tolist() == [0, 1, 2, 1]
    many = WeightBuckets.from_weights(np.linspace(0.1, 3.0, 1000))
    assert len(many.names) == 4 and len(many.edges) == 3
    idx = many.index(torch.linspace(0.1, 3.0, 1000, dtype=torch.float64))
    assert torch.bincount(idx).tolist() == [250, 250, 250, 250]
    assert MAX_DISTINCT == 8
    assert WeightBuckets.from_weights(np.arange(1, 9, dtype=float)).names == tuple(str(i) for i in range(1, 9))


@pytest.mark.slow
def test_cli_evaluates_every_eval_steps_and_draws_the_loss_plot(sample_shards, tmp_path):
    from weightprep.cli import main

    out = tmp_path / "run"
    args = ["train", str(sample_shards), "--model", str(REPO / "sample_data" / "tiny-llama"), "--output-dir",
            str(out), "--max-steps", "4", "--eval-steps", "2", "--save-steps", "2", "--logging-steps", "1",
            "--micro-batch-size", "2", "--lr", "3e-3", "--eval-shards", str(sample_shards),
            "--load-best-model-at-end", "--normalize", "tokens"]  # fmt: skip
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    evals = [h for h in state["log_history"] if "eval_loss" in h]
    assert [h["step"] for h in evals] == [2, 4]
    assert all(any(k.startswith("eval_loss_w=") for k in h) for h in evals)
    assert state["best_metric"] == min(h["eval_loss"] for h in evals)
    summary = json.loads((out / "weightprep_train.json").read_text())
    assert summary["eval"]["eval_loss"] > 0 and summary["loss_plot"].endswith("loss.png")
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_flags_without_an_eval_set_are_refused(sample_shards, tmp_path):
    from weightprep.train.command import _eval_set
    from weightprep.train.data import load_shards

    shards = load_shards(sample_shards)
    assert shards.validation is None
    with pytest.raises(UsageError, match="need an evaluation set"):
        _eval_set({"eval_steps": 5}, shards, None, None)
    opts = {"eval_shards": sample_shards, "load_best_model_at_end": True, "eval_steps": 3, "save_steps": 10}
    with pytest.raises(UsageError, match="multiple of --eval-steps"):
        _eval_set(opts, shards, None, None)


@pytest.mark.slow
def test_load_best_model_at_end_keeps_the_checkpoint_of_the_lowest_eval_loss(sample_shards, tmp_path, monkeypatch):
    """The evaluations at steps 1-4 report the losses 3, 1, 2, 4 (the real loop runs; its eval_loss is then
    replaced, so the best checkpoint is neither the first nor the last): the model left in --output-dir is
    checkpoint-2's. The final evaluation, of that model, keeps its real loss."""
    from safetensors.torch import load_file

    from weightprep.cli import main
    from weightprep.train import WeightedSFTTrainer

    scripted = iter([3.0, 1.0, 2.0, 4.0])
    real = WeightedSFTTrainer.evaluation_loop

    def evaluation_loop(self, *args, **kwargs):
        output = real(self, *args, **kwargs)
        assert output.metrics["eval_loss"] > 0  # the real weighted loss was computed
        output.metrics["eval_loss"] = next(scripted, output.metrics["eval_loss"])
        return output

    monkeypatch.setattr(WeightedSFTTrainer, "evaluation_loop", evaluation_loop)
    out = tmp_path / "run"
    args = ["train", str(sample_shards), "--model", str(REPO / "sample_data" / "tiny-llama"), "--output-dir",
            str(out), "--max-steps", "4", "--eval-steps", "1", "--save-steps", "1", "--logging-steps", "1",
            "--micro-batch-size", "2", "--lr", "3e-2", "--eval-shards", str(sample_shards),
            "--load-best-model-at-end"]  # fmt: skip
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert [h["eval_loss"] for h in state["log_history"] if "eval_loss" in h] == [3.0, 1.0, 2.0, 4.0]
    assert state["best_metric"] == 1.0 and Path(state["best_model_checkpoint"]).name == "checkpoint-2"
    final = load_file(out / "model.safetensors")
    for step, same in ((2, True), (4, False), (1, False)):
        saved = load_file(out / f"checkpoint-{step}" / "model.safetensors")
        assert final.keys() == saved.keys()
        assert all(torch.equal(final[k], saved[k]) for k in final) is same, step
