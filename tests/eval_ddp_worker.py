"""Worker of the 2-process evaluation test: ``torchrun --nproc-per-node 2 tests/eval_ddp_worker.py SHARDS MODEL OUT``.

Each process evaluates the validation split(s) of SHARDS with ``WeightedSFTTrainer`` (eval batch 3, gloo on CPU);
rank 0 writes the metrics to ``OUT/metrics.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_support import end_distributed_worker  # noqa: E402


def main() -> None:
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig

    from weightprep.tokenizer import load_tokenizer
    from weightprep.train import WeightedSFTTrainer, load_shards

    shards_dir, model_dir, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    shards = load_shards(shards_dir)
    args = SFTConfig(
        output_dir=str(out / "run"), use_cpu=True, bf16=False, report_to="none", activation_checkpointing=False,
        per_device_eval_batch_size=3,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    trainer = WeightedSFTTrainer(
        model, args=args, train_dataset=shards, eval_dataset=shards.validation,
        processing_class=load_tokenizer(model_dir),
    )  # fmt: skip
    metrics = trainer.evaluate()
    if int(os.environ.get("RANK", "0")) == 0:
        (out / "metrics.json").write_text(json.dumps(metrics))


if __name__ == "__main__":
    main()
    end_distributed_worker()
