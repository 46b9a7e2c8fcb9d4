"""The weighted causal-LM loss, computed without ever building the ``batch x length x vocab`` logits.

What it computes, for one micro-batch (labels unshifted, HF convention: position ``t`` predicts ``t + 1``)::

    supervised[t] = labels[t + 1] != IGNORE_INDEX and weights[t + 1] > 0
    nll_sum       = sum over supervised t of  weights[t + 1] * -log p(labels[t + 1] | tokens <= t)
    loss          = nll_sum / denominator

and the denominator is, by ``normalize``:

- ``"weight"`` (default): the sum of the weights of the supervised tokens — a weighted mean of the per-token
  negative log-likelihood. Its scale does not depend on how large the weights are, so a learning rate tuned for
  plain SFT carries over, and all-ones weights give exactly the model's own causal-LM loss.
- ``"tokens"``: the number of supervised tokens — weights act as absolute multipliers of a token's loss
  (weight 2 counts twice as much as an ordinary token, in every step, whatever else is in the batch).

For exactness across gradient accumulation and data-parallel ranks the denominator must be the total over every
micro-batch of the optimizer step and every rank (:func:`loss_denominator`, then a sum across ranks):
then 8 rows x 1 step, 1 row x 8 accumulation steps and 2 ranks x 4 rows give the same update.

How the logits are avoided. :func:`attach_weighted_head` patches the model instance's ``forward`` (the base model
under peft; DDP/FSDP wrappers call it, so their hooks still run): when called with ``token_weights=...`` it runs the
decoder body only, gathers the hidden states of the supervised positions (prompt tokens, weight-0 spans and padding
are never projected), and feeds them to TRL's chunked log-prob kernel (``trl.kernels.ChunkedLogProbFunction``, the
kernel behind TRL 1.16's ``add_fused_lm_head``). That kernel projects tiles of ``4096 tokens x vocab_chunk``
through the LM head, folds each tile into an online log-sum-exp (a Triton kernel on CUDA, torch ops elsewhere) and
recomputes the tiles in the backward, accumulating the head's gradients in float32. Memory is set by the tile,
``min(n_supervised, 4096) x min(vocab, vocab_chunk)``, not by ``batch x length x vocab``: for 8 x 2048 tokens and
a 128k vocabulary one bf16 tile is 0.27 GB where the float32 logits alone are 8.6 GB (before their log-softmax
and gradient). On CPU the torch fallback keeps about nine tile-sized temporaries, hence a narrower default tile
there (:func:`default_vocab_chunk`); measured in ``tests/test_train_memory.py``.

Why not ``add_fused_lm_head`` itself: it selects positions by label only, and only on Triton devices (elsewhere it
scores every position with a ``4096 x 32768`` buffer whatever the vocabulary); it must be attached before peft
wraps the model; and it computes an unweighted loss we would throw away. The kernel underneath carries
per-token weights for free: the gradient it receives is ``-weight / denominator`` per token.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from transformers.utils import ModelOutput

from weightprep.constants import ATTENTION_MASK, IGNORE_INDEX, INPUT_IDS, LABELS, POSITION_IDS, WEIGHTS
from weightprep.errors import UsageError
from weightprep.train.attention import packed_attention_kwargs, unwrap_model

__all__ = [
    "NORMALIZATIONS",
    "Normalize",
    "WeightedLMOutput",
    "attach_weighted_head",
    "check_normalize",
    "default_vocab_chunk",
    "loss_denominator",
    "step_totals",
    "supervised_mask",
    "unwrap_model",
    "weighted_lm_loss",
]

Normalize = Literal["weight", "tokens"]
#: Accepted values of ``normalize``; the first is the default.
NORMALIZATIONS: tuple[str, ...] = ("weight", "tokens")

#: Vocabulary columns per projection tile (``None``: by device, see :func:`default_vocab_chunk`).
DEFAULT_VOCAB_CHUNK: int | None = None


def default_vocab_chunk(device: torch.device) -> int:
    """32768 where TRL's Triton kernel folds the tile in registers (CUDA/XPU): large GEMMs, one tile in memory.
    2048 elsewhere: the torch fallback of the kernel holds about nine tile-sized temporaries at once in its
    backward (the float32 tile, its exponentials, the target mask, the gradient...), so a narrow tile is what
    bounds memory on CPU (measured in ``tests/test_train_memory.py``).
    """
    from transformers.utils import is_triton_available

    return 32768 if device.type in ("cuda", "xpu") and is_triton_available() else 2048


_PATCHED = "_weightprep_weighted_head"


@dataclass
class WeightedLMOutput(ModelOutput):
    """What the patched forward returns when called with ``token_weights``.

    ``nll_sum`` is ``sum(w * -log p)`` over the supervised positions (differentiable); ``weight_sum`` and
    ``num_supervised`` are the local totals of this micro-batch (no gradient); ``log_probs`` has shape
    ``(batch, length - 1)``: the log-probability of ``labels[:, 1:]``, zero where a position is not supervised.
    ``loss`` is filled by :func:`weighted_lm_loss`. A ``ModelOutput`` (a dict), so DDP, FSDP and accelerate's
    output conversion walk it like any model output.
    """

    loss: torch.Tensor | None = None
    nll_sum: torch.Tensor | None = None
    weight_sum: torch.Tensor | None = None
    num_supervised: torch.Tensor | None = None
    log_probs: torch.Tensor | None = None


def supervised_mask(labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Positions ``t`` (of ``labels[:, 1:]``) that are predicted and trained on: label kept and weight > 0.

    >>> supervised_mask(torch.tensor([[-100, 5, -100, 7]]), torch.tensor([[0.0, 1.0, 0.0, 2.0]]))
    tensor([[ True, False,  True]])
    """
    return (labels[..., 1:] != IGNORE_INDEX) & (weights[..., 1:] > 0)


