"""Open a weightprep shard directory for training, and refuse it clearly when it cannot train this model.

Checks, each a :class:`~weightprep.errors.UsageError` naming what was found, what was expected and the fix:
the manifest exists and is of this format and version; the columns a row needs are there with one row length;
and, given the model, that its vocabulary covers the shards' tokenizer, that the tokenizer shipped with the model
is the one the shards were built with (by fingerprint), and that the row length fits its position embeddings.
Reading is memory-mapped Arrow (``datasets.load_from_disk``): nothing is loaded until a row is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightprep import storage
from weightprep.constants import (
    ATTENTION_MASK,
    INPUT_IDS,
    LABELS,
    MANIFEST_NAME,
    PACKED_COLUMNS,
    POSITION_IDS,
    WEIGHTS,
)
from weightprep.errors import UsageError
from weightprep.manifest import REBUILD, build_setting, read_manifest

__all__ = ["Shards", "check_model_compatibility", "load_shards", "read_manifest"]

#: The held-out split of a build with a validation split (``load_from_disk`` gives a DatasetDict).
VALIDATION = "validation"
#: A build with sources holds one held-out split per source instead: ``validation_<name>``.
SOURCE_SPLIT_PREFIX = VALIDATION + "_"


@dataclass(frozen=True)
class Shards:
    """A validated shard directory: the training rows (``seq_len`` tokens each), the held-out rows if the build
    has a validation split, and the manifest.

    A build with sources has one ``validation_<name>`` split per source: ``validation`` is then their rows as one
    set, each tagged with its source (:func:`~weightprep.train.evaluate.tag_sources`), and ``validation_sources``
    the names in split order, so evaluation logs the pooled loss and each source's."""

    path: Path | str
    dataset: Any  # datasets.Dataset
    manifest: dict[str, Any]
    seq_len: int
    packed: bool
    tokenizer: dict[str, Any] = field(default_factory=dict)
    validation: Any = None  # datasets.Dataset of the validation split(s), or None
    validation_sources: tuple[str, ...] = ()

    def __repr__(self) -> str:  # the manifest and the datasets are far too long to print
        held_out = f", validation rows={len(self.validation):,}" if self.validation is not None else ""
        return (f"Shards(path={str(self.path)!r}, rows={len(self.dataset):,}, seq_len={self.seq_len}, "
                f"packed={self.packed}{held_out})")  # fmt: skip

    @property
    def columns(self) -> list[str]:
        """The columns a training row keeps: token columns, plus ``attention_mask`` when unpacked."""
        return [*PACKED_COLUMNS, *(() if self.packed else (ATTENTION_MASK,))]


def load_shards(
    path: str | Path,
    *,
    model_config: Any = None,
    tokenizer: Any = None,
    storage_options: dict[str, Any] | str | None = None,
) -> Shards:
    """Open and validate the shards at ``path``; with ``model_config`` (and the model's ``tokenizer``, if loaded)
    also check that they can train that model. ``storage_options``: the fsspec options of a URL ``path``
    (``s3://bucket/shards``), for this call only (``weightprep.storage.session``; None: the process's).

    >>> shards = load_shards("shards/", model_config=model.config)  # doctest: +SKIP
    >>> trainer = WeightedSFTTrainer(model, train_dataset=shards.dataset, ...)  # doctest: +SKIP
    """
    with storage.session(storage_options):
        return _load_shards(path, model_config, tokenizer)


def _local_copy(url: str) -> Path:
    """The build at ``url`` (in a store) copied to a new local temporary directory, removed when the process ends,
    for ``datasets`` to map. (``datasets.load_from_disk(url)`` copies to one directory per path and process, and a
    second load of the same URL copies into a subdirectory of the first copy, so it maps the first build's files:
    a rebuild in between would be trained on as the build before it.)"""
    import atexit
    import shutil
    import tempfile

    local = Path(tempfile.mkdtemp(prefix="weightprep-shards-"))
    atexit.register(shutil.rmtree, local, True)
    storage.download_tree(url, local)
    return local


