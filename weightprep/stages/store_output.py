"""The build's output in an object store (``--out s3://bucket/shards``): its temporary prefix and its commit.

Object stores have no atomic rename, so the local scheme (a hidden directory renamed into place) cannot be used.
Instead everything is written beside the output first, and the output prefix receives the files that make it
loadable last::

    s3://bucket/.shards.tmp-KEY/plan.json            the build's resume key (KEY: its first 16 hex digits)
    s3://bucket/.shards.tmp-KEY/parts/NNNNN/...       each part's shards, rejects, turns; its result.json last
    s3://bucket/.shards.tmp-KEY/publishing           present only while the commit runs

Each input part is run by a worker (here, a local process or a Ray actor on another machine: no shared disk is
needed) into a local scratch directory and uploaded under ``parts/NNNNN/``, ``result.json`` last: a part is finished
exactly when its ``result.json`` exists (``weightprep.distribute.job.PartJob``). The driver merges the parts'
rejects and turns into a local staging directory, then commits (``StoreOutput.publish``):

1. ``publishing`` is written in the temporary prefix;
2. an earlier build at the output (``--overwrite``) is removed: its manifest first, then its ``state.json``,
   ``dataset_info.json`` and ``dataset_dict.json``, then every other object;
3. every shard is copied (server-side) from its part to ``OUT/[SPLIT/]data-i-of-n.arrow``;
4. ``rejects.jsonl`` and ``chat_turns.jsonl`` are uploaded;
5. each split's ``state.json`` and ``dataset_info.json``, then ``dataset_dict.json`` (``datasets.load_from_disk``
   opens the output from here on), then ``weightprep_manifest.json`` (weightprep's readers open it from here on);
6. ``publishing`` and the temporary prefix are removed.

A build that fails removes its temporary prefix and, if it failed during the commit, what it had put under the
output: nothing loadable is left (an earlier build replaced by ``--overwrite`` is gone from step 2). A build that
is killed cannot clean up: the next build to the same output removes the leftover prefixes (``--resume`` adopts the
one of its own plan and reuses its finished parts) and, if the kill came during a commit (``publishing`` present
and no manifest under the output), the partial output. Two builds to the same output at once are not supported:
a store has no locks.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from weightprep import storage
from weightprep.constants import MANIFEST_NAME
from weightprep.errors import UsageError
from weightprep.stages.write import _ShardSet, arrow_schema, loadable_files, shard_name

__all__ = ["StoreOutput", "prepare_store_output", "remove_output"]

#: The files that make a directory loadable, removed first (the manifest before the others).
_LOADABLE = (MANIFEST_NAME, "dataset_dict.json", "state.json", "dataset_info.json")
_PUBLISHING = "publishing"
_PLAN = "plan.json"


def _split(out: str) -> tuple[str, str]:
    parent, _, name = out.rstrip("/").rpartition("/")
    if parent.endswith(":/") or not name:
        raise UsageError(f"--out {out}: give a prefix inside the bucket (e.g. {out.rstrip('/')}/shards), not its root")
    return parent, name


def _leftovers(out: str) -> list[str]:
    """The temporary prefixes of earlier builds to ``out``."""
    parent, name = _split(out)
    return [p.rstrip("/") for p in storage.glob(f"{parent}/.{name}.tmp-*")]


def remove_output(out: str) -> None:
    """Remove every object under ``out``: the manifest first, then the other loadable files, then the rest, so that
    no reader ever sees a loadable output with objects missing."""
    objects = storage.find(out)
    name = lambda u: u.rsplit("/", 1)[-1]  # noqa: E731
    for kind in _LOADABLE:
        for url in objects:
            if name(url) == kind:
                storage.remove(url)
    storage.remove(out, recursive=True)


def prepare_store_output(out: str, *, overwrite: bool, inputs: Sequence[str] = (), resume: bool = False) -> str:
    """Check that the output prefix ``out`` can be written (see ``weightprep.stages.write.prepare_output``); clear
    what a build killed during its commit left there. Returns ``out`` without its trailing slash."""
    out = out.rstrip("/")
    storage._writable(out)
    _split(out)
    for p in inputs:
        if p.rstrip("/") == out or p.startswith(out + "/"):
            raise UsageError(f"input {p} is inside the output path {out}; choose another --out")
    if not storage.exists(storage.join(out, MANIFEST_NAME)):
        for prefix in _leftovers(out):
            if storage.exists(storage.join(prefix, _PUBLISHING)):  # killed during its commit: a partial output
                remove_output(out)
                storage.remove(storage.join(prefix, _PUBLISHING))
    existing = storage.find(out)
    if existing:
        if not overwrite:
            raise UsageError(f"output path {out} already exists; pass --overwrite to replace it, or choose another --out")
        if storage.join(out, MANIFEST_NAME) not in existing:
            raise UsageError(
                f"output path {out} is not a weightprep output (no {MANIFEST_NAME}); --overwrite only replaces "
                "earlier builds: remove it yourself or choose another --out"
            )
    return out


class StoreOutput:
    """The build's temporary prefix beside ``out`` in the store and its commit (see the module docstring).
    ``tmp`` is a local staging directory for what the driver writes itself (the merged rejects and turns);
    ``work_dir`` the prefix the parts' jobs write to."""

    def __init__(self, out: str, plan_key: str, *, resume: bool = False) -> None:
        self.out = out.rstrip("/")
        parent, name = _split(self.out)
        self.prefix = f"{parent}/.{name}.tmp-{plan_key[:16]}"
        adopted = False
        for leftover in _leftovers(self.out):
            plan = storage.join(leftover, _PLAN)
            if resume and leftover == self.prefix and storage.isfile(plan) and storage.read_text(plan) == plan_key:
                adopted = True
            else:  # another plan, a killed build not resumed, or a failed one: of no use to this build
                storage.remove(leftover, recursive=True)
        if not adopted:
            storage.write_bytes(storage.join(self.prefix, _PLAN), plan_key.encode())
        self.work_dir = storage.join(self.prefix, "parts")
        self.tmp = Path(tempfile.mkdtemp(prefix="weightprep-out-"))
        weakref.finalize(self, shutil.rmtree, self.tmp, True)  # also after Ctrl-C, which keeps the prefix (--resume)
        self._publishing = False

    def publish(
        self,
        sets: dict[str, list[tuple[Any, int]]],
        manifest: dict[str, Any],
        *,
        seq_len: int,
        packed: bool,
        turns: bool,
        discard: Any = None,
    ) -> dict[str, Any]:
        """Commit: shards, sidecars, then the loadable files, the manifest last (the module docstring's steps)."""
        storage.write_bytes(storage.join(self.prefix, _PUBLISHING), b"")
        self._publishing = True
        remove_output(self.out)
        per_set = {}
        for name, parts in sets.items():
            if not parts:  # a dataset with no rows is still a valid, empty dataset
                scratch = Path(tempfile.mkdtemp(dir=self.tmp, prefix=".empty-"))
                parts = [(_ShardSet(scratch, arrow_schema(seq_len, packed=packed), 1).empty_shard(), 0)]
            entries = []
            for i, (source, rows) in enumerate(parts):
                rel = f"{name}/{shard_name(i, len(parts))}" if name else shard_name(i, len(parts))
                target = storage.join(self.out, rel)
                if storage.is_url(source):
                    storage.copy(str(source), target)
                else:
                    storage.put_file(source, target)
                entries.append({"filename": rel, "rows": rows, "bytes": storage.size(source)})
            per_set[name] = entries
        for sidecar in sorted(self.tmp.rglob("*.jsonl")):
            storage.put_file(sidecar, storage.join(self.out, sidecar.relative_to(self.tmp).as_posix()))
        manifest, files = loadable_files(per_set, manifest, seq_len=seq_len, packed=packed, turns=turns)
        for rel, data in files:  # the manifest is the last of them
            storage.write_bytes(storage.join(self.out, rel), data)
        self._publishing = False
        try:  # committed: what is left is cleaning up (a next build removes what this one could not)
            storage.remove(storage.join(self.prefix, _PUBLISHING))
            storage.remove(self.prefix, recursive=True)
        except storage.StorageError:
            pass
        shutil.rmtree(self.tmp, ignore_errors=True)
        return manifest

    def abort(self) -> None:
        """Remove everything this build wrote: its temporary prefix and, during the commit, the output."""
        try:
            if self._publishing:
                remove_output(self.out)
            storage.remove(self.prefix, recursive=True)
        except storage.StorageError as exc:  # the store is failing: the next build removes the leftovers
            print(f"warning: could not remove {self.prefix} ({exc}); the next build to {self.out} removes it",
                  file=sys.stderr)
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)


def part_files(directory: Path) -> list[Path]:
    """A finished part's files in upload order: ``result.json`` (what marks the part finished) last."""
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    return sorted(files, key=lambda p: p.name == "result.json")


def upload_part(directory: Path, prefix: str) -> None:
    """Upload a part's local scratch ``directory`` to ``prefix``, its ``result.json`` last."""
    for f in part_files(directory):
        storage.put_file(f, storage.join(prefix, f.relative_to(directory).as_posix()))


def read_result(prefix: str) -> dict[str, Any] | None:
    """The result of the part at ``prefix`` if it finished (``upload_part``), else None."""
    result = storage.join(prefix, "result.json")
    return json.loads(storage.read_text(result)) if storage.isfile(result) else None

