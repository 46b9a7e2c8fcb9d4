"""One rank of the FSDP2 equivalence test (run by torchrun with gloo on CPU): shard a tiny Llama with torch's
``fully_shard`` in the given layout, take one weighted-loss backward on this rank's half of the rows with the
global denominator, and save the full (gathered) gradients, scaled by the world size (FSDP averages over ranks).

Layouts: ``accelerate`` (each decoder layer, then [final norm, lm_head] with ``reshard_after_forward=False``,
then the root: what accelerate's FSDP2 preparation does), ``head-alone`` (lm_head its own unit, never called by the
weighted loss, so its weight is still a sharded DTensor when read), ``root`` (one unit).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).parent))
import train_support as ts  # noqa: E402

from weightprep.train import WeightedCollator, weighted_lm_loss  # noqa: E402
from weightprep.train.loss import loss_denominator  # noqa: E402

#: (layout, tied embeddings, normalization) of each run; a tied head cannot be a unit of its own
RUNS = [
    ("accelerate", False, "weight"),
    ("accelerate", True, "weight"),
    ("accelerate", False, "tokens"),
    ("head-alone", False, "weight"),
    ("root", False, "weight"),
]


def run(layout: str, tie: bool, normalize: str, rank: int, world: int) -> dict[str, torch.Tensor]:
    rows = ts.random_rows(0, 8, 40, ts.VOCAB_FOR_STEPS)
    model = ts.tiny_llama(ts.VOCAB_FOR_STEPS, seed=0, tie=tie).train()
    if layout in ("accelerate", "head-alone"):
        for layer in model.model.layers:
            fully_shard(layer)
    if layout == "accelerate":
        tail = [model.model.norm, model.model.embed_tokens, model.lm_head] if tie else [model.model.norm, model.lm_head]
        fully_shard(tail, reshard_after_forward=False)
    elif layout == "head-alone":
        fully_shard(model.lm_head)
    fully_shard(model)
    share = len(rows) // world
    mine = WeightedCollator()(rows[rank * share : (rank + 1) * share])
    denominator = loss_denominator([WeightedCollator()(rows)], normalize)  # the global one, as the trainer's
    weighted_lm_loss(model, mine, normalize=normalize, denominator=denominator).loss.backward()
    return {name: p.grad.full_tensor() * world for name, p in model.named_parameters()}


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for layout, tie, normalize in RUNS:
        grads = run(layout, tie, normalize, rank, world)
        if rank == 0:
            torch.save(grads, Path(out_dir) / f"{layout}-{'tied' if tie else 'untied'}-{normalize}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    ts.end_distributed_worker()
