"""``loss.png``: the training loss, the evaluation loss, the per-source and the per-weight-bucket evaluation losses
against step.

Drawn from ``trainer.state.log_history`` with matplotlib's Agg backend (no display needed). Up to three panels:
train and eval loss on the left; with several evaluation sources (a build with sources), one curve per source
(``eval_<name>_loss``) beside the pooled ``eval_loss``; one curve per weight bucket (``eval_loss_w=...``) on the
right. Whether the heavily weighted spans, or one source, are learned faster than the rest reads off one picture.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from weightprep.train.evaluate import SOURCE_NAME

__all__ = ["loss_curves", "plot_losses"]

_BUCKET = "eval_loss_w="
#: ``eval_<name>_loss``: the loss of one evaluation source.
_SOURCE = re.compile(rf"eval_({SOURCE_NAME.pattern})_loss")


def loss_curves(log_history: Iterable[Mapping[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """``{"loss": [(step, value), ...], "eval_loss": [...], "eval_math_loss": [...], "eval_loss_w=2.5": [...]}``
    from a log history."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for entry in log_history:
        step = entry.get("step")
        if step is None:
            continue
        for key, value in entry.items():
            wanted = key in ("loss", "eval_loss") or key.startswith(_BUCKET) or _SOURCE.fullmatch(key)
            if wanted and isinstance(value, int | float):
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
    sources = [k for k in curves if _SOURCE.fullmatch(k)]  # in the order the evaluation logs them
    panels = 1 + bool(sources) + bool(buckets)
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels + 2, 4.5), squeeze=False)
    axes = list(axes[0])
    left = axes.pop(0)
    for key, label, style in (("loss", "train", "-"), ("eval_loss", "eval", "o-")):
        if key in curves:
            steps, values = zip(*curves[key], strict=True)
            left.plot(steps, values, style, label=label, markersize=4)
    left.set(xlabel="step", ylabel="loss (weighted)", title="train and eval loss")
    left.legend()
    left.grid(alpha=0.3)
    if sources:
        middle = axes.pop(0)
        if "eval_loss" in curves:  # the pooled loss, for reference
            steps, values = zip(*curves["eval_loss"], strict=True)
            middle.plot(steps, values, "k-", label="all (pooled)", linewidth=2)
        for key in sources:
            steps, values = zip(*curves[key], strict=True)
            middle.plot(steps, values, "o--", label=_SOURCE.fullmatch(key).group(1), markersize=4)
        middle.set(xlabel="step", ylabel="eval loss", title="eval loss per source")
        middle.legend()
        middle.grid(alpha=0.3)
    if buckets:
        right = axes.pop(0)
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
