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

Several named evaluation sets (the ``validation_<name>`` splits of a build with sources, or a dict given to the
trainer) are evaluated as one: :func:`tag_sources` concatenates them and tags each row with its source in an
``eval_source`` column, and the sums are kept per source and bucket. Then, with ``s`` ranging over the sources::

    eval_<s>_loss    = sum_{t in s} w_t * nll_t / D_s
    eval_loss        = sum_s N_s / sum_s D_s         (N_s: the numerator of s; pooled, not a mean of the eval_<s>_loss)

and the buckets are those of the union. A source with no supervised token (all its weights 0) logs no loss.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from weightprep.constants import EVAL_SOURCE, IGNORE_INDEX, LABELS, WEIGHTS
from weightprep.errors import UsageError
from weightprep.train.loss import Normalize, supervised_mask

__all__ = ["MAX_DISTINCT", "SOURCE_NAME", "EvalTotals", "WeightBuckets", "buckets_for", "source_names", "tag_sources"]

#: What a source name may be: it becomes part of a log key (``eval_<name>_loss``) and of a split name.
SOURCE_NAME = re.compile(r"[A-Za-z0-9_-]+")

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


def tag_sources(sets: Mapping[str, Any]) -> Any:
    """One evaluation set of several named ones (``datasets.Dataset`` of shard rows, same columns): their rows in
    order, each tagged with its source's index in an ``eval_source`` column whose ``ClassLabel`` holds the names.

    One set rather than one evaluation per source: the union's buckets, the pooled ``eval_loss`` and every source's
    loss then come from one pass and one all-reduce, and transformers logs them in one entry."""
    import datasets

    if not sets:
        raise UsageError("no evaluation sets to tag: give at least one name -> dataset")
    names = [str(name) for name in sets]
    bad = [name for name in names if not SOURCE_NAME.fullmatch(name)]
    if bad:
        raise UsageError(
            f"evaluation set name(s) {', '.join(map(repr, bad))}: a name becomes the log key eval_<name>_loss, so "
            f"it must match {SOURCE_NAME.pattern}; rename the set"
        )
    label = datasets.ClassLabel(names=names)
    tagged = [
        dataset.add_column(EVAL_SOURCE, np.full(len(dataset), i, dtype=np.int64), feature=label)
        for i, dataset in enumerate(sets.values())
    ]
    return datasets.concatenate_datasets(tagged)


def source_names(dataset: Any) -> tuple[str, ...]:
    """The source names of an evaluation set tagged by :func:`tag_sources`, or ``()`` for a plain one."""
    features = getattr(dataset, "features", None) or {}
    feature = features.get(EVAL_SOURCE)
    return tuple(feature.names) if feature is not None else ()


class EvalTotals:
    """Running sums of one evaluation, per source and bucket: ``sum w*nll``, ``sum w``, supervised count; plus
    positions. ``sources``: the names of a tagged set (batches then carry ``eval_source``), ``()`` for a plain one."""

    def __init__(
        self, buckets: WeightBuckets, device: torch.device | str = "cpu", sources: Sequence[str] = ()
    ) -> None:
        self.buckets = buckets
        self.sources = tuple(sources)
        n = len(buckets.names)
        self.sums = torch.zeros(3, max(1, len(self.sources)), n, dtype=torch.float64, device=device)
        self.positions = torch.zeros((), dtype=torch.float64, device=device)

    def add(self, log_probs: torch.Tensor, batch: dict[str, Any]) -> None:
        """Fold one batch in: ``log_probs`` as :class:`~weightprep.train.loss.WeightedLMOutput` gives them."""
        labels, weights = batch[LABELS], batch[WEIGHTS]
        mask = supervised_mask(labels, weights)
        w = weights[..., 1:][mask].to(torch.float64)
        nll = -log_probs[mask].to(torch.float64)
        n = len(self.buckets.names)
        index = self.buckets.index(w).to(self.sums.device)
        if self.sources:
            source = batch.get(EVAL_SOURCE)
            if source is None:
                raise UsageError(
                    f"the evaluation rows are tagged with sources ({', '.join(self.sources)}) but the batch has no "
                    f"{EVAL_SOURCE!r}: the data collator dropped it; use WeightedCollator (it keeps the column)"
                )
            # each supervised token's (source, bucket) cell of the flattened sums
            rows = source.to(self.sums.device).view(-1, 1).expand(mask.shape)[mask.to(self.sums.device)]
            index = rows * n + index
        flat = self.sums.view(3, -1)
        cells = flat.shape[1]
        flat[0] += torch.bincount(index, weights=(w * nll).to(self.sums.device), minlength=cells)
        flat[1] += torch.bincount(index, weights=w.to(self.sums.device), minlength=cells)
        flat[2] += torch.bincount(index, minlength=cells).to(torch.float64)
        attended = batch.get("attention_mask")
        self.positions += float(attended.sum()) if attended is not None else float(labels.numel())

    def metrics(self, normalize: Normalize, prefix: str = "eval") -> dict[str, float]:
        """The pooled loss, each source's loss, the per-bucket losses of the union and the totals (call after
        summing across ranks)."""
        nll_w, weight, count = self.sums  # each sources x buckets
        denominators = weight if normalize == "weight" else count
        total = float(denominators.sum())
        out = {f"{prefix}_loss": float(nll_w.sum()) / total if total > 0 else float("nan")}
        if self.sources:  # a plain set has one group, no name
            per_source = zip(self.sources, nll_w.sum(1).tolist(), denominators.sum(1).tolist(), strict=True)
            for name, num, den in per_source:
                if den > 0:
                    out[f"{prefix}_{name}_loss"] = num / den
        bucket_sums = zip(self.buckets.names, nll_w.sum(0).tolist(), denominators.sum(0).tolist(), strict=True)
        for name, num, den in bucket_sums:
            if den > 0:
                out[f"{prefix}_loss_w={name}"] = num / den
        out[f"{prefix}_supervised_tokens"] = int(count.sum())
        out[f"{prefix}_weight"] = float(weight.sum())
        return out
