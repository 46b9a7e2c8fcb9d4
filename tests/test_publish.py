"""The commit of a build to an object store (``weightprep.stages.publish``) on fsspec's ``memory://`` filesystem:
killed at every single write of the commit, the output is the earlier build or the new one, never nothing, and the
next build finishes or undoes the commit; names are literal; a failed commit leaves the earlier build.

A kill is simulated in-process, as a kill -9 is seen from the store: from the chosen write on, no write, copy or
removal of the build's process reaches the store any more (every one raises ``_Killed``, which no code of weightprep
catches), so neither the failed build's clean-up nor its undo can run."""

from __future__ import annotations

import json

import pytest
from conftest import SAMPLE_RAW
from storage_support import load_rows

from weightprep import storage
from weightprep.config import config_from_dict
from weightprep.constants import MANIFEST_NAME
from weightprep.errors import UsageError
from weightprep.manifest import read_manifest, shard_batches
from weightprep.pipeline import build
from weightprep.stages import publish
from weightprep.train.data import load_shards

LINES = SAMPLE_RAW.read_bytes().splitlines(keepends=True)
OLD = b"".join(LINES[:40])
NEW = b"".join(LINES[40:70]) + b'{"pieces": "not a list"}\n'  # one reject: the commit has a sidecar to move
OUT = "memory://out/shards"


def _cfg():
    return config_from_dict({"pack": {"seq_len": 128}, "validate": {"on_invalid": "skip"}})


@pytest.fixture
def mem(mem):
    """conftest's ``memory://`` filesystem with the two inputs."""
    mem.pipe_file("/in/old.jsonl", OLD)
    mem.pipe_file("/in/new.jsonl", NEW)
    return mem


class _Killed(BaseException):
    """What every store write raises once the simulated process is dead."""


_WRITES = ("pipe_file", "put_file", "cp_file", "rm_file")


class _KillAt:
    """Counts the store's writes from the commit's journal on; from write ``at`` on, every write raises."""

    def __init__(self, monkeypatch, fs, at: int | None) -> None:
        self.at, self.seen, self.started = at, [], False
        for name in _WRITES:
            real = getattr(type(fs), name)

            def write(self_fs, path, *args, _real=real, _name=name, **kwargs):
                target = args[0] if _name in ("put_file", "cp_file") else path
                if str(target).endswith("/" + publish._JOURNAL) and _name == "pipe_file":
                    self.started = True
                if self.started:
                    if self.at is not None and len(self.seen) >= self.at:
                        raise _Killed(f"{_name} {target}")
                    self.seen.append((_name, str(target)))
                return _real(self_fs, path, *args, **kwargs)

            monkeypatch.setattr(type(fs), name, write)


def _objects(fs, prefix: str) -> dict[str, bytes]:
    return {k[len(prefix) + 1 :]: fs.cat_file(k) for k in fs.find(prefix)}


def _leftovers(fs) -> list[str]:
    return [p for p in fs.ls("/out", detail=False) if p.rsplit("/", 1)[-1].startswith(".shards.tmp-")]


@pytest.fixture
def builds(mem, tmp_path):
    """The rows and manifests of the earlier build (OLD) and of the new one (NEW) as each alone gives them."""
    old = build(["memory://in/old.jsonl"], "memory://ref/old", _cfg())
    new = build(["memory://in/new.jsonl"], "memory://ref/new", _cfg())
    assert new["counts"]["rejected"] and load_rows("memory://ref/old") != load_rows("memory://ref/new")
    return {"old": (load_rows("memory://ref/old"), old), "new": (load_rows("memory://ref/new"), new)}


def _commit_writes(mem, monkeypatch, builds) -> list[tuple[str, str]]:
    """The store writes the commit of NEW over OLD makes (a complete run, counted): (method, path) each."""
    build(["memory://in/old.jsonl"], OUT, _cfg())
    with monkeypatch.context() as m:
        counter = _KillAt(m, mem, None)
        build(["memory://in/new.jsonl"], OUT, _cfg(), overwrite=True)
    assert load_rows(OUT) == builds["new"][0]
    mem.rm("/out", recursive=True)
    return counter.seen


