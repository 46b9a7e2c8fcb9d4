"""Builds from and to a real S3-compatible server on loopback (moto's standalone server, ``moto[server]``), through a
proxy that logs every request and injects faults (``storage_support``).

Every executor writes, object for object, the bytes of the same build written to local disk; a split input is
read by range requests only; transient faults are retried to the same bytes; a persistent one ends the build with
an error naming the object and leaves nothing loadable; ``datasets.load_from_disk``, ``weightprep inspect`` and
``weightprep train`` read the output by its URL."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from conftest import REPO, SAMPLE_RAW
from storage_support import s3_options, serve_s3

from weightprep import storage
from weightprep.cli import main
from weightprep.config import config_from_dict
from weightprep.distribute.executors import LocalExecutor, RayExecutor
from weightprep.distribute.plan import plan_parts
from weightprep.errors import UsageError
from weightprep.pipeline import build
from weightprep.stages.read import expand_inputs

# s3fs and moto[server] are in the dev extra: missing, these tests fail (they are not skipped)

PART = 40_000  # DATA: 5 parts
BUCKET = "wpdata"
INPUT = f"s3://{BUCKET}/in/raw.jsonl"
SMALL = f"s3://{BUCKET}/small/raw.jsonl"  # the first ~20 kB: one part
TINY_LLAMA = REPO / "sample_data" / "tiny-llama"


#: the first ~200 kB of the sample (small keeps the server tests fast)
DATA = SAMPLE_RAW.read_bytes()[: SAMPLE_RAW.read_bytes().index(b"\n", 200_000) + 1]
SMALL_DATA = DATA[: DATA.index(b"\n", 20_000) + 1]


def _cfg():
    return config_from_dict({"pack": {"seq_len": 256}, "read": {"part_bytes": PART, "block_bytes": 32768}})


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """The server, its proxy, the bucket and the uploaded input; storage options pointing at the proxy."""
    yield from serve_s3(tmp_path_factory, BUCKET, {INPUT: DATA, SMALL: SMALL_DATA})


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch):
    monkeypatch.setenv("WEIGHTPREP_STORAGE_BACKOFF", "0.01")
    monkeypatch.setenv("WEIGHTPREP_STORAGE_RETRIES", "4")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, s3):
    """The same build (the same input URL) written to local disk: file name -> bytes."""
    out = tmp_path_factory.mktemp("ref") / "shards"
    build([INPUT], out, _cfg())
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def serial_build(s3):
    """The serial s3:// -> s3:// build, made once for the module: its output URL, the proxy's requests and the
    server's log lines during it (the tests of its bytes, of its ranged reads and of its readers share it)."""
    proxy, server = s3
    out = f"s3://{BUCKET}/out-serial"
    proxy.requests.clear()
    before = server.log().count("\n")
    build([INPUT], out, _cfg())
    return out, list(proxy.requests), server.log().splitlines()[before:]


def _objects(url: str) -> dict[str, bytes]:
    fs, _ = storage.filesystem(url)
    return {u[len(url) + 1 :]: fs.cat_file(storage.filesystem(u)[1]) for u in storage.find(url)}


def _leftovers(name: str) -> list[str]:
    return storage.glob(f"s3://{BUCKET}/.{name}.tmp-*")


@pytest.mark.parametrize("kind", ["serial", "local", "local-driver", "ray"])
def test_s3_to_s3_is_byte_identical_to_the_local_disk_build(kind, s3, reference, request):
    out = f"s3://{BUCKET}/out-{kind}"
    if kind == "serial":
        request.getfixturevalue("serial_build")
    else:  # the options given to build() only, none configured: they reach the worker processes (Ray actors) too
        if kind == "ray":
            request.getfixturevalue("ray_session")
        storage.configure(None)
        try:
            # local-driver: the command line's, a part run in this process's thread with the session's options
            executors = {"local": lambda: LocalExecutor(2), "local-driver": lambda: LocalExecutor(2, driver=True)}
            executor = executors.get(kind, lambda: RayExecutor(2))()
            build([INPUT], out, _cfg(), executor=executor, storage_options=s3_options(s3[0].url))
        finally:
            storage.configure(s3_options(s3[0].url))
    assert _objects(out) == reference  # every object, names and bytes
    assert _leftovers(f"out-{kind}") == []  # the temporary prefix is gone


def test_local_inputs_give_the_same_shards_as_url_inputs(s3, reference, tmp_path):
    out = tmp_path / "local"
    (tmp_path / "raw.jsonl").write_bytes(DATA)
    build([str(tmp_path / "raw.jsonl")], out, _cfg())
    shards = {n: b for n, b in reference.items() if n.endswith(".arrow")}
    assert shards and {p.name: p.read_bytes() for p in out.glob("*.arrow")} == shards