def _check_against_manifest(path: str | Path, manifest: dict[str, Any], dataset: Any) -> None:
    """Refuse shards that are not the ones the manifest lists, file for file and row for row: what a reader sees
    in the moment a build to a store replaces another (its ``state.json`` and its manifest are two writes,
    ``weightprep.stages.publish``), or after a kill between them, or after hand edits."""
    import datasets

    splits = dataset.items() if isinstance(dataset, datasets.DatasetDict) else [(None, dataset)]
    for name, split in splits:
        listed = [s for s in manifest.get("shards") or [] if s.get("split") == name]
        if not listed:  # a manifest written before it listed shards (format 1) has nothing to compare
            continue
        files = [Path(f["filename"]).name for f in split.cache_files]
        expected = [Path(s["filename"]).name for s in listed]
        rows = sum(int(s["rows"]) for s in listed)
        if files != expected or len(split) != rows:
            where = f"the {name} split of {path}" if name else str(path)
            raise UsageError(
                f"{where} holds shards {files} ({len(split):,} rows), its {MANIFEST_NAME} lists {expected} "
                f"({rows:,} rows): a build to it is running or was killed during its commit. Wait for it to end, or "
                f"run the build again (it finishes or undoes the commit first)"
            )


def _load_shards(path: str | Path, model_config: Any, tokenizer: Any) -> Shards:
    import datasets

    path = path if storage.is_url(path) else Path(path)
    manifest = read_manifest(path)
    try:
        dataset = datasets.load_from_disk(str(_local_copy(path) if storage.is_url(path) else path))
    except Exception as exc:  # datasets raises FileNotFoundError/ValueError/... with useful text
        raise UsageError(f"{path}: datasets.load_from_disk failed ({exc}); {REBUILD}") from exc
    _check_against_manifest(path, manifest, dataset)
    held_out: dict[str, Any] = {}  # split name -> rows
    if isinstance(dataset, datasets.DatasetDict):
        if "train" not in dataset:
            raise UsageError(f"{path}: a DatasetDict without a 'train' split ({', '.join(dataset)})")
        held_out = _held_out_splits(path, dataset)
        dataset = dataset["train"]

    config = manifest.get("config") or {}
    packed = build_setting(config, "packed", ("pack", "enabled"))
    if packed is None:
        packed = ATTENTION_MASK not in (manifest.get("columns") or dataset.column_names)
    packed = bool(packed)
    needed = [*PACKED_COLUMNS, *(() if packed else (ATTENTION_MASK,))]
    for name, split in (("train", dataset), *held_out.items()):
        missing = [c for c in needed if c not in split.column_names]
        if missing:
            raise UsageError(
                f"{path}: the {name} shards lack column(s) {', '.join(missing)} (have "
                f"{', '.join(split.column_names)}); {'packed' if packed else 'unpacked'} rows need "
                f"{', '.join(needed)}; {REBUILD}"
            )
    seq_len = _row_length(path, dataset, config)
    for split in held_out.values():
        _row_length(path, split, config)
    if len(dataset) == 0:
        raise UsageError(f"{path}: the shards hold no rows; check the build's counts in {MANIFEST_NAME}")
    validation, sources = held_out.get(VALIDATION), ()
    if held_out and validation is None:
        from weightprep.train.evaluate import tag_sources

        sources = tuple(name[len(SOURCE_SPLIT_PREFIX) :] for name in held_out)
        validation = tag_sources(dict(zip(sources, held_out.values(), strict=True)))
    if validation is not None and not len(validation):
        validation, sources = None, ()

    shards = Shards(
        path=path,
        dataset=dataset,
        manifest=manifest,
        seq_len=seq_len,
        packed=packed,
        tokenizer=dict(manifest.get("tokenizer") or {}),
        validation=validation,
        validation_sources=sources,
    )
    if model_config is not None:
        check_model_compatibility(shards, model_config, tokenizer)
    return shards


