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
row of every rank, each row once (per batch, the rows' sums are gathered from every rank with accelerate's
``gather_for_metrics``, which drops the rows a multi-process loader repeats to fill its last batch), so the figures
do not depend on batch size or rank count.

Several named evaluation sets (the ``validation_<name>`` splits of a build with sources, or a dict given to the
trainer) are evaluated as one: :func:`tag_sources` concatenates them and tags each row with its source in an
``eval_source`` column, and the sums are kept per source and bucket. Then, with ``s`` ranging over the sources::

    eval_<s>_loss    = sum_{t in s} w_t * nll_t / D_s
    eval_loss        = sum_s N_s / sum_s D_s         (N_s: the numerator of s; pooled, not a mean of the eval_<s>_loss)

and the buckets are those of the union. A source with no supervised token (all its weights 0) logs no loss.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from weightprep.constants import EVAL_SOURCE, IGNORE_INDEX, LABELS, WEIGHTS
from weightprep.errors import UsageError
from weightprep.train.loss import Normalize, supervised_mask

__all__ = [
    "MAX_DISTINCT",
    "SOURCE_NAME",
    "EvalTotals",
    "WeightBuckets",
    "buckets_for",
    "source_names",
    "tag_sources",
]

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
    positions and rows. ``sources``: the names of a tagged set (batches then carry ``eval_source``), ``()`` for a
    plain one."""

    def __init__(
        self, buckets: WeightBuckets, device: torch.device | str = "cpu", sources: Sequence[str] = ()
    ) -> None:
        self.buckets = buckets
        self.sources = tuple(sources)
        n = len(buckets.names)
        self.sums = torch.zeros(3, max(1, len(self.sources)), n, dtype=torch.float64, device=device)
        self.positions = torch.zeros((), dtype=torch.float64, device=device)
        self.rows = 0

    def add(
        self,
        log_probs: torch.Tensor,
        batch: dict[str, Any],
        gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        """Fold one batch in: ``log_probs`` as :class:`~weightprep.train.loss.WeightedLMOutput` gives them.

        ``gather`` maps this batch's per-row sums to those to fold in. The trainer passes accelerate's
        ``gather_for_metrics``: every rank's rows, less the ones a multi-process loader repeats to even out its last
        batch (a plain sum over ranks would count those twice, and the figures would depend on the rank count)."""
        per_row = self._row_sums(log_probs, batch)
        if gather is not None:
            per_row = gather(per_row)
        self.sums.view(3, -1).add_(per_row[:, :-1].sum(0).view(3, -1))
        self.positions += per_row[:, -1].sum()
        self.rows += int(per_row.shape[0])

    def _row_sums(self, log_probs: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
        """``rows x (3 * cells + 1)``: each row's three sums per (source, bucket) cell, then its positions."""
        labels, weights = batch[LABELS], batch[WEIGHTS]
        device = self.sums.device
        mask = supervised_mask(labels, weights)
        w = weights[..., 1:][mask].to(device, torch.float64)
        nll = -log_probs[mask].to(device, torch.float64)
        n_rows, cells = labels.shape[0], self.sums[0].numel()
        # each token's cell of the flattened sums: its bucket, or with sources its (source, bucket)
        cell = self.buckets.index(w)
        if self.sources:
            source = batch.get(EVAL_SOURCE)
            if source is None:
                raise UsageError(
                    f"the evaluation rows are tagged with sources ({', '.join(self.sources)}) but the batch has no "
                    f"{EVAL_SOURCE!r}: the data collator dropped it; use WeightedCollator (it keeps the column)"
                )
            token_source = source.to(device).view(-1, 1).expand(mask.shape)[mask.to(device)]
            cell = token_source * len(self.buckets.names) + cell
        row = torch.arange(n_rows, device=device).view(-1, 1).expand(mask.shape)[mask.to(device)]
        index = row * cells + cell
        size = n_rows * cells
        per_row = torch.stack(
            [
                torch.bincount(index, weights=w * nll, minlength=size),
                torch.bincount(index, weights=w, minlength=size),
                torch.bincount(index, minlength=size).to(torch.float64),
            ]
        ).view(3, n_rows, cells)
        attended = batch.get("attention_mask")
        positions = attended.sum(-1) if attended is not None else torch.full((n_rows,), labels.shape[-1])
        per_row = per_row.permute(1, 0, 2).reshape(n_rows, -1)
        return torch.cat([per_row, positions.to(device, torch.float64).view(-1, 1)], 1)

    def metrics(self, normalize: Normalize, prefix: str = "eval") -> dict[str, float]:
        """The pooled loss, each source's loss, the per-bucket losses of the union and the totals."""
        nll_w, weight, count = self.sums  # each sources x buckets
        denominators = weight if normalize == "weight" else count
        total = float(denominators.sum())
        out = {f"{prefix}_loss": float(nll_w.sum()) / total if total > 0 else float("nan")}
        if self.sources:  # a plain set has one group, no name
            per_source = zip(self.sources, nll_w.sum(1).tolist(), denominators.sum(1).tolist(), strict=True)
            for name, num, den in per_source:
                if den > 0:
                    out[f"{prefix}_{name}_loss"] = num / den
        bucket_sums = zip(
            self.buckets.names, nll_w.sum(0).tolist(), denominators.sum(0).tolist(), strict=True
        )
        for name, num, den in bucket_sums:
            if den > 0:
                out[f"{prefix}_loss_w={name}"] = num / den
        out[f"{prefix}_supervised_tokens"] = int(count.sum())
        out[f"{prefix}_weight"] = float(weight.sum())
        return out
