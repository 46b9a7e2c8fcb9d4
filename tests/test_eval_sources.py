"""Evaluation per source: a build whose held-out rows are ``validation_<name>`` splits logs ``eval_<name>_loss``
for each, the pooled ``eval_loss`` (every source's numerators over the sum of their denominators, not a mean of the
per-source losses) and the buckets of the union; ``loss.png`` draws a curve per source.

The sources build is derived from a real ``weightprep build`` of the sample data with a validation split: its
validation rows are split into ``validation_a`` (the first rows) and ``validation_b`` (the rest), so the union of
the two is exactly the plain build's validation split and every figure can be checked against it and against an
independent full-logits computation on each split's rows.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from weightprep.constants import EVAL_SOURCE, MANIFEST_NAME
from weightprep.errors import UsageError

REPO = Path(__file__).resolve().parent.parent
SAMPLE_RAW = REPO / "sample_data" / "raw.jsonl"
TINY_LLAMA = REPO / "sample_data" / "tiny-llama"
SEQ = 256
#: validation_a: the first 7 validation rows (odd: a batch of 2 straddles the two sets); validation_b: the rest,
#: about three times as many
A_ROWS = 7
TOL = 2e-5


@pytest.fixture(scope="module")
def plain_build(tmp_path_factory) -> Path:
    """The sample data built by the real pipeline with a validation split (``train`` + ``validation``)."""
    from tokenizer_factory import sample_tokenizer

    from weightprep.config import config_from_dict
    from weightprep.pipeline import build

    out = tmp_path_factory.mktemp("plain") / "shards"
    cfg = config_from_dict({"pack": {"seq_len": SEQ}, "split": {"validation_fraction": 0.25}})
    build([str(SAMPLE_RAW)], out, cfg, tokenizer=sample_tokenizer())
    return out


@pytest.fixture(scope="module")
def sources_build(plain_build, tmp_path_factory) -> Path:
    """The same build in the layout of a build with sources: ``train``, ``validation_a``, ``validation_b``."""
    import datasets

    splits = datasets.load_from_disk(str(plain_build))
    validation = splits["validation"]
    assert len(validation) > 2 * A_ROWS, len(validation)  # two sets of clearly different sizes
    out = tmp_path_factory.mktemp("sources") / "shards"
    datasets.DatasetDict(
        {
            "train": splits["train"],
            "validation_a": validation.select(range(A_ROWS)),
            "validation_b": validation.select(range(A_ROWS, len(validation))),
        }
    ).save_to_disk(str(out))
    shutil.copy(plain_build / MANIFEST_NAME, out / MANIFEST_NAME)
    return out


@pytest.fixture(scope="module")
def model():
    """The sample tiny-llama with its logits sharpened (final norm x 8): a random model predicts nearly uniformly,
    so every set's loss is near ln(4096) and a pooled loss could not be told from a mean of means."""
    if not (TINY_LLAMA / "config.json").is_file():
        pytest.skip("sample_data/tiny-llama missing: python sample_data/make_model.py")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(TINY_LLAMA)).eval()
    with torch.no_grad():
        model.model.norm.weight.mul_(8.0)
    return model


@pytest.fixture(scope="module")
def reference(model, sources_build) -> dict[str, tuple[float, float, float]]:
    """Per source: the independent ``(sum w * nll, sum w, supervised count)`` of its split's rows."""
    import datasets

    splits = datasets.load_from_disk(str(sources_build))
    return {name: _sums(model, splits[f"validation_{name}"]) for name in "ab"}


def _sums(model, rows) -> tuple[float, float, float]:
    """Independent sums over a set of shard rows: the model's ordinary forward (full logits), one row at a time,
    log-softmax in float64, over the supervised targets (label kept, weight > 0)."""
    num = weight = count = 0.0
    for row in rows.with_format("torch"):
        with torch.no_grad():
            ids, positions = row["input_ids"][None].long(), row["position_ids"][None].long()
            logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0]
        log_probs = torch.log_softmax(logits[:-1].double(), -1)
        labels, weights = row["labels"][1:].long(), row["weights"][1:].double()
        keep = (labels != -100) & (weights > 0)
        nll = -log_probs[keep].gather(1, labels[keep][:, None])[:, 0]
        num += float((weights[keep] * nll).sum())
        weight += float(weights[keep].sum())
        count += int(keep.sum())
    return num, weight, count


def _evaluate(model, shards_dir: Path, tmp_path: Path, normalize: str, batch: int) -> dict[str, float]:
    from trl import SFTConfig

    from weightprep.tokenizer import load_tokenizer
    from weightprep.train import WeightedSFTTrainer, load_shards

    shards = load_shards(shards_dir)
    args = SFTConfig(
        output_dir=str(tmp_path / f"o-{normalize}-{batch}"), use_cpu=True, bf16=False, report_to="none",
        activation_checkpointing=False, per_device_eval_batch_size=batch,
    )  # fmt: skip
    trainer = WeightedSFTTrainer(
        model, args=args, train_dataset=shards, eval_dataset=shards.validation,
        processing_class=load_tokenizer(str(TINY_LLAMA)), normalize=normalize,
    )  # fmt: skip
    return trainer.evaluate()


