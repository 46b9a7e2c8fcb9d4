"""WeightedSFTTrainer end to end: exact normalization across accumulation and processes, packed isolation
through the trainer's own forward path, FSDP2 gradients (torch fully_shard on CPU), and a short CLI run on the sample shards that learns and resumes.
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
import train_support as ts
from click.testing import CliRunner

from weightprep.constants import ATTENTION_MASK
from weightprep.train import WeightedCollator, weighted_lm_loss

REPO = Path(__file__).resolve().parent.parent
TINY_LLAMA = REPO / "sample_data" / "tiny-llama"
TOL = 1e-5


@pytest.fixture(scope="module")
def step_shards(tmp_path_factory) -> Path:
    """8 packed rows of unequal supervised counts and weights (the 'global batch' of one optimizer step)."""
    rows = ts.random_rows(21, 8, 32, ts.VOCAB_FOR_STEPS, packed=True)
    sup = [int((r["weights"][1:] > 0).sum()) for r in rows]
    assert len(set(sup)) > 3, sup  # unequal counts, or the test could not tell normalizations apart
    return ts.write_shards(tmp_path_factory.mktemp("step") / "shards", rows, 32)


def _assert_same_grads(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys() and a, what
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=TOL, rtol=0, msg=f"{what}: {name}")


@pytest.mark.parametrize("normalize", ["weight", "tokens"])
def test_accumulation_8x1_equals_1x8(step_shards, tmp_path, normalize):
    g81 = ts.one_step_grads(
        step_shards, batch_size=8, grad_accum=1, normalize=normalize, out_dir=tmp_path / "a"
    )
    g18 = ts.one_step_grads(
        step_shards, batch_size=1, grad_accum=8, normalize=normalize, out_dir=tmp_path / "b"
    )
    _assert_same_grads(g81, g18, f"8x1 vs 1x8 ({normalize})")
    # and the step's gradient really is the whole-batch weighted loss's gradient
    model = ts.tiny_llama(ts.VOCAB_FOR_STEPS)
    from weightprep.train import load_shards, weighted_lm_loss

    ds = load_shards(step_shards).dataset
    weighted_lm_loss(
        model, WeightedCollator()([ds[i] for i in range(8)]), normalize=normalize
    ).loss.backward()
    _assert_same_grads(g81, {n: p.grad for n, p in model.named_parameters()}, "trainer vs direct")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # ~30-60 s: two real processes (torchrun, gloo on CPU); small enough to keep in CI
def test_two_processes_x4_equal_one_process_8x1(step_shards, tmp_path):
    out = tmp_path / "ddp"
    out.mkdir()
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(_free_port()), str(REPO / "tests" / "train_ddp_worker.py"), str(step_shards), str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    for normalize in ("weight", "tokens"):
        g24 = torch.load(out / f"grads-{normalize}.pt")
        g81 = ts.one_step_grads(
            step_shards, batch_size=8, grad_accum=1, normalize=normalize, out_dir=tmp_path / normalize
        )
        _assert_same_grads(g81, g24, f"8x1 vs 2 processes x 4 ({normalize})")


@pytest.mark.slow  # ~20-40 s: two processes, five sharded models
def test_fsdp2_gradients_equal_single_process_gradients(tmp_path):
    """torch's FSDP2 (fully_shard, gloo on CPU) in accelerate's layout and two others, 2 ranks x 4 rows: the
    weighted loss's gathered gradients equal one process on all 8 rows (hence DDP's, tested above)."""
    import train_fsdp_worker as fw

    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(_free_port()), str(REPO / "tests" / "train_fsdp_worker.py"), str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    rows = WeightedCollator()(ts.random_rows(0, 8, 40, ts.VOCAB_FOR_STEPS))
    for layout, tie, normalize in fw.RUNS:
        model = ts.tiny_llama(ts.VOCAB_FOR_STEPS, seed=0, tie=tie).train()
        weighted_lm_loss(model, rows, normalize=normalize).loss.backward()
        sharded = torch.load(tmp_path / f"{layout}-{'tied' if tie else 'untied'}-{normalize}.pt")
        assert set(sharded) == {n for n, _ in model.named_parameters()}
        _assert_same_grads({n: p.grad for n, p in model.named_parameters()}, sharded, f"FSDP2 {layout} {tie}")


def test_packed_documents_are_isolated_in_the_trainer_forward(tmp_path):
    """Each document's log-probs inside a packed row equal those of the document run alone."""
    from trl import SFTConfig

    from weightprep.tokenizer import load_tokenizer
    from weightprep.train import WeightedSFTTrainer

    rng = __import__("numpy").random.default_rng(4)
    docs = [ts.make_document(rng, n, ts.VOCAB_FOR_STEPS, zero_frac=0.0) for n in (9, 14, 6)]
    packed_rows = ts.pack_rows([docs], 36)  # three documents and a 7-token pad tail
    ds = ts.write_shards(tmp_path / "s", packed_rows, 36)
    model = ts.tiny_llama(ts.VOCAB_FOR_STEPS)
    args = SFTConfig(
        output_dir=str(tmp_path / "o"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        activation_checkpointing=False,
    )
    trainer = WeightedSFTTrainer(
        model, args=args, train_dataset=__import__("datasets").load_from_disk(str(ds)),
        processing_class=load_tokenizer(None),
    )  # fmt: skip
    collate = WeightedCollator()
    _, packed_out = trainer.compute_loss(trainer.model, collate(packed_rows), return_outputs=True)
    start = 0
    for doc in docs:
        n = len(doc["ids"])
        _, alone = trainer.compute_loss(trainer.model, collate(ts.pack_rows([[doc]], n)), return_outputs=True)
        inside = packed_out.log_probs[0, start : start + n - 1]
        torch.testing.assert_close(inside, alone.log_probs[0], atol=TOL, rtol=0)
        start += n
    # the check has teeth: one causal mask over the whole row (no isolation) changes the later documents
    leaky = collate(packed_rows)
    leaky[ATTENTION_MASK] = torch.ones_like(leaky["input_ids"])
    leaky["position_ids"] = torch.arange(36).unsqueeze(0)
    _, leaky_out = trainer.compute_loss(trainer.model, leaky, return_outputs=True)
    assert (leaky_out.log_probs[0, 9:] - packed_out.log_probs[0, 9:]).abs().max() > 1e-3


def _train_cli(*args: str) -> None:
    from weightprep.cli import main

    result = CliRunner().invoke(main, ["train", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output


def _losses(checkpoint: Path) -> dict[int, float]:
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return {h["step"]: h["loss"] for h in state["log_history"] if "loss" in h}


@pytest.mark.slow
def test_short_run_learns_and_resume_continues_the_same_run(sample_shards, tmp_path, monkeypatch):
    """Also: the allocator setting is made when the user set none and left alone when they did, and every
    training log carries throughput and peak memory."""
    if not (TINY_LLAMA / "config.json").is_file():
        pytest.skip("sample_data/tiny-llama missing: python sample_data/make_model.py")
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    common = ["--model", str(TINY_LLAMA), "--max-steps", "8", "--save-steps", "4", "--logging-steps", "1",
              "--micro-batch-size", "2", "--lr", "3e-3", "--lr-scheduler", "constant", "--warmup-ratio", "0",
              "--seed", "7"]  # fmt: skip
    full = tmp_path / "full"
    _train_cli(str(sample_shards), "--output-dir", str(full), *common)
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    losses = _losses(full / "checkpoint-8")
    assert sorted(losses) == list(range(1, 9))
    logs = [h for h in json.loads((full / "checkpoint-8" / "trainer_state.json").read_text())["log_history"] if "loss" in h]
    for h in logs:  # a micro-batch of 2 packed rows per step: positions >= supervised tokens > 0
        assert h["tokens_per_second"] >= h["supervised_tokens_per_second"] > 0, h
        assert h["weighted_tokens_per_second"] > 0 and h["supervised_tokens"] > 0, h
        assert h["peak_rss_gib"] > 0 and "peak_cuda_allocated_gib" not in h, h  # a CPU run
    first, last = [losses[s] for s in (1, 2, 3)], [losses[s] for s in (6, 7, 8)]
    assert sum(last) / 3 < sum(first) / 3 - 0.05, losses
    for name in ("model.safetensors", "tokenizer.json", "config.json", "weightprep_train.json"):
        assert (full / name).is_file(), name
    card = (full / "README.md").read_text()
    assert "[None]" not in card and f"fine-tuned version of `{TINY_LLAMA}` (a local model directory)" in card

    # interrupted after step 4: resume from that checkpoint and get the same steps 5..8
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(full / "checkpoint-4", resumed / "checkpoint-4")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")  # the user's own: kept
    _train_cli(str(sample_shards), "--output-dir", str(resumed), "--resume", *common)
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"
    again = _losses(resumed / "checkpoint-8")
    for step in range(5, 9):
        assert abs(again[step] - losses[step]) < 1e-4, (step, again[step], losses[step])


@pytest.mark.slow
def test_ctrl_c_names_the_last_checkpoint_and_the_command_that_resumes(sample_shards, tmp_path, monkeypatch):
    """Interrupted at step 5 with a checkpoint every 2: it names checkpoint-4 and the command with --resume, never
    "nothing was written"; before it, the start summary gave the trainer's own step count, and, stderr not being a
    terminal, plain progress lines."""
    import shlex

    from weightprep.cli import main
    from weightprep.train.trainer import WeightedSFTTrainer

    if not (TINY_LLAMA / "config.json").is_file():
        pytest.skip("sample_data/tiny-llama missing: python sample_data/make_model.py")
    real = WeightedSFTTrainer.training_step

    def interrupted(self, *args, **kwargs):
        if self.state.global_step == 5:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(WeightedSFTTrainer, "training_step", interrupted)
    out = tmp_path / "run"
    args = ["train", str(sample_shards), "--model", str(TINY_LLAMA), "--output-dir", str(out), "--save-steps", "2",
            "--micro-batch-size", "2", "--grad-accum", "3", "--logging-steps", "1"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 130, result.output
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    rows = len(__import__("datasets").load_from_disk(str(sample_shards)))
    assert f"interrupted: the last checkpoint is {out / 'checkpoint-4'} (step 4 of {state['max_steps']:,})" in result.output
    assert "to continue from it: " + shlex.join(["weightprep", *args, "--resume"]) in result.output
    assert "nothing was written" not in result.output
    summary = result.output.split("training ", 1)[1]
    assert f"{rows:,} rows of 256 tokens (packed)" in summary
    assert f"steps: {state['max_steps']:,} (1 epoch(s) of {state['max_steps']:,} steps)" in summary  # transformers' count
    assert "effective batch 6 rows = 1,536 tokens (2 per device x 3 accumulation x 1 process(es))" in summary
    assert "fp32, attention sdpa" in summary
    assert f"training: 10% (2 of {state['max_steps']} steps)" in result.output
