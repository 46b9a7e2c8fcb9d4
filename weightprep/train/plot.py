"""``loss.png``: the training loss, the evaluation loss and the per-weight-bucket evaluation losses against step.

Drawn from ``trainer.state.log_history`` with matplotlib's Agg backend (no display needed). Two panels: train and
eval loss on the left, one curve per weight bucket (``eval_loss_w=...``) on the right, so whether the heavily
weighted spans are learned faster than the rest reads off one picture.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["loss_curves", "plot_losses"]

_BUCKET = "eval_loss_w="


def loss_curves(log_history: Iterable[Mapping[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """``{"loss": [(step, value), ...], "eval_loss": [...], "eval_loss_w=2.5": [...]}`` from a log history."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for entry in log_history:
        step = entry.get("step")
        if step is None:
            continue
        for key, value in entry.items():
            if (key in ("loss", "eval_loss") or key.startswith(_BUCKET)) and isinstance(value, int | float):
                curves.setdefault(key, []).append((int(step), float(value)))
    return curves


def plot_losses(log_history: Iterable[Mapping[str, Any]], path: str | Path, title: str = "") -> Path | None:
    """Write the picture to ``path``; ``None`` (nothing written) when the history holds no loss at all."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    curves = loss_curves(log_history)
    if not curves:
        return None
    buckets = sorted((k for k in curves if k.startswith(_BUCKET)), key=_bucket_order)
    fig, axes = plt.subplots(1, 2 if buckets else 1, figsize=(12 if buckets else 7, 4.5), squeeze=False)
    left = axes[0][0]
    for key, label, style in (("loss", "train", "-"), ("eval_loss", "eval", "o-")):
        if key in curves:
            steps, values = zip(*curves[key], strict=True)
            left.plot(steps, values, style, label=label, markersize=4)
    left.set(xlabel="step", ylabel="loss (weighted)", title="train and eval loss")
    left.legend()
    left.grid(alpha=0.3)
    if buckets:
        right = axes[0][1]
        for key in buckets:
            steps, values = zip(*curves[key], strict=True)
            right.plot(steps, values, "o-", label=f"w = {key[len(_BUCKET):]}", markersize=4)
        right.set(xlabel="step", ylabel="eval loss", title="eval loss per weight")
        right.legend()
        right.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bucket_order(key: str) -> float:
    name = key[len(_BUCKET) :]
    try:
        return float(name.split("-")[0])
    except ValueError:
        return float("inf")
