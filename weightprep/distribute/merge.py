"""The driver's merge: the parts' results, in part order, made into one build.

- Counts are summed in part order (float sums are the same for every executor and worker count).
- Line numbers of rejects are made the file's: the part's own number plus its line base (``plan.line_bases``, as
  for the errors ``run_parts`` raises; byte offsets are the file's already); ``rejects.jsonl`` is the parts'
  rejects in part order.
- Shards are taken in (part, shard) order, so the published ``data-i-of-n`` follow the input; the row numbers
  of ``chat_turns.jsonl`` are shifted by the rows of the earlier parts.
- Each input's entry sums its parts' bytes and lines; its ``sha256`` is that of the whole file when it is one
  part, else each part's range is listed with its own ``sha256`` (a file is never read twice).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightprep import storage
from weightprep.constants import TURNS_NAME
from weightprep.distribute.plan import InputPart, line_bases
from weightprep.stages.rejects import REJECTS_NAME

__all__ = ["Merged", "merge_results"]


@dataclass
class Merged:
    #: raw counters per validation split (``""`` without one), summed over the input parts
    counts: dict[str, Counter] = field(default_factory=dict)
    total: Counter = field(default_factory=Counter)
    rejected: Counter = field(default_factory=Counter)
    inputs: list[dict[str, Any]] = field(default_factory=list)
    #: shard files per validation split, in output order, with their rows
    shards: dict[str, list[tuple[Path, int]]] = field(default_factory=dict)
    turns: bool = False


def _shift(lines: Any, key: str, base: int) -> Any:
    """JSON lines with ``key`` increased by ``base`` (as written by ``json.dumps(..., ensure_ascii=False)``)."""
    for line in lines:
        if base:
            entry = json.loads(line)
            entry[key] += base
            line = json.dumps(entry, ensure_ascii=False) + "\n"
        yield line


def merge_results(
    parts: list[InputPart], results: list[dict[str, Any]], out_dir: Path, work_dir: Path | str, *, names: tuple[str, ...] | None,
    skip: bool,
) -> Merged:
    """Merge ``results`` (one per part, in part order) into ``out_dir``: rejects and turns files written there,
    shards listed for ``Output.publish``."""
    merged = Merged()
    sets = list(names) if names else [""]
    merged.shards = {name: [] for name in sets}
    merged.counts = {name: Counter() for name in sets}
    line_base = line_bases(parts, [r["input"]["lines"] for r in results])
    files: dict[int, list[tuple[InputPart, dict[str, Any]]]] = {}
    for part, result in zip(parts, results, strict=True):
        files.setdefault(part.file, []).append((part, result))
    for file_parts in files.values():
        first = file_parts[0][0]
        entry: dict[str, Any] = {
            "path": first.path,
            "bytes": sum(r["input"]["bytes"] for _, r in file_parts),
            "sha256": file_parts[0][1]["input"]["sha256"] if first.whole else None,
            "lines": sum(r["input"]["lines"] for _, r in file_parts),
        }
        if not first.whole:
            entry["parts"] = [
                {"start": s.start, "bytes": r["input"]["bytes"], "lines": r["input"]["lines"], "sha256": r["input"]["sha256"]}
                for s, r in file_parts
            ]
        merged.inputs.append(entry)
    rejects = (out_dir / REJECTS_NAME).open("w", encoding="utf-8", newline="\n") if skip else None
    turns: dict[str, Any] = {}
    row_base = dict.fromkeys(sets, 0)
    try:
        for i, (part, result) in enumerate(zip(parts, results, strict=True)):
            directory = storage.join(work_dir, f"{part.index:05d}")  # a local directory or a prefix in a store
            merged.rejected.update(result["rejected"])
            if rejects is not None and result["rejects_file"]:
                with storage.open_text(storage.join(directory, result["rejects_file"])) as f:
                    rejects.writelines(_shift(f, "line", line_base[i]))
            for name in sets:
                merged.counts[name].update(result["counts"][name])
                written = result["written"][name]
                merged.shards[name].extend((storage.join(directory, rel), rows) for rel, rows in written["shards"])
                if written["turns"]:
                    if name not in turns:
                        (out_dir / name).mkdir(parents=True, exist_ok=True)
                        turns[name] = (out_dir / name / TURNS_NAME).open("w", encoding="utf-8")
                    with storage.open_text(storage.join(directory, written["turns"])) as f:
                        turns[name].writelines(_shift(f, "row", row_base[name]))
                row_base[name] += sum(rows for _, rows in written["shards"])
    finally:
        if rejects is not None:
            rejects.close()
        for f in turns.values():
            f.close()
    for name in sets:
        merged.total.update(merged.counts[name])
    merged.turns = bool(turns)
    return merged
