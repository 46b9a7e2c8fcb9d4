"""Histograms as inline SVG: no scripts, no fonts or files fetched, readable in any browser or by a parser.

Each bar is a ``<rect class="bar">`` carrying its count and bin (``data-count``, ``data-lo``/``data-hi`` or
``data-value``) and a ``<title>`` shown on hover.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

__all__ = ["histogram_svg", "composition_svg"]

_W, _H = 560, 230
_LEFT, _RIGHT, _TOP, _BOTTOM = 58, 12, 26, 46


def _fmt(x: float) -> str:
    if float(x).is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:.3g}"


def histogram_svg(
    title: str,
    counts: Sequence[int],
    *,
    edges: Sequence[float] | None = None,
    values: Sequence[float] | None = None,
    xlabel: str,
    ylabel: str = "count",
) -> str:
    """A bar chart of ``counts``: bins between ``edges`` (len(counts) + 1 of them), or one bar per distinct
    value in ``values`` (categorical)."""
    n = len(counts)
    if (edges is None) == (values is None):
        raise ValueError("give edges or values")
    top = max(counts, default=0) or 1
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="histogram" viewBox="0 0 {_W} {_H}" width="{_W}" '
        f'height="{_H}" role="img" aria-label="{escape(title)}">',
        f'<text x="{_W / 2}" y="16" text-anchor="middle" class="chart-title">{escape(title)}</text>',
        f'<line x1="{_LEFT}" y1="{_TOP + plot_h}" x2="{_LEFT + plot_w}" y2="{_TOP + plot_h}" class="axis"/>',
        f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_TOP + plot_h}" class="axis"/>',
        f'<text x="{_LEFT - 6}" y="{_TOP + 4}" text-anchor="end" class="tick">{_fmt(top)}</text>',
        f'<text x="{_LEFT - 6}" y="{_TOP + plot_h}" text-anchor="end" class="tick">0</text>',
        f'<text x="14" y="{_TOP + plot_h / 2}" transform="rotate(-90 14 {_TOP + plot_h / 2})" text-anchor="middle" '
        f'class="label">{escape(ylabel)}</text>',
        f'<text x="{_LEFT + plot_w / 2}" y="{_H - 6}" text-anchor="middle" class="label">{escape(xlabel)}</text>',
    ]
    slot = plot_w / max(n, 1)
    for i, count in enumerate(counts):
        h = plot_h * count / top
        x = _LEFT + i * slot
        if edges is not None:
            lo, hi = edges[i], edges[i + 1]
            data = f'data-lo="{lo!r}" data-hi="{hi!r}"'
            tip = f"{_fmt(lo)} to {_fmt(hi)}: {count:,}"
        else:
            data = f'data-value="{values[i]!r}"'
            tip = f"{_fmt(values[i])}: {count:,}"
        parts.append(
            f'<rect class="bar" x="{x + slot * 0.08:.2f}" y="{_TOP + plot_h - h:.2f}" width="{slot * 0.84:.2f}" '
            f'height="{h:.2f}" data-count="{count}" {data}><title>{escape(tip)}</title></rect>'
        )
    ticks = list(range(n)) if values is not None else [0, n // 2] if n > 2 else [0]
    for i in dict.fromkeys(ticks):
        if values is not None:
            label, x = _fmt(values[i]), _LEFT + (i + 0.5) * slot
        else:
            label, x = _fmt(edges[i]), _LEFT + i * slot
        parts.append(f'<text x="{x:.2f}" y="{_TOP + plot_h + 16}" text-anchor="middle" class="tick">{label}</text>')
    if edges is not None and n:
        parts.append(
            f'<text x="{_LEFT + plot_w:.2f}" y="{_TOP + plot_h + 16}" text-anchor="end" class="tick">'
            f"{_fmt(edges[-1])}</text>"
        )
    parts.append("</svg>")
    return "\n".join(parts)


#: Colours of the sources in the composition bar, in declared order (repeating).
_PALETTE = ("#2563eb", "#f59e0b", "#10b981", "#ef4444", "#8b5cf6", "#14b8a6", "#ec4899", "#84cc16")


def composition_svg(sources: Sequence[dict]) -> str:
    """One horizontal bar cut into each source's share of the train split's weight (the manifest's ``sources``):
    a ``<rect class="source">`` per source with ``data-source`` and ``data-share``, its name and share below."""
    width, height, bar = _W, 64, 28
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="composition" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="share of the train weight by source">'
    ]
    x = 0.0
    for i, src in enumerate(sources):
        share = float(src.get("weight_share") or 0.0)
        w = share * width
        colour = _PALETTE[i % len(_PALETTE)]
        name = escape(str(src.get("name")))
        parts.append(
            f'<rect class="source" x="{x:.2f}" y="0" width="{w:.2f}" height="{bar}" fill="{colour}" '
            f'data-source="{name}" data-share="{share:.6f}"><title>{name}: {100 * share:.1f}%</title></rect>'
        )
        parts.append(f'<rect x="{8 + 110 * i}" y="{bar + 12}" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{22 + 110 * i}" y="{bar + 21}" class="tick">{name} {100 * share:.1f}%</text>')  # fmt: skip
        x += w
    parts.append("</svg>")
    return "".join(parts)
