"""The driver's merge: the parts' results, in part order, made into one build.

- Counts are summed in part order (float sums are the same for every executor and worker count).
- Line numbers of rejects (a JSON array's record numbers) are made the file's: the part's own number plus its line
  base (``plan.line_bases``, as for the errors ``run_parts`` raises; byte offsets are the file's already); ``rejects.jsonl`` is the parts'
  rejects in part order.
- Shards are taken in (part, shard) order, so the published ``data-i-of-n`` follow the input; the row numbers
  of ``chat_turns.jsonl`` are shifted by the rows of the earlier parts.
- A mixed part (a build with sources) reads several byte ranges, its segments: rejects and input statistics are
  the segments', each numbered in its own file (``_ranges``); counts, shards and turns are the part's.
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
from weightprep.distribute.plan import InputPart, MixedPart, line_bases
from weightprep.errors import record_unit
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
    """JSON lines with ``key`` increased by ``base`` (as written by ``json.dumps(..., ensure_ascii=False)``). A line
    that opens with ``key`` (the turns file's ``{"row": N, ...``) has its number replaced in the text, the rest of the
    line as it is: the bytes ``json.dumps`` writes for the entry parsed and shifted (a turns line of a 4,096-token row
    holds hundreds of spans, parsed and written again in ~70 us)."""
    head = f'{{"{key}": '
    for line in lines:
        if base:
            end = line.find(",", len(head)) if line.startswith(head) else -1
            number = line[len(head) : end]
            if end > 0 and number.isascii() and number.isdigit():
                line = f"{head}{int(number) + base}{line[end:]}"
            else:
                entry = json.loads(line)
                entry[key] += base
                line = json.dumps(entry, ensure_ascii=False) + "\n"
        yield line


def _ranges(parts: list[Any], results: list[dict[str, Any]]) -> list[tuple[InputPart, dict[str, Any], int, str | None]]:
    """(byte range, its input statistics, its part's index, its rejects file) of every range read, in plan order."""
    out = []
    for part, result in zip(parts, results, strict=True):
        if isinstance(part, MixedPart):
            index = [part.index] * len(part.segments)
            out.extend(zip(part.segments, result["inputs"], index, result["rejects_files"], strict=True))
        else:
            out.append((part, result["input"], part.index, result["rejects_file"]))
    return out


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
    # the byte ranges read, each with what it read and its rejects file: a plain part is one, a mixed part several
    ranges = _ranges(parts, results)
    line_base = iter(line_bases([p for p, _, _, _ in ranges], [i["lines"] for _, i, _, _ in ranges]))
    files: dict[int, list[tuple[InputPart, dict[str, Any]]]] = {}
    for segment, read, _, _ in ranges:
        files.setdefault(segment.file, []).append((segment, read))
    for file_index in sorted(files):
        file_parts = sorted(files[file_index], key=lambda pr: pr[0].start)
        first = file_parts[0][0]
        entry: dict[str, Any] = {
            "path": first.path,
            "bytes": sum(r["bytes"] for _, r in file_parts),
            "sha256": file_parts[0][1]["sha256"] if first.whole else None,
            "lines": sum(r["lines"] for _, r in file_parts),
        }
        if not first.whole:
            entry["parts"] = [
                {"start": s.start, "bytes": r["bytes"], "lines": r["lines"], "sha256": r["sha256"]} for s, r in file_parts
            ]
        merged.inputs.append(entry)
    rejects = (out_dir / REJECTS_NAME).open("w", encoding="utf-8", newline="\n") if skip else None
    turns: dict[str, Any] = {}
    row_base = dict.fromkeys(sets, 0)
    try:
        for segment, _, part_index, rejects_file in ranges:
            base = next(line_base)
            if rejects is not None and rejects_file:
                # a local directory or a prefix in a store; a reject names its line, or a JSON array's record
                with storage.open_text(storage.join(work_dir, f"{part_index:05d}", rejects_file)) as f:
                    rejects.writelines(_shift(f, record_unit(segment.path), base))
        for part, result in zip(parts, results, strict=True):
            directory = storage.join(work_dir, f"{part.index:05d}")
            merged.rejected.update(result["rejected"])
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
