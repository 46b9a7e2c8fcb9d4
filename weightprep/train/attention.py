"""Keeping the documents of a packed row apart, whatever attention implementation the model runs.

A packed row holds several documents back to back; each must attend only to itself. transformers does that in
two different ways, and which one applies depends on the attention implementation:

- **mask** (``eager``, ``sdpa``, ``flex_attention``): the mask code finds the documents from ``position_ids``
  (each restart at 0 opens one) when no 2-D attention mask is passed and no cache is used, at any batch size.
- **varlen** (``flash_attention_2/3/4`` and hub kernels served through transformers' flash wrapper, such as
  ``kernels-community/flash-attn2``): no mask is built. The flash path infers documents from ``position_ids``
  *only at batch size 1*; for a ``(B, L)`` batch it runs plain causal attention over each whole row, so documents
  silently see each other. It isolates them at any batch size when given the varlen kwargs over the flattened
  batch: ``cu_seq_lens_q/k`` (cumulative segment boundaries, int32) and ``max_length_q/k`` (the longest segment),
  as TRL's padding-free collator passes them. For two rows of ``L = 6`` with segments ``[2, 3, 1]`` and ``[6]``::

      cu_seq_lens_q = cu_seq_lens_k = [0, 2, 5, 6, 12]     # over the flattened 12 positions
      max_length_q  = max_length_k  = 6

  :class:`~weightprep.train.collator.WeightedCollator` builds them from the rows' ``seq_lengths`` (no device
  sync), and :func:`~weightprep.train.loss.weighted_lm_loss` passes them whenever the model's implementation is a
  varlen one (deriving them from ``position_ids`` if a batch lacks them).

Anything else (``paged|...``, a custom registered function, a kernel without a varlen entry point) cannot be
relied on to keep packed documents apart and is refused for packed rows; unpacked rows (with their
``attention_mask``) work with every implementation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch

from weightprep.constants import ATTENTION_MASK, POSITION_IDS
from weightprep.errors import UsageError

__all__ = [
    "MASK_IMPLEMENTATIONS",
    "VARLEN_KEYS",
    "IsolationMode",
    "attention_implementation",
    "unwrap_model",
    "isolation_mode",
    "packed_attention_kwargs",
    "varlen_kwargs_from_position_ids",
    "varlen_kwargs_from_seq_lengths",
]

IsolationMode = Literal["mask", "varlen"]

#: Implementations whose mask code isolates packed documents from ``position_ids`` (transformers' masking_utils).
MASK_IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention")
#: The flash path's varlen kwargs, in the order TRL's padding-free collator emits them.
VARLEN_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def attention_implementation(model: Any) -> str:
    """The attention implementation the (possibly wrapped) model runs, as its config names it."""
    config = getattr(unwrap_model(model), "config", None)
    impl = getattr(config, "_attn_implementation", None)
    return "eager" if impl is None else str(impl)


def isolation_mode(impl: str) -> IsolationMode:
    """How packed documents are kept apart under attention implementation ``impl``; refuses the others.

    >>> isolation_mode("sdpa"), isolation_mode("flash_attention_2")
    ('mask', 'varlen')
    """
    if impl in MASK_IMPLEMENTATIONS:
        return "mask"
    if not impl.startswith("paged|"):
        from transformers.integrations.flash_attention import flash_attention_forward
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        # flash_attention_2/3/4 and hub kernels that transformers registered with its flash wrapper (those have a
        # varlen entry point; kernels without one are registered with another wrapper)
        if impl in ALL_ATTENTION_FUNCTIONS and ALL_ATTENTION_FUNCTIONS[impl] is flash_attention_forward:
            return "varlen"
    raise UsageError(
        f"attention implementation {impl!r} cannot keep the documents of a packed row apart: weightprep knows how "
        f"to isolate them under {', '.join(MASK_IMPLEMENTATIONS)} (block mask from position_ids) and under "
        "flash_attention_2/3/4 or a hub flash kernel (varlen cu_seq_lens). Load the model with "
        "attn_implementation='sdpa' (or one of those), or build unpacked shards (`weightprep build --unpacked`), "
        "whose attention_mask every implementation honours."
    )


def varlen_kwargs_from_seq_lengths(seq_lengths: Sequence[Any], row_length: int) -> dict[str, Any]:
    """The flash varlen kwargs of a batch of packed rows from each row's ``seq_lengths`` (CPU, no device sync).

    >>> kw = varlen_kwargs_from_seq_lengths([[2, 3, 1], [6]], 6)
    >>> kw["cu_seq_lens_q"].tolist(), kw["max_length_q"]
    ([0, 2, 5, 6, 12], 6)
    """
    parts = [np.asarray(s, dtype=np.int64).reshape(-1) for s in seq_lengths]
    for i, part in enumerate(parts):
        if part.size == 0 or int(part.sum()) != row_length or int(part.min()) <= 0:
            raise UsageError(
                f"row {i} of the batch has seq_lengths {part.tolist()} (sum {int(part.sum())}), expected positive "
                f"segment lengths summing to the row length {row_length}; rebuild the shards with `weightprep build`"
            )
    lengths = np.concatenate(parts)
    cu = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    longest = int(lengths.max())
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}


def varlen_kwargs_from_position_ids(position_ids: torch.Tensor) -> dict[str, Any]:
    """The same kwargs derived from ``position_ids`` (each 0 opens a segment), for batches without
    ``seq_lengths``; costs one device sync.

    >>> varlen_kwargs_from_position_ids(torch.tensor([[0, 1, 0, 1, 2, 0]]))["cu_seq_lens_q"].tolist()
    [0, 2, 5, 6]
    """
    flat = position_ids.reshape(-1)
    starts = (flat == 0).nonzero().view(-1)
    if starts.numel() == 0 or int(starts[0]) != 0 or position_ids.shape[-1] == 0:
        raise UsageError(
            "packed rows must start every document (and the pad tail) at position 0; these position_ids do not "
            "start at 0 (rebuild the shards with `weightprep build`)"
        )
    row_starts = torch.arange(0, flat.numel(), position_ids.shape[-1], device=flat.device)
    cu = torch.cat([starts, row_starts, flat.new_tensor([flat.numel()])]).unique(sorted=True).to(torch.int32)
    longest = int(cu.diff().max())
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}


def packed_attention_kwargs(model: Any, batch: Mapping[str, Any]) -> dict[str, Any]:
    """What ``model``'s forward needs besides ``position_ids`` to keep the documents of ``batch``'s packed rows
    apart: the varlen kwargs under a flash implementation (the batch's own, else derived from its position ids),
    nothing under a mask implementation. Refuses implementations that cannot isolate them. Batches with an
    ``attention_mask`` (unpacked rows) or without ``position_ids`` (one sequence per row) need nothing.
    """
    if batch.get(ATTENTION_MASK) is not None or batch.get(POSITION_IDS) is None:
        return {}
    if isolation_mode(attention_implementation(model)) == "mask":
        return {}
    if all(batch.get(key) is not None for key in VARLEN_KEYS):
        return {key: batch[key] for key in VARLEN_KEYS}
    return varlen_kwargs_from_position_ids(batch[POSITION_IDS])


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside DDP/FSDP/``torch.compile`` wrappers and a peft model."""
    seen = 0
    while seen < 8:
        seen += 1
        if hasattr(model, "get_base_model") and callable(model.get_base_model):  # peft PeftModel
            model = model.get_base_model()
        elif isinstance(getattr(model, "module", None), torch.nn.Module):  # DDP, FSDP1, DataParallel
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):  # torch.compile
            model = model._orig_mod
        else:
            break
    return model
