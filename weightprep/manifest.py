"""Reading the manifest that ``weightprep build`` writes beside its shards: the one reader of the package.

``weightprep train``, ``weightprep inspect`` and ``weightprep plan --shards`` all open a shard directory through
:func:`read_manifest`, which refuses, with the fix, a directory that is not a finished build of this format.
``inspect`` and its HTML report read the shards the manifest lists through :func:`shard_batches` and
:func:`read_row`, which refuse a damaged or truncated shard the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from weightprep import storage
from weightprep.constants import FORMAT_NAME, FORMAT_VERSION, MANIFEST_NAME, READABLE_VERSIONS
from weightprep.errors import UsageError

__all__ = ["REBUILD", "build_setting", "read_manifest", "read_row", "read_turns", "shard_batches", "split_shards"]

#: The fix for shards this version cannot use.
REBUILD = "rebuild them with `weightprep build` from this version"


def read_manifest(path: str | Path, *, storage_options: dict[str, Any] | str | None = None) -> dict[str, Any]:
    """The manifest beside the shards, checked for this format and version. ``storage_options``: the fsspec
    options of a URL ``path`` (``weightprep.storage.session``; None: the process's), as for the readers below."""
    with storage.session(storage_options):
        return _read_manifest(path)


def _read_manifest(path: str | Path) -> dict[str, Any]:
    path = path if storage.is_url(path) else Path(path)  # a URL: a prefix in a store (weightprep.storage)
    if not storage.isdir(path):
        raise UsageError(f"shard directory {str(path)!r} does not exist; create it with `weightprep build`")
    manifest_path = storage.join(path, MANIFEST_NAME)
    if not storage.isfile(manifest_path):
        raise UsageError(
            f"{path} has no {MANIFEST_NAME}: it is not a weightprep shard directory (or the build did not finish); "
            "create it with `weightprep build INPUT.jsonl --out DIR`"
        )
    try:
        manifest = json.loads(storage.read_text(manifest_path))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{manifest_path}: unreadable manifest ({exc}); {REBUILD}") from exc
    if not isinstance(manifest, dict):
        raise UsageError(f"{manifest_path}: manifest is not a JSON object; {REBUILD}")
    fmt, version = manifest.get("format"), manifest.get("format_version")
    if fmt != FORMAT_NAME or version not in READABLE_VERSIONS:
        raise UsageError(
            f"{manifest_path}: shards of format {fmt!r} version {version!r}, expected {FORMAT_NAME!r} version "
            f"{FORMAT_VERSION} (written by weightprep {manifest.get('weightprep_version', '?')}); {REBUILD}"
        )
    return manifest


def build_setting(config: dict[str, Any], flat: str, nested: tuple[str, str]) -> Any:
    """A build setting from the manifest's resolved configuration: ``config[flat]`` or ``config[a][b]``."""
    if flat in config:
        return config[flat]
    section = config.get(nested[0])
    return section.get(nested[1]) if isinstance(section, dict) else None


def split_shards(manifest: dict[str, Any], split: str | None = None) -> list[dict[str, Any]]:
    """The manifest's shards of ``split`` (default: ``train`` in a build with splits, else all of them)."""
    splits = manifest.get("splits") or {}
    if split is None:
        split = "train" if splits else None
    elif split not in splits:
        have = ", ".join(splits) or "none: the build has no validation split"
        raise UsageError(f"no split {split!r} in this build (splits: {have})")
    return [s for s in manifest.get("shards") or [] if s.get("split") == split]


def shard_batches(
    directory: Path | str, shard: dict[str, Any], *, storage_options: dict[str, Any] | str | None = None
) -> Iterator[Any]:
    """The record batches of one shard (a manifest entry), memory-mapped; a shard that cannot be read, or holds
    other than the manifest's number of rows, is refused with the fix."""
    import pyarrow as pa

    path = storage.join(directory, shard["filename"])
    rows = 0
    try:
        # opened in the session, read after it: the object's filesystem (and its options) is fixed when it opens
        with storage.session(storage_options):
            source = pa.PythonFile(storage.open_input(path), mode="r") if storage.is_url(path) else pa.memory_map(str(path))
        with source:
            for batch in pa.ipc.open_stream(source):
                rows += batch.num_rows
                yield batch
    except (OSError, pa.ArrowInvalid) as exc:
        raise UsageError(f"{path}: unreadable shard ({exc}); the directory is damaged: {REBUILD}") from exc
    if rows != shard["rows"]:
        raise UsageError(
            f"{path}: {rows} rows where the manifest records {shard['rows']}; the shard is truncated or was "
            f"replaced: {REBUILD}"
        )


def read_row(
    directory: Path | str, manifest: dict[str, Any], index: int, split: str | None = None, *,
    storage_options: dict[str, Any] | str | None = None,
) -> dict[str, Any]:
    """Row ``index`` of the shards (of ``split``) as a dict of NumPy arrays (reads only the shard it is in)."""
    import pyarrow as pa

    seen = 0
    for shard in split_shards(manifest, split):
        if index < seen + shard["rows"]:
            table = pa.Table.from_batches(list(shard_batches(directory, shard, storage_options=storage_options)))
            row = table.slice(index - seen, 1).to_pylist()[0]
            return {k: np.asarray(v) for k, v in row.items()}
        seen += shard["rows"]
    raise UsageError(f"row {index} does not exist: {directory} has {seen} rows (0..{seen - 1})")


def read_turns(
    directory: Path | str, manifest: dict[str, Any], index: int, split: str | None = None, *,
    storage_options: dict[str, Any] | str | None = None,
) -> list[list[Any]]:
    """The conversation turns of row ``index`` (``[start, length, role, message index]`` each), from the build's
    turns file (``TURNS_NAME``); empty for a row without conversation tokens or a build without chat records."""
    with storage.session(storage_options):
        return _read_turns(directory, manifest, index, split)


def _read_turns(directory: Path | str, manifest: dict[str, Any], index: int, split: str | None) -> list[list[Any]]:
    if not manifest.get("turns_file"):
        return []
    if split is None and manifest.get("splits"):
        split = "train"
    path = storage.join(directory, *([split] if split else []), manifest["turns_file"])
    if not storage.isfile(path):
        return []
    with storage.open_text(path) as f:
        for line in f:
            entry = json.loads(line)
            if entry["row"] == index:
                return entry["turns"]
            if entry["row"] > index:  # rows are written in order
                break
    return []

