"""The URL plumbing of ``weightprep.storage`` on fsspec's ``memory://`` filesystem (fast, no server): inputs by URL
(JSONL, globs, directories, Parquet by row group), outputs by URL with their commit order, retries, missing
extras, ``hf://`` through the same path (the Hub itself cannot be reached from the test machines)."""

from __future__ import annotations

import io
import random

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import SAMPLE_RAW, PartInterrupter
from fsspec.implementations.memory import MemoryFileSystem

from weightprep import storage
from weightprep.cli import main
from weightprep.config import config_from_dict
from weightprep.errors import LeftoverParts, UsageError
from weightprep.pipeline import build
from weightprep.stages import publish
from weightprep.stages.read import expand_inputs

DATA = SAMPLE_RAW.read_bytes()[: SAMPLE_RAW.read_bytes().index(b"\n", 60_000) + 1]


def _cfg(**read):
    return config_from_dict({"pack": {"seq_len": 128}, "read": {"part_bytes": 20_000, "block_bytes": 8192, **read}})


def _tree(fs, prefix: str) -> dict[str, bytes]:
    return {k[len(prefix) + 1 :]: fs.cat_file(k) for k in fs.find(prefix)}


@pytest.fixture
def local_reference(tmp_path):
    (tmp_path / "raw.jsonl").write_bytes(DATA)
    out = tmp_path / "ref"
    build([str(tmp_path / "raw.jsonl")], out, _cfg())
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def test_memory_to_memory_build_has_the_local_shards(mem, local_reference):
    mem.pipe_file("/in/raw.jsonl", DATA)
    manifest = build(["memory://in/raw.jsonl"], "memory://out/shards", _cfg())
    got = _tree(mem, "/out/shards")
    assert sorted(got) == sorted(local_reference)
    assert {n: b for n, b in got.items() if n.endswith(".arrow")} == {
        n: b for n, b in local_reference.items() if n.endswith(".arrow")
    }
    assert manifest["inputs"][0]["path"] == "memory://in/raw.jsonl" and len(manifest["inputs"][0]["parts"]) > 1
    assert not mem.glob("/out/.shards.tmp-*")



def test_input_hashes_by_url_are_those_of_the_local_files(mem, tmp_path):
    """The manifest's input hashes come from the bytes read: a file cut into parts (each part's sha256) and a
    compressed one (its whole sha256) give, by URL, the entries of the same files on disk (but path and mtime)."""
    import gzip

    files = {"a.jsonl": DATA, "c.jsonl.gz": gzip.compress(DATA[: DATA.index(b"\n", 20_000) + 1])}
    for name, data in files.items():
        mem.pipe_file(f"/in/{name}", data)
        (tmp_path / name).write_bytes(data)
    by_url = build([f"memory://in/{n}" for n in files], "memory://out/h", _cfg())["inputs"]
    local = build([str(tmp_path / n) for n in files], tmp_path / "h", _cfg())["inputs"]

    def strip(entry):
        return {k: v for k, v in entry.items() if k not in ("path", "mtime")}

    assert len(by_url[0]["parts"]) > 1 and by_url[1]["sha256"]
    assert [strip(e) for e in by_url] == [strip(e) for e in local]


def test_a_file_url_output_makes_its_directories_and_has_the_local_shards(local_reference, tmp_path):
    """``--out file:///...``: a local disk has directories, which fsspec's LocalFileSystem does not make on a write
    (an object store needs none): the build failed with 'plan.json: not found (writing it)'."""
    (tmp_path / "in.jsonl").write_bytes(DATA)
    out = tmp_path / "new" / "shards"
    build([str(tmp_path / "in.jsonl")], f"file://{out}", _cfg())
    got = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert sorted(got) == sorted(local_reference)
    assert {n: b for n, b in got.items() if n.endswith(".arrow")} == {
        n: b for n, b in local_reference.items() if n.endswith(".arrow")
    }
    assert not list((tmp_path / "new").glob(".shards.tmp-*"))