def _losses(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.startswith("eval_") and "_loss" in k}


@pytest.mark.parametrize("normalize", ["weight", "tokens"])
def test_each_source_loss_and_the_pooled_loss_equal_an_independent_computation(
    model, reference, sources_build, plain_build, tmp_path, normalize
):
    from weightprep.train import load_shards

    shards = load_shards(sources_build)
    assert shards.validation_sources == ("a", "b")
    denominator = 1 if normalize == "weight" else 2
    (na, da), (nb, db) = ((reference[s][0], reference[s][denominator]) for s in "ab")

    metrics = _evaluate(model, sources_build, tmp_path, normalize, batch=3)  # 3: ragged last batches
    assert abs(metrics["eval_a_loss"] - na / da) < TOL, (metrics["eval_a_loss"], na / da)
    assert abs(metrics["eval_b_loss"] - nb / db) < TOL, (metrics["eval_b_loss"], nb / db)
    pooled, mean_of_means = (na + nb) / (da + db), (na / da + nb / db) / 2
    assert abs(metrics["eval_loss"] - pooled) < TOL, (metrics["eval_loss"], pooled)
    # sets of unequal size: the pooled loss is not the mean of the two, by far more than the tolerance
    assert abs(pooled - mean_of_means) > 20 * TOL, (pooled, mean_of_means)
    assert abs(metrics["eval_loss"] - mean_of_means) > 10 * TOL

    # the union of the two sets is the plain build's validation split: the same eval_loss and the same buckets,
    # and the plain build logs no per-source loss (its figures as before)
    plain = _evaluate(model, plain_build, tmp_path, normalize, batch=3)
    buckets = {k: v for k, v in _losses(metrics).items() if k.startswith("eval_loss_w=")}
    assert len(buckets) >= 2, metrics
    assert _losses(plain).keys() == {"eval_loss", *buckets}, plain
    for key, value in _losses(plain).items():
        assert abs(metrics[key] - value) < 1e-9, (key, metrics[key], value)
    assert metrics["eval_supervised_tokens"] == plain["eval_supervised_tokens"]


def test_figures_do_not_depend_on_the_eval_batch_size(model, sources_build, tmp_path):
    one = _losses(_evaluate(model, sources_build, tmp_path, "weight", batch=1))
    two = _losses(_evaluate(model, sources_build, tmp_path, "weight", batch=2))
    assert {"eval_loss", "eval_a_loss", "eval_b_loss"} <= one.keys() and one.keys() == two.keys()
    for key in one:
        assert abs(one[key] - two[key]) < 1e-6, (key, one[key], two[key])