def test_a_split_input_is_read_by_ranges_only(serial_build, tmp_path):
    _, requests, log = serial_build
    size = len(DATA)
    (tmp_path / "raw.jsonl").write_bytes(DATA)
    parts = plan_parts([str(tmp_path / "raw.jsonl")], PART)
    assert len(parts) == 5
    gets = [(path, rng) for method, path, rng in requests if method == "GET" and path.startswith("/wpdata/in/raw.jsonl")]
    assert gets and all(rng is not None for _, rng in gets), gets  # no whole-object read
    spans = [tuple(map(int, re.fullmatch(r"bytes=(\d+)-(\d+)", rng).groups())) for _, rng in gets]
    for part in parts:  # each worker fetched exactly its part's bytes
        assert (part.start, part.end - 1) in spans
    fetched = sum(b - a + 1 for a, b in spans)
    assert fetched < 1.5 * size, (fetched, size)  # the parts, plus the plan's short reads at each cut
    # the server's own log: every read of the input is a 206 Partial Content, none a 200 of the whole object
    statuses = [line.split('" ')[1].split()[0] for line in log if '"GET /wpdata/in/raw.jsonl' in line]
    assert statuses and set(statuses) == {"206"}, statuses
    print(f"input {size} bytes, {len(parts)} parts: {len(gets)} ranged GETs, {fetched} bytes fetched")


def test_transient_faults_are_retried_to_the_same_bytes(s3, reference):
    proxy, _ = s3
    seen: set[tuple[str, str, str | None]] = set()

    def once(method, path, headers):
        key = (method, path, headers.get("Range"))
        if key in seen:
            return None
        seen.add(key)
        if method == "GET" and path.startswith("/wpdata/in/") and headers.get("Range"):
            return "drop"  # each range's first read breaks off half way
        if method == "PUT" and "/.flaky.tmp-" in path:
            return "error"  # each upload of a part's file first gets a 503
        if method == "PUT" and path.startswith("/wpdata/flaky/"):
            return "error"  # so does each write of the commit
        return None

    proxy.fault = once
    try:
        build([INPUT], f"s3://{BUCKET}/flaky", _cfg())
    finally:
        proxy.fault = None
    kinds = {action for action, _, _ in proxy.injected}
    assert {"drop", "error"} <= kinds
    assert _objects(f"s3://{BUCKET}/flaky") == reference


def test_a_persistent_read_fault_names_the_object_and_leaves_nothing(s3):
    proxy, _ = s3
    proxy.fault = lambda method, path, headers: "error" if method == "GET" and path.startswith("/wpdata/in/") else None
    try:
        with pytest.raises(UsageError, match=re.escape(INPUT) + r": reading bytes .* failed after 5 tries"):
            build([INPUT], f"s3://{BUCKET}/broken", _cfg())
    finally:
        proxy.fault = None
    assert storage.find(f"s3://{BUCKET}/broken") == {}
    assert _leftovers("broken") == []


def test_a_persistent_fault_during_the_commit_leaves_nothing_loadable(s3):
    proxy, _ = s3
    proxy.fault = lambda method, path, headers: (
        "error" if method == "PUT" and path.startswith("/wpdata/commit/") and "state.json" in path else None
    )
    try:
        with pytest.raises(UsageError, match=r"s3://wpdata/commit/state.json: writing it failed"):
            build([SMALL], f"s3://{BUCKET}/commit", _cfg())
    finally:
        proxy.fault = None
    assert storage.find(f"s3://{BUCKET}/commit") == {}  # the shards it had copied were removed too
    assert _leftovers("commit") == []


def test_an_existing_output_needs_overwrite(s3):
    out = f"s3://{BUCKET}/replaced"  # the small input (one part) keeps the two builds short
    build([SMALL], out, _cfg())
    earlier = _objects(out)
    with pytest.raises(UsageError, match="already exists; pass --overwrite"):
        build([SMALL], out, _cfg())
    storage.write_bytes(f"{out}/stale.txt", b"from the earlier build")
    manifest = build([SMALL], out, _cfg(), overwrite=True)
    now = _objects(out)
    # the earlier build's objects are gone; the new shards have the same bytes under names the earlier build did
    # not use (it stayed loadable until the new one was complete: weightprep.stages.publish)
    (shard,) = [s["filename"] for s in manifest["shards"]]
    assert shard != "data-00000-of-00001.arrow" and now[shard] == earlier["data-00000-of-00001.arrow"]
    assert sorted(now) == sorted({*earlier, shard} - {"data-00000-of-00001.arrow"})