def test_a_kill_at_every_write_of_the_commit_leaves_the_old_or_the_new_build(mem, monkeypatch, builds):
    n = len(_commit_writes(mem, monkeypatch, builds))
    assert n >= 12  # journal, shard, sidecar, 3 loadable files, then the tidying
    outcomes = []
    for at in range(n):
        build(["memory://in/old.jsonl"], OUT, _cfg())
        with monkeypatch.context() as m:
            killer = _KillAt(m, mem, at)
            with pytest.raises(_Killed):
                build(["memory://in/new.jsonl"], OUT, _cfg(), overwrite=True)
        assert len(killer.seen) == at
        # what a reader sees now, through datasets (state.json) and through weightprep (the manifest and the shards
        # it lists): in each, the old build or the new one, whole; the manifest is never ahead of the rows
        rows, manifest = load_rows(OUT), read_manifest(OUT)
        which = "old" if rows == builds["old"][0] else "new"
        assert rows == builds[which][0], f"kill at write {at} ({killer.seen[-1:]}): datasets sees neither build"
        listed = "old" if manifest["counts"] == builds["old"][1]["counts"] else "new"
        assert manifest["counts"] == builds[listed][1]["counts"], f"kill at write {at}: a manifest of neither build"
        by_manifest = [r.tolist() for s in manifest["shards"] for b in shard_batches(OUT, s)
                       for r in b.column("input_ids").to_numpy(zero_copy_only=False)]
        assert by_manifest == builds[listed][0], f"kill at write {at}: the manifest's shards are not its build's"
        assert (which, listed) != ("old", "new"), f"kill at write {at}: the manifest switched before the rows"
        if which == listed:  # weightprep train's loader: the build, or a refusal that says why
            assert len(load_shards(OUT).dataset) == len(builds[which][0])
        else:
            with pytest.raises(UsageError, match="a build to it is running or was killed during its commit"):
                load_shards(OUT)
        outcomes.append(which)
        # the next build to the output finishes or undoes the commit first, then replaces it as asked
        build(["memory://in/new.jsonl"], OUT, _cfg(), overwrite=True)
        assert load_rows(OUT) == builds["new"][0] and _leftovers(mem) == []
        manifest = read_manifest(OUT)
        listed = {s["filename"] for s in manifest["shards"]}
        extra = {"dataset_info.json", "state.json", MANIFEST_NAME, "rejects.jsonl"}
        assert set(_objects(mem, "/out/shards")) == listed | extra, f"kill at write {at}: objects left behind"
        mem.rm("/out", recursive=True)
    # the sweep crossed the commit point: early kills leave the old build, late ones the new
    assert outcomes[0] == "old" and outcomes[-1] == "new" and outcomes == sorted(outcomes, key=["old", "new"].index)


def test_a_killed_commit_is_finished_or_undone_without_overwrite(mem, monkeypatch, builds):
    """Recovery does not need --overwrite: it restores what the killed build was allowed to do. An undone commit
    keeps the killed build's finished parts (``--resume`` reuses them); a finished one leaves nothing."""
    writes = _commit_writes(mem, monkeypatch, builds)
    manifest_write = writes.index(("pipe_file", f"/out/shards/{MANIFEST_NAME}"))
    # early; at the manifest (all else written: sidecars in the prefix); just after it; at the last removal
    for at, expected in ((2, "old"), (manifest_write, "old"), (manifest_write + 1, "new"), (len(writes) - 1, "new")):
        build(["memory://in/old.jsonl"], OUT, _cfg())
        with monkeypatch.context() as m:
            _KillAt(m, mem, at)
            with pytest.raises(_Killed):
                build(["memory://in/new.jsonl"], OUT, _cfg(), overwrite=True)
        with pytest.raises(UsageError, match="already exists; pass --overwrite"):
            build(["memory://in/old.jsonl"], OUT, _cfg())  # recovers first, then refuses
        assert load_rows(OUT) == builds[expected][0]
        left = [k for p in _leftovers(mem) for k in mem.find(p)]
        if expected == "new":
            assert left == []
        else:
            assert left and all("/parts/" in k or k.endswith("/plan.json") for k in left), left
        mem.rm("/out", recursive=True)


