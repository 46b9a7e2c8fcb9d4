"""``weightprep inspect DIR --html report.html``: one self-contained page about a build.

The page holds the manifest's numbers (per split), the accounting of tokens and weight, dropped and rejected
records by reason (with the first rejects from ``rejects.jsonl``), histograms of document length, per-token
weight and row fill (inline SVG, computed from the shards by :mod:`weightprep.report.stats`), and the first rows
of each split token by token: coloured by weight, documents framed, each token's id, label and weight on hover.
Nothing is fetched: no scripts, fonts or images from anywhere. Every text from the data is HTML-escaped.
"""

from __future__ import annotations

import json
import os
from html import escape
from pathlib import Path
from typing import Any

import numpy as np

from weightprep import storage
from weightprep.constants import IGNORE_INDEX, INPUT_IDS, LABELS, WEIGHTS
from weightprep.errors import record_position
from weightprep.redact import redact
from weightprep.report.stats import SplitStats, document_turns, row_segments, split_stats
from weightprep.report.svg import composition_svg, histogram_svg
from weightprep.report.tokens import token_groups

__all__ = ["render_report", "write_report", "weight_class"]

#: distinct weights up to which the weight histogram has one bar per weight
MAX_WEIGHT_BARS = 16
#: rejects listed from rejects.jsonl
MAX_REJECTS_LISTED = 20

_SUMMARY = [
    ("records", "records read"),
    ("accepted", "records accepted"),
    ("rejected", "records rejected"),
    ("documents", "documents"),
    ("documents_written", "documents written"),
    ("dropped", "documents dropped"),
    ("truncated", "documents truncated"),
    ("tokens", "tokens written"),
    ("supervised_tokens", "supervised tokens"),
    ("total_weight", "total weight"),
    ("rows", "rows"),
    ("pad_tokens", "pad positions"),
    ("fill_ratio", "fill ratio"),
]

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1180px;
       color: #1f2937; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #e5e7eb; }