def test_readers_open_the_output_by_url(s3, serial_build):
    import datasets

    out = serial_build[0]
    dataset = datasets.load_from_disk(out, storage_options=s3_options(s3[0].url))
    assert len(dataset) > 0 and "weights" in dataset.column_names
    options = ["--storage-options", json.dumps(s3_options(s3[0].url))]
    result = CliRunner().invoke(main, ["inspect", out, *options, "--max-tokens", "20"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"{out}/: ") and "row 0" in result.output and "[w=" in result.output  # no "wrote"

    from transformers import AutoConfig

    from weightprep.manifest import read_manifest, read_row
    from weightprep.train.data import load_shards

    storage.configure(None)  # a library caller: the options given to each call, none configured for the process
    try:
        options = s3_options(s3[0].url)
        shards = load_shards(out, model_config=AutoConfig.from_pretrained(TINY_LLAMA), storage_options=options)
        manifest = read_manifest(out, storage_options=options)
        row = read_row(out, manifest, len(dataset) - 1, storage_options=options)
        assert storage.current_options() == {}  # nothing left behind by the calls
    finally:
        storage.configure(s3_options(s3[0].url))
    assert shards.seq_len == 256 and len(shards.dataset) == len(dataset)
    assert shards.dataset[-1]["weights"] == dataset[-1]["weights"] == row["weights"].tolist()


def test_cli_build_and_train_by_url(s3, tmp_path):
    options = ["--storage-options", json.dumps(s3_options(s3[0].url))]
    out = f"s3://{BUCKET}/cli"
    result = CliRunner().invoke(
        main, ["build", SMALL, "--out", out, "--seq-len", "64", "--executor", "serial", *options]
    )
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(
        main,
        ["train", out, "--model", str(TINY_LLAMA), "--output-dir", str(tmp_path / "run"), "--max-steps", "1",
         "--micro-batch-size", "2", *options],
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "weightprep_train.json").is_file()
    assert json.loads((tmp_path / "run" / "weightprep_train.json").read_text())["shards"] == out


def test_credentials_and_endpoint_from_the_environment(s3, monkeypatch):
    """No --storage-options: botocore's own AWS_ENDPOINT_URL and AWS_* variables reach the store."""
    proxy, _ = s3
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    storage.configure(None)
    try:
        assert expand_inputs([f"s3://{BUCKET}/in/*.jsonl"]) == [INPUT]
        with storage.open_input(INPUT, 10, 200) as f:
            assert f.read() == DATA[10:200]
    finally:
        storage.configure(s3_options(proxy.url))


def test_plan_reads_the_shards_by_url(s3, serial_build):
    """``weightprep plan --shards URL --storage-options JSON``: the endpoint comes from the flag alone."""
    storage.configure(None)
    try:
        options = ["--storage-options", json.dumps(s3_options(s3[0].url))]
        result = CliRunner().invoke(main, ["plan", "--model", "llama-2-7b", "--shards", serial_build[0], *options])
    finally:
        storage.configure(s3_options(s3[0].url))
    assert result.exit_code in (0, 1), result.output  # 1: does not fit; either way the table was printed
    assert "micro-batch 1 x 256" in result.output  # the shards' seq_len, read from their manifest in the store


def _kind(method: str, path: str) -> str:
    if method == "GET" and "?" in path and ("list-type" in path or "prefix=" in path):
        return "LIST"
    return method


def test_inputs_cost_one_listing_and_their_reads(s3, tmp_path):
    """N objects found by a glob or a prefix cost O(1) listing requests (the pages) plus one ranged read each: no
    HEAD per object for the plan, the resume key or the workers' opens. s3fs's own listings cache is off, so the
    count is weightprep's (other stores' filesystems have none)."""
    proxy, _ = s3
    n = 30
    lines = DATA.splitlines(keepends=True)
    for i in range(n):
        storage.write_bytes(f"s3://{BUCKET}/many/{i:03d}.jsonl", b"".join(lines[2 * i : 2 * i + 2]))
    options = {**s3_options(proxy.url), "use_listings_cache": False}
    storage.configure(None)
    try:
        for k, pattern in enumerate([f"s3://{BUCKET}/many/*.jsonl", f"s3://{BUCKET}/many/"]):
            proxy.requests.clear()
            manifest = build([pattern], tmp_path / f"out{k}", _cfg(), storage_options=options)
            kinds = [_kind(m, p) for m, p, _ in proxy.requests]
            reads = [(p, r) for m, p, r in proxy.requests if _kind(m, p) == "GET" and p.startswith("/wpdata/many/")]
            counts = {kind: kinds.count(kind) for kind in set(kinds)}
            print(f"{pattern}: {n} objects, {len(proxy.requests)} requests {counts}")
            assert len(manifest["inputs"]) == n
            assert len(reads) == n and all(r is not None for _, r in reads), reads  # one ranged read each
            assert counts.get("HEAD", 0) <= 4 and counts.get("LIST", 0) <= 5, counts  # constant, whatever n is
            assert len(proxy.requests) <= n + 9, counts
    finally:
        storage.configure(s3_options(proxy.url))
