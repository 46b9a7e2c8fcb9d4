"""``weightprep inspect DIR``: the manifest's numbers, and one row decoded with its weights visible.

In a terminal each span is coloured by weight (dim = 0, cyan < 1, green = 1, yellow/red > 1);
otherwise (a pipe, a file, a test) every change of weight is marked inline as ``[w=0.5]``.
Document boundaries are drawn as rules, the pad tail is summarized, not printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import numpy as np

from weightprep.commands._errors import reports_errors
from weightprep.commands.build import format_summary
from weightprep.constants import SEQ_LENGTHS
from weightprep.errors import UsageError
from weightprep.manifest import REBUILD, read_manifest

__all__ = ["inspect", "read_row", "split_shards", "weight_spans"]


def split_shards(manifest: dict[str, Any], split: str | None = None) -> list[dict[str, Any]]:
    """The manifest's shards of ``split`` (default: ``train`` in a build with splits, else all of them)."""
    splits = manifest.get("splits") or {}
    if split is None:
        split = "train" if splits else None
    elif split not in splits:
        have = ", ".join(splits) or "none: the build has no validation split"
        raise UsageError(f"no split {split!r} in this build (splits: {have})")
    return [s for s in manifest.get("shards") or [] if s.get("split") == split]


def read_row(directory: Path, manifest: dict[str, Any], index: int, split: str | None = None) -> dict[str, Any]:
    """Row ``index`` of the shards (of ``split``) as a dict of NumPy arrays (reads only the batches it needs)."""
    import pyarrow as pa

    seen = 0
    for shard in split_shards(manifest, split):
        if index < seen + shard["rows"]:
            path = directory / shard["filename"]
            try:
                with pa.memory_map(str(path)) as source:
                    table = pa.ipc.open_stream(source).read_all()
            except (OSError, pa.ArrowInvalid) as exc:
                raise UsageError(f"{path}: unreadable shard ({exc}); the directory is damaged: {REBUILD}") from exc
            if table.num_rows != shard["rows"]:
                raise UsageError(
                    f"{path}: {table.num_rows} rows where the manifest records {shard['rows']}; the shard is "
                    f"truncated or was replaced: {REBUILD}"
                )
            row = table.slice(index - seen, 1).to_pylist()[0]
            return {k: np.asarray(v) for k, v in row.items()}
        seen += shard["rows"]
    raise UsageError(f"row {index} does not exist: {directory} has {seen} rows (0..{seen - 1})")


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


def _style(w: float) -> str:
    from weightprep.report.page import weight_class

    return _STYLES[weight_class(w)]


@click.command("inspect")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
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
@reports_errors
def inspect(
    directory: Path,
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
    click.echo(format_summary(manifest, str(directory).rstrip("/")))
    tok = load_tokenizer(tokenizer or manifest["tokenizer"]["name_or_path"])
    if tokenizer_fingerprint(tok) != manifest["tokenizer"]["fingerprint"]:
        click.echo("warning: this tokenizer's fingerprint differs from the one the shards were built with", err=True)
    row = read_row(directory, manifest, row_index, split)
    console = Console(force_terminal=color, no_color=color is False, highlight=False, soft_wrap=True)
    plain = not console.is_terminal if color is None else not color
    start = 0
    n_segments = len(row[SEQ_LENGTHS])
    where = f" of {split}" if split else ""
    click.echo(f"\nrow {row_index}{where}: {len(row['input_ids'])} positions, segments {row[SEQ_LENGTHS].tolist()}")
    if not plain:
        legend = Text("weights: ")
        for label, w in (("0", 0.0), ("<1", 0.5), ("1", 1.0), ("<=2", 2.0), (">2", 3.0)):
            legend.append(f" {label} ", style=_style(w))
        console.print(legend)
    for k, length in enumerate(row[SEQ_LENGTHS].tolist()):
        ids = row["input_ids"][start : start + length]
        weights = row["weights"][start : start + length]
        # every written document has a supervised token, so an unsupervised last segment is the pad tail
        if k == n_segments - 1 and not (weights > 0).any():
            click.echo(f"── padding: {length} positions (label -100, weight 0) ──")
        else:
            click.echo(f"── document {k + 1}: {length} tokens, {int((weights > 0).sum())} supervised ──")
            text = Text()
            for w, span in weight_spans(ids[:max_tokens], weights[:max_tokens]):
                piece = tok.decode(span, skip_special_tokens=False)
                if plain:
                    text.append(f"[w={w:g}]{piece}")
                else:
                    text.append(piece, style=_style(w))
            if length > max_tokens:
                text.append(f" … ({length - max_tokens} more tokens; --max-tokens to see more)", style="italic")
            console.print(text)
        start += length