@pytest.mark.slow
def test_two_processes_give_the_figures_of_one(sources_build, tmp_path):
    """2 ranks x batch 3 over a row count that 6 does not divide: accelerate evens out the last batch by repeating
    rows from the start; those repeats must not be counted (they were, by a plain sum over every rank's batches)."""
    import datasets
    from transformers import AutoModelForCausalLM

    splits = datasets.load_from_disk(str(sources_build))
    assert (len(splits["validation_a"]) + len(splits["validation_b"])) % 6, "the last batch must be uneven"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(port), str(REPO / "tests" / "eval_ddp_worker.py"), str(sources_build),
           str(TINY_LLAMA), str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    two = json.loads((tmp_path / "metrics.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(str(TINY_LLAMA)).eval()
    one = _evaluate(model, sources_build, tmp_path, "weight", 3)
    assert two["eval_supervised_tokens"] == one["eval_supervised_tokens"]
    assert {"eval_loss", "eval_a_loss", "eval_b_loss"} <= _losses(one).keys() == _losses(two).keys()
    for key, value in _losses(one).items():
        assert abs(two[key] - value) < 1e-6, (key, two[key], value)


@pytest.mark.slow
def test_cli_logs_every_source_keeps_the_best_by_eval_loss_and_plots_a_curve_per_source(
    model, sources_build, tmp_path, monkeypatch
):
    """``weightprep train`` on a build with sources: every evaluation logs eval_a_loss, eval_b_loss and eval_loss;
    --load-best-model-at-end chooses by eval_loss; loss.png is drawn with one labelled curve per source."""
    import matplotlib.axes

    from weightprep.cli import main

    plotted: list[tuple[str, list[float]]] = []  # (label, y values) of every curve loss.png draws
    original = matplotlib.axes.Axes.plot

    def spy(self, *args, **kwargs):
        plotted.append((kwargs.get("label"), [float(v) for v in args[1]]))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    out = tmp_path / "run"
    args = ["train", str(sources_build), "--model", str(TINY_LLAMA), "--output-dir", str(out), "--max-steps", "4",
            "--eval-steps", "2", "--save-steps", "2", "--logging-steps", "1", "--micro-batch-size", "2",
            "--lr", "3e-3", "--load-best-model-at-end"]  # fmt: skip
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    evals = [h for h in state["log_history"] if "eval_loss" in h]
    assert [h["step"] for h in evals] == [2, 4]
    for h in evals:
        assert h["eval_a_loss"] > 0 and h["eval_b_loss"] > 0, h
        assert any(k.startswith("eval_loss_w=") for k in h), h
        # pooled: a weighted mean of the two sources' losses, so between them
        low, high = sorted((h["eval_a_loss"], h["eval_b_loss"]))
        assert low <= h["eval_loss"] <= high, h
    assert state["best_metric"] == min(h["eval_loss"] for h in evals)
    summary = json.loads((out / "weightprep_train.json").read_text())
    assert {"eval_loss", "eval_a_loss", "eval_b_loss"} <= summary["eval"].keys()

    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the curves drawn are the logged figures (the final evaluation after training adds one point at the end)
    curves = dict(plotted)
    drawn = (("a", "eval_a_loss"), ("b", "eval_b_loss"), ("all (pooled)", "eval_loss"), ("eval", "eval_loss"))
    for label, key in drawn:
        assert label in curves, (label, [p[0] for p in plotted])
        assert curves[label][: len(evals)] == [h[key] for h in evals], (label, curves[label])
        assert curves[label][-1] == summary["eval"][key]


def test_eval_shards_accepts_a_build_with_sources(sample_shards, sources_build):
    from weightprep.train.command import _eval_set
    from weightprep.train.data import load_shards
    from weightprep.train.evaluate import source_names

    eval_set = _eval_set({"eval_shards": sources_build}, load_shards(sample_shards), None, None)
    assert source_names(eval_set) == ("a", "b")
    assert EVAL_SOURCE in eval_set.column_names
    tags = eval_set[EVAL_SOURCE]
    assert tags == [0] * A_ROWS + [1] * (len(tags) - A_ROWS)


def test_a_layout_that_mixes_validation_and_per_source_splits_or_misnames_a_source_is_refused(
    plain_build, tmp_path
):
    import datasets

    from weightprep.train import load_shards
    from weightprep.train.evaluate import tag_sources

    splits = datasets.load_from_disk(str(plain_build))
    for name, layout, match in (
        ("both", {"validation": splits["validation"], "validation_a": splits["validation"]}, "or the other"),
        ("badname", {"validation_a.b": splits["validation"]}, "validation_a.b"),
    ):
        out = tmp_path / name
        datasets.DatasetDict({"train": splits["train"], **layout}).save_to_disk(str(out))
        shutil.copy(plain_build / MANIFEST_NAME, out / MANIFEST_NAME)
        with pytest.raises(UsageError, match=match):
            load_shards(out)
    with pytest.raises(UsageError, match="eval_<name>_loss"):
        tag_sources({"a b": splits["validation"]})


@pytest.mark.slow
def test_a_build_with_two_sources_trains_and_logs_each_source_s_loss(tmp_path):
    """The path users run, end to end: ``weightprep build --source a=... --source b=...`` with a validation split,
    then ``weightprep train`` on it logs ``eval_a_loss`` and ``eval_b_loss``, each equal to that source's figure
    computed from its own ``validation_<name>`` split alone, and the pooled ``eval_loss``."""
    import datasets

    from weightprep.cli import main

    lines = SAMPLE_RAW.read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp_path / "a.jsonl").write_text("".join(lines[:150]), encoding="utf-8")
    (tmp_path / "b.jsonl").write_text("".join(lines[150:]), encoding="utf-8")
    shards = tmp_path / "shards"
    build_args = ["build", "--source", f"a={tmp_path / 'a.jsonl'},weight=2", "--source",
                  f"b={tmp_path / 'b.jsonl'},epochs=1.5", "--seq-len", str(SEQ), "--validation-fraction", "0.1",
                  "--out", str(shards)]  # fmt: skip
    result = CliRunner().invoke(main, build_args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert set(datasets.load_from_disk(str(shards))) == {"train", "validation_a", "validation_b"}

    out = tmp_path / "run"
    args = ["train", str(shards), "--model", str(TINY_LLAMA), "--output-dir", str(out), "--max-steps", "2",
            "--eval-steps", "2", "--save-steps", "2", "--logging-steps", "1", "--micro-batch-size", "2"]  # fmt: skip
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "weightprep_train.json").read_text())["eval"]
    assert {"eval_loss", "eval_a_loss", "eval_b_loss"} <= summary.keys(), summary

    # each source's figure is its own split's: the final model evaluated on validation_a alone (a plain layout)
    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    figures = {}
    for name in ("a", "b"):
        rows = datasets.load_from_disk(str(shards))[f"validation_{name}"]
        num, den, _ = _sums(final, rows)
        figures[name] = num / den
    assert summary["eval_a_loss"] == pytest.approx(figures["a"], rel=1e-4)
    assert summary["eval_b_loss"] == pytest.approx(figures["b"], rel=1e-4)
    low, high = sorted(figures.values())
    assert low <= summary["eval_loss"] <= high
