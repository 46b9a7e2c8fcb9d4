"""Publishing a build: how its output appears at ``--out`` all at once, on a local disk or in an object store.
One protocol, two media; the shards themselves are written by ``weightprep.stages.write``.

A reader of ``--out`` (``datasets.load_from_disk``, ``weightprep.manifest.read_manifest``, ``weightprep train``)
sees either nothing or a complete build: the earlier one (``--overwrite``) until the new one is complete, then the
new one. Same input, configuration and tokenizer give byte-identical files, on either medium.

On a local disk
---------------
Everything is written into a hidden temporary directory beside ``out`` (``.NAME.tmp-PID``) and moved into place by
a rename only when the whole build has succeeded. Each input part writes its ``shard-i.arrow`` shards under
``.NAME.tmp-PID/parts/NNNNN/`` (``weightprep.stages.write.ShardWriter``); the driver moves them, in part order, to
their final ``data-i-of-n`` names (``Output.publish``). The directory's ``plan.json`` names the build it belongs
to, so ``--resume`` can adopt the directory of a killed build of the same plan. Replacing an existing ``out`` is
two renames (``out`` -> ``.NAME.old-PID``, temporary -> ``out``); a kill between them leaves the previous dataset
in ``.NAME.old-PID``, and the next build to ``out`` puts it back before doing anything else. Leftovers of builds
whose process is gone are removed then too, except the finished parts of an interrupted build: ``--resume`` reuses
them, ``--overwrite`` removes them, and a build given neither stops and says so
(``weightprep.errors.LeftoverParts``). ``--overwrite`` replaces only a directory that holds a weightprep
manifest (or nothing at all), and never one that holds an input. Every file is written at a fixed name inside the
temporary directory: no input can make a path escape it.

In an object store (``--out s3://bucket/shards``)
-----------------------------------------------
A store has no rename and no locks, so the commit is a sequence of single-object writes, ordered so that every
prefix of it leaves a loadable output, and journaled so that a killed commit is finished or undone by the next
build::

    s3://bucket/.shards.tmp-KEY/plan.json             the build's resume key (KEY: its first 16 hex digits)
    s3://bucket/.shards.tmp-KEY/parts/NNNNN/...        each part's shards, rejects, turns; its result.json last
    s3://bucket/.shards.tmp-KEY/sidecars/...           rejects.jsonl, chat_turns.jsonl, during the commit
    s3://bucket/.shards.tmp-KEY/publishing             the commit's journal, present only while it runs

Each part is run by a worker (a local process or a Ray actor on another machine: no shared disk is needed) into a
local scratch directory and uploaded under ``parts/NNNNN/``, ``result.json`` last: a part is finished exactly
when its ``result.json`` exists (``weightprep.distribute.job.PartJob``). The commit (``StoreOutput.publish``):

1. lists the objects under ``out`` (the earlier build, or nothing) and reads its loadable files;
2. writes the journal: the keys this commit adds, the earlier build's keys, its loadable files' bytes, and the
   SHA-256 of the new manifest;
3. copies every shard (server-side) from its part to ``OUT/[SPLIT/]data-i-of-n.arrow``, or, where such a key
   already exists (the earlier build has a shard of that name), to ``data-i-of-n-TAG.arrow`` (TAG: the first 8
   hex digits of the resume key): no object of the earlier build is overwritten, so it stays loadable;
4. uploads the sidecars into the temporary prefix;
5. writes each split's ``dataset_info.json`` and ``state.json``, then ``dataset_dict.json`` (with splits), then
   ``weightprep_manifest.json``: from here the new build is what readers see, and it is committed;
6. copies the sidecars to ``out``, removes the earlier build's objects that the new build did not overwrite (the
   exact keys listed in step 1), then the journal and the temporary prefix.

A build that fails during the commit undoes it (``StoreOutput.abort``): the earlier build's loadable files are
written back from the journal, the new shards removed; the earlier build is loadable again. A build killed during
its commit cannot undo anything: the next build to the same output reads the journal and finishes the commit (the
output's manifest is the new one: steps 6) or undoes it (it is not), before anything else (``--resume`` then reuses
the finished parts). Without ``--overwrite`` nothing is touched. The only windows: the few writes of step 5 replace
files that both builds name alike, so a reader between two of them may see one split of the new build beside one
of the earlier (with splits), and ``dataset_info.json`` of one beside ``state.json`` of the other (which
``datasets`` refuses only where their features differ: another ``seq_len`` or packing); a kill there leaves it so
until the next build to the output. Two builds to the same output at once are not supported: a store has no locks.

Every name is literal: the output's objects are listed and removed key by key (never ``rm`` of a pattern, never a
sibling prefix that shares the name's start), leftovers are found by matching the names of one listing, and
copies are ``cp_file`` of one key (fsspec's ``rm``, ``copy`` and ``glob`` would expand ``*?[]`` in a name).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
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
from weightprep.stages.write import empty_shard, loadable_files, shard_name

__all__ = ["Output", "StoreOutput", "open_output", "prepare_output", "recover_stale", "remove_output", "interrupted_builds",
           "upload_part", "read_result"]


_STALE = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)$")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie counts as gone)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def recover_stale(out: Path, *, keep_resumable: bool = False) -> None:
    """Undo what a killed build to ``out`` left behind (see the module docstring, "On a local disk").

    A ``.NAME.old-PID`` of a dead process is the previous dataset, caught between the two renames of
    a replace: if ``out`` is missing it is put back, else removed. A ``.NAME.tmp-PID`` of a dead
    process is an unfinished build: removed, unless ``keep_resumable`` and it holds the ``plan.json`` of a
    build whose finished parts ``--resume`` can reuse. Directories of live processes are left alone.
    """
    parent = out.parent
    if not parent.is_dir():
        return
    stale = []
    for p in parent.iterdir():
        m = _STALE.match(p.name)
        if m and m["name"] == out.name and not _alive(int(m["pid"])):
            stale.append((m["kind"] != "old", p))  # old ones first
    for _, p in sorted(stale):
        if p.name.startswith(f".{out.name}.old-") and not out.exists():
            p.rename(out)
        elif keep_resumable and (p / Output.PLAN).is_file():
            continue
        else:
            shutil.rmtree(p, ignore_errors=True)


def interrupted_builds(out: Path | str) -> list[Path] | list[str]:
    """The temporary directories (prefixes in a store) of dead builds to ``out`` that ``--resume`` could adopt
    (each with its ``plan.json``), in name order."""
    if storage.is_url(out):
        return [p for p in _leftovers(str(out)) if storage.isfile(storage.join(p, _PLAN))]
    out = Path(out)
    if not out.parent.is_dir():
        return []
    found = []
    for p in sorted(out.parent.iterdir()):
        m = _STALE.match(p.name)
        if m and m["name"] == out.name and m["kind"] == "tmp" and not _alive(int(m["pid"])) and (p / Output.PLAN).is_file():
            found.append(p)
    return found


def open_output(out: str | Path, plan_key: str, *, resume: bool = False) -> Any:
    """The build's output: ``Output`` for a local directory, ``StoreOutput`` for a URL (an object store)."""
    if storage.is_url(out):
        return StoreOutput(str(out), plan_key, resume=resume)
    return Output(Path(out), plan_key, resume=resume)