def loss_denominator(batches: Iterable[Mapping[str, Any]], normalize: Normalize = "weight") -> torch.Tensor:
    """The local denominator of one optimizer step: over all its micro-batches, on this process (float64).

    Sum it across data-parallel ranks (``accelerator.gather(d).sum()`` or ``all_reduce``) before use; the trainer
    does both. ``weight``: sum of supervised weights; ``tokens``: count of supervised tokens.
    """
    batches = list(batches)
    if not batches:
        raise ValueError("loss_denominator needs at least one batch")
    return step_totals(batches, normalize)[0]


def step_totals(batches: Iterable[Mapping[str, Any]], normalize: Normalize = "weight") -> torch.Tensor:
    """``[denominator, positions, supervised tokens, weight]`` over ``batches`` on this process (float64, on the
    batches' device; zeros for no batch). Positions are the attended ones: mask sum when unpacked, else all."""
    check_normalize(normalize)
    total: torch.Tensor | None = None
    for batch in batches:
        labels, weights = torch.as_tensor(batch[LABELS]), torch.as_tensor(batch[WEIGHTS])
        mask = supervised_mask(labels, weights)
        supervised = mask.sum().double()
        weight = weights[..., 1:][mask].double().sum()
        attended = batch.get(ATTENTION_MASK)
        positions = torch.as_tensor(attended).sum().double() if attended is not None else labels.numel()
        parts = [weight if normalize == "weight" else supervised, positions, supervised, weight]
        part = torch.stack([torch.as_tensor(p, dtype=torch.float64, device=labels.device) for p in parts])
        total = part if total is None else total + part.to(total.device)
    return total if total is not None else torch.zeros(4, dtype=torch.float64)


