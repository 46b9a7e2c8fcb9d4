"""Several sources in one build: each a named set of inputs with a weight and a number of epochs.

A source is declared on the command line (``--source NAME=PATH[,weight=W][,epochs=E]``, repeatable) or as a
``sources:`` list in a pipeline file::

    sources:
      - {name: math, path: data/math.jsonl, weight: 2.0, epochs: 1.5}
      - {name: chat, path: [data/chat-*.jsonl], role_weights: "assistant=1,tool=0.5"}
      - {name: qa, path: data/qa.parquet, columns: "prompt=question,completion=answer"}

- ``weight`` W (a number >= 0, default 1) multiplies every token weight of the source before the float32 cast
  of the shards: a token whose weight is w (a piece's, a prompt's or completion's, a message's, the EOS weight)
  gets ``float32(W * w)``, the product taken in float64 (``scaled``). W = 0 is allowed: its documents are then
  unsupervised, dropped and counted as such, as any document without a supervised token.
- ``epochs`` E (a number > 0 and at most ``MAX_EPOCHS``, default 1): each training record of the source appears ``floor(E)`` times, and once
  more for the ``round((E - floor(E)) * N)`` of its N training records with the smallest epoch keys (``epoch_keys``:
  a mix of the record's content hash with the build's ``split.seed``, never its position; the cut is found by a
  pass over the input, ``distribute.mixed.epoch_cuts_from``; ``copies``). Held-out (validation) records appear once.
- ``columns`` and ``role_weights``: the source's own ``read.columns`` and ``chat.role_weights``.

Every problem (an unknown key, a bad number, a name used twice or not usable in a split name, a path that matches
nothing) is a ``ConfigError`` before any work (exit 2).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from weightprep.errors import ConfigError, UsageError
from weightprep.weights import is_valid_weight, weight_overflow_note

__all__ = ["Source", "parse_source_option", "sources_from_data", "check_source_names", "scaled_weights", "copies",
           "epoch_keys", "NAME_PATTERN", "manifest_sources"]

#: A source's name: it becomes part of a split name (``validation_NAME``) and of metric names; no '-', which
#: ``datasets`` refuses in a split name (``^\w+(\.\w+)*$``), so ``load_from_disk`` could not open the output;
#: at most 100 characters, as ``validation_NAME`` is a directory (a file name has at most 255 bytes).
NAME_PATTERN = re.compile(r"[A-Za-z0-9_]{1,100}")
_KEYS = ("name", "path", "weight", "epochs", "columns", "role_weights")
_CLI_KEYS = ("weight", "epochs")
_FULL = 1 << 64
#: The most epochs a source may have: each copy is a packing pass of every part (its own packer), so a huge E
#: never ends rather than failing; no mix repeats a record more than this.
MAX_EPOCHS = 1000


@dataclass(frozen=True)
class Source:
    name: str
    paths: tuple[str, ...]
    weight: float = 1.0
    epochs: float = 1.0
    columns: str | None = None
    role_weights: str | None = None

    def as_manifest(self) -> dict[str, Any]:
        return {"name": self.name, "paths": list(self.paths), "weight": self.weight, "epochs": self.epochs,
                "columns": self.columns, "role_weights": self.role_weights}  # fmt: skip


def _number(field: str, key: str, value: Any, problems: list[str]) -> float | None:
    """``value`` as a float, or None and a problem naming ``field + key``."""
    if isinstance(value, str):
        try:
            if "_" in value:  # Python's float() reads "1_000" as 1000; no config language a user writes does
                raise ValueError(value)
            value = float(value)
        except ValueError:
            problems.append(f"{field}{key}: expected a number, got {value!r}")
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        problems.append(f"{field}{key}: expected a number, got {type(value).__name__} {value!r}")
        return None
    try:
        return float(value)
    except OverflowError:
        problems.append(f"{field}{key}: {value} is too large")
        return None


def _source(field: str, data: dict[str, Any], problems: list[str]) -> Source | None:
    """One source from its mapping, its problems appended, each naming its key after ``field`` (``sources[2].``,
    ``--source a=x.jsonl,epochs=0: ``)."""
    for key in data:
        if key not in _KEYS:
            problems.append(f"{field}{key}: unknown key; expected one of {', '.join(_KEYS)}")
    name, path = data.get("name"), data.get("path")
    ok = True
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        problems.append(f"{field}name: expected a name of letters, digits and '_', at most 100 (it names the split "
                        f"validation_NAME), got {name!r}")  # fmt: skip
        ok = False
    if isinstance(path, str):
        path = [path]
    if not isinstance(path, list) or not path or not all(isinstance(p, str) and p for p in path):
        problems.append(f"{field}path: expected a file, directory or glob (or a list of them), got {path!r}")
        ok = False
    weight = _number(field, "weight", data.get("weight", 1.0), problems)
    if weight is not None:
        weight += 0.0  # -0.0 is 0: no "-0" in the manifest and the table, no -0.0 token weights
    if weight is not None and not is_valid_weight(weight):
        problems.append(f"{field}weight: must be a finite number >= 0, got {weight}{weight_overflow_note(weight)}")
    epochs = _number(field, "epochs", data.get("epochs", 1.0), problems)
    if epochs is not None and not (math.isfinite(epochs) and epochs > 0):
        problems.append(f"{field}epochs: must be a finite number > 0, got {epochs}")
    elif epochs is not None and epochs > MAX_EPOCHS:
        shown = repr(epochs).removesuffix(".0")  # all its digits: 1000.0000001 is not shown as the limit itself
        problems.append(f"{field}epochs: {shown} is more than {MAX_EPOCHS}: each copy is a packing pass of every "
                        "part; give fewer epochs")  # fmt: skip
    for key in ("columns", "role_weights"):
        if data.get(key) is not None and not isinstance(data[key], str):
            problems.append(f"{field}{key}: expected a string, got {data[key]!r}")
    if data.get("columns") is not None and isinstance(data["columns"], str):
        from weightprep.stages.columns import parse_columns

        try:
            parse_columns(data["columns"])
        except UsageError as exc:
            problems.append(f"{field}columns: {exc}".replace("--columns: ", ""))
    if isinstance(data.get("role_weights"), str):
        from weightprep.weights import parse_role_weights

        try:
            parse_role_weights(data["role_weights"])
        except ConfigError as exc:
            problems.extend(f"{field}{p}" for p in exc.problems)
    if not ok:
        return None
    return Source(name, tuple(path), weight, epochs, data.get("columns"), data.get("role_weights"))  # type: ignore


def parse_source_option(text: str) -> Source:
    """``--source NAME=PATH[,weight=W][,epochs=E]`` as a Source (a path holding a comma needs a pipeline file)."""
    head, *options = text.split(",")
    name, sep, path = head.partition("=")
    where = f"--source {text}"
    problems: list[str] = []
    if not sep:
        raise ConfigError([f"{where}: expected NAME=PATH[,weight=W][,epochs=E]"])
    data: dict[str, Any] = {"name": name, "path": path}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or key not in _CLI_KEYS:
            problems.append(f"{where}: unknown option {option!r}; expected weight=W or epochs=E (a path with a "
                            "comma, per-source columns or role_weights: use a pipeline file's sources:)")  # fmt: skip
            continue
        if key in data:
            problems.append(f"{where}: {key} given twice")
        data[key] = value
    source = _source(f"{where}: ", data, problems)
    if problems:
        raise ConfigError(problems)
    assert source is not None
    return source


def sources_from_data(data: Any, origin: str | None = None) -> list[Source]:
    """The ``sources:`` list of a pipeline file."""
    problems: list[str] = []
    if not isinstance(data, list) or not data:
        raise ConfigError([f"sources: expected a non-empty list of {{name, path, ...}}, got {data!r}"], origin)
    sources = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            problems.append(f"sources[{i}]: expected a mapping of {', '.join(_KEYS)}, got {item!r}")
            continue
        source = _source(f"sources[{i}].", item, problems)
        if source is not None:
            sources.append(source)
    if problems:
        raise ConfigError(problems, origin)
    return sources


def check_source_names(sources: list[Source]) -> None:
    """Two sources with one name would share their validation split and their numbers. Each source is checked
    as a declaration is too: a ``Source`` made in Python (``build(sources=...)``) skips the parsing."""
    problems: list[str] = []
    for s in sources:
        _source(f"source {s.name!r}.", {"name": s.name, "path": list(s.paths), "weight": s.weight, "epochs": s.epochs,
                                      "columns": s.columns, "role_weights": s.role_weights}, problems)  # fmt: skip
    if problems:
        raise ConfigError(problems)
    seen: dict[str, str] = {}
    for s in sources:
        if s.name in seen:
            raise ConfigError([f"source {s.name!r} is declared twice; give each source its own name"])
        if s.name.casefold() in (folded := {k.casefold(): v for k, v in seen.items()}):
            raise ConfigError([
                f"sources {folded[s.name.casefold()]!r} and {s.name!r} differ only in case: their validation splits "
                "(validation_NAME) would be one directory on a case-insensitive filesystem (macOS, Windows, some "
                "object-store mounts); give them names that differ otherwise"
            ])
        seen[s.name] = s.name
    if all(s.weight == 0 for s in sources):
        raise ConfigError([
            "every source has weight 0: no token would be learned and the build would write no row; give at least "
            "one source a weight > 0"
        ])


def scaled_weights(weights: np.ndarray, weight: float) -> np.ndarray:
    """float64 ``weight * weights``: what the float32 cast of assemble makes ``float32(W * w)`` (W = 1: as they are)."""
    return weights if weight == 1.0 else np.asarray(weights, dtype=np.float64) * weight


def epoch_keys(split_keys: np.ndarray) -> np.ndarray:
    """uint64: each record's epoch key, a SplitMix64 mix of its split key (``split.record_keys``), so that whether a
    record gets its extra copy is independent of whether it is held out for validation (the same key)."""
    z = split_keys.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def copies(split_keys: np.ndarray, epochs: float, cut: int) -> np.ndarray:
    """int64: how many times each record appears in the train split: ``floor(E)``, plus one where its epoch key
    (``epoch_keys``) is below ``cut`` (the source's, ``distribute.mixed.epoch_cuts_from``)."""
    base = np.full(len(split_keys), math.floor(epochs), dtype=np.int64)
    if cut == 0:
        return base
    if cut >= _FULL:
        return base + 1
    return base + (epoch_keys(split_keys) < np.uint64(cut))


#: The written side of a split, counted per source from its documents and for the split from its rows.
_WRITTEN = ("documents_written", "tokens", "supervised_tokens")


def manifest_sources(
    sources: list[Source], files: list[list[str]], results: list[dict[str, Any]], splits: dict[str, Counter]
) -> list[dict[str, Any]]:
    """The manifest's ``sources``: each source's numbers (summed over the mixed parts, in part order), checked by
    the accounting identity, and the check that the sources' written tokens are the rows' (``splits``: each split's
    raw counters)."""
    from weightprep.accounting import check_accounting, source_counts
    from weightprep.errors import AccountingError

    raw = [{name: Counter() for name in splits} for _ in sources]
    rejected = [Counter() for _ in sources]
    for result in results:
        for s, by_split in enumerate(result["sources"]):
            rejected[s].update(result["source_rejected"][s])
            for name, c in by_split.items():
                raw[s][name].update(c)
    problems = []
    for name, split in splits.items():
        for key in _WRITTEN:
            if sum(r[name][key] for r in raw) != split[key]:
                problems.append(f"split {name or 'train'}: the sources' {key} {[r[name][key] for r in raw]} do not sum "
                                f"to the rows' {split[key]}")  # fmt: skip
        if not math.isclose(sum(r[name]["total_weight"] for r in raw), split["total_weight"], rel_tol=1e-9, abs_tol=1e-6):
            problems.append(f"split {name or 'train'}: the sources' weight does not sum to the rows' {split['total_weight']}")
    if problems:
        raise AccountingError(problems)
    train = "train" if "train" in splits else ""
    train_weight = sum(r[train]["total_weight"] for r in raw)
    entries = []
    for source, paths, by_split, source_rejected in zip(sources, files, raw, rejected, strict=True):
        total = Counter()
        for c in by_split.values():
            total.update(c)  # not Counter's +, which drops the negative (net) repeats of epochs < 1
        counts = source_counts(total, source_rejected)
        check_accounting(counts)
        entries.append({
            **source.as_manifest(),
            "paths": paths,
            "records": counts["records"],
            "rejected": counts["rejected"],
            "documents": counts["documents"],
            "repeats": counts["repeats"],
            "omitted": counts["omitted"],
            "tokens": counts["tokens"],
            "supervised_tokens": counts["supervised_tokens"],
            "total_weight": counts["total_weight"],
            "weight_share": round(by_split[train]["total_weight"] / train_weight, 6) if train_weight else 0.0,
            "splits": {
                name or "train": {**{k: c[k] for k in _WRITTEN}, "records": c["accepted"],
                                  "total_weight": round(c["total_weight"], 6)}
                for name, c in by_split.items()
            },
            "counts": counts,
        })  # fmt: skip
    return entries
