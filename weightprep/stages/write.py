"""Stage 8 — write: rows as Arrow shards that ``datasets`` opens as they are, plus the manifest.

Layout of the output directory (the same as ``Dataset.save_to_disk``)::

    out/data-00000-of-00003.arrow ...   Arrow IPC streams, fixed-size list columns
    out/dataset_info.json, state.json   what ``datasets.load_from_disk`` reads
    out/weightprep_manifest.json        what was done (config, tokenizer, inputs, counts)
    out/chat_turns.jsonl                where conversations' turns lie in the rows (builds with chat records)

With a validation split (``--validation-fraction``/``--validation-records``) it is the layout of
``DatasetDict.save_to_disk``: ``out/dataset_dict.json``, ``out/train/...`` and ``out/validation/...``, each
split a directory as above without the manifest, which stays at ``out/`` and lists every shard with its split.

Each input part writes its ``shard-i.arrow`` shards into its own directory (``ShardWriter``); how they become the
``data-i-of-n`` files of ``out``, all at once, on a local disk or in an object store, is
``weightprep.stages.publish``'s. Shards are capped at ``max_shard_bytes``; a rerun with the same inputs, configuration and
tokenizer writes byte-identical files (no timestamps, no random fingerprints).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from weightprep.arrow import from_numpy
from weightprep.batches import Rows, split_turn_code
from weightprep.constants import (
    ATTENTION_MASK,
    INPUT_IDS,
    LABELS,
    MANIFEST_NAME,
    PACKED_COLUMNS,
    POSITION_IDS,
    SEQ_LENGTHS,
    TURNS_NAME,
    UNPACKED_COLUMNS,
    WEIGHTS,
)
from weightprep.redact import redact_record

__all__ = ["features", "arrow_schema", "ShardWriter", "empty_shard", "loadable_files", "turn_lines",
           "shard_name"]

_DTYPES = {INPUT_IDS: "int32", LABELS: "int32", WEIGHTS: "float32", POSITION_IDS: "int32", ATTENTION_MASK: "int8"}


def features(seq_len: int, *, packed: bool) -> dict[str, Any]:
    """The shards' ``datasets`` features as the JSON ``datasets`` writes: fixed-size lists of
    ``seq_len`` (``List(Value(dtype), length=seq_len)``) and ``seq_lengths`` a plain list of int32.
    Spelled out here so a build never imports ``datasets``; tests check it against ``datasets`` itself."""
    cols = PACKED_COLUMNS if packed else UNPACKED_COLUMNS
    spec: dict[str, Any] = {}
    for c in cols:
        if c == SEQ_LENGTHS:
            spec[c] = {"feature": {"dtype": "int32", "_type": "Value"}, "_type": "List"}
        else:
            spec[c] = {"feature": {"dtype": _DTYPES[c], "_type": "Value"}, "length": seq_len, "_type": "List"}
    return spec


def arrow_schema(seq_len: int, *, packed: bool) -> pa.Schema:
    """The Arrow schema of the shards, with the ``huggingface`` metadata ``datasets`` reads back."""
    arrow_types = {"int32": pa.int32(), "float32": pa.float32(), "int8": pa.int8()}
    cols = PACKED_COLUMNS if packed else UNPACKED_COLUMNS
    fields = [
        pa.field(c, pa.list_(pa.int32()) if c == SEQ_LENGTHS else pa.list_(arrow_types[_DTYPES[c]], seq_len))
        for c in cols
    ]
    meta = json.dumps({"info": {"features": features(seq_len, packed=packed)}}, separators=(", ", ": "))
    return pa.schema(fields, metadata={"huggingface": meta})


class _ShardSet:
    """The size-capped shards of one ``datasets`` directory (the whole output, or one split of it) as a split writes
    them: ``shard-i.arrow`` files, named ``data-i-of-n`` only when the whole build is published."""

    def __init__(self, directory: Path, schema: pa.Schema, rows_per_shard: int) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.schema = schema
        self.rows_per_shard = rows_per_shard
        self._shards: list[tuple[Path, int]] = []
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self._sink: Any = None
        self._rows_in_shard = 0

    def _open_next(self) -> None:
        self.close()
        path = self.directory / f"shard-{len(self._shards):05d}.arrow"
        self._sink = pa.OSFile(str(path), "wb")
        self._writer = pa.ipc.new_stream(self._sink, self.schema)
        self._shards.append((path, 0))
        self._rows_in_shard = 0

    def close(self) -> list[tuple[Path, int]]:
        """Close the open shard; the shards written, with their rows."""
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            path, _ = self._shards[-1]
            self._shards[-1] = (path, self._rows_in_shard)
            self._writer = None
        return list(self._shards)

    def write(self, batch: pa.RecordBatch) -> None:
        start = 0
        while start < batch.num_rows:
            if self._writer is None or self._rows_in_shard >= self.rows_per_shard:
                self._open_next()
            take = min(batch.num_rows - start, self.rows_per_shard - self._rows_in_shard)
            self._writer.write_batch(batch.slice(start, take))  # type: ignore[union-attr]
            self._rows_in_shard += take
            start += take

    def empty_shard(self) -> Path:
        """Write a shard of no rows (a dataset with no rows is still a valid, empty dataset)."""
        self._open_next()
        self.close()
        return self._shards[-1][0]

    def abort(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
                self._sink.close()
            except Exception:  # the shard is being thrown away anyway
                pass
            self._writer = None


def empty_shard(directory: Path, seq_len: int, *, packed: bool) -> Path:
    """A shard of no rows in ``directory``: a dataset with no rows (every record dropped, an empty split) is still
    a valid, empty dataset."""
    return _ShardSet(directory, arrow_schema(seq_len, packed=packed), 1).empty_shard()


class ShardWriter:
    """Writes one input part's ``Rows`` into size-capped Arrow shards (``shard-i.arrow``) under ``directory``.

    With ``splits`` (``("train", "validation")``) each ``write`` names its split and each split's shards go to
    ``directory/SPLIT/``. Conversations' turns go to ``chat_turns.jsonl`` beside the shards, rows numbered from
    0 within this writer; ``weightprep.distribute.merge`` renumbers them for the whole build.
    """

    def __init__(
        self,
        directory: Path,
        seq_len: int,
        *,
        packed: bool,
        max_shard_bytes: int,
        splits: Sequence[str] | None = None,
        turn_roles: list[str] | None = None,
    ) -> None:
        self.directory = directory
        self.seq_len = seq_len
        self.schema = arrow_schema(seq_len, packed=packed)
        self.columns = PACKED_COLUMNS if packed else UNPACKED_COLUMNS
        per_token = sum(4 if _DTYPES[c] != "int8" else 1 for c in self.columns if c != SEQ_LENGTHS)
        self.rows_per_shard = max(1, max_shard_bytes // (seq_len * per_token + 64))
        self._sets = {
            name: _ShardSet(directory / name if name else directory, self.schema, self.rows_per_shard)
            for name in (tuple(splits) if splits else (None,))
        }
        self.turn_roles = turn_roles if turn_roles is not None else []
        self._rows = dict.fromkeys(self._sets, 0)  # rows written per split: the turns file's row numbers
        self._turns: dict[str | None, Any] = {}  # open turns files per split

    def _record_batch(self, rows: Rows) -> pa.RecordBatch:
        arrays = []
        for c in self.columns:
            if c == SEQ_LENGTHS:
                counts = np.fromiter(map(len, rows.seq_lengths), dtype=np.int32, count=len(rows))
                offsets = np.zeros(len(rows) + 1, dtype=np.int32)
                np.cumsum(counts, out=offsets[1:])
                values = from_numpy(np.concatenate(rows.seq_lengths), pa.int32())
                arrays.append(pa.ListArray.from_arrays(from_numpy(offsets, pa.int32()), values))
            else:
                data = getattr(rows, c)
                flat = from_numpy(data.reshape(-1), self.schema.field(c).type.value_type)
                arrays.append(pa.FixedSizeListArray.from_arrays(flat, self.seq_len))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def write(self, rows: Rows, split: str | None = None) -> None:
        self._sets[split].write(self._record_batch(rows))
        if rows.turns is not None:
            self._write_turns(rows.turns, split)
        self._rows[split] += len(rows)

    def _write_turns(self, turns: np.ndarray, split: str | None) -> None:
        """One line per row holding conversation tokens: its turns as [start, length, role, message]."""
        lines = turn_lines(turns, self._rows[split], self.turn_roles)
        if lines:
            if split not in self._turns:
                self._turns[split] = open(self._sets[split].directory / TURNS_NAME, "w", encoding="utf-8")  # noqa: SIM115
            self._turns[split].writelines(lines)

    def close(self) -> dict[str, Any]:
        """Close every file; what was written, per split (``""`` without splits): shard files (relative to
        ``directory``) with their rows, and the turns file if any."""
        for f in self._turns.values():
            f.close()
        out: dict[str, Any] = {}
        for name, shard_set in self._sets.items():
            out[name or ""] = {
                "shards": [[p.relative_to(self.directory).as_posix(), rows] for p, rows in shard_set.close()],
                "turns": (Path(name or ".") / TURNS_NAME).as_posix() if name in self._turns else None,
            }
        return out

    def abort(self) -> None:
        for f in self._turns.values():
            f.close()
        for shard_set in self._sets.values():
            shard_set.abort()


def turn_lines(turns: np.ndarray, first_row: int, roles: list[str]) -> list[str]:
    """The turns file's lines of a chunk of rows (``turns``: rows x seq_len turn codes, ``batches.turn_code``): for
    each row holding a non-zero code, ``{"row": first_row + r, "turns": [[start, length, role, message], ...]}``, one
    span per run of one non-zero code, as ``json.dumps(..., ensure_ascii=False)`` writes it. The runs of all the rows
    are found at once, in the rows laid end to end: a run starts where a code differs from the one before it, or
    where a row starts (``flatnonzero``: a 2-D ``nonzero`` of a chunk's 4M positions took ~10x as long)."""
    n_rows, seq_len = turns.shape
    if not n_rows or not seq_len:
        return []
    flat = turns.ravel()
    starts_run = np.empty(flat.shape, dtype=bool)
    np.not_equal(flat[1:], flat[:-1], out=starts_run[1:])
    starts_run[::seq_len] = True  # the first position of every row, the chunk's first among them
    at = np.flatnonzero(starts_run)  # row by row, in order
    lengths = np.diff(at, append=flat.size)  # a run ends where the next starts: in its row, or at the row's end
    codes = flat[at].astype(np.int64)
    spans = codes != 0
    at, lengths, codes = at[spans], lengths[spans], codes[spans]
    rows, starts = np.divmod(at, seq_len)
    role, message = split_turn_code(codes)  # type: ignore[arg-type]
    names = [json.dumps(name, ensure_ascii=False) for name in roles]
    texts = [f"[{a}, {b}, {names[c]}, {m}]"
             for a, b, c, m in zip(starts.tolist(), lengths.tolist(), role.tolist(), message.tolist(), strict=True)]  # fmt: skip
    if not len(rows):
        return []
    cuts = np.flatnonzero(np.append(True, rows[1:] != rows[:-1])).tolist() + [len(rows)]
    return [f'{{"row": {first_row + int(rows[a])}, "turns": [{", ".join(texts[a:b])}]}}\n'
            for a, b in zip(cuts[:-1], cuts[1:], strict=True)]  # fmt: skip


def shard_name(i: int, n: int) -> str:
    """The published name of shard ``i`` of ``n`` (``Dataset.save_to_disk``'s)."""
    return f"data-{i:05d}-of-{n:05d}.arrow"


def loadable_files(
    per_set: dict[str, list[dict[str, Any]]], manifest: dict[str, Any], *, seq_len: int, packed: bool, turns: bool
) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    """The final manifest and the files that make the output loadable, in the order they are written: each
    split's ``state.json`` and ``dataset_info.json``, ``dataset_dict.json`` (with splits), the manifest last.
    ``per_set``: each split's (``""``: the output's) shard entries, ``{"filename", "rows", "bytes"}``."""
    shards = [{**e, "split": name} if name else e for name, entries in per_set.items() for e in entries]
    manifest = redact_record(manifest)  # inputs and sources by URL: recorded without their secrets
    manifest = {**manifest, "shards": shards, "turns_file": TURNS_NAME if turns else None}
    manifest_text = json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    digest = hashlib.sha256(manifest_text.encode()).hexdigest()
    feats = features(seq_len, packed=packed)
    files = []
    for name, entries in per_set.items():
        fingerprint = hashlib.sha256(f"{digest}/{name}".encode()).hexdigest()[:16] if name else digest[:16]
        prefix = f"{name}/" if name else ""
        files.extend((prefix + f, text) for f, text in _metadata(entries, fingerprint, feats, name or None))
    names = [n for n in per_set if n]
    if names:
        files.append(("dataset_dict.json", (json.dumps({"splits": names}) + "\n").encode()))
    files.append((MANIFEST_NAME, manifest_text.encode("utf-8")))
    return manifest, files


def _metadata(
    shards: list[dict[str, Any]], fingerprint: str, feats: dict[str, Any], split: str | None
) -> list[tuple[str, bytes]]:
    """``state.json`` and ``dataset_info.json``, what ``datasets.load_from_disk`` reads."""
    state = {
        "_data_files": [{"filename": Path(s["filename"]).name} for s in shards],
        "_fingerprint": fingerprint,
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": split,
    }
    info = {
        "citation": "",
        "description": "Token-weighted rows written by weightprep; see weightprep_manifest.json.",
        "features": feats,
        "homepage": "",
        "license": "",
    }
    return [  # state.json last: it switches a split to its shards (weightprep.stages.publish writes in this order)
        ("dataset_info.json", (json.dumps(info, indent=2, sort_keys=True) + "\n").encode()),
        ("state.json", (json.dumps(state, indent=2, sort_keys=True) + "\n").encode()),
    ]