def test_sources_by_url_build_the_local_shards(mem, tmp_path):
    """Several sources (a weight, fractional epochs, a validation split per source) read from a store and written
    to one: the same shard bytes as the same sources on local disk (the plan cuts objects by range requests)."""
    from weightprep.sources import parse_source_option

    half = DATA.index(b"\n", len(DATA) // 2) + 1
    cfg = config_from_dict(
        {"pack": {"seq_len": 128}, "read": {"part_bytes": 20_000, "block_bytes": 8192},
         "split": {"validation_fraction": 0.1}}
    )  # fmt: skip
    specs = {"a": (DATA[:half], ",weight=2"), "b": (DATA[half:], ",epochs=1.5")}
    for name, (data, _) in specs.items():
        mem.pipe_file(f"/in/{name}.jsonl", data)
        (tmp_path / f"{name}.jsonl").write_bytes(data)
    remote = [parse_source_option(f"{n}=memory://in/{n}.jsonl{o}") for n, (_, o) in specs.items()]
    local = [parse_source_option(f"{n}={tmp_path / n}.jsonl{o}") for n, (_, o) in specs.items()]
    manifest = build([], "memory://out/mixed", cfg, sources=remote)
    build([], tmp_path / "ref", cfg, sources=local)
    got = _tree(mem, "/out/mixed")
    want = {p.relative_to(tmp_path / "ref").as_posix(): p.read_bytes() for p in (tmp_path / "ref").rglob("*") if p.is_file()}
    assert sorted(got) == sorted(want)
    arrow = [n for n in want if n.endswith(".arrow")]
    assert {n.split("/")[0] for n in arrow} == {"train", "validation_a", "validation_b"}
    assert {n: got[n] for n in arrow} == {n: want[n] for n in arrow}
    assert [s["name"] for s in manifest["sources"]] == ["a", "b"]
    assert not mem.glob("/out/.mixed.tmp-*")

def test_globs_directories_and_save_to_disk_dirs_by_url(mem):
    for name in ("b.jsonl", "a.jsonl.gz", ".hidden.jsonl", "notes.txt"):
        mem.pipe_file(f"/d/{name}", b"{}\n")
    assert expand_inputs(["memory://d"]) == ["memory://d/a.jsonl.gz", "memory://d/b.jsonl"]
    assert expand_inputs(["memory://d/*.jsonl"]) == ["memory://d/b.jsonl"]
    mem.pipe_file("/ds/state.json", b'{"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}')
    assert expand_inputs(["memory://ds"]) == ["memory://ds/data-00000-of-00001.arrow"]
    with pytest.raises(UsageError, match="given twice"):
        expand_inputs(["memory://d/b.jsonl", "memory://d/b.jsonl/"])
    with pytest.raises(UsageError, match="no file matches"):
        expand_inputs(["memory://d/*.parquet"])


def test_a_glob_for_dot_names_matches_them_and_a_star_does_not(mem):
    for name in ("b.jsonl", ".hidden.jsonl", ".other.txt"):
        mem.pipe_file(f"/g/{name}", b"{}\n")
    assert storage.glob("memory://g/*") == ["memory://g/b.jsonl"]
    assert storage.glob("memory://g/.*.jsonl") == ["memory://g/.hidden.jsonl"]
    assert storage.glob("memory://g/.*") == ["memory://g/.hidden.jsonl", "memory://g/.other.txt"]


def test_what_is_a_file_a_directory_or_nothing_and_a_local_input_s_resume_key(mem, tmp_path):
    mem.pipe_file("/kinds/sub/x.jsonl", DATA)
    assert storage.isdir("memory://kinds/sub") and not storage.isfile("memory://kinds/sub")
    assert storage.isfile("memory://kinds/sub/x.jsonl") and not storage.isdir("memory://kinds/sub/x.jsonl")
    assert not storage.isdir("memory://kinds/none") and not storage.isfile("memory://kinds/none")
    local = tmp_path / "x.jsonl"
    local.write_bytes(DATA)
    st = local.stat()
    assert storage.stat_key(str(local)) == [str(local.resolve()), len(DATA), st.st_mtime_ns]
    key = storage.stat_key("memory://kinds/sub/x.jsonl")
    assert key[:2] == ["memory://kinds/sub/x.jsonl", len(DATA)] and key[2] is not None


def test_parquet_by_url_reads_row_groups_through_pyarrow(mem, tmp_path, monkeypatch):
    rng = random.Random(0)  # incompressible text: six row groups of ~40 kB, beyond pyarrow's 64 kB footer read
    table = pa.table({"text": [" ".join(f"{rng.getrandbits(64):x}" for _ in range(50)) for _ in range(300)]})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=50)
    mem.pipe_file("/pq/train.parquet", buf.getvalue())
    (tmp_path / "train.parquet").write_bytes(buf.getvalue())
    reads, fetch = [], storage._RangeFile._fetch

    def record(self, n):
        reads.append((self._pos, n))
        return fetch(self, n)

    monkeypatch.setattr(storage._RangeFile, "_fetch", record)
    remote = build(["memory://pq/train.parquet"], "memory://pq-out/s", _cfg())
    size = len(buf.getvalue())
    row_groups = {pos for pos, n in reads if n < size // 3}  # the footer, then each row group on its own
    assert len(row_groups) >= 4, reads
    assert reads.count((0, size)) == 1  # the whole file once: its hash, as for a local file
    local = build([str(tmp_path / "train.parquet")], tmp_path / "s", _cfg())
    assert remote["counts"] == local["counts"] and remote["inputs"][0]["sha256"] == local["inputs"][0]["sha256"]
    assert _tree(mem, "/pq-out/s")["data-00000-of-00001.arrow"] == (tmp_path / "s" / "data-00000-of-00001.arrow").read_bytes()


def test_the_commit_writes_the_loadable_files_last(mem, monkeypatch):
    mem.pipe_file("/in/raw.jsonl", DATA)
    writes: list[str] = []
    for name in ("copy", "put_file", "write_bytes"):
        real = getattr(storage, name)

        def record(*args, _real=real, _name=name):
            writes.append(str(args[1] if _name != "write_bytes" else args[0]))
            return _real(*args)

        monkeypatch.setattr(storage, name, record)
    build(["memory://in/raw.jsonl"], "memory://out/shards", _cfg())
    published = [w.rsplit("/", 1)[-1] for w in writes if w.startswith("memory://out/shards/")]
    assert published[-3:] == ["dataset_info.json", "state.json", "weightprep_manifest.json"]
    assert all(n.startswith("data-") for n in published[:-3])


def test_the_commit_of_a_build_with_splits_writes_dataset_dict_json_after_every_split(mem, monkeypatch):
    """Sources with a validation split: a DatasetDict, which ``load_from_disk`` opens once ``dataset_dict.json`` is
    there, so every split's loadable files come before it and the manifest after it."""
    from weightprep.sources import parse_source_option

    half = DATA.index(b"\n", len(DATA) // 2) + 1
    mem.pipe_file("/in/a.jsonl", DATA[:half])
    mem.pipe_file("/in/b.jsonl", DATA[half:])
    writes: list[str] = []
    real = storage.write_bytes
    monkeypatch.setattr(storage, "write_bytes", lambda url, data: (writes.append(url), real(url, data))[1])
    cfg = config_from_dict({"pack": {"seq_len": 128}, "split": {"validation_fraction": 0.1}})
    sources = [parse_source_option("a=memory://in/a.jsonl,weight=2"), parse_source_option("b=memory://in/b.jsonl")]
    build([], "memory://out/mixed", cfg, sources=sources)
    published = [w[len("memory://out/mixed/") :] for w in writes if w.startswith("memory://out/mixed/")]
    splits = ("train", "validation_a", "validation_b")
    assert published == [f"{s}/{f}" for s in splits for f in ("dataset_info.json", "state.json")] + [
        "dataset_dict.json", "weightprep_manifest.json"]


def test_a_failed_commit_leaves_nothing_and_a_killed_one_is_cleared(mem, monkeypatch):
    mem.pipe_file("/in/raw.jsonl", DATA)
    real = storage.write_bytes

    def fail_on_manifest(url, data):
        if url.endswith("weightprep_manifest.json"):
            raise storage.StorageError(f"{url}: writing it failed (denied)")
        return real(url, data)

    monkeypatch.setattr(storage, "write_bytes", fail_on_manifest)
    with pytest.raises(UsageError, match="memory://out/shards/weightprep_manifest.json: writing it failed"):
        build(["memory://in/raw.jsonl"], "memory://out/shards", _cfg())
    assert mem.find("/out") == []  # state.json was written, and removed again
    # a build killed during its commit: shards and state.json there, no manifest, the publishing marker left
    mem.pipe_file("/out/shards/data-00007-of-00009.arrow", b"partial")
    mem.pipe_file("/out/shards/state.json", b"{}")
    mem.pipe_file("/out/.shards.tmp-0123456789abcdef/publishing", b"")
    monkeypatch.setattr(storage, "write_bytes", real)
    build(["memory://in/raw.jsonl"], "memory://out/shards", _cfg())  # no --overwrite needed: it was never loadable
    assert "data-00007-of-00009.arrow" not in _tree(mem, "/out/shards")


def test_resume_reuses_the_finished_parts_in_the_store(mem, monkeypatch):
    mem.pipe_file("/in/raw.jsonl", DATA)
    ctrl_c = PartInterrupter(monkeypatch)
    runs = ctrl_c.runs
    with pytest.raises(KeyboardInterrupt):
        build(["memory://in/raw.jsonl"], "memory://out/shards", _cfg())
    assert len(mem.glob("/out/.shards.tmp-*/parts/*/result.json")) == 1  # part 0 finished
    runs.clear()
    ctrl_c.interrupt = False
    with pytest.raises(LeftoverParts, match=r"left 1 finished part\(s\) in memory://out/\.shards\.tmp-"):
        build(["memory://in/raw.jsonl"], "memory://out/shards", _cfg())  # neither --resume nor --overwrite: kept
    assert runs == [] and len(mem.glob("/out/.shards.tmp-*/parts/*/result.json")) == 1
    build(["memory://in/raw.jsonl"], "memory://out/shards", _cfg(), resume=True)
    assert runs == [1]  # part 0 was reused


def test_an_output_in_a_store_is_refused_unless_overwrite(mem):
    mem.pipe_file("/in/raw.jsonl", DATA)
    mem.pipe_file("/area/taken/file.txt", b"x")
    with pytest.raises(UsageError, match="already exists; pass --overwrite"):
        build(["memory://in/raw.jsonl"], "memory://area/taken", _cfg())
    with pytest.raises(UsageError, match="not a weightprep output"):
        build(["memory://in/raw.jsonl"], "memory://area/taken", _cfg(), overwrite=True)
    with pytest.raises(UsageError, match="read-only"):
        build(["memory://in/raw.jsonl"], "https://example.com/out", _cfg())
    with pytest.raises(UsageError, match="inside the output path"):
        build(["memory://in/raw.jsonl"], "memory://in/raw.jsonl", _cfg(), overwrite=True)


class _Named(MemoryFileSystem):
    """The memory store under a protocol of its own (``protocol``)."""

    @classmethod
    def _strip_protocol(cls, path):
        return "/" + path.removeprefix(f"{cls.protocol}://").lstrip("/")


class _Faulty(_Named):
    """A memory filesystem under a protocol of its own whose opened files read through ``_read`` (a fault of the
    subclass's choosing)."""

    protocol = "faulty"

    def _open(self, path, mode="rb", **kwargs):
        f = super()._open(path, mode, **kwargs)
        if "r" in mode:
            read = f.read
            f.read = lambda n=-1: self._read(f, read, n)
        return f

    def _read(self, f, read, n):
        return read(n)


class _Flaky(_Faulty):
    """Reads that fail ``failures`` times (a dropped connection), then work."""

    protocol = "flaky"
    failures = 0

    def cat_file(self, path, start=None, end=None, **kwargs):
        if _Flaky.failures:
            _Flaky.failures -= 1
            raise ConnectionResetError("connection reset by peer")
        return super().cat_file(path, start, end, **kwargs)

    def _read(self, f, read, n):
        if _Flaky.failures:
            _Flaky.failures -= 1
            raise ConnectionResetError("connection reset by peer")
        return read(n)


def test_transient_read_errors_are_retried_then_name_the_object(mem, monkeypatch):
    fsspec.register_implementation("flaky", _Flaky, clobber=True)
    mem.pipe_file("/f/raw.jsonl", DATA)
    _Flaky.failures = 3
    with storage.open_input("flaky://f/raw.jsonl", 100, 5000) as f:
        assert f.read() == DATA[100:5000]
    assert _Flaky.failures == 0
    _Flaky.failures = 10**6
    monkeypatch.setenv("WEIGHTPREP_STORAGE_RETRIES", "2")
    with pytest.raises(storage.StorageError, match=r"flaky://f/raw.jsonl: reading bytes 0\.\.4900 failed after 3 tries"):
        storage.open_input("flaky://f/raw.jsonl", 0, 4900).read()
    _Flaky.failures = 0


def test_retries_wait_twice_as_long_each_time_and_zero_retries_try_once(monkeypatch):
    """``WEIGHTPREP_STORAGE_RETRIES`` transient failures are retried, the waits doubling from
    ``WEIGHTPREP_STORAGE_BACKOFF`` seconds; 0 retries means one try."""
    waits: list[float] = []
    monkeypatch.setattr(storage.time, "sleep", waits.append)
    calls = []

    def failing():
        calls.append(1)
        raise ConnectionError("reset by peer")

    monkeypatch.setenv("WEIGHTPREP_STORAGE_BACKOFF", "0.5")
    monkeypatch.setenv("WEIGHTPREP_STORAGE_RETRIES", "3")
    with pytest.raises(storage.StorageError, match="after 4 tries"):
        storage.retry(failing, "memory://b/x", "reading it")
    assert waits == [0.5, 1.0, 2.0] and len(calls) == 4
    waits.clear(), calls.clear()
    monkeypatch.setenv("WEIGHTPREP_STORAGE_RETRIES", "0")
    with pytest.raises(storage.StorageError, match=r"reading it failed \(ConnectionError"):
        storage.retry(failing, "memory://b/x", "reading it")
    assert waits == [] and len(calls) == 1
    monkeypatch.setenv("WEIGHTPREP_STORAGE_RETRIES", "1")
    with pytest.raises(storage.StorageError, match=r"reading it failed after 2 tries with backoff \(ConnectionError"):
        storage.retry(failing, "memory://b/x", "reading it")


def test_missing_extra_names_the_pip_line(monkeypatch):
    def missing(protocol):
        raise ImportError(f"Install gcsfs to access {protocol}")

    monkeypatch.setattr(fsspec, "get_filesystem_class", missing)
    with pytest.raises(UsageError, match=r"pip install 'weightprep\[gcs\]'"):
        storage.filesystem("gs://bucket/data.jsonl")
    with pytest.raises(UsageError, match=r"pip install 'weightprep\[s3\]'"):
        expand_inputs(["s3://bucket/data.jsonl"])


def test_hf_urls_go_through_the_same_fsspec_path(mem, monkeypatch, local_reference):
    """The Hub cannot be reached from the test machines: ``hf://`` resolves to huggingface_hub's filesystem, and a
    build from an ``hf://datasets/...`` URL runs through it (here a stand-in on memory for the network)."""
    from huggingface_hub import HfFileSystem

    fs, path = storage.filesystem("hf://datasets/org/name/data/raw.jsonl")
    assert isinstance(fs, HfFileSystem) and path == "datasets/org/name/data/raw.jsonl"

    class Hub(MemoryFileSystem):
        protocol = "hf"

        @classmethod
        def _strip_protocol(cls, path):
            return "/" + path.removeprefix("hf://").lstrip("/")

    fsspec.register_implementation("hf", Hub, clobber=True)
    try:
        mem.pipe_file("/datasets/org/name/data/raw.jsonl", DATA)
        out = build(["hf://datasets/org/name/data/raw.jsonl"], "memory://hf-out/s", _cfg())
    finally:
        fsspec.register_implementation("hf", HfFileSystem, clobber=True)
    assert out["inputs"][0]["path"] == "hf://datasets/org/name/data/raw.jsonl"
    assert _tree(mem, "/hf-out/s")["data-00000-of-00002.arrow"] == local_reference["data-00000-of-00002.arrow"]


def test_secrets_of_configured_and_session_options_are_masked_in_messages():
    """``--storage-options`` (``configure``) and a library caller's ``storage_options`` (``session``) are
    remembered: a library's error that echoes the value is masked, though the value is no URL's part."""
    from weightprep.redact import redact

    storage.configure({"s3": {"secret": "ConfiguredSecret41"}})
    try:
        assert redact("denied for ConfiguredSecret41") == "denied for ***"
    finally:
        storage.configure(None)
    with storage.session({"token": "SessionToken42"}):
        assert redact("bad token SessionToken42") == "bad token ***"


def test_a_nested_session_without_options_is_the_enclosing_one_and_with_options_its_own():
    """``session()`` inside a session shares its options and its metadata cache (the command line's listing of
    the inputs is its build's); ``session(options)`` or ``session(known=...)`` is a scope of its own; a
    ``session()`` at the top level is one too."""
    info = {"name": "/x", "size": 3, "type": "file"}
    with storage.session({"anon": True}):
        with storage.session():
            storage._remember("memory://shared/x", info)
            assert storage.current_options() == {"anon": True}
        assert storage.known_metadata(["memory://shared/x"]) == {"memory://shared/x": info}
        with storage.session({"anon": False}):
            assert storage.current_options() == {"anon": False}
            assert storage.known_metadata(["memory://shared/x"]) == {}
            storage._remember("memory://inner/y", info)
        with storage.session(known={"memory://k/z": info}):
            assert storage.current_options() == {"anon": True}
            assert storage.known_metadata(["memory://shared/x", "memory://k/z"]) == {"memory://k/z": info}
        assert storage.current_options() == {"anon": True}
        assert storage.known_metadata(["memory://inner/y"]) == {}
    with storage.session():
        storage._remember("memory://top/w", info)
        assert storage.known_metadata(["memory://top/w"]) == {"memory://top/w": info}
    with storage.session():
        assert storage.known_metadata(["memory://top/w"]) == {}


def test_an_object_looked_up_once_costs_no_second_request_in_a_session(mem, monkeypatch):
    mem.pipe_file("/once/raw.jsonl", DATA)
    asked: list[str] = []
    real = MemoryFileSystem.info
    monkeypatch.setattr(MemoryFileSystem, "info", lambda self, path, **kw: asked.append(path) or real(self, path, **kw))
    with storage.session():
        assert storage.size("memory://once/raw.jsonl") == len(DATA)
        assert storage.isfile("memory://once/raw.jsonl") and storage.exists("memory://once/raw.jsonl")
        assert not storage.exists("memory://once/missing.jsonl") and not storage.exists("memory://once/missing.jsonl")
    assert asked == ["/once/raw.jsonl", "/once/missing.jsonl", "/once/missing.jsonl"]
    mem.pipe_file("/listed/a.jsonl", DATA)
    mem.pipe_file("/listed/b.jsonl", DATA[:10])
    asked.clear()
    with storage.session():  # a listing's metadata serves the lookups after it
        assert [storage.size(u) for u in storage.listdir("memory://listed")] == [len(DATA), 10]
    with storage.session():
        assert [storage.size(u) for u in storage.glob("memory://listed/*.jsonl")] == [len(DATA), 10]
    assert [a for a in asked if a.endswith(".jsonl")] == []  # (the filesystem's own listing asks of the directory)


def test_closing_a_range_read_closes_the_object_it_read(mem, monkeypatch):
    mem.pipe_file("/closing/raw.jsonl", DATA)
    closed: list[str] = []
    real = MemoryFileSystem._open

    def spy(self, path, *args, **kwargs):
        f = real(self, path, *args, **kwargs)
        f.close = lambda: closed.append(path)  # a memory file's own close does not mark it closed
        return f

    monkeypatch.setattr(MemoryFileSystem, "_open", spy)
    f = storage.open_input("memory://closing/raw.jsonl", 10, 100)
    assert f.read(20) == DATA[10:30] and closed == []
    f.close()
    assert f.closed and closed == ["/closing/raw.jsonl"]


def test_a_one_byte_range_reads_its_byte_and_an_empty_range_asks_the_store_nothing(mem, monkeypatch):
    mem.pipe_file("/tiny/raw.jsonl", DATA)
    opened: list[str] = []
    real = MemoryFileSystem._open
    monkeypatch.setattr(MemoryFileSystem, "_open", lambda self, path, *a, **kw: opened.append(path) or real(self, path, *a, **kw))
    with storage.open_input("memory://tiny/raw.jsonl", 5, 6) as f:
        assert f.read() == DATA[5:6] and f.read() == b""
    assert opened == ["/tiny/raw.jsonl"]
    with storage.open_input("memory://tiny/raw.jsonl", 7, 7) as f:
        assert f.read() == b""
    assert opened == ["/tiny/raw.jsonl"]


def test_a_range_read_is_a_seekable_file_of_the_range_alone(mem):
    mem.pipe_file("/seek/raw.jsonl", DATA)
    with storage.open_input("memory://seek/raw.jsonl", 100, 300) as f:
        assert f.seekable() is True and f.tell() == 0
        assert f.read(10) == DATA[100:110] and f.tell() == 10
        assert f.seek(5, 1) == 15 and f.read(5) == DATA[115:120]
        assert f.seek(-20, 2) == 180 and f.read() == DATA[280:300]
        assert f.seek(3) == 3 and f.read(2) == DATA[103:105]
        assert f.seek(-50) == 0  # not before the range's start


class _NoSize(_Named):
    """A filesystem whose files take no ``size`` (it looks the size up itself)."""

    protocol = "nosize"

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        if "size" in kwargs:
            raise TypeError("_open() got an unexpected keyword argument 'size'")
        return super()._open(path, mode, block_size, autocommit, cache_options, **kwargs)


class _Buffered(_Named):
    """A filesystem of fsspec's buffered files (as s3fs's and gcsfs's are), reading from the memory store."""

    protocol = "buffered"

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        from fsspec.spec import AbstractBufferedFile

        store = self.store

        class File(AbstractBufferedFile):
            def _fetch_range(self, start, end):
                return store[self.path].getvalue()[start:end]

        return File(self, path, mode, size=kwargs.get("size"), cache_type=kwargs.get("cache_type", "none"))


def test_a_range_read_opens_filesystems_without_size_and_gives_buffered_files_the_listing_s_details(mem):
    mem.pipe_file("/opt/raw.jsonl", DATA)
    fsspec.register_implementation("nosize", _NoSize, clobber=True)
    with storage.open_input("nosize://opt/raw.jsonl", 10, 50) as f:
        assert f.read() == DATA[10:50]
    fsspec.register_implementation("buffered", _Buffered, clobber=True)
    url = "buffered://opt/raw.jsonl"
    listed = {"name": "/opt/raw.jsonl", "size": len(DATA), "type": "file", "ETag": '"v1"'}
    with storage.session(known={url: listed}):
        f = storage.open_input(url, 10, 50)
        assert f.read() == DATA[10:50] and f._f.details == listed  # the ETag s3fs checks reads against
    with storage.session():  # nothing listed: the file keeps the details it made itself
        f = storage.open_input(url, 10, 50)
        assert f.read() == DATA[10:50] and f._f.details["size"] == len(DATA) and "ETag" not in f._f.details


def test_options_that_name_no_protocol_apply_to_every_protocol_dicts_included():
    storage.configure({"client_kwargs": {"region_name": "r1"}, "s3": {"anon": True}, "gs": {"token": "t"}})
    try:
        assert storage.options_for("s3") == {"client_kwargs": {"region_name": "r1"}, "anon": True}
        assert storage.options_for("memory") == {"client_kwargs": {"region_name": "r1"}}
    finally:
        storage.configure(None)


def test_a_url_given_to_a_filesystem_has_its_password_remembered_and_an_unknown_protocol_is_named():
    from weightprep.redact import redact

    storage.filesystem("memory://KeyUser:FsPassword43@host/x.jsonl")
    assert redact("login refused: FsPassword43") == "login refused: ***"
    with pytest.raises(UsageError, match=r"unknown protocol nosuchproto://"):
        storage.filesystem("nosuchproto://bucket/x.jsonl")


def test_storage_options_per_protocol_and_the_cli_flag():
    storage.configure('{"anon": true, "s3": {"endpoint_url": "http://x"}, "hf": {"token": "t"}}')
    try:
        assert storage.options_for("s3") == {"anon": True, "endpoint_url": "http://x"}
        assert storage.options_for("hf") == {"anon": True, "token": "t"}
    finally:
        storage.configure(None)
    result = CliRunner().invoke(main, ["inspect", "memory://nothing", "--storage-options", "{not json"])
    assert result.exit_code == 2 and "not valid JSON" in result.output
    assert storage.join("s3://b/p/", "x", "y.json") == "s3://b/p/x/y.json"
    assert publish._split("s3://b/p/out") == ("s3://b/p", "out")
    with pytest.raises(UsageError, match="not its root"):
        publish._split("s3://bucket")


def test_compressed_and_save_to_disk_inputs_by_url(mem, tmp_path, local_reference):
    import gzip

    import datasets
    import zstandard

    mem.pipe_file("/c/raw.jsonl.gz", gzip.compress(DATA, mtime=0))
    mem.pipe_file("/c/raw.jsonl.zst", zstandard.ZstdCompressor().compress(DATA))
    for name in ("raw.jsonl.gz", "raw.jsonl.zst"):
        manifest = build([f"memory://c/{name}"], f"memory://c-out/{name}", _cfg())
        assert manifest["inputs"][0]["lines"] == DATA.count(b"\n")
        shards = {n: b for n, b in _tree(mem, f"/c-out/{name}").items() if n.endswith(".arrow")}
        assert len(shards) == 1  # a compressed file is one part: its rows pack differently from the split JSONL
    local = tmp_path / "ds"
    datasets.Dataset.from_dict({"text": ["a b c " * 30, "d e f " * 20]}).save_to_disk(str(local))
    for f in local.iterdir():
        mem.pipe_file(f"/ds/{f.name}", f.read_bytes())
    remote = build(["memory://ds"], "memory://ds-out/s", _cfg())
    here = build([str(local)], tmp_path / "ds-out", _cfg())
    assert remote["counts"] == here["counts"] and remote["counts"]["records"] == 2


def test_inspect_html_report_of_a_url(mem, tmp_path):
    mem.pipe_file("/in/raw.jsonl", DATA)
    build(["memory://in/raw.jsonl"], "memory://out/shards", _cfg())
    result = CliRunner().invoke(main, ["inspect", "memory://out/shards", "--html", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert "memory://out/shards" in (tmp_path / "r.html").read_text()


class _Tagged(MemoryFileSystem):
    """A memory filesystem that records the ``tag`` storage option of every file it opens (and in which thread)."""

    protocol = "tagged"
    opened: list[tuple[str | None, str]] = []

    @classmethod
    def _strip_protocol(cls, path):
        return "/" + path.removeprefix("tagged://").lstrip("/")

    def _open(self, path, mode="rb", **kwargs):
        import threading

        _Tagged.opened.append((self.storage_options.get("tag"), threading.current_thread().name))
        return super()._open(path, mode, **kwargs)


def test_build_takes_storage_options_per_call(mem):
    """A library caller passes ``storage_options`` to ``build()``: no ``storage.configure``; the options reach the
    driver's listing, the parts' reads (in the read thread too) and the writes, and two calls with other options
    do not see each other's, nor leave any behind."""
    fsspec.register_implementation("tagged", _Tagged, clobber=True)
    mem.pipe_file("/in/raw.jsonl", DATA)
    assert storage.current_options() == {}
    outputs = {}
    for tag in ("a", "b"):
        _Tagged.opened.clear()
        outputs[tag] = build(["tagged://in/raw.jsonl"], f"tagged://out/{tag}", _cfg(), storage_options={"tag": tag})
        assert {t for t, _ in _Tagged.opened} == {tag}, _Tagged.opened
        assert "weightprep-read" in {thread for _, thread in _Tagged.opened}  # the background reader has them
        assert storage.current_options() == {}
    assert outputs["a"]["counts"] == outputs["b"]["counts"]
    with storage.session({"tag": "outer"}):  # a session's options hold inside it, a call's own ones win
        assert storage.current_options() == {"tag": "outer"}
        build(["tagged://in/raw.jsonl"], "tagged://out/c", _cfg(), storage_options='{"tag": "c"}')
        assert storage.current_options() == {"tag": "outer"}
    with pytest.raises(UsageError, match="not valid JSON"):
        build(["tagged://in/raw.jsonl"], "tagged://out/d", _cfg(), storage_options="{nope")


@pytest.mark.parametrize(
    ("url", "extra", "package"),
    [("gs://bucket/raw.jsonl", "gcs", "gcsfs"), ("gcs://bucket/raw.jsonl", "gcs", "gcsfs"),
     ("az://container/raw.jsonl", "azure", "adlfs"), ("abfs://container/raw.jsonl", "azure", "adlfs"),
     ("abfss://container@account.dfs.core.windows.net/raw.jsonl", "azure", "adlfs")],
)
def test_gcs_and_azure_urls_name_their_extra(url, extra, package):
    """No emulator runs here: gs:// and az:// are checked without a store. With the package missing (as in the dev
    environment) the real import failure names the extra's pip line (abfss://, which fsspec registers only once
    adlfs is installed, too); installed, the URL resolves to the package's filesystem without a request."""
    import importlib.util

    assert storage.EXTRAS[storage.protocol(url)] == extra and storage.EXTRA_PACKAGES[extra] == package
    if importlib.util.find_spec(package) is None:
        with pytest.raises(UsageError, match=rf"needs a package that is not installed .*pip install 'weightprep\[{extra}\]'"):
            storage.filesystem(url)
    else:
        fs, _ = storage.filesystem(url)
        assert type(fs).__module__.split(".")[0] == package


class _Short(_Faulty):
    """The next ``short`` reads past the start return an empty body (a store that ends a ranged GET early)."""

    protocol = "short"
    short = 0

    def _read(self, f, read, n):
        if _Short.short and f.tell() > 0:
            _Short.short -= 1
            return b""
        return read(n)


def test_a_short_read_mid_range_is_retried_not_taken_as_the_end(mem):
    """An empty body in the middle of a range would end the input there: a truncated input, silently."""
    fsspec.register_implementation("short", _Short, clobber=True)
    mem.pipe_file("/f/raw.jsonl", DATA)
    _Short.short = 2
    with storage.open_input("short://f/raw.jsonl", 0, 30_000) as f:
        f._chunk = 10_000  # three requests: the second and third start mid-range
        assert f.read() == DATA[:30_000]
    assert _Short.short == 0


def test_resume_does_not_reuse_parts_of_an_input_replaced_at_the_same_size(mem, monkeypatch):
    """The resume key holds each object's version (ETag, generation, mtime): same size, other bytes, new parts."""
    mem.pipe_file("/in/raw.jsonl", DATA)
    ctrl_c = PartInterrupter(monkeypatch)
    runs = ctrl_c.runs
    with pytest.raises(KeyboardInterrupt):
        build(["memory://in/raw.jsonl"], "memory://out/shards", _cfg())
    lines = DATA.splitlines(keepends=True)
    replaced = b"".join([lines[1], lines[0], *lines[2:]])  # the same bytes in another order: the same size
    assert len(replaced) == len(DATA) and replaced != DATA
    import time

    time.sleep(0.01)  # the memory filesystem's version is its creation time
    mem.pipe_file("/in/raw.jsonl", replaced)
    runs.clear()
    ctrl_c.interrupt = False
    manifest = build(["memory://in/raw.jsonl"], "memory://out/shards", _cfg(), resume=True)
    assert 0 in runs  # part 0 was run again, on the new bytes
    mem.pipe_file("/in/fresh.jsonl", replaced)
    fresh = build(["memory://in/fresh.jsonl"], "memory://out/fresh", _cfg())
    assert manifest["inputs"][0]["sha256"] == fresh["inputs"][0]["sha256"]
    shards = lambda prefix: {k: v for k, v in _tree(mem, prefix).items() if k.endswith(".arrow")}  # noqa: E731
    assert shards("/out/shards") == shards("/out/fresh") != {}


def test_an_input_under_the_output_prefix_is_refused(mem):
    mem.pipe_file("/out/shards/raw.jsonl", DATA)
    with pytest.raises(UsageError, match="input memory://out/shards/raw.jsonl is inside the output path"):
        build(["memory://out/shards/raw.jsonl"], "memory://out/shards", _cfg(), overwrite=True)
    mem.rm_file("/out/shards/raw.jsonl")
    mem.pipe_file("/out/shards2/raw.jsonl", DATA)  # a sibling that shares the name's start is not inside it
    build(["memory://out/shards2/raw.jsonl"], "memory://out/shards", _cfg())


def test_a_part_is_uploaded_with_its_result_last(mem, tmp_path, monkeypatch):
    """A part is finished exactly when its result.json exists: uploaded before a shard, a part killed in the
    middle of its upload would be taken as finished by --resume."""
    for name in ("result.json", "a/shard-00000.arrow", "rejects.jsonl", "z.jsonl"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    uploaded = []
    monkeypatch.setattr(storage, "put_file", lambda local, url: uploaded.append(url.rsplit("/", 1)[-1]))
    publish.upload_part(tmp_path, "memory://p/parts/00000")
    assert uploaded[-1] == "result.json" and sorted(uploaded) == sorted(["result.json", "shard-00000.arrow",
                                                                         "rejects.jsonl", "z.jsonl"])


def test_a_session_forgets_what_this_process_writes_copies_and_removes(mem):
    """Within a session object metadata is taken as unchanged, except what this process changes itself."""
    mem.pipe_file("/s/a.bin", b"12345")
    with storage.session({}):
        assert storage.size("memory://s/a.bin") == 5  # now known to the session
        storage.copy("memory://s/a.bin", "memory://s/b.bin")
        assert storage.isfile("memory://s/b.bin") and storage.size("memory://s/b.bin") == 5
        storage.write_bytes("memory://s/a.bin", b"1234567")
        assert storage.size("memory://s/a.bin") == 7
        storage.remove("memory://s/b.bin")
        assert not storage.isfile("memory://s/b.bin")
        assert storage.size("memory://s/a.bin") == 7
        assert storage.remove_tree("memory://s") == ["memory://s/a.bin"]  # what it removed
        assert not storage.exists("memory://s/a.bin")
        mem.pipe_file("/s/c.bin", b"1")
        assert storage.size("memory://s/c.bin") == 1
        mem.pipe_file("/s/c.bin", b"123")  # another writer
        assert storage.read_fresh("memory://s/c.bin") == b"123" and storage.size("memory://s/c.bin") == 3
        assert storage.read_fresh("memory://s/none.bin") is None


def test_a_session_forgets_an_object_this_process_uploads(mem, tmp_path):
    mem.pipe_file("/up/a.bin", b"12345")
    local = tmp_path / "a.bin"
    local.write_bytes(b"123456789")
    with storage.session({}):
        assert storage.size("memory://up/a.bin") == 5
        storage.put_file(local, "memory://up/a.bin")
        assert storage.size("memory://up/a.bin") == 9


def test_a_read_that_fails_goes_on_from_its_byte_on_a_file_opened_anew(mem, monkeypatch):
    """A broken connection stays broken: the retry opens the object again rather than reading the same file."""
    mem.pipe_file("/re/raw.jsonl", DATA)
    opened: list[str] = []
    real = MemoryFileSystem._open

    class Dying(io.BytesIO):  # reads once, then its connection is gone for good
        reads = 0

        def read(self, n=-1):
            self.reads += 1
            if self.reads > 1:
                raise ConnectionError("connection reset")
            return super().read(n)

    def first_one_dies(self, path, *args, **kwargs):
        f = real(self, path, *args, **kwargs)
        opened.append(path)
        return Dying(f.getvalue()) if len(opened) == 1 else f

    monkeypatch.setattr(MemoryFileSystem, "_open", first_one_dies)
    monkeypatch.setenv("WEIGHTPREP_STORAGE_RETRIES", "3")
    with storage.open_input("memory://re/raw.jsonl", 0, 3000) as f:
        got = b"".join(iter(lambda: f.read(1000), b""))
    assert got == DATA[:3000] and len(opened) == 2


def test_download_tree_copies_nested_keys_literally(mem, tmp_path):
    for key in ("/t/x[1]/a.json", "/t/x[1]/train/state.json", "/t/x1/other"):
        mem.pipe_file(key, key.encode())
    storage.download_tree("memory://t/x[1]", tmp_path / "copy")
    got = sorted(p.relative_to(tmp_path / "copy").as_posix() for p in (tmp_path / "copy").rglob("*") if p.is_file())
    assert got == ["a.json", "train/state.json"]  # x1/, which the name matches as a pattern, is not copied
    assert (tmp_path / "copy" / "train" / "state.json").read_bytes() == b"/t/x[1]/train/state.json"


def test_a_missing_bucket_is_said_and_an_existing_empty_one_is_not(mem, monkeypatch):
    monkeypatch.setattr(storage, "BUCKETED", (*storage.BUCKETED, "memory"))  # memory's first component as a bucket
    mem.pipe_file("/bucket/keep", b"x")
    assert storage.names_under("memory://bucket/empty-prefix") == []
    assert storage.names_under("memory://bucket") == ["keep"]
    with pytest.raises(UsageError, match="the bucket nobucket does not exist"):
        storage.names_under("memory://nobucket/out")


@pytest.mark.parametrize(("module", "name", "transient"), [
    ("botocore.exceptions", "ParamValidationError", False),  # an invalid bucket name: no retry fixes it
    ("botocore.exceptions", "NoCredentialsError", False),
    ("botocore.exceptions", "EndpointConnectionError", True),  # the store unreachable for a moment
    ("aiohttp.client_exceptions", "ServerDisconnectedError", True),
    ("weightprep.somewhere", "Oddity", False),  # not a store library's: a bug, not a fault
    ("builtins", "ValueError", False),
])
def test_which_errors_are_retried(module, name, transient):
    cls = type(name, (Exception,), {"__module__": module})
    if name == "ValueError":
        cls = ValueError
    assert storage._transient(cls("x")) is transient
    sub = type("Sub" + name, (cls,), {"__module__": "elsewhere.lib"})  # persistence is inherited by name
    if not transient and module.startswith("botocore"):
        assert storage._transient(sub("x")) is False
    assert storage._transient(ConnectionResetError("reset")) is True and storage._transient(PermissionError("403")) is False