h3 { font-size: 15px; margin-top: 20px; }
.meta { color: #6b7280; } table { border-collapse: collapse; margin: 8px 0; }
td, th { border: 1px solid #e5e7eb; padding: 3px 9px; text-align: right; } th { background: #f9fafb; }
td.k, th.k { text-align: left; } td.text { text-align: left; max-width: 520px; overflow-wrap: anywhere; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
svg.histogram { background: #fff; border: 1px solid #e5e7eb; border-radius: 4px; }
svg .bar { fill: #3b82f6; } svg .bar:hover { fill: #1d4ed8; } svg .axis { stroke: #9ca3af; }
svg .tick { font-size: 11px; fill: #4b5563; } svg .label { font-size: 12px; fill: #374151; }
svg .chart-title { font-size: 13px; font-weight: 600; fill: #111827; }
.hbar { display: inline-block; height: 10px; background: #f59e0b; vertical-align: middle; }
.doc { border: 1px solid #d1d5db; border-left: 4px solid #6366f1; border-radius: 4px; margin: 6px 0; }
.turn { display: block; margin: 4px 0 1px; font: bold 11px sans-serif; color: #374151; }
.doc-head, .pad { font-size: 12px; color: #4b5563; background: #f3f4f6; padding: 2px 8px; }
.pad { border: 1px dashed #d1d5db; border-radius: 4px; margin: 6px 0; }
.tokens { font: 13px/1.7 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; white-space: pre-wrap;
          padding: 6px 8px; overflow-wrap: anywhere; }
.t { border-radius: 2px; box-shadow: inset -1px 0 0 rgba(0,0,0,.12); }
.t:hover { outline: 2px solid #111827; }
.w0 { background: #e5e7eb; color: #6b7280; } .wlt1 { background: #bfdbfe; } .w1 { background: #bbf7d0; }
.wle2 { background: #fde68a; } .wgt2 { background: #fca5a5; }
.nl { color: #9ca3af; } .empty { color: #9ca3af; font-style: italic; }
.legend span { padding: 1px 8px; margin-right: 4px; border-radius: 3px; }
.warn { color: #b45309; }
"""


def weight_class(w: float) -> str:
    """The CSS class of a weight, the buckets of ``weightprep inspect``'s terminal colours."""
    if w == 0:
        return "w0"
    if w < 1:
        return "wlt1"
    if w == 1:
        return "w1"
    return "wle2" if w <= 2 else "wgt2"


def _num(x: Any) -> str:
    if isinstance(x, float) and not x.is_integer():
        return f"{x:,.6g}"
    return f"{int(x):,}" if isinstance(x, int | float) else escape(str(x))


def _summary_value(counts: dict[str, Any], key: str) -> Any:
    value = counts.get(key, 0)
    if isinstance(value, dict):  # rejected / dropped by reason
        return sum(value.values())
    return value


def _summary_table(manifest: dict[str, Any], splits: list[str]) -> str:
    columns = [("all", manifest["counts"])] + [(s, manifest["splits"][s]["counts"]) for s in splits]
    head = "".join(f"<th>{escape(name)}</th>" for name, _ in columns)
    body = []
    for key, label in _SUMMARY:
        cells = "".join(
            f'<td data-split="{escape(name)}" data-key="{key}">{_num(_summary_value(counts, key))}</td>'
            for name, counts in columns
        )
        body.append(f'<tr><td class="k">{escape(label)}</td>{cells}</tr>')
    return f'<table class="summary"><tr><th class="k"></th>{head}</tr>{"".join(body)}</table>'


#: The columns of the sources table: manifest key, heading.
_SOURCE_COLUMNS = (("weight", "weight"), ("epochs", "epochs"), ("records", "records"), ("rejected", "rejected"),
                   ("documents", "documents"), ("repeats", "repeated records"), ("tokens", "tokens"),
                   ("supervised_tokens", "supervised tokens"), ("total_weight", "total weight"),
                   ("weight_share", "share of train weight"))  # fmt: skip


def _sources_section(manifest: dict[str, Any]) -> list[str]:
    """A build with sources: their composition as a table and a bar (share of the train split's weight)."""
    sources = manifest.get("sources") or []
    if not sources:
        return []
    head = "".join(f"<th>{escape(label)}</th>" for _, label in _SOURCE_COLUMNS)
    body = []
    for src in sources:
        cells = []
        for key, _ in _SOURCE_COLUMNS:
            value = src.get(key, 0)
            shown = f"{100 * value:.1f}%" if key == "weight_share" else _num(_summary_value(src, key))
            cells.append(f'<td data-source="{escape(str(src["name"]))}" data-key="{key}">{shown}</td>')
        body.append(f'<tr><td class="k">{escape(str(src["name"]))}</td>{"".join(cells)}</tr>')
    table = f'<table class="sources"><tr><th class="k">source</th>{head}</tr>{"".join(body)}</table>'
    return ["<h3>Sources</h3>", table, composition_svg(sources)]


def _accounting_table(counts: dict[str, Any]) -> str:
    acc = counts.get("accounting") or {}
    keys = sorted({k for part in acc.values() for k in part})
    head = "".join(f"<th>{escape(k.replace('_', ' '))}</th>" for k in keys)
    body = "".join(
        f'<tr><td class="k">{escape(kind)}</td>'
        + "".join(f'<td data-acc="{kind}.{k}">{_num(part.get(k, 0))}</td>' for k in keys)
        + "</tr>"
        for kind, part in acc.items()
    )
    return f'<table class="accounting"><tr><th class="k"></th>{head}</tr>{body}</table>'


def _reasons_table(counts: dict[str, Any]) -> str:
    rows = [("rejected", r, n) for r, n in sorted((counts.get("rejected") or {}).items())]
    rows += [("dropped", r, n) for r, n in sorted((counts.get("dropped") or {}).items()) if n]
    if counts.get("truncated"):
        rows.append(("truncated", "overlong (kept, cut)", counts["truncated"]))
    if not rows:
        return "<p>No record was rejected and no document dropped.</p>"
    top = max(n for *_, n in rows) or 1
    body = "".join(
        f'<tr><td class="k">{kind}</td><td class="k" data-reason="{kind}.{escape(reason)}">{escape(reason)}</td>'
        f'<td>{n:,}</td><td class="k"><span class="hbar" style="width:{240 * n / top:.0f}px"></span></td></tr>'
        for kind, reason, n in rows
    )
    return f'<table class="reasons"><tr><th class="k">what</th><th class="k">reason</th><th>count</th><th></th></tr>{body}</table>'


def _rejects_list(directory: Path | str, manifest: dict[str, Any]) -> str:
    name = manifest.get("rejects_file")
    if not name or not storage.isfile(storage.join(directory, name)):
        return ""
    rows, total = [], 0
    with storage.open_text(storage.join(directory, name)) as f:
        for line in f:
            total += 1
            if len(rows) < MAX_REJECTS_LISTED:
                r = json.loads(line)
                # rows of Parquet/Arrow inputs, records of JSON arrays, lines of JSONL and text
                where = next((r[k] for k in ("row", "record") if k in r), r.get("line"))
                original = str(r.get("original", ""))
                if len(original) > 200:
                    original = original[:200] + "…"
                rows.append(
                    f'<tr class="reject"><td class="k">{escape(redact(record_position(str(r.get("source")), where)))}</td>'
                    f'<td class="k">{escape(str(r.get("reason")))}</td><td class="k">{escape(str(r.get("field")))}</td>'
                    f'<td class="text">{escape(str(r.get("problem")))}</td><td class="text">{escape(original)}</td></tr>'
                )
    shown = f"the first {len(rows)} of {total:,}" if total > len(rows) else f"all {total:,}"
    return (
        f"<h3>Rejected records ({shown}, from {escape(name)})</h3>"
        '<table class="rejects"><tr><th class="k">where</th><th class="k">reason</th><th class="k">field</th>'
        f'<th class="k">problem</th><th class="k">original</th></tr>{"".join(rows)}</table>'
    )


def _charts(stats: SplitStats, seq_len: int) -> str:
    charts = []
    lengths = stats.lengths
    if len(lengths):
        lo, hi = int(lengths.min()), int(lengths.max()) + 1
        edges = np.linspace(lo, hi, min(30, hi - lo) + 1)
        counts, _ = np.histogram(lengths, edges)
        charts.append(histogram_svg(f"document length ({len(lengths):,} documents)", counts.tolist(),
                                    edges=edges.tolist(), xlabel="tokens per document"))  # fmt: skip
    if stats.weight_counts:
        values = sorted(stats.weight_counts)
        counts = [stats.weight_counts[v] for v in values]
        total = sum(counts)
        title = f"per-token weight ({total:,} document tokens)"
        if len(values) <= MAX_WEIGHT_BARS:
            charts.append(histogram_svg(title, counts, values=values, xlabel="weight"))
        else:
            edges = np.linspace(values[0], values[-1], 31)
            binned, _ = np.histogram(values, edges, weights=counts)
            charts.append(histogram_svg(title, binned.astype(np.int64).tolist(), edges=edges.tolist(),
                                        xlabel="weight" + (" (rounded to 0.001)" if stats.weights_rounded else "")))  # fmt: skip
    if stats.rows:
        edges = np.linspace(0.0, 1.0, 21)
        counts, _ = np.histogram(stats.fill, edges)
        charts.append(histogram_svg(f"row fill ({stats.rows:,} rows of {seq_len:,})", counts.tolist(),
                                    edges=edges.tolist(), xlabel="share of positions holding a document"))  # fmt: skip
    return f'<div class="charts">{"".join(charts)}</div>' if charts else "<p>No rows.</p>"


def _token_html(text: str) -> str:
    if not text:
        return '<span class="empty">∅</span>'
    return escape(text).replace("\n", '<span class="nl">↵</span>\n')


def _row_html(tok: Any, row: dict[str, Any], pad_id: int | None, max_tokens: int, turns: list[list[Any]]) -> str:
    lengths, pad = row_segments(row, pad_id)
    ids, labels, weights = row[INPUT_IDS], row[LABELS], row[WEIGHTS]
    out, start = [], 0
    for k, length in enumerate(lengths):
        doc_ids = ids[start : start + length].tolist()
        shown = min(length, max_tokens)
        sup = int((weights[start : start + length] > 0).sum())
        spans = []
        heads = [(o, role, m) for o, _, role, m in document_turns(turns, start, length) if role is not None]
        for a, b, text in token_groups(tok, doc_ids[:shown]):
            while heads and heads[0][0] < b:  # a conversation turn starts in this group: its role first
                _, role, message = heads.pop(0)
                spans.append(f'<span class="turn" data-role="{escape(role)}" data-message="{message}">'
                             f"{escape(role)} · messages[{message}]</span>")  # fmt: skip
            t_ids = doc_ids[a:b]
            t_labels = labels[start + a : start + b].tolist()
            t_weights = weights[start + a : start + b].tolist()
            tip = "\n".join(
                f"id {i} · label {lab}{' (ignored)' if lab == IGNORE_INDEX else ''} · weight {w:g}"
                for i, lab, w in zip(t_ids, t_labels, t_weights, strict=True)
            )
            spans.append(
                f'<span class="t {weight_class(t_weights[0])}" data-ids="{" ".join(map(str, t_ids))}" '
                f'data-labels="{" ".join(map(str, t_labels))}" data-weights="{" ".join(f"{w!r}" for w in t_weights)}" '
                f'title="{escape(tip)}">{_token_html(text)}</span>'
            )
        more = f" · showing {shown:,}" if shown < length else ""
        out.append(
            f'<div class="doc" data-doc="{k}" data-tokens="{length}"><div class="doc-head">document {k + 1} · '
            f"{length:,} tokens · {sup:,} supervised{more}</div>"
            f'<div class="tokens">{"".join(spans)}</div></div>'
        )
        start += length
    if pad:
        out.append(f'<div class="pad" data-pad="{pad}">padding: {pad:,} positions (label -100, weight 0)</div>')
    return "".join(out)


def render_report(
    directory: Path | str, *, tokenizer: str | None = None, rows: int = 3, max_tokens: int = 2048,
    storage_options: dict[str, Any] | str | None = None,
) -> str:
    """The page for the build in ``directory``, as a string (``storage_options``: of a URL ``directory``)."""
    with storage.session(storage_options):
        return _render_report(directory, tokenizer=tokenizer, rows=rows, max_tokens=max_tokens)


def _render_report(directory: Path | str, *, tokenizer: str | None, rows: int, max_tokens: int) -> str:
    from weightprep.commands.build import format_summary
    from weightprep.manifest import read_manifest, read_row, read_turns, split_shards
    from weightprep.tokenizer import load_tokenizer, tokenizer_fingerprint

    directory = directory if storage.is_url(directory) else Path(directory)  # a URL: a build in a store
    manifest = read_manifest(directory)
    tok_info = manifest["tokenizer"]
    tok = load_tokenizer(tokenizer or tok_info["name_or_path"], direct=True)
    warn = ""
    if tokenizer_fingerprint(tok) != tok_info["fingerprint"]:
        warn = '<p class="warn">This tokenizer\'s fingerprint differs from the one the shards were built with.</p>'
    pad_id = tok_info.get("pad_used")
    splits = list(manifest.get("splits") or {})
    config = manifest.get("config") or {}
    seq_len = int((config.get("pack") or {}).get("seq_len") or 0)
    inputs = "".join(
        f'<tr><td class="k">{escape(redact(str(i.get("path"))))}</td><td>{i.get("lines", 0):,}</td><td>{i.get("bytes", 0):,}</td>'
        f'<td class="k">{escape(str(i.get("sha256", ""))[:16])}</td></tr>'
        for i in manifest.get("inputs") or []
    )
    name = escape(redact(str(directory)).rstrip("/") or ".")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'unsafe-inline\'; '
        "img-src data:\">",
        f"<title>weightprep build report: {name}</title><style>{_CSS}</style></head><body>",
        f"<h1>weightprep build: {name}</h1>",
        f'<p class="meta">format {escape(str(manifest.get("format")))} v{manifest.get("format_version")} · '
        f"weightprep {escape(str(manifest.get('weightprep_version')))} · tokenizer "
        f"{escape(str(tok_info.get('name_or_path')))} ({escape(str(tok_info.get('class')))}, vocabulary "
        f"{tok_info.get('vocab_size', 0):,}, fingerprint {escape(str(tok_info.get('fingerprint'))[:12])}) · "
        f"seq_len {seq_len:,} · {'packed' if (config.get('pack') or {}).get('enabled', True) else 'padded, one document per row'}"
        f"{' · splits ' + ', '.join(map(escape, splits)) if splits else ''}</p>",
        warn,
        "<h2>Numbers</h2>",
        _summary_table(manifest, splits),
        f'<pre class="meta">{escape(format_summary(manifest, name, built=False))}</pre>',
        *_sources_section(manifest),
        "<h3>Inputs</h3>",
        f'<table class="inputs"><tr><th class="k">path</th><th>lines</th><th>bytes</th><th class="k">sha256</th></tr>{inputs}</table>',
        "<h3>Accounting (accepted = written + dropped + cut)</h3>",
        _accounting_table(manifest["counts"]),
        "<h2>Dropped and rejected</h2>",
        _reasons_table(manifest["counts"]),
        _rejects_list(directory, manifest),
    ]
    for split in splits or [None]:
        label = f" ({escape(split)})" if split else ""
        shards = split_shards(manifest, split)
        stats = split_stats(directory, shards, pad_id)
        parts += [f'<section class="split" data-split="{escape(split or "all")}">',
                  f"<h2>Distributions{label}</h2>", _charts(stats, seq_len)]  # fmt: skip
        n_rows = min(rows, stats.rows)
        if n_rows:
            parts.append(
                f"<h2>First {n_rows} row{'s' if n_rows > 1 else ''}{label}, token by token</h2>"
                '<p class="legend">weight: <span class="w0">0</span><span class="wlt1">&lt; 1</span>'
                '<span class="w1">1</span><span class="wle2">≤ 2</span><span class="wgt2">&gt; 2</span> · hover a '
                "token for its id, label and weight · ↵ is a newline</p>"
            )
        for index in range(n_rows):
            row = read_row(directory, manifest, index, split)
            turns = read_turns(directory, manifest, index, split)
            parts.append(f'<h3>row {index}</h3><div class="row" data-row="{index}">'
                         f"{_row_html(tok, row, pad_id, max_tokens, turns)}</div>")  # fmt: skip
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p)


def write_report(directory: Path | str, out: Path, **options: Any) -> Path:
    """Render the page and write it to ``out`` atomically (a temporary file, then a rename)."""
    page = render_report(directory, **options)
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