def prepare_output(
    out: str | Path, *, overwrite: bool, inputs: Sequence[str] = (), resume: bool = False
) -> Path | str:
    """Check that ``out`` can be written and finish or undo what a killed build to it left; return it as a Path
    (a URL: as a string). Fails before any work is done."""
    if storage.is_url(out):
        return _prepare_store_output(str(out), overwrite=overwrite, inputs=inputs)
    out = Path(out)
    if out.name in ("", ".", ".."):
        out = Path(os.path.abspath(out))
    recover_stale(out, keep_resumable=resume or not overwrite)  # without either, the build says what it found
    resolved = out.resolve()
    for p in inputs:
        if not storage.is_url(p) and resolved in Path(p).resolve().parents:
            raise UsageError(f"input {p} is inside the output path {out}; choose another --out")
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise UsageError(f"output path {out} already exists; pass --overwrite to replace it, or choose another --out")
        if not out.is_dir() or out.is_symlink():
            raise UsageError(f"output path {out} exists and is not a directory; remove it or choose another --out")
        if not (out / MANIFEST_NAME).is_file() and any(out.iterdir()):
            raise UsageError(
                f"output path {out} is not a weightprep output (no {MANIFEST_NAME}); --overwrite only replaces "
                "earlier builds: remove it yourself or choose another --out"
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    return out




class Output:
    """The build's temporary directory beside ``out`` and its publication (see the module docstring).

    ``plan_key`` (what a resumed build must share with the one it resumes) is kept in its ``plan.json``; with
    ``resume`` it adopts the temporary directory of a dead earlier build of the same key instead of starting
    empty, so the parts that build finished are not done again (``--resume``)."""

    PLAN = "plan.json"

    def __init__(self, out: Path, plan_key: str, *, resume: bool = False) -> None:
        self.out = out
        self.tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
        adopted = False
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        if resume:  # the name is literal: no glob, whatever characters it holds
            for candidate in sorted(c for c in out.parent.iterdir() if c.name.startswith(f".{out.name}.tmp-")):
                m = _STALE.match(candidate.name)
                plan = candidate / self.PLAN
                if m and m["name"] == out.name and not _alive(int(m["pid"])) and plan.is_file():
                    if not adopted and plan.read_text() == plan_key:
                        candidate.rename(self.tmp)
                        adopted = True
                    else:  # another plan (or a second leftover of this one): of no use to this build
                        shutil.rmtree(candidate, ignore_errors=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        (self.tmp / self.PLAN).write_text(plan_key)
        #: where the parts' jobs write (``weightprep.distribute.job.PartJob``)
        self.work_dir = self.tmp.absolute() / "parts"
        self.work_dir.mkdir(exist_ok=True)

    def publish(
        self,
        sets: dict[str, list[tuple[Path, int]]],
        manifest: dict[str, Any],
        *,
        seq_len: int,
        packed: bool,
        turns: bool,
        discard: Path | None = None,
    ) -> dict[str, Any]:
        """Move each split's shards (``sets``: ``""`` or ``train``/``validation`` -> shard files with their rows, in
        order) to ``data-i-of-n``, write the metadata files and the manifest, remove ``discard`` (what is left of
        the parts' work) and move the directory to ``out``."""
        per_set = {}
        for name, parts in sets.items():
            directory = self.tmp / name if name else self.tmp
            directory.mkdir(parents=True, exist_ok=True)
            if not parts:
                parts = [(empty_shard(directory, seq_len, packed=packed), 0)]
            n = len(parts)
            entries = []
            for i, (path, rows) in enumerate(parts):
                final = directory / shard_name(i, n)
                path.rename(final)
                entries.append({"filename": final.relative_to(self.tmp).as_posix(), "rows": rows, "bytes": final.stat().st_size})
            per_set[name] = entries
        manifest, files = loadable_files(per_set, manifest, seq_len=seq_len, packed=packed, turns=turns)
        for rel, data in files[:-1]:  # the manifest is written last, below
            (self.tmp / rel).write_bytes(data)
        (self.tmp / self.PLAN).unlink(missing_ok=True)
        if discard is not None:
            shutil.rmtree(discard, ignore_errors=True)
        (self.tmp / MANIFEST_NAME).write_bytes(files[-1][1])
        if self.out.exists():
            old = self.out.parent / f".{self.out.name}.old-{os.getpid()}"
            self.out.rename(old)
            self.tmp.rename(self.out)
            shutil.rmtree(old)
        else:
            self.tmp.rename(self.out)
        return manifest

    def abort(self) -> None:
        """Remove everything written so far (the output path is left untouched)."""
        shutil.rmtree(self.tmp, ignore_errors=True)


# ---- in an object store ---------------------------------------------------------------------------------------

#: The files that make a directory loadable, in the order a commit writes them within a split (``state.json``
#: switches a split to its new shards; ``dataset_dict.json`` a DatasetDict to its splits; the manifest last).
_LOADABLE = ("dataset_info.json", "state.json", "dataset_dict.json", MANIFEST_NAME)
_JOURNAL = "publishing"
_PLAN = "plan.json"
_SIDECARS = "sidecars"


def _split(out: str) -> tuple[str, str]:
    parent, _, name = out.rstrip("/").rpartition("/")
    if parent.endswith(":/") or not name:
        raise UsageError(f"--out {out}: give a prefix inside the bucket (e.g. {out.rstrip('/')}/shards), not its root")
    return parent, name


def _leftovers(out: str) -> list[str]:
    """The temporary prefixes of earlier builds to ``out`` (``.NAME.tmp-KEY``), found by matching the names of one
    listing of the parent: the name is literal, whatever characters it holds."""
    parent, name = _split(out)
    pattern = re.compile(re.escape(f".{name}.tmp-") + "[0-9a-f]{16}")
    return [f"{parent}/{n}" for n in storage.names_under(parent) if pattern.fullmatch(n)]


def _loadable_order(rel: str) -> tuple[int, int, str]:
    """Sort key of a loadable file in write order: per split before the top level, ``_LOADABLE``'s order within."""
    name = rel.rsplit("/", 1)[-1]
    return (0 if "/" in rel else 1, _LOADABLE.index(name) if name in _LOADABLE else -1, rel)


def remove_output(out: str) -> None:
    """Remove every object under ``out``, key by key: the manifest first, then the other loadable files, then the
    rest, so that no reader ever sees a loadable output with objects missing."""
    objects = sorted(storage.find(out))
    for url in sorted((u for u in objects if u.rsplit("/", 1)[-1] in _LOADABLE),
                      key=lambda u: _loadable_order(u[len(out) + 1 :]), reverse=True):
        storage.remove(url)
    storage.remove_tree(out)


def _read_journal(prefix: str) -> dict[str, Any] | None:
    """The journal of a commit that did not end (None: no commit ran there; ``{}``: one of weightprep < 0.2, which
    wrote an empty marker)."""
    data = storage.read_fresh(storage.join(prefix, _JOURNAL))
    if data is None:
        return None
    return json.loads(data) if data.strip() else {}


def _finish(out: str, prefix: str, journal: dict[str, Any]) -> None:
    """The end of a commit whose manifest is written (step 6): the sidecars to ``out``, the earlier build's
    objects that the new one did not overwrite removed, then the temporary prefix. Every step can be run again."""
    for rel in journal["sidecars"]:
        source = storage.join(prefix, _SIDECARS, rel)
        if storage.isfile(source):
            storage.copy(source, storage.join(out, rel))
    keep = {*journal["new"], *journal["sidecars"], *journal["loadable"]}
    for rel in journal["old"]:
        if rel not in keep:
            storage.remove(storage.join(out, rel))
    journal_url = storage.join(prefix, _JOURNAL)
    for url in storage.find(prefix):  # the journal last: until it is gone, the next build ends this
        if url != journal_url:
            storage.remove(url)
    storage.remove_tree(prefix)


def _undo(out: str, prefix: str, journal: dict[str, Any]) -> None:
    """Undo a commit whose manifest is not written: the new build's loadable files that the earlier build lacks
    removed (the manifest first), the earlier build's written back (its ``state.json`` after its
    ``dataset_info.json``, its manifest last), the new shards removed, then the journal and the sidecars. The parts
    stay: ``--resume`` reuses them. Every step can be run again."""
    old = journal["old_loadable"]
    for rel in sorted((r for r in journal["loadable"] if r not in old), key=_loadable_order, reverse=True):
        storage.remove(storage.join(out, rel))
    for rel in sorted(old, key=_loadable_order):  # only those the commit replaced: a store refusing writes (a 403)
        url = storage.join(out, rel)            # still lets an undo of a commit that wrote nothing there end
        if storage.read_fresh(url) != old[rel].encode("utf-8"):
            storage.write_bytes(url, old[rel].encode("utf-8"))
    for rel in journal["new"]:
        storage.remove(storage.join(out, rel))
    storage.remove_tree(storage.join(prefix, _SIDECARS))
    storage.remove(storage.join(prefix, _JOURNAL))


def _committed(out: str, journal: dict[str, Any]) -> bool:
    """Whether the manifest at ``out`` is the one the journal's commit wrote (step 5 ended)."""
    data = storage.read_fresh(storage.join(out, MANIFEST_NAME))
    return data is not None and hashlib.sha256(data).hexdigest() == journal["manifest_sha256"]


def _recover(out: str, prefix: str) -> None:
    """Finish or undo the commit a killed build left in ``prefix`` (nothing if it left none)."""
    journal = _read_journal(prefix)
    if journal is None:
        return
    if not journal:  # an empty marker (weightprep < 0.2): the commit had removed the earlier build first
        if not storage.exists(storage.join(out, MANIFEST_NAME)):
            remove_output(out)
        storage.remove(storage.join(prefix, _JOURNAL))
    elif _committed(out, journal):
        _finish(out, prefix, journal)
    else:
        _undo(out, prefix, journal)


def _prepare_store_output(out: str, *, overwrite: bool, inputs: Sequence[str] = ()) -> str:
    """``prepare_output`` for a URL: the checks, after finishing or undoing what a build killed during its commit
    left at ``out``. Returns ``out`` without its trailing slash."""
    out = out.rstrip("/")
    storage._writable(out)
    _split(out)
    for p in inputs:
        if p.rstrip("/") == out or p.startswith(out + "/"):
            raise UsageError(f"input {p} is inside the output path {out}; choose another --out")
    for prefix in _leftovers(out):
        _recover(out, prefix)
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
    """The build's temporary prefix beside ``out`` in the store and its commit (the module docstring's steps).
    ``tmp`` is a local staging directory for what the driver writes itself (the merged rejects and turns);
    ``work_dir`` the prefix the parts' jobs write to."""

    def __init__(self, out: str, plan_key: str, *, resume: bool = False) -> None:
        self.out = out.rstrip("/")
        parent, name = _split(self.out)
        self.prefix = f"{parent}/.{name}.tmp-{plan_key[:16]}"
        self.tag = plan_key[:8]
        adopted = False
        for leftover in _leftovers(self.out):
            plan = storage.join(leftover, _PLAN)
            if resume and leftover == self.prefix and storage.isfile(plan) and storage.read_text(plan) == plan_key:
                adopted = True
            else:  # another plan, a killed build not resumed, or a failed one: of no use to this build
                storage.remove_tree(leftover)
        if not adopted:
            storage.write_bytes(storage.join(self.prefix, _PLAN), plan_key.encode())
        self.work_dir = storage.join(self.prefix, "parts")
        self.tmp = Path(tempfile.mkdtemp(prefix="weightprep-out-"))
        weakref.finalize(self, shutil.rmtree, self.tmp, True)  # also after Ctrl-C, which keeps the prefix (--resume)
        self._journal: dict[str, Any] | None = None

    def _names(self, sets: dict[str, list[Any]], taken: set[str]) -> dict[str, list[str]]:
        """Each split's shard names: ``data-i-of-n.arrow``, or with the build's tag where one of them is taken."""
        for attempt in range(1 << 16):
            tag = "" if attempt == 0 else f"-{self.tag}" if attempt == 1 else f"-{self.tag}-{attempt}"
            names = {
                name: [(f"{name}/" if name else "") + shard_name(i, len(parts)).replace(".arrow", f"{tag}.arrow")
                       for i in range(len(parts))]
                for name, parts in sets.items()
            }
            if not taken.intersection(n for rels in names.values() for n in rels):
                return names
        raise AssertionError("no free shard names")  # 65,536 tags taken: not an output this commit made

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
        """Commit: the module docstring's steps 1-6."""
        sets = dict(sets)
        for name, parts in sets.items():
            if not parts:  # a dataset with no rows is still a valid, empty dataset
                scratch = Path(tempfile.mkdtemp(dir=self.tmp, prefix=".empty-"))
                sets[name] = [(empty_shard(scratch, seq_len, packed=packed), 0)]
        before = {u[len(self.out) + 1 :] for u in storage.find(self.out)}  # 1.
        old_loadable = {rel: (storage.read_fresh(storage.join(self.out, rel)) or b"").decode("utf-8")
                        for rel in before if rel.rsplit("/", 1)[-1] in _LOADABLE}
        names = self._names(sets, before)
        per_set = {
            name: [{"filename": rel, "rows": rows, "bytes": storage.size(source)}
                   for rel, (source, rows) in zip(names[name], parts, strict=True)]
            for name, parts in sets.items()
        }
        manifest, files = loadable_files(per_set, manifest, seq_len=seq_len, packed=packed, turns=turns)
        sidecars = sorted(p.relative_to(self.tmp).as_posix() for p in self.tmp.rglob("*.jsonl"))
        journal = {
            "new": [rel for rels in names.values() for rel in rels],
            "sidecars": sidecars,
            "loadable": [rel for rel, _ in files],
            "old": sorted(before),
            "old_loadable": old_loadable,
            "manifest_sha256": hashlib.sha256(files[-1][1]).hexdigest(),
        }
        storage.write_bytes(storage.join(self.prefix, _JOURNAL), json.dumps(journal, sort_keys=True).encode())  # 2.
        self._journal = journal
        for name, parts in sets.items():  # 3.
            for rel, (source, _) in zip(names[name], parts, strict=True):
                if storage.is_url(source):
                    storage.copy(str(source), storage.join(self.out, rel))
                else:
                    storage.put_file(source, storage.join(self.out, rel))
        for rel in sidecars:  # 4.
            storage.put_file(self.tmp / rel, storage.join(self.prefix, _SIDECARS, rel))
        for rel, data in files:  # 5. (loadable_files gives them in write order, the manifest last)
            storage.write_bytes(storage.join(self.out, rel), data)
        self._journal = None  # committed: a failure from here leaves the new build, which the next build tidies
        try:
            _finish(self.out, self.prefix, journal)  # 6.
        except storage.StorageError as exc:
            print(f"warning: the build is committed, but tidying up failed ({exc}); the next build to "
                  f"{self.out} finishes it", file=sys.stderr)
        shutil.rmtree(self.tmp, ignore_errors=True)
        return manifest

    def abort(self) -> None:
        """Undo a commit that failed (the earlier build is loadable again) and remove the temporary prefix."""
        try:
            if self._journal is not None:
                _undo(self.out, self.prefix, self._journal)
                self._journal = None
            storage.remove_tree(self.prefix)
        except storage.StorageError as exc:  # the store is failing: the next build finishes the undo
            print(f"warning: could not undo the commit or remove {self.prefix} ({exc}); the next build to "
                  f"{self.out} does", file=sys.stderr)
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _part_files(directory: Path) -> list[Path]:
    """A finished part's files in upload order: ``result.json`` (what marks the part finished) last."""
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    return sorted(files, key=lambda p: p.name == "result.json")


def upload_part(directory: Path, prefix: str) -> None:
    """Upload a part's local scratch ``directory`` to ``prefix``, its ``result.json`` last."""
    for f in _part_files(directory):
        storage.put_file(f, storage.join(prefix, f.relative_to(directory).as_posix()))


def read_result(prefix: str) -> dict[str, Any] | None:
    """The result of the part at ``prefix`` if it finished (``upload_part``), else None."""
    result = storage.join(prefix, "result.json")
    return json.loads(storage.read_text(result)) if storage.isfile(result) else None