def attach_weighted_head(model: torch.nn.Module) -> torch.nn.Module:
    """Patch the causal LM inside ``model`` so ``model(..., token_weights=w, labels=y)`` returns a
    :class:`WeightedLMOutput` instead of logits. Idempotent; returns the patched (inner) model.

    Without ``token_weights`` the forward is the original one, so generation and evaluation are unchanged.
    The backbone and the LM head are looked up on every call, since peft and FSDP replace modules after patching.
    """
    target = unwrap_model(model)
    if getattr(target, _PATCHED, False):
        return target
    if not callable(getattr(target, "get_output_embeddings", None)) or target.get_output_embeddings() is None:
        raise UsageError(
            f"{type(target).__name__} has no output embeddings (LM head); weightprep trains causal LMs such as "
            "LlamaForCausalLM, Qwen2ForCausalLM or GPT2LMHeadModel"
        )
    scale, softcap = _logit_transform(target.config)
    original_forward = target.forward

    # functools.wraps keeps the signature: transformers' generate() validates model kwargs against it
    @functools.wraps(type(target).forward)
    def forward(self: Any, *args: Any, token_weights: torch.Tensor | None = None, **kwargs: Any) -> Any:
        if token_weights is None:
            return original_forward(*args, **kwargs)
        return _weighted_forward(self, token_weights, scale, softcap, *args, **kwargs)

    target.forward = types.MethodType(forward, target)
    setattr(target, _PATCHED, True)
    return target


def weighted_lm_loss(
    model: torch.nn.Module,
    batch: Mapping[str, Any],
    *,
    normalize: Normalize = "weight",
    denominator: torch.Tensor | float | None = None,
    vocab_chunk: int | None = DEFAULT_VOCAB_CHUNK,
) -> WeightedLMOutput:
    """Forward ``batch`` through ``model`` and return the weighted loss (in ``.loss``) with its parts.

    ``model`` is any transformers causal LM, possibly peft-wrapped (LoRA, Unsloth) or DDP/FSDP-wrapped (the
    forward goes through the wrapper, so gradient sync still happens). ``batch`` holds ``input_ids``, ``labels``
    and ``weights`` (``batch x length``), plus ``position_ids`` for packed rows or ``attention_mask`` for padded
    rows — what :class:`~weightprep.train.collator.WeightedCollator` produces. ``denominator``: the step's total
    from :func:`loss_denominator` summed over ranks; ``None`` uses this batch alone (one micro-batch, one process).
    Data-parallel wrappers average gradients over ranks, so with a global denominator multiply the loss by the
    world size before ``backward`` (the trainer does). ``vocab_chunk``: vocabulary columns per LM-head tile
    (``None``: :func:`default_vocab_chunk`). Mixed precision: the weighted path runs inside the model's
    ``forward``, so it is autocast when accelerate wraps that forward *after* the head is attached (call
    :func:`attach_weighted_head` before ``accelerator.prepare``; the trainer does) or under ``torch.autocast``.

    >>> out = weighted_lm_loss(model, collator(rows))  # doctest: +SKIP
    >>> out.loss.backward()  # doctest: +SKIP
    """
    check_normalize(normalize)
    attach_weighted_head(model)
    inputs = {
        "input_ids": batch[INPUT_IDS],
        "labels": batch[LABELS],
        "token_weights": batch[WEIGHTS],
        "use_cache": False,
        "vocab_chunk": vocab_chunk,
    }
    for key in (POSITION_IDS, ATTENTION_MASK):
        if batch.get(key) is not None:
            inputs[key] = batch[key]
    inputs.update(packed_attention_kwargs(model, batch))
    out: WeightedLMOutput = model(**inputs)
    if denominator is None:
        denominator = out.weight_sum if normalize == "weight" else out.num_supervised
    denom = torch.as_tensor(denominator, device=out.nll_sum.device, dtype=out.nll_sum.dtype)
    # An empty step (no supervised token anywhere) gives a differentiable zero, never 0 / 0
    out.loss = out.nll_sum / torch.where(denom > 0, denom, torch.ones_like(denom))
    return out


def check_normalize(normalize: str) -> None:
    """Refuse an unknown normalization with the accepted values."""
    if normalize not in NORMALIZATIONS:
        raise UsageError(f"normalize must be one of {', '.join(NORMALIZATIONS)}, got {normalize!r}")


