"""Weighted evaluation: the loss of a held-out set in the training normalization, and the loss per weight bucket.

Did the weights work? ``eval_loss`` alone cannot say; the loss of the weight-2.5 spans against the weight-0.5 spans
can. For every supervised token ``t`` of the evaluation set (label kept, weight > 0), with ``nll_t`` its negative
log-likelihood from the weighted head (no full logits) and ``w_t`` its weight::

    eval_loss        = sum_t w_t * nll_t / D        D = sum_t w_t   (normalize="weight")
                                                    D = count(t)    (normalize="tokens")
    eval_loss_w=<b>  = sum_{t in b} w_t * nll_t / D_b      (D_b: the same denominator over bucket b)

so ``eval_loss = sum_b (D_b / D) * eval_loss_w=<b>``. Buckets are the distinct weights of the evaluation set when
there are at most 8 (``eval_loss_w=0.5``, ``eval_loss_w=1``, ``eval_loss_w=2.5``), else 4 quantile bins of its
per-token weights (``eval_loss_w=0.25-0.9``: the smallest and largest weight in the bin). The sums run over every
batch of every rank (one all-reduce at the end), so the figures do not depend on batch size or rank count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from weightprep.constants import IGNORE_INDEX, LABELS, WEIGHTS
from weightprep.train.loss import Normalize, supervised_mask

__all__ = ["MAX_DISTINCT", "EvalTotals", "WeightBuckets", "buckets_for"]

#: Up to this many distinct weights each get a bucket; more are binned by quantiles.
MAX_DISTINCT = 8
_QUANTILE_BINS = 4
#: Tokens read to choose quantile bins (the distinct-value check reads the whole set).
_SAMPLE_TOKENS = 4_000_000


@dataclass(frozen=True)
class WeightBuckets:
    """Buckets of token weights: ``names[i]`` holds the weights ``w`` with ``searchsorted(edges, w, 'right') == i``."""

    edges: tuple[float, ...]  # interior boundaries, ascending; len(edges) == len(names) - 1
    names: tuple[str, ...]

    def index(self, weights: torch.Tensor) -> torch.Tensor:
        edges = torch.tensor(self.edges, dtype=weights.dtype, device=weights.device)
        return torch.searchsorted(edges, weights.contiguous(), right=True)

    @classmethod
    def from_weights(cls, weights: np.ndarray) -> WeightBuckets:
        """Buckets for this sample of supervised per-token weights (distinct values, or quantile bins)."""
        weights = np.asarray(weights, dtype=np.float64)
        distinct = np.unique(weights)
        if distinct.size == 0:
            return cls(edges=(), names=("all",))
        if distinct.size <= MAX_DISTINCT:
            mids = tuple(float(x) for x in (distinct[:-1] + distinct[1:]) / 2)
            return cls(edges=mids, names=tuple(f"{v:g}" for v in distinct))
        qs = np.quantile(weights, np.linspace(0, 1, _QUANTILE_BINS + 1)[1:-1])
        edges = [float(e) for e in np.unique(qs) if distinct[0] < e <= distinct[-1]]
        bins = np.searchsorted(np.asarray(edges), weights, side="right")
        names = []
        for i in range(len(edges) + 1):
            members = weights[bins == i]
            names.append(f"{members.min():g}-{members.max():g}" if members.size else f"bin{i}")
        return cls(edges=tuple(edges), names=tuple(names))


def buckets_for(dataset: Any) -> WeightBuckets:
    """The buckets of an evaluation set of shard rows: every supervised weight is read for the distinct-value check
    (stopping at ``MAX_DISTINCT + 1`` values); quantiles come from the first ``_SAMPLE_TOKENS`` supervised tokens."""
    distinct: set[float] = set()
    sample: list[np.ndarray] = []
    taken = 0
    for batch in dataset.select_columns([LABELS, WEIGHTS]).with_format("numpy").iter(batch_size=512):
        labels, weights = np.asarray(batch[LABELS]), np.asarray(batch[WEIGHTS], dtype=np.float32)
        # the targets: positions 1.. of each row (position t predicts t + 1), label kept and weight > 0
        keep = (labels[:, 1:] != IGNORE_INDEX) & (weights[:, 1:] > 0)
        w = weights[:, 1:][keep]
        if taken < _SAMPLE_TOKENS:
            sample.append(w[: _SAMPLE_TOKENS - taken])
            taken += min(w.size, _SAMPLE_TOKENS - taken)
        if len(distinct) <= MAX_DISTINCT:
            distinct.update(np.unique(w).tolist())
        elif taken >= _SAMPLE_TOKENS:
            break
    weights = np.concatenate(sample) if sample else np.zeros(0, dtype=np.float32)
    if len(distinct) <= MAX_DISTINCT:  # every distinct value, also those beyond the sample
        weights = np.concatenate([weights, np.asarray(sorted(distinct), dtype=np.float32)])
    return WeightBuckets.from_weights(weights)


class EvalTotals:
    """Running sums of one evaluation, per bucket: ``sum w*nll``, ``sum w``, supervised count; plus positions."""

    def __init__(self, buckets: WeightBuckets, device: torch.device | str = "cpu") -> None:
        self.buckets = buckets
        n = len(buckets.names)
        self.sums = torch.zeros(3, n, dtype=torch.float64, device=device)
        self.positions = torch.zeros((), dtype=torch.float64, device=device)

    def add(self, log_probs: torch.Tensor, batch: dict[str, Any]) -> None:
        """Fold one batch in: ``log_probs`` as :class:`~weightprep.train.loss.WeightedLMOutput` gives them."""
        labels, weights = batch[LABELS], batch[WEIGHTS]
        mask = supervised_mask(labels, weights)
        w = weights[..., 1:][mask].to(torch.float64)
        nll = -log_probs[mask].to(torch.float64)
        index = self.buckets.index(w).to(self.sums.device)
        n = len(self.buckets.names)
        self.sums[0] += torch.bincount(index, weights=(w * nll).to(self.sums.device), minlength=n)
        self.sums[1] += torch.bincount(index, weights=w.to(self.sums.device), minlength=n)
        self.sums[2] += torch.bincount(index, minlength=n).to(torch.float64)
        attended = batch.get("attention_mask")
        self.positions += float(attended.sum()) if attended is not None else float(labels.numel())

    def metrics(self, normalize: Normalize, prefix: str = "eval") -> dict[str, float]:
        """The loss, the per-bucket losses and the totals (call after summing across ranks)."""
        nll_w, weight, count = self.sums
        denominators = weight if normalize == "weight" else count
        total = float(denominators.sum())
        out = {f"{prefix}_loss": float(nll_w.sum()) / total if total > 0 else float("nan")}
        for name, num, den in zip(self.buckets.names, nll_w.tolist(), denominators.tolist(), strict=True):
            if den > 0:
                out[f"{prefix}_loss_w={name}"] = num / den
        out[f"{prefix}_supervised_tokens"] = int(count.sum())
        out[f"{prefix}_weight"] = float(weight.sum())
        return out