def test_a_failed_commit_puts_the_earlier_build_back(mem, monkeypatch, builds):
    build(["memory://in/old.jsonl"], OUT, _cfg())
    before = _objects(mem, "/out/shards")
    real = storage.write_bytes

    def refuse_manifest(url, data):
        if url == f"{OUT}/{MANIFEST_NAME}":
            raise storage.StorageError(f"{url}: writing it failed (AccessDenied)")
        return real(url, data)

    monkeypatch.setattr(storage, "write_bytes", refuse_manifest)
    with pytest.raises(UsageError, match="AccessDenied"):
        build(["memory://in/new.jsonl"], OUT, _cfg(), overwrite=True)
    assert _objects(mem, "/out/shards") == before  # state.json had been replaced: written back
    assert _leftovers(mem) == []


def test_shards_of_a_replaced_build_are_never_overwritten(mem, builds):
    """The new shards take names the earlier build does not use, so its state.json never points at new bytes."""
    build(["memory://in/old.jsonl"], OUT, _cfg())
    old_shards = {k: v for k, v in _objects(mem, "/out/shards").items() if k.endswith(".arrow")}
    manifest = build(["memory://in/new.jsonl"], OUT, _cfg(), overwrite=True)
    names = [s["filename"] for s in manifest["shards"]]
    assert not set(names) & set(old_shards)
    tag = mem.cat_file(next(p for p in mem.find("/ref") if p.endswith("state.json")))  # any build's: valid JSON
    assert json.loads(tag)["_data_files"]
    assert all(n.endswith(f"-{names[0].rsplit('-', 1)[-1]}") for n in names)  # one tag for the whole build
    manifest = build(["memory://in/new.jsonl"], OUT, _cfg(), overwrite=True)  # and back to the plain names
    assert [s["filename"] for s in manifest["shards"]] == sorted(old_shards)
    assert load_rows(OUT) == builds["new"][0]


GLOB_NAMES = ["many/*", "run[1X]", "r?n", "all/**", "set{a,b}"]


@pytest.mark.parametrize("name", GLOB_NAMES)
def test_an_output_name_is_literal(mem, name):
    """Neighbours that the name would match as a pattern, and leftovers of other builds beside them, are never
    touched: by the build, by --overwrite, or by a failed commit's undo."""
    base = "/g/" + name.rsplit("/", 1)[0] if "/" in name else "/g"
    neighbours = {
        f"{base}/run1/data-00000-of-00001.arrow": b"a", f"{base}/runX/{MANIFEST_NAME}": b"{}",
        f"{base}/note.txt": b"n", f"{base}/b/weightprep_manifest.json": b"{}", f"{base}/seta/x": b"x",
        f"{base}/.run1.tmp-0123456789abcdef/plan.json": b"p", f"{base}/.note.tmp-0123456789abcdef/plan.json": b"p",
        f"{base}/rXn/state.json": b"{}", f"{base}/all/deep/er": b"d",
    }
    for path, data in neighbours.items():
        mem.pipe_file(path, data)
    out = f"memory://g/{name}"
    build(["memory://in/old.jsonl"], out, _cfg())
    build(["memory://in/new.jsonl"], out, _cfg(), overwrite=True)
    assert read_manifest(out)["counts"]["records"] == NEW.count(b"\n")
    for path, data in neighbours.items():
        assert mem.cat_file(path) == data, f"{path} changed"
    storage.remove_tree(out)
    for path, data in neighbours.items():
        assert mem.cat_file(path) == data, f"{path} changed by remove_tree({out})"


def test_a_sibling_that_shares_the_name_start_is_not_removed(mem):
    mem.pipe_file("/out/shards2/weightprep_manifest.json", b"{}")
    mem.pipe_file("/out/.shards2.tmp-0123456789abcdef/plan.json", b"p")
    mem.pipe_file("/out/.shards.tmp-not-hex/keep", b"k")  # not a name weightprep makes
    build(["memory://in/old.jsonl"], OUT, _cfg())
    build(["memory://in/new.jsonl"], OUT, _cfg(), overwrite=True)
    assert mem.cat_file("/out/shards2/weightprep_manifest.json") == b"{}"
    assert mem.cat_file("/out/.shards2.tmp-0123456789abcdef/plan.json") == b"p"
    assert mem.cat_file("/out/.shards.tmp-not-hex/keep") == b"k"


