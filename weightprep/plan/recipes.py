"""The two loss recipes whose memory the plan models, and a CPU peak-memory tracker to check it.

* :func:`full_logits_loss` -- the seed recipe: ``model(...).logits`` (B x L x V in the model dtype),
  ``.float()``, ``cross_entropy(reduction="none")``, times the weights. Labels are shifted, not the
  logits, so no extra B x L x V copy is made (``logits[:, :-1].contiguous()`` would add one).
* :func:`chunked_weighted_loss` -- the weightprep recipe: gather the supervised positions' hidden
  states, project them through lm_head ``chunk`` tokens at a time in an autograd Function that
  keeps only the log-sum-exp and recomputes the chunk's logits in backward. Peak: one
  chunk x V block (model-dtype logits, their fp32 copy, logsumexp's temporary).
* :class:`LiveTensorTracker` -- a ``TorchDispatchMode`` that records every storage an op creates and
  the peak of the live total at op boundaries: a CPU stand-in for ``torch.cuda.max_memory_allocated``
  (it misses temporaries that live only inside one kernel).

Both recipes return ``sum(w_t * nll_t) / sum(w_t)`` over the supervised positions. This module
imports torch; ``weightprep.train`` holds the trainer's own implementation.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from weightprep.constants import IGNORE_INDEX

__all__ = ["full_logits_loss", "chunked_weighted_loss", "LiveTensorTracker", "shift_targets"]


def shift_targets(labels: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Position t predicts token t+1: shift labels and weights left, pad the end with ignore / 0."""
    lab = torch.full_like(labels, IGNORE_INDEX)
    lab[:, :-1] = labels[:, 1:]
    w = torch.zeros_like(weights, dtype=torch.float32)
    w[:, :-1] = weights[:, 1:]
    return lab, w


def full_logits_loss(model: torch.nn.Module, input_ids: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                     position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The seed recipe: full logits in the model dtype, an fp32 copy, per-token cross-entropy."""
    logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits
    lab, w = shift_targets(labels, weights)
    logits32 = logits.float()
    nll = F.cross_entropy(logits32.view(-1, logits32.size(-1)), lab.view(-1), reduction="none",
                          ignore_index=IGNORE_INDEX)
    w = w.view(-1)
    return (nll * w).sum() / w.sum().clamp_min(1e-12)


class _ChunkedNLL(torch.autograd.Function):
    """Per-token negative log-likelihood of ``hidden @ weight.T`` without keeping the logits."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                chunk: int) -> torch.Tensor:
        lse = torch.empty(hidden.size(0), dtype=torch.float32, device=hidden.device)
        nll = torch.empty_like(lse)
        w = weight.to(hidden.dtype)
        for start in range(0, hidden.size(0), chunk):
            sl = slice(start, start + chunk)
            logits = (hidden[sl] @ w.T).float()
            lse[sl] = torch.logsumexp(logits, dim=-1)
            nll[sl] = lse[sl] - logits.gather(1, targets[sl, None]).squeeze(1)
            del logits
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunk = chunk
        return nll

    @staticmethod
    def backward(ctx: Any, grad_nll: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, targets, lse = ctx.saved_tensors
        w = weight.to(hidden.dtype)
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        for start in range(0, hidden.size(0), ctx.chunk):
            sl = slice(start, start + ctx.chunk)
            p = (hidden[sl] @ w.T).float()
            p.sub_(lse[sl, None]).exp_()  # softmax
            p.scatter_add_(1, targets[sl, None], torch.full_like(lse[sl, None], -1.0))
            p.mul_(grad_nll[sl, None])
            g = p.to(hidden.dtype)
            del p
            if grad_h is not None:
                grad_h[sl] = g @ w
            if grad_w is not None:
                grad_w.addmm_(g.T.float(), hidden[sl].float()) if hidden.dtype != torch.float32 else grad_w.addmm_(
                    g.T, hidden[sl])
            del g
        if grad_w is not None and grad_w.dtype != weight.dtype:
            grad_w = grad_w.to(weight.dtype)
        return grad_h, grad_w, None, None


def chunked_weighted_loss(model: torch.nn.Module, input_ids: torch.Tensor, labels: torch.Tensor,
                          weights: torch.Tensor, position_ids: torch.Tensor | None = None,
                          chunk: int = 4096) -> torch.Tensor:
    """weightprep's recipe: run the decoder, project only supervised positions, chunk by chunk."""
    out = model.model(input_ids=input_ids, position_ids=position_ids, use_cache=False) if hasattr(
        model, "model") else model.transformer(input_ids=input_ids, position_ids=position_ids, use_cache=False)
    hidden = out.last_hidden_state
    lab, w = shift_targets(labels, weights)
    sel = (lab != IGNORE_INDEX).view(-1)
    h = hidden.reshape(-1, hidden.size(-1))[sel]
    nll = _ChunkedNLL.apply(h, model.get_output_embeddings().weight, lab.view(-1)[sel], chunk)
    ws = w.view(-1)[sel]
    return (nll * ws).sum() / ws.sum().clamp_min(1e-12)


class LiveTensorTracker(TorchDispatchMode):
    """Track bytes of storages created under this mode; ``peak`` is the largest live total seen
    at an op boundary, ``live`` the current one. Storages that existed before entering are not
    counted (the weights), so ``peak`` measures activations, loss buffers, gradients and whatever
    else the step allocates."""

    def __init__(self, exclude: Any = ()) -> None:
        super().__init__()
        self._live: dict[int, int] = {}
        self._refs: dict[int, Any] = {}
        self.live = 0
        self.peak = 0
        # storages that exist already (pass the model's parameters): views of them are not new memory
        self.baseline: set[int] = {t.untyped_storage()._cdata for t in exclude}

    def _track(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key = st._cdata
        if key in self._live or key in self.baseline:
            return
        self._live[key] = st.nbytes()
        self._refs[key] = StorageWeakRef(st)
        self.live += self._live[key]

    def _sweep(self) -> None:
        dead = [k for k, ref in self._refs.items() if ref.expired()]
        for k in dead:
            self.live -= self._live.pop(k, 0)
            self._refs.pop(k, None)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self._sweep()
        for t in _tensors(out):
            if t.device.type != "meta" and not t._is_view():
                self._track(t)
        self.peak = max(self.peak, self.live)
        return out


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    return []
