"""weightprep: token-weighted data for causal LM fine-tuning.

Build side (no torch needed)::

    weightprep build raw.jsonl --out shards/

Train side (``pip install 'weightprep[train]'``)::

    from weightprep import WeightedSFTTrainer, WeightedCollator, weighted_lm_loss
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from weightprep.constants import IGNORE_INDEX

try:
    __version__ = version("weightprep")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+src"

# Public names that live in modules importing torch: resolved on first use only.
_LAZY = {
    "WeightedSFTTrainer": "weightprep.train",
    "WeightedCollator": "weightprep.train",
    "weighted_lm_loss": "weightprep.train",
    "load_shards": "weightprep.train",
    "estimate_memory": "weightprep.plan",
}

__all__ = ["IGNORE_INDEX", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'weightprep' has no attribute {name!r}")
