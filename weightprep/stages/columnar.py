"""Stage 1, columnar inputs: Parquet files and ``datasets.save_to_disk`` directories (Arrow), read in record batches.

Each batch of rows becomes a ``Block`` of JSON lines, one per row, so the records go through exactly the validation
of JSONL input (the same shapes, the same checks, the same rejects, which keep the row as JSON). A block's "lines"
are row numbers, counted from 0 as ``datasets`` indexes them; errors read ``train-00003.parquet: row 18211:
pieces[2].weight: ...``. Memory is bounded by the batch: Parquet is read by row group and batch
(``ParquetFile.iter_batches``), Arrow memory-mapped batch by batch.

``--columns prompt=question,completion=answer`` renames columns before anything else (target=source;
``weightprep.stages.columns``, whose message and role names apply in validation, as for JSON). A file
whose columns can hold no accepted shape (``pieces``, ``messages``, ``text``, ``prompt`` + ``completion``) fails
before any row is read, naming the columns it has; so does one where two columns would get the same name
(``--columns text=body`` onto a file that has a ``text`` column too), as a duplicate key does in JSONL: never
"last one wins". ``weightprep.stages.read.check_inputs`` runs these checks before the build starts.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weightprep import storage
from weightprep.batches import Block
from weightprep.errors import UsageError, kind_path
from weightprep.stages.shapes import SHAPE_KEYS

if TYPE_CHECKING:
    from weightprep.stages.input_file import InputFile

__all__ = ["COLUMNAR_SUFFIXES", "columnar_blocks", "check_schema", "dataset_dir_files"]

COLUMNAR_SUFFIXES = (".parquet", ".arrow")
#: The column sets that can hold a record: every shape's keys (``weightprep.stages.shapes``).
_SHAPES = tuple(set(keys) for keys in SHAPE_KEYS.values())


def dataset_dir_files(directory: str | Path) -> list[str] | None:
    """The Arrow files of a ``Dataset.save_to_disk`` directory (local or a URL) in their order, or None if it is
    not one."""
    state, listing = storage.join(directory, "state.json"), storage.join(directory, "dataset_dict.json")
    if storage.isfile(listing):
        splits = json.loads(storage.read_text(listing)).get("splits", [])
        raise UsageError(
            f"{directory} is a DatasetDict ({', '.join(splits)}); give the split to read, e.g. "
            f"{storage.join(directory, 'train')}"
        )
    if not storage.isfile(state):
        return None
    files = [f["filename"] for f in json.loads(storage.read_text(state)).get("_data_files", [])]
    return [str(storage.join(directory, f)) for f in files]


def _open_arrow(path: str) -> tuple[Any, Any]:
    """The file and a reader of its batches (an Arrow stream, as ``datasets`` writes, or an Arrow file)."""
    import pyarrow as pa

    source = pa.PythonFile(storage.open_input(path), mode="r") if storage.is_url(path) else pa.memory_map(path)
    try:
        return source, pa.ipc.open_stream(source)
    except pa.ArrowInvalid:
        source.seek(0)
        return source, pa.ipc.open_file(source)


def _parquet(path: str) -> Any:
    """A ``ParquetFile``; an object in a store through pyarrow's filesystem layer (footer, then row groups, by
    range requests: ``storage.arrow_filesystem``)."""
    import pyarrow.parquet as pq

    if storage.is_url(path):
        fs, inner = storage.arrow_filesystem(path)
        return pq.ParquetFile(inner, filesystem=fs)
    return pq.ParquetFile(path)


def _schema(path: str) -> Any:
    if kind_path(path).endswith(".parquet"):
        return _parquet(path).schema_arrow
    return _open_arrow(path)[1].schema


def check_schema(path: str, columns: dict[str, str]) -> None:
    """Refuse, before reading rows, a file none of whose column sets is an accepted shape, or two of whose columns
    would have the same name once renamed (``--columns text=body`` onto a file with a ``text`` column)."""
    import pyarrow as pa

    try:
        sources = _schema(path).names
    except (OSError, pa.ArrowInvalid) as exc:
        raise UsageError(f"{path}: not a readable {Path(path).suffix[1:]} file ({exc})") from exc
    names = [columns.get(n, n) for n in sources]
    clash = next((name for name in names if names.count(name) > 1), None)
    if clash is not None:  # a row would keep one of them as the field and drop the other: never last one wins
        held = [source for source, name in zip(sources, names, strict=True) if name == clash]
        renamed = [f"{clash}={s}" for s in held if s != clash]
        how = f" (renamed by --columns {', '.join(renamed)})" if renamed else ""
        unmap = f", or take {', '.join(renamed)} out of --columns" if renamed else ""
        raise UsageError(
            f"{path}: columns {' and '.join(map(repr, held))} would both be the field {clash!r}{how}; one would "
            f"silently replace the other. Keep the one to train on: drop the other column from the file{unmap}"
        )
    if not any(shape <= set(names) for shape in _SHAPES):
        mapped = f" (after --columns: {', '.join(names)})" if columns else ""
        raise UsageError(
            f"{path}: no column holds a record: expected 'pieces', 'messages', 'text' or 'prompt' + 'completion' "
            "(or another tool's shape: 'conversations', 'instruction' + 'output'), "
            f"found {', '.join(sources) or 'no columns'}{mapped}; map yours with --columns, e.g. "
            "--columns prompt=question,completion=answer"
        )


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    return str(value)


def _batches(path: str, rows: int) -> Iterator[tuple[Any, float]]:
    """The record batches of ``path``, each with the share of the file behind it once it is read: of the rows
    for Parquet (the footer counts them), of the bytes for an Arrow stream (its position), of the batches for an
    Arrow file."""
    import pyarrow as pa

    if kind_path(path).endswith(".parquet"):
        parquet = _parquet(path)
        total, done = max(1, parquet.metadata.num_rows), 0
        if storage.is_url(path):  # one row group at a time: pyarrow would otherwise fetch them all in one range
            groups = ([g] for g in range(parquet.num_row_groups))
            batches = (b for g in groups for b in parquet.iter_batches(batch_size=rows, row_groups=g))
        else:
            batches = parquet.iter_batches(batch_size=rows)
        for batch in batches:
            done += batch.num_rows
            yield batch, done / total
        return
    source, reader = _open_arrow(path)
    if isinstance(reader, pa.ipc.RecordBatchFileReader):
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i), (i + 1) / reader.num_record_batches
        return
    size = max(1, source.size())
    for batch in reader:
        yield batch, source.tell() / size


def columnar_blocks(record: InputFile, rows: int, columns: dict[str, str], size: int | None = None) -> Iterator[Block]:
    """``Block``s of JSON lines, one per row of ``record.path``; fills in its size, hash and row count, and before
    each block ``record.behind``: its share of the file's ``size`` (read from the store if not given)."""
    check_schema(record.path, columns)
    size = storage.size(record.path) if size is None else size
    row = 0
    for batch, done in _batches(record.path, rows):
        names = [columns.get(n, n) for n in batch.schema.names]
        table = batch.rename_columns(names) if names != batch.schema.names else batch
        lines = [json.dumps(r, ensure_ascii=False, default=_json_default) for r in table.to_pylist()]
        record.behind = min(size, round(done * size))
        if lines:
            data = ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
            yield Block(record.path, row, len(lines), data)
        row += len(lines)
    record.lines = row
    digest = hashlib.sha256()
    for chunk in storage.iter_chunks(record.path):
        digest.update(chunk)
        record.size += len(chunk)
    record.sha256 = digest.hexdigest()