def test_recovering_an_empty_marker_of_an_earlier_version_leaves_no_marker(mem):
    """weightprep < 0.2 wrote an empty ``publishing`` marker and removed the earlier build first: a partial output
    without a manifest is removed, and so is the marker, even where no build follows."""
    mem.pipe_file("/out/shards/data-00000-of-00002.arrow", b"partial")
    mem.pipe_file("/out/.shards.tmp-0123456789abcdef/publishing", b"")
    mem.pipe_file("/out/.shards.tmp-0123456789abcdef/parts/00000/result.json", b"{}")
    publish.prepare_output(OUT, overwrite=False)
    assert mem.find("/out/shards") == []
    assert mem.find("/out/.shards.tmp-0123456789abcdef") == ["/out/.shards.tmp-0123456789abcdef/parts/00000/result.json"]


def test_remove_output_takes_the_manifest_first_then_the_loadable_files(mem, monkeypatch):
    """An output removed object by object is never loadable with objects missing: weightprep's readers stop at
    the manifest's absence, datasets' at state.json's."""
    for name in ("data-00000-of-00001.arrow", "dataset_info.json", "state.json", MANIFEST_NAME, "rejects.jsonl",
                 "train/state.json", "train/dataset_info.json", "dataset_dict.json"):
        mem.pipe_file(f"/out/shards/{name}", b"x")
    removed = []
    real = storage.remove
    monkeypatch.setattr(storage, "remove", lambda url: (removed.append(url.rsplit("shards/", 1)[1]), real(url))[1])
    publish.remove_output(OUT)
    assert removed[:6] == [MANIFEST_NAME, "dataset_dict.json", "state.json", "dataset_info.json", "train/state.json",
                           "train/dataset_info.json"]
    assert sorted(removed) == sorted(set(removed)) and mem.find("/out/shards") == []


def test_an_undo_removes_the_new_builds_switches_first(mem, monkeypatch):
    """A failed commit to a fresh output with splits: dataset_dict.json (what makes it a DatasetDict) goes before
    the splits' state.json, so no reader ever sees a DatasetDict with a split missing."""
    cfg = config_from_dict({"pack": {"seq_len": 128}, "split": {"validation_fraction": 0.2}})
    real_write, real_remove, removed = storage.write_bytes, storage.remove, []

    def refuse_manifest(url, data):
        if url == f"{OUT}/{MANIFEST_NAME}":
            raise storage.StorageError(f"{url}: writing it failed (AccessDenied)")
        return real_write(url, data)

    monkeypatch.setattr(storage, "write_bytes", refuse_manifest)
    monkeypatch.setattr(storage, "remove", lambda url: (removed.append(url), real_remove(url))[1])
    with pytest.raises(UsageError, match="AccessDenied"):
        build(["memory://in/old.jsonl"], OUT, cfg)
    loadable = [u.rsplit("shards/", 1)[1] for u in removed if u.startswith(OUT + "/") and u.endswith(".json")]
    assert loadable[:2] == [MANIFEST_NAME, "dataset_dict.json"] and set(loadable) == {MANIFEST_NAME,
        "dataset_dict.json", *(f"{s}/{f}" for s in ("train", "validation") for f in ("state.json", "dataset_info.json"))}
    assert mem.find("/out/shards") == []


def test_an_undo_the_store_refuses_says_so_and_leaves_no_local_staging(mem, monkeypatch, capsys):
    import os
    import tempfile

    build(["memory://in/old.jsonl"], OUT, _cfg())
    staging, real_mkdtemp = [], tempfile.mkdtemp
    monkeypatch.setattr(publish.tempfile, "mkdtemp", lambda *a, **kw: staging.append(real_mkdtemp(*a, **kw)) or staging[-1])
    real_write = storage.write_bytes

    def refuse(url, *args):
        raise storage.StorageError(f"{url}: refused (AccessDenied)")

    # the store takes the journal and the shards, then refuses every write to the output and every removal
    monkeypatch.setattr(storage, "write_bytes", lambda url, data: refuse(url) if url.startswith(OUT + "/") else
                        real_write(url, data))
    monkeypatch.setattr(storage, "remove", refuse)
    with pytest.raises(UsageError, match="AccessDenied"):
        build(["memory://in/new.jsonl"], OUT, _cfg(), overwrite=True)
    assert "warning: could not undo the commit" in capsys.readouterr().err
    assert staging and not any(os.path.exists(d) for d in staging)  # the build's local staging directories
    assert load_rows(OUT) == builds_rows_old(mem)


def builds_rows_old(mem):
    """The rows of OLD built alone (the earlier build, still what the output holds)."""
    build(["memory://in/old.jsonl"], "memory://ref/old-again", _cfg())
    return load_rows("memory://ref/old-again")