def check_model_compatibility(shards: Shards, model_config: Any, tokenizer: Any = None) -> None:
    """Refuse a model whose vocabulary, tokenizer or maximum length does not fit the shards."""
    from weightprep.tokenizer import tokenizer_fingerprint

    cfg = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    name = getattr(model_config, "_name_or_path", "") or type(model_config).__name__
    tok = shards.tokenizer
    vocab = getattr(cfg, "vocab_size", None)
    needed = tok.get("vocab_size")
    if vocab is not None and needed is not None and int(vocab) < int(needed):
        raise UsageError(
            f"model {name!r} has a vocabulary of {vocab} ids but the shards were tokenized with "
            f"{tok.get('name_or_path', '?')!r} ({needed} ids): ids >= {vocab} would index past the embedding. "
            "Train the model that goes with that tokenizer, rebuild the shards with the model's tokenizer "
            "(`weightprep build --tokenizer MODEL`), or resize the embeddings (model.resize_token_embeddings)."
        )
    if tokenizer is not None and tok.get("fingerprint"):
        fp = tokenizer_fingerprint(tokenizer)
        if fp != tok["fingerprint"]:
            raise UsageError(
                f"tokenizer mismatch: the shards were built with {tok.get('name_or_path', '?')!r} "
                f"(fingerprint {tok['fingerprint'][:16]}..., {needed} ids) but the model's tokenizer "
                f"{getattr(tokenizer, 'name_or_path', '?')!r} has fingerprint {fp[:16]}... ({len(tokenizer)} ids): "
                "the same text maps to different ids, so training would learn noise. Rebuild the shards with "
                f"`weightprep build --tokenizer {getattr(tokenizer, 'name_or_path', 'MODEL')}`, or train the model "
                "that goes with the shards' tokenizer."
            )
    max_pos = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    if max_pos is not None and shards.seq_len > int(max_pos):
        raise UsageError(
            f"rows of {shards.seq_len} tokens exceed model {name!r}'s max_position_embeddings = {max_pos}: "
            f"rebuild the shards with `--seq-len {max_pos}` (or less), or use a model with a longer context"
        )


def _held_out_splits(path: Path | str, splits: Any) -> dict[str, Any]:
    """The held-out splits of a build's DatasetDict by split name: ``validation``, or one ``validation_<name>`` per
    source (never both: which would ``eval_loss`` be?)."""
    from weightprep.train.evaluate import SOURCE_NAME

    per_source = [name for name in splits if name.startswith(SOURCE_SPLIT_PREFIX)]
    if VALIDATION in splits and per_source:
        raise UsageError(
            f"{path}: both a {VALIDATION!r} split and per-source splits ({', '.join(per_source)}); a build has one "
            f"or the other; {REBUILD}"
        )
    bad = [name for name in per_source if not SOURCE_NAME.fullmatch(name[len(SOURCE_SPLIT_PREFIX) :])]
    if bad:
        raise UsageError(
            f"{path}: split name(s) {', '.join(bad)}: a source's split is {SOURCE_SPLIT_PREFIX}<name> with <name> "
            f"matching {SOURCE_NAME.pattern}; {REBUILD}"
        )
    names = [VALIDATION] if VALIDATION in splits else per_source
    return {name: splits[name] for name in names}


def _row_length(path: Path | str, dataset: Any, config: dict[str, Any]) -> int:
    """The one row length of every token column: the fixed list size, checked against the manifest."""
    lengths: dict[str, int] = {}
    for name in (INPUT_IDS, LABELS, WEIGHTS, POSITION_IDS, ATTENTION_MASK):
        feature = dataset.features.get(name)
        if feature is None:
            continue
        length = getattr(feature, "length", -1)
        if length is None or length < 0:  # a variable-length list: read the first row
            length = len(dataset[0][name])
        lengths[name] = int(length)
    if len(set(lengths.values())) != 1:
        raise UsageError(
            f"{path}: token columns of different lengths {lengths}; every column of a row has length seq_len; "
            f"{REBUILD}"
        )
    seq_len = next(iter(lengths.values()))
    declared = build_setting(config, "seq_len", ("pack", "seq_len"))
    if declared is not None and int(declared) != seq_len:
        raise UsageError(
            f"{path}: rows have {seq_len} tokens but the manifest says seq_len = {declared}; the directory mixes "
            f"builds; {REBUILD}"
        )
    return seq_len
