"""Turn rows of weightprep shards into model-ready tensors: a stack, nothing else.

Shard rows already have one fixed length ``L``, so a batch is ``np.stack`` of the rows and one
``torch.as_tensor``: no padding, no truncation, no re-tokenizing, and labels are never touched (in particular
never masked by comparing ids with the pad id, which would also mask EOS when ``pad == eos``).

A packed batch of two rows, ``L = 6``, documents ``[5, 6, 7]`` and ``[8, 9]`` then one pad (id 2)::

    input_ids     [[  0,    5,    6,    0,    8,    2], ...]
    labels        [[-100,   5,    6, -100,    8, -100], ...]   # unshifted; first token of each doc unlabeled
    weights       [[  0.,   1.,   1.,   0.,   2.,   0.], ...]
    position_ids  [[  0,    1,    2,    0,    1,    0], ...]   # restarts mark the documents
    cu_seq_lens_q [0, 3, 5, 6, ...]  # = cu_seq_lens_k: segment boundaries over the flattened batch (int32)
    max_length_q  6                  # = max_length_k: the longest segment (a Python int)
    (no attention_mask: sdpa/eager/flex isolate the documents from position_ids, flash-attention from the
     cu_seq_lens, see :mod:`weightprep.train.attention`)

The varlen kwargs come from the rows' ``seq_lengths`` (from ``position_ids`` for rows without them) and are what
flash-attention needs to keep documents apart at a micro-batch above 1; the other implementations ignore them.
Unpacked rows (one document per row, right-padded) keep their ``attention_mask`` and get no varlen kwargs. Rows of
an evaluation set of several sources keep their ``eval_source`` tag (one int64 per row, see
:func:`~weightprep.train.evaluate.tag_sources`). Any other column (metadata) is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from weightprep.constants import (
    ATTENTION_MASK,
    EVAL_SOURCE,
    INPUT_IDS,
    LABELS,
    POSITION_IDS,
    SEQ_LENGTHS,
    WEIGHTS,
)
from weightprep.errors import UsageError
from weightprep.train.attention import varlen_kwargs_from_position_ids, varlen_kwargs_from_seq_lengths

__all__ = ["WeightedCollator"]

_LONG = (INPUT_IDS, LABELS, POSITION_IDS)


@dataclass(frozen=True)
class WeightedCollator:
    """Collate shard rows into ``input_ids``, ``labels``, ``position_ids`` (int64), ``weights`` (float32) and,
    for packed rows, the flash varlen kwargs; for unpacked rows, ``attention_mask`` (int64).

    ``packed=None`` decides from the rows (an ``attention_mask`` column means unpacked); ``True`` drops any
    attention mask so packed documents are isolated by their position ids; ``False`` requires one.
    """

    packed: bool | None = None

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if not rows:
            raise ValueError("WeightedCollator got an empty batch")
        first = rows[0]
        missing = [c for c in (INPUT_IDS, LABELS, WEIGHTS, POSITION_IDS) if c not in first]
        if missing:
            raise UsageError(
                f"rows lack column(s) {', '.join(missing)} (have {', '.join(first)}); feed the collator rows of "
                "weightprep shards (`weightprep build`), and keep the columns through column pruning "
                "(WeightedSFTTrainer does; with a plain Trainer set remove_unused_columns=False)"
            )
        packed = self.packed if self.packed is not None else ATTENTION_MASK not in first
        if not packed and ATTENTION_MASK not in first:
            raise UsageError("unpacked rows need an attention_mask column; these rows have none")

        batch: dict[str, Any] = {}
        columns = (INPUT_IDS, LABELS, WEIGHTS, POSITION_IDS) + (() if packed else (ATTENTION_MASK,))
        for name in columns:
            batch[name] = _stack(name, [row[name] for row in rows])
        for name in (*_LONG, ATTENTION_MASK):
            if name in batch:
                batch[name] = batch[name].long()  # embedding lookups and gather want int64; int32 on disk
        batch[WEIGHTS] = batch[WEIGHTS].float()
        if EVAL_SOURCE in first:  # the evaluation sums are kept per source
            batch[EVAL_SOURCE] = torch.as_tensor([int(row[EVAL_SOURCE]) for row in rows], dtype=torch.long)
        if packed:
            row_length = batch[INPUT_IDS].shape[-1]
            if all(row.get(SEQ_LENGTHS) is not None for row in rows):
                batch.update(varlen_kwargs_from_seq_lengths([row[SEQ_LENGTHS] for row in rows], row_length))
            else:
                batch.update(varlen_kwargs_from_position_ids(batch[POSITION_IDS]))
        return batch


def _stack(name: str, values: list[Any]) -> torch.Tensor:
    if isinstance(values[0], torch.Tensor):
        shapes = {tuple(v.shape) for v in values}
        if len(shapes) == 1:
            return torch.stack(values)
    else:
        arrays = [np.asarray(v) for v in values]
        shapes = {a.shape for a in arrays}
        if len(shapes) == 1 and arrays[0].ndim == 1:
            return torch.as_tensor(np.stack(arrays))
    raise UsageError(
        f"column {name!r} has rows of different shapes {sorted(shapes)}; weightprep shards have one fixed "
        "row length (rebuild them with `weightprep build`)"
    )
