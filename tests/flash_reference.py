"""CPU reference kernels for flash-attention, plugged into transformers' real flash-attention dispatch.

``flash_attn_func`` and ``flash_attn_varlen_func`` below take the arguments, shapes and conventions of the
flash_attn 2 package (``(B, L, H, D)`` / ``(total, H, D)`` with ``cu_seqlens``; GQA by head groups; causal
bottom-right aligned; ``softmax_scale``, ``window_size``, ``softcap``), computed with plain torch per sequence.
:func:`reference_flash_attention` installs them where transformers' ``lazy_import_flash_attention`` caches the
loaded kernels, so a model whose config says ``flash_attention_2`` (or a hub kernel name registered with the flash
wrapper) runs transformers' own ``flash_attention_forward`` -> ``_flash_attention_forward`` code: the unpad path
for masks, the varlen path for ``cu_seq_lens``, the batch-1 ``position_ids`` inference, the plain path otherwise.
Only the innermost kernel call is ours.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["CALLS", "flash_attn_func", "flash_attn_varlen_func", "reference_flash_attention", "use_attention"]

#: How often each reference kernel ran, so a test can tell which path transformers took.
CALLS = {"dense": 0, "varlen": 0}

_CACHE = (
    "_loaded_implementation",
    "_flash_fn",
    "_flash_varlen_fn",
    "_flash_with_kvcache_fn",
    "_pad_fn",
    "_unpad_fn",
    "_process_flash_kwargs_fn",
    "_process_with_kvcache_kwargs_fn",
)


def _attend(q, k, v, softmax_scale, causal, window_size, softcap):
    """One sequence: q (Lq, H, D), k/v (Lk, Hkv, D) -> (Lq, H, D), in float32."""
    lq, heads, dim = q.shape
    lk, kv_heads = k.shape[0], k.shape[1]
    rep = heads // kv_heads
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(dim)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    qi = torch.arange(lq).unsqueeze(1) + (lk - lq)  # bottom-right aligned, as flash_attn >= 2.1
    ki = torch.arange(lk).unsqueeze(0)
    allowed = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        allowed &= ki <= qi
    left, right = window_size if window_size is not None else (-1, -1)
    if left >= 0:
        allowed &= ki >= qi - left
    if right >= 0:
        allowed &= ki <= qi + right
    scores = scores.masked_fill(~allowed.to(scores.device), float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)


def flash_attn_func(
    q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
    alibi_slopes=None, deterministic=False, return_attn_probs=False,
):  # fmt: skip
    """flash_attn's dense kernel: each row of the batch is one sequence."""
    assert dropout_p == 0.0 and alibi_slopes is None
    CALLS["dense"] += 1
    return torch.stack(
        [_attend(q[b], k[b], v[b], softmax_scale, causal, window_size, softcap) for b in range(q.shape[0])]
    )


def flash_attn_varlen_func(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None,
    causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
    return_attn_probs=False, block_table=None,
):  # fmt: skip
    """flash_attn's varlen kernel: the flattened tokens cut into sequences at ``cu_seqlens``."""
    assert dropout_p == 0.0 and alibi_slopes is None and block_table is None
    CALLS["varlen"] += 1
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    assert cq[-1] == q.shape[0] and ck[-1] == k.shape[0], (cq[-1], q.shape, ck[-1], k.shape)
    assert max(b - a for a, b in zip(cq, cq[1:], strict=False)) <= int(max_seqlen_q)
    out = torch.empty_like(q)
    for (qa, qb), (ka, kb) in zip(zip(cq, cq[1:], strict=False), zip(ck, ck[1:], strict=False), strict=True):
        out[qa:qb] = _attend(q[qa:qb], k[ka:kb], v[ka:kb], softmax_scale, causal, window_size, softcap)
    return out


@contextmanager
def reference_flash_attention(implementation: str = "flash_attention_2") -> Iterator[None]:
    """Make transformers' flash dispatch call the reference kernels for ``implementation``."""
    import transformers.modeling_flash_attention_utils as fa
    from transformers.integrations.flash_attention import flash_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    saved = {name: getattr(fa, name) for name in _CACHE}
    registered = implementation in ALL_ATTENTION_FUNCTIONS._global_mapping
    if not registered:  # a hub kernel: what load_and_register_attn_kernel registers for a varlen kernel
        ALL_ATTENTION_FUNCTIONS.register(implementation, flash_attention_forward)
        ALL_MASK_ATTENTION_FUNCTIONS.register(implementation, flash_attention_mask)
    fa._loaded_implementation = implementation
    fa._flash_fn, fa._flash_varlen_fn, fa._flash_with_kvcache_fn = flash_attn_func, flash_attn_varlen_func, None
    fa._pad_fn, fa._unpad_fn = fa._pad_input, fa._unpad_input
    fa._process_flash_kwargs_fn = fa._lazy_define_process_function(flash_attn_varlen_func)
    fa._process_with_kvcache_kwargs_fn = dict
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(fa, name, value)
        if not registered:
            ALL_ATTENTION_FUNCTIONS._global_mapping.pop(implementation, None)
            ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.pop(implementation, None)


def use_attention(model: torch.nn.Module, implementation: str) -> torch.nn.Module:
    """Point ``model`` (and every sub-config) at ``implementation`` without transformers' availability checks,
    which would refuse flash-attention on a machine without flash_attn."""
    model.config._attn_implementation = implementation
    return model
