"""weightprep: token-weighted data for causal LM fine-tuning.

Build side (no torch needed)::

    weightprep build raw.jsonl --out shards/

Train side (``pip install 'weightprep[train]'``)::

    from weightprep import WeightedSFTTrainer, WeightedCollator, weighted_lm_loss
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from weightprep.constants import IGNORE_INDEX

# Public names that live in modules importing torch: resolved on first use only.
_LAZY = {
    "WeightedSFTTrainer": "weightprep.train",
    "WeightedCollator": "weightprep.train",
    "weighted_lm_loss": "weightprep.train",
    "load_shards": "weightprep.train",
    "estimate_memory": "weightprep.plan",
}

__all__ = ["IGNORE_INDEX", "__version__", *_LAZY]

#: The one place the version is written: pyproject.toml reads it from here (``[tool.setuptools.dynamic]``), so the
#: build's manifest need not look it up in the installed metadata (``importlib.metadata``: ~10 ms of imports).
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'weightprep' has no attribute {name!r}")
