"""Worker of the 2-process equivalence test: ``torchrun --nproc-per-node 2 tests/train_ddp_worker.py SHARDS OUT``.

Each process runs one optimizer step of ``WeightedSFTTrainer`` on its half of the rows (micro-batch 4, gloo on
CPU) for both normalizations; rank 0 saves the synchronized gradients to ``OUT/grads-{normalize}.pt``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import train_support as ts  # noqa: E402


def main() -> None:
    shards, out = Path(sys.argv[1]), Path(sys.argv[2])
    for normalize in ("weight", "tokens"):
        grads = ts.one_step_grads(
            shards, batch_size=4, grad_accum=1, normalize=normalize, out_dir=out / f"run-{normalize}"
        )
        if int(os.environ.get("RANK", "0")) == 0:
            torch.save(grads, out / f"grads-{normalize}.pt")


if __name__ == "__main__":
    main()
    ts.end_distributed_worker()
