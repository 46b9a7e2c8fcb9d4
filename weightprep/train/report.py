"""What ``weightprep train`` says about its run: the summary before the first step, plain progress lines when
stderr is a log, and, on Ctrl-C, which checkpoint it left and the command that continues from it.

The start summary names what decides the run's cost and meaning, so a wrong setting is seen before an hour is
spent on it (the tiny sample model on the sample shards, on a CPU)::

    training sample_data/tiny-llama: 459,328 parameters, 459,328 trainable (all weights)
      data: 122 rows of 256 tokens (packed), 23,120 supervised tokens, weight 24,034.5
      steps: 21 (1 epoch(s) of 21 steps), effective batch 6 rows = 1,536 tokens (2 per device x 3 accumulation x
      1 process(es))
      cpu: fp32, attention sdpa, gradient checkpointing off, loss normalized by weight

On a GPU a last line gives the memory plan that ``weightprep plan`` makes for the run (``memory plan: X of Y GiB
per GPU predicted (weightprep plan), up to micro-batch N``).

The steps are the trainer's own count (``ceil(rows / (micro-batch x processes))`` batches an epoch, ``ceil`` of
that over the accumulation, times the epochs; or ``--max-steps``).
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

from weightprep.progress import ProgressLines

__all__ = ["optimizer_steps", "start_summary", "last_checkpoint", "interrupted_message", "progress_callback"]


def optimizer_steps(rows: int, micro_batch: int, grad_accum: int, processes: int, epochs: float, max_steps: int) -> int:
    """The optimizer steps of a run, as transformers' ``Trainer`` counts them (a last, short batch and a last,
    short accumulation count as one each)."""
    if max_steps > 0:
        return max_steps
    batches = math.ceil(rows / (micro_batch * processes))
    per_epoch = max(1, math.ceil(batches / grad_accum))
    return math.ceil(epochs * per_epoch)


def _train_counts(manifest: dict[str, Any]) -> dict[str, Any]:
    """The counts of the rows that train: the ``train`` split's where the build held some out, else the build's."""
    splits = manifest.get("splits") or {}
    return splits["train"]["counts"] if "train" in splits else manifest["counts"]


def start_summary(
    *, model: str, parameters: int, trainable: int, lora_r: int, rows: int, seq_len: int, packed: bool,
    manifest: dict[str, Any], steps: int, epochs: float, max_steps: int, micro_batch: int, grad_accum: int,
    processes: int, device: str, gpu: str | None, precision: str, attention: str, gradient_checkpointing: bool,
    normalize: str, memory: tuple[int, int, int] | None = None,
) -> str:
    """The lines printed before the first step (the module docstring shows them). ``memory``: the memory plan's
    (predicted bytes per GPU, the GPU's bytes, the largest micro-batch that fits), where one was made (a GPU)."""
    counts = _train_counts(manifest)
    batch = micro_batch * grad_accum * processes
    per_epoch = optimizer_steps(rows, micro_batch, grad_accum, processes, 1, 0)
    span = f"--max-steps {max_steps}" if max_steps > 0 else f"{epochs:g} epoch(s) of {per_epoch:,} steps"
    return "\n".join([
        f"training {model}: {parameters:,} parameters, {trainable:,} trainable"
        + (f" (LoRA r={lora_r})" if lora_r else " (all weights)"),
        f"  data: {rows:,} rows of {seq_len:,} tokens ({'packed' if packed else 'unpacked'}), "
        f"{counts['supervised_tokens']:,} supervised tokens, weight {counts['total_weight']:,.1f}",
        f"  steps: {steps:,} ({span}), effective batch {batch:,} rows = {batch * seq_len:,} tokens "
        f"({micro_batch} per device x {grad_accum} accumulation x {processes} process(es))",
        f"  {device}{f' ({gpu})' if gpu else ''}: {precision}, attention {attention}, gradient checkpointing "
        f"{'on' if gradient_checkpointing else 'off'}, loss normalized by {normalize}",
        *([f"  memory plan: {memory[0] / 2**30:.1f} of {memory[1] / 2**30:.1f} GiB per GPU predicted "
           f"(weightprep plan), up to micro-batch {memory[2]}"] if memory else []),
    ])  # fmt: skip


_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def last_checkpoint(output_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint of the highest step in ``output_dir`` that is complete (its ``trainer_state.json`` is written
    last), with that state; None if there is none."""
    if not output_dir.is_dir():
        return None
    found = [(int(m[1]), p) for p in output_dir.iterdir() if (m := _CHECKPOINT.match(p.name))]
    for _, path in sorted(found, reverse=True):
        state = path / "trainer_state.json"
        if state.is_file():
            try:
                return path, json.loads(state.read_text())
            except (OSError, json.JSONDecodeError):
                continue
    return None


def interrupted_message(output_dir: Path, save_steps: int, command: str) -> str:
    """What an interrupted run left in ``output_dir`` and how to go on: the last checkpoint and the ``--resume``
    command, or that none was written yet."""
    found = last_checkpoint(output_dir)
    if found is None:
        return (f"interrupted before the first checkpoint (one every --save-steps {save_steps} steps): no checkpoint "
                f"in {output_dir}; the final model was not saved")  # fmt: skip
    path, state = found
    step, total = state.get("global_step"), state.get("max_steps")
    of = f" of {total:,}" if isinstance(total, int) and total > 0 else ""
    return (f"interrupted: the last checkpoint is {path} (step {step:,}{of}); the final model was not saved\n"
            f"  to continue from it: {command}")  # fmt: skip


def progress_callback(write: Any = None) -> Any:
    """A transformers ``TrainerCallback`` that writes ``ProgressLines`` (step, share, ETA, last loss) to stderr:
    for a run whose stderr is a log, where tqdm's bar is turned off."""
    from transformers import TrainerCallback

    out = write if write is not None else (lambda line: print(line, file=sys.stderr, flush=True))

    class PlainProgress(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.lines: ProgressLines | None = None
            self.loss = ""

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.is_world_process_zero:
                self.lines = ProgressLines("training", state.max_steps, out, unit="steps")
                self.lines.begin(state.global_step)  # a resumed run: its rate from here

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if logs and "loss" in logs:
                self.loss = f"loss {logs['loss']:.4f}"

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.lines is not None:
                self.lines.update(state.global_step, self.loss)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.lines is not None:
                self.lines.close()

    return PlainProgress()
