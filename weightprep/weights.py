"""What a weight may be, checked in one place for every way a weight enters a build.

A weight is a number >= 0 that is finite once stored as float32, the dtype of the shards' ``weights`` column.
Finite as a JSON number or a float64 is not enough: ``1e39`` becomes ``inf`` in the shards, the manifest's
total weight is ``inf`` and the loss of every row holding that token is ``inf``. The test is the cast itself
(round to nearest), so a value a hair above float32's largest, which rounds down to it, is accepted.
Record weights (pieces, ``prompt_weight``/``completion_weight``, message weights, Parquet columns) are checked
by ``weightprep.stages.validate``; ``assemble.eos_weight`` and ``chat.role_weights`` by the configuration.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from weightprep.errors import ConfigError

__all__ = ["WEIGHT_DTYPE", "valid_weights", "is_valid_weight", "weight_overflow_note", "parse_role_weights"]

#: dtype of the shards' weights column (``weightprep.stages.write``) and of the trainer's weights tensor.
WEIGHT_DTYPE = np.float32
_LARGEST = str(np.finfo(WEIGHT_DTYPE).max)  # "3.4028235e+38", the shortest text that casts to it
_LARGEST_FLOAT = float(np.finfo(WEIGHT_DTYPE).max)


def valid_weights(values: Any) -> np.ndarray:
    """Element-wise: >= 0 and finite as float32 (NaN, inf, negatives and float32 overflows are not)."""
    w = np.asarray(values, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is the answer here, not a warning
        return np.isfinite(w.astype(WEIGHT_DTYPE)) & (w >= 0)


def is_valid_weight(value: float) -> bool:
    """``valid_weights`` of one number (a float; an int too large for a float is the caller's OverflowError)."""
    if 0.0 <= value <= _LARGEST_FLOAT:  # the common case, without numpy's errstate (µs per message weight)
        return True
    return bool(valid_weights(value))


def weight_overflow_note(value: float) -> str:
    """`` (...)`` saying why a number that looks finite is refused, or ``""`` for any other value."""
    if np.isfinite(value) and value >= 0 and not is_valid_weight(value):
        return f" (beyond float32's largest, {_LARGEST}: the shards store weights as float32)"
    return ""


def parse_role_weights(spec: str) -> dict[str, float]:
    """``"assistant=1,user=0"`` -> ``{"assistant": 1.0, "user": 0.0}``; roles not named get 0."""
    weights: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        role, sep, value = part.partition("=")
        try:
            w = float(value)
        except ValueError:
            w = float("nan")
        if not sep or not role.strip() or not is_valid_weight(w):
            raise ConfigError([f"chat.role_weights: expected ROLE=WEIGHT[,ROLE=WEIGHT...] with weights >= 0, got {part!r}"
                               f"{weight_overflow_note(w)}"])  # fmt: skip
        weights[role.strip()] = w
    return weights
