"""Training on weightprep shards: the weighted loss, the collator, the trainer, the shard loader.

Public surface (each name resolved lazily, so ``import weightprep.train`` stays cheap)::

    from weightprep.train import WeightedSFTTrainer, WeightedCollator, weighted_lm_loss, load_shards

Modules: :mod:`~weightprep.train.data` (open and validate shards), :mod:`~weightprep.train.collator` (rows to
tensors), :mod:`~weightprep.train.loss` (weighted loss without full logits), :mod:`~weightprep.train.trainer`
(``SFTTrainer`` subclass), :mod:`~weightprep.train.command` (the ``weightprep train`` CLI).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__all__ = ["WeightedSFTTrainer", "WeightedCollator", "weighted_lm_loss", "load_shards"]

_WHERE = {
    "WeightedSFTTrainer": "weightprep.train.trainer",
    "WeightedCollator": "weightprep.train.collator",
    "weighted_lm_loss": "weightprep.train.loss",
    "load_shards": "weightprep.train.data",
}

if TYPE_CHECKING:  # pragma: no cover
    from weightprep.train.collator import WeightedCollator
    from weightprep.train.data import load_shards
    from weightprep.train.loss import weighted_lm_loss
    from weightprep.train.trainer import WeightedSFTTrainer


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'weightprep.train' has no attribute {name!r}")