def _logit_transform(config: Any) -> tuple[float, float | None]:
    """(multiplier, softcap) the model applies to its logits, read like TRL's fused head reads them."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    softcap = getattr(text_config, "final_logit_softcapping", None)
    scale = getattr(text_config, "logit_scale", None)  # Cohere
    if scale is None:
        scale = getattr(text_config, "output_multiplier", None)
    if scale is None:
        scale = getattr(text_config, "lm_head_multiplier", None)  # Falcon-H1
    if scale is None and getattr(text_config, "logits_scaling", None) is not None:  # Granite, MiniCPM3 divide
        scaling = text_config.logits_scaling
        scale = scaling if getattr(text_config, "model_type", "") == "hyperclovax" else 1 / scaling
    return (1.0 if scale is None else float(scale)), (None if not softcap else float(softcap))


def _lm_head_params(model: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Weight and bias of the LM head, refusing a peft adapter on it (the kernel reads ``weight`` directly)."""
    head = model.get_output_embeddings()
    if hasattr(head, "lora_A") or hasattr(head, "base_layer"):
        raise UsageError(
            "a peft adapter on the LM head (lm_head in target_modules) is not supported: the weighted loss "
            "projects through lm_head.weight directly, so the adapter would never train. Remove 'lm_head' from "
            "the LoRA target modules (use modules_to_save=['lm_head'] to train the head fully)."
        )
    weight, bias = head.weight, getattr(head, "bias", None)
    return _gathered(weight), (None if bias is None else _gathered(bias))


def _gathered(param: torch.Tensor) -> torch.Tensor:
    """A parameter as a whole tensor. FSDP2 leaves the head sharded (a DTensor) when it is a unit of its own,
    since the weighted loss never calls ``lm_head``: gather it here, and mark its gradient as a per-rank partial
    *average*, so the backward reduce-scatters it into the shards the way FSDP reduces every other gradient
    (without that mark each rank would keep only its own data's gradient for its shard)."""
    try:
        from torch.distributed.tensor import DTensor, Partial
    except ImportError:  # pragma: no cover - torch without distributed
        return param
    if not isinstance(param, DTensor):
        return param
    return param.full_tensor(grad_placements=[Partial("avg")] * param.device_mesh.ndim)


def _weighted_forward(
    self: Any,
    token_weights: torch.Tensor,
    scale: float,
    softcap: float | None,
    *args: Any,
    labels: torch.Tensor | None = None,
    vocab_chunk: int | None = DEFAULT_VOCAB_CHUNK,
    num_items_in_batch: Any = None,  # transformers may pass it; the denominator is the caller's business
    **kwargs: Any,
) -> WeightedLMOutput:
    from trl.kernels import ChunkedLogProbFunction

    if labels is None:
        raise ValueError("token_weights given without labels")
    kwargs["use_cache"] = False  # with a cache, transformers skips packed-sequence detection
    kwargs.pop("return_dict", None)
    hidden = self.base_model(*args, **kwargs).last_hidden_state  # (B, L, H): the decoder body only
    weight, bias = _lm_head_params(self)
    hidden = hidden[:, :-1].to(weight.device)
    targets = labels[:, 1:].to(weight.device)
    w = token_weights[:, 1:].to(device=weight.device, dtype=torch.float32)
    mask = supervised_mask(labels, token_weights).to(weight.device)

    sel_w = w[mask]
    if sel_w.numel() == 0:
        # Keep the graph connected to every parameter so DDP/FSDP reductions still fire, with zero gradient
        zero = hidden.sum() * 0.0 + weight.sum() * 0.0 + (bias.sum() * 0.0 if bias is not None else 0.0)
        log_probs = hidden.new_zeros(mask.shape, dtype=torch.float32) + zero
        return WeightedLMOutput(
            nll_sum=zero.float(), weight_sum=sel_w.sum(), num_supervised=mask.sum(), log_probs=log_probs
        )

    logp = ChunkedLogProbFunction.apply(
        hidden[mask],
        weight,
        bias,
        targets[mask].long(),
        1.0,  # temperature
        max(1, min(int(vocab_chunk or default_vocab_chunk(hidden.device)), weight.shape[0])),
        softcap,
        scale,
        ("log_probs",),
    )[0]
    return WeightedLMOutput(
        nll_sum=-(logp * sel_w).sum(),
        weight_sum=sel_w.detach().sum(),
        num_supervised=mask.sum(),
        log_probs=logp.new_zeros(mask.shape).masked_scatter(mask, logp),
    )
