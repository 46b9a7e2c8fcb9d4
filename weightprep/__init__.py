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


def _version() -> str:
    """The installed distribution's version (``importlib.metadata``, ~30 ms of imports: looked up on first use)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("weightprep")
    except PackageNotFoundError:  # running from a source tree without installing
        return "0.0.0+src"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value = globals()["__version__"] = _version()
        return value
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'weightprep' has no attribute {name!r}")
