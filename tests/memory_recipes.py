"""Test and benchmark support for the memory plan: the seed recipe and a CPU peak-memory tracker.

* :func:`full_logits_loss` -- the seed recipe: ``model(...).logits`` (B x L x V in the model dtype),
  ``.float()``, ``cross_entropy(reduction="none")``, times the weights. Labels are shifted, not the
  logits, so no extra B x L x V copy is made (``logits[:, :-1].contiguous()`` would add one).
* :class:`LiveTensorTracker` -- a ``TorchDispatchMode`` that records every storage an op creates and
  the peak of the live total at op boundaries: a CPU stand-in for ``torch.cuda.max_memory_allocated``
  (it misses temporaries that live only inside one kernel).

weightprep's own loss is ``weightprep.train.weighted_lm_loss`` itself, measured as it is (the plan models TRL's
kernel that it runs; ``tests/kernel_worker.py memory`` measures that kernel on its Triton path, in the interpreter).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from weightprep.constants import IGNORE_INDEX

__all__ = ["full_logits_loss", "LiveTensorTracker", "shift_targets", "triton_path_in_interpreter"]


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


class _CollectingLaunch:
    """A Triton kernel whose launches (``kernel[grid](...)``) are followed by ``gc.collect()``: Triton's interpreter
    leaves reference cycles that keep a launch's argument tensors alive until the next collection, which a GPU
    launch never does. Without it the tracker's peak depends on when Python's collector last ran (measured: the
    same loss at 3.29 MB alone, 5.40 MB after other tests had run)."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def __getitem__(self, grid: Any) -> Any:
        launch = self.kernel[grid]

        def run(*args: Any, **kwargs: Any) -> Any:
            out = launch(*args, **kwargs)
            gc.collect()
            return out

        return run


@contextlib.contextmanager
def triton_path_in_interpreter(token_tile: int | None = None) -> Iterator[Any]:
    """TRL's chunked log-prob kernel on its Triton path on CPU (``TRITON_INTERPRET=1`` must be set before triton is
    imported): ``_use_triton`` forced, the token tile set, launches that free their arguments as on a GPU. Yields
    the kernel module. The kernels fold their tiles in registers, so the torch tensors are all a GPU allocates."""
    import trl.kernels.chunked_logprob as ck

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(ck, "_use_triton", lambda device: True))
        if token_tile is not None:
            stack.enter_context(mock.patch.object(ck, "TOKEN_CHUNK_SIZE", token_tile))
        for name in ("_forward_kernel", "_backward_kernel"):
            stack.enter_context(mock.patch.object(ck, name, _CollectingLaunch(getattr(ck, name))))
        yield ck
