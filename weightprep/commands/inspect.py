"""``weightprep inspect DIR``: the manifest's numbers, and one row decoded with its weights visible.

In a terminal each span is coloured by weight (dim = 0, cyan < 1, green = 1, yellow/red > 1);
otherwise (a pipe, a file, a test) every change of weight is marked inline as ``[w=0.5]``.
Document boundaries are drawn as rules, the pad tail is summarized, not printed. A conversation (chat record) is
shown turn by turn, each headed by its role, message index and weight (from the build's turns file).
"""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from weightprep.commands._errors import reports_errors
from weightprep.commands._storage import LOCATION, storage_options
from weightprep.commands.build import format_summary
from weightprep.constants import SEQ_LENGTHS
from weightprep.errors import UsageError
from weightprep.manifest import read_manifest, read_row, read_turns
from weightprep.report.page import weight_class
from weightprep.report.stats import document_turns, row_segments

__all__ = ["inspect", "weight_spans"]


def weight_spans(input_ids: np.ndarray, weights: np.ndarray) -> list[tuple[float, list[int]]]:
    """Consecutive tokens of equal weight, as (weight, ids) runs."""
    spans: list[tuple[float, list[int]]] = []
    for tid, w in zip(input_ids.tolist(), weights.tolist(), strict=True):
        if spans and spans[-1][0] == w:
            spans[-1][1].append(tid)
        else:
            spans.append((w, [tid]))
    return spans


#: terminal colours of the weight buckets (the HTML report's classes)
_STYLES = {"w0": "dim", "wlt1": "cyan", "w1": "green", "wle2": "bold yellow", "wgt2": "bold red"}


def _per_turn_label(parts: list[tuple[int, int, str | None, int | None]], weights: np.ndarray) -> str:
    """``, the per-turn document of messages[3]``: the weighted turn a per-turn document was made for (its last
    turn with weight), or nothing for a document of no weighted turn."""
    weighted = [m for a, n, role, m in parts if role is not None and n and float(weights[a : a + n].max()) > 0]
    return f", the per-turn document of messages[{weighted[-1]}]" if weighted else ""


def _style(w: float) -> str:
    return _STYLES[weight_class(w)]


@click.command("inspect")
@click.argument("directory", type=LOCATION)
@click.option("--row", "row_index", type=int, default=0, show_default=True, help="Which row to render.")
@click.option("--split", help="Which split's rows, in a build with a validation split (default: train).")
@click.option("--tokenizer", help="Tokenizer to decode with (default: the one recorded in the manifest).")
@click.option("--max-tokens", type=int, default=300, show_default=True, help="Tokens shown per document.")
@click.option("--color/--no-color", default=None, help="Colour spans by weight (default: when a terminal).")
@click.option(
    "--html",
    "html_out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write a self-contained HTML report of the build (numbers, histograms, rows token by token) to this file.",
)
@click.option("--report-rows", type=click.IntRange(min=0), default=3, show_default=True,
              help="Rows per split shown token by token in the HTML report.")  # fmt: skip
@storage_options
@reports_errors
def inspect(
    directory: Path | str,
    row_index: int,
    split: str | None,
    tokenizer: str | None,
    max_tokens: int,
    color: bool | None,
    html_out: Path | None,
    report_rows: int,
) -> None:
    """Show DIRECTORY's manifest numbers and one row decoded, with each token's weight visible; or, with --html,
    write all of it and more as one web page."""
    from rich.console import Console
    from rich.text import Text

    from weightprep.tokenizer import load_tokenizer, tokenizer_fingerprint

    manifest = read_manifest(directory)
    if html_out is not None:
        from weightprep.report import write_report

        if not html_out.parent.is_dir():
            raise UsageError(f"--html {html_out}: directory {html_out.parent} does not exist")
        write_report(directory, html_out, tokenizer=tokenizer, rows=report_rows)
        click.echo(f"wrote {html_out} ({html_out.stat().st_size:,} bytes)")
        return
    click.echo(format_summary(manifest, str(directory).rstrip("/"), built=False))
    tok = load_tokenizer(tokenizer or manifest["tokenizer"]["name_or_path"], direct=True)
    if tokenizer_fingerprint(tok) != manifest["tokenizer"]["fingerprint"]:
        click.echo("warning: this tokenizer's fingerprint differs from the one the shards were built with", err=True)
    row = read_row(directory, manifest, row_index, split)
    console = Console(force_terminal=color, no_color=color is False, highlight=False, soft_wrap=True)
    plain = not console.is_terminal if color is None else not color
    start = 0
    where = f" of {split}" if split else ""
    click.echo(f"\nrow {row_index}{where}: {len(row['input_ids'])} positions, segments {row[SEQ_LENGTHS].tolist()}")
    if not plain:
        legend = Text("weights: ")
        for label, w in (("0", 0.0), ("<1", 0.5), ("1", 1.0), ("<=2", 2.0), (">2", 3.0)):
            legend.append(f" {label} ", style=_style(w))
        console.print(legend)
    documents, pad = row_segments(row, manifest["tokenizer"].get("pad_used"))
    turns = read_turns(directory, manifest, row_index, split)
    per_turn = bool(manifest["counts"].get("chat_history_documents"))
    for k, length in enumerate(documents):
        ids = row["input_ids"][start : start + length]
        weights = row["weights"][start : start + length]
        parts = document_turns(turns, start, length)
        chat = any(role is not None for _, _, role, _ in parts)
        click.echo(f"── document {k + 1}: {length} tokens, {int((weights > 0).sum())} supervised"
                   f"{_per_turn_label(parts, weights) if per_turn else ''} ──")  # fmt: skip
        shown = 0
        for a, n, role, message in parts:
            text = Text()
            w_max = float(weights[a : a + n].max()) if n else 0.0
            if role is not None:
                text.append(f"▸ {role} (messages[{message}]), weight {w_max:g}: ", style="bold")
            elif chat:  # no message's turn: template text, or earlier turns as the template renders them later on
                later = [m for b, _, r, m in parts if r is not None and b > a]
                what = f"earlier turns as rendered before messages[{later[-1]}]" if per_turn and later else "template text"
                text.append(f"▸ {what}, weight {w_max:g}: ", style="bold")
            span_ids, span_w = ids[a : a + n], weights[a : a + n]
            take = max(0, min(n, max_tokens - shown))
            for w, span in weight_spans(span_ids[:take], span_w[:take]):
                piece = tok.decode(span, skip_special_tokens=False)
                if plain:
                    text.append(f"[w={w:g}]{piece}")
                else:
                    text.append(piece, style=_style(w))
            shown += take
            if text:
                console.print(text)
        if length > max_tokens:
            console.print(Text(f" … ({length - max_tokens} more tokens; --max-tokens to see more)", style="italic"))
        start += length
    if pad:
        click.echo(f"── padding: {pad} positions (label -100, weight 0) ──")
