"""What object storage promises, held against a real S3-compatible server on loopback (moto's, behind the fault
proxy of ``storage_support``), as a user meets it:

- an ``--out`` name is literal: a glob character in it never deletes, copies or lists anything beside it;
- no secret a user gives (a URL's password or query, ``--storage-options``, the environment) reaches any artifact
  of a build, an inspect or a train run, or anything they print;
- ``--overwrite`` keeps the earlier build loadable until the new one is complete: under a persistent 403, and under
  a kill -9 in the middle of the commit, after which the next build finishes or undoes it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO, SAMPLE_RAW
from storage_support import RangeServer, load_rows, s3_options, serve_s3

from weightprep import storage
from weightprep.cli import main
from weightprep.config import config_from_dict
from weightprep.constants import MANIFEST_NAME
from weightprep.errors import UsageError
from weightprep.manifest import read_manifest
from weightprep.pipeline import build

BUCKET = "wpsafe"
LINES = SAMPLE_RAW.read_bytes().splitlines(keepends=True)
OLD = b"".join(LINES[:30])
NEW = b"".join(LINES[30:55])
TINY_LLAMA = REPO / "sample_data" / "tiny-llama"


def _cfg():
    return config_from_dict({"pack": {"seq_len": 128}})


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """The proxy in front of the server (its faults are these tests' tool), the bucket and the two inputs."""
    objects = {f"s3://{BUCKET}/in/old.jsonl": OLD, f"s3://{BUCKET}/in/new.jsonl": NEW}
    for proxy, _ in serve_s3(tmp_path_factory, BUCKET, objects):
        yield proxy


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch):
    monkeypatch.setenv("WEIGHTPREP_STORAGE_BACKOFF", "0.01")
    monkeypatch.setenv("WEIGHTPREP_STORAGE_RETRIES", "2")


def _objects(prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix`` (a bucket-level listing: nothing beside it escapes notice)."""
    fs, _ = storage.filesystem(prefix)
    return {u: fs.cat_file(storage.filesystem(u)[1]) for u in storage.find(prefix)}


# ---- 1. a name is a name ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("area,name,neighbours", [
    ("a1", "many/*", ["many/b1", "many/b2"]),  # the review's reproductions: two complete builds beside the name
    ("a2", "run[1X]", ["run1", "runX"]),
    ("a3", "r?n", ["ran", "rXn"]),
])
def test_an_out_url_with_glob_characters_touches_nothing_beside_it(s3, area, name, neighbours):
    base = f"s3://{BUCKET}/{area}"
    for n in neighbours:
        build([f"s3://{BUCKET}/in/old.jsonl"], f"{base}/{n}", _cfg())
    parent = f"{base}/{name.rsplit('/', 1)[0]}" if "/" in name else base
    storage.write_bytes(f"{parent}/unrelated.txt", b"keep me")
    # a resumable leftover of another build that the name, as a pattern, would match
    storage.write_bytes(f"{base}/.{neighbours[0].rsplit('/', 1)[-1]}.tmp-0123456789abcdef/plan.json", b"p")
    before = _objects(base)
    out = f"{base}/{name}"
    build([f"s3://{BUCKET}/in/old.jsonl"], out, _cfg())
    build([f"s3://{BUCKET}/in/new.jsonl"], out, _cfg(), overwrite=True)
    s3.fault = lambda method, path, headers: "denied" if method == "PUT" and path.endswith("state.json") else None
    try:  # a failed commit's undo, too
        with pytest.raises(UsageError, match="writing it failed"):  # (a name with ? reads as a query: masked)
            build([f"s3://{BUCKET}/in/old.jsonl"], out, _cfg(), overwrite=True)
    finally:
        s3.fault = None
    after = _objects(base)
    assert {u: b for u, b in after.items() if u in before} == before  # every neighbour, byte for byte
    ours = sorted(u[len(out) + 1 :] for u in after if u not in before)
    manifest = read_manifest(out)
    assert ours == sorted([s["filename"] for s in manifest["shards"]] + ["dataset_info.json", "state.json", MANIFEST_NAME])
    assert manifest["counts"]["records"] == NEW.count(b"\n")
    for n in neighbours:
        assert load_rows(f"{base}/{n}") and read_manifest(f"{base}/{n}")["counts"]["records"] == OLD.count(b"\n")


def test_a_missing_bucket_and_an_invalid_one_are_said_at_once(s3):
    start = time.monotonic()
    with pytest.raises(UsageError, match="the bucket no-such-bucket does not exist"):
        build([f"s3://{BUCKET}/in/old.jsonl"], "s3://no-such-bucket/out", _cfg())
    with pytest.raises(UsageError, match="ParamValidationError") as invalid:
        build([f"s3://{BUCKET}/in/old.jsonl"], "s3://Not_A_Valid:Bucket/out", _cfg())
    assert "tries" not in str(invalid.value)  # persistent: not retried
    assert time.monotonic() - start < 30


# ---- 2. no secret anywhere -------------------------------------------------------------------------------------

SECRETS = {"url_password": "PwSecret1x", "url_query": "QuerySecret2x", "storage_options": "OptSecret3x",
           "environment": "EnvSecret4x"}


def test_no_secret_reaches_an_artifact_or_a_message(s3, tmp_path, monkeypatch):
    """A secret planted in every place a user can give one; every artifact and every message of a build, an
    inspect and a train run is searched for it."""
    data = OLD + b'{"pieces": [{"text": 3}]}\n'  # a reject: rejects.jsonl names the input
    http = RangeServer({"/data/raw.jsonl": data}, auth=("alice", SECRETS["url_password"]))
    monkeypatch.setenv("HF_TOKEN", SECRETS["environment"])
    monkeypatch.setenv("WEIGHTPREP_TEST_API_KEY", SECRETS["environment"])
    storage.configure(None)
    options = ["--storage-options", json.dumps({"s3": {**s3_options(s3.url), "secret": SECRETS["storage_options"]}})]
    url = f"http://alice:{SECRETS['url_password']}@127.0.0.1:{http.port}/data/raw.jsonl?token={SECRETS['url_query']}"
    out = f"s3://{BUCKET}/secret-out"
    printed = []
    try:
        runs = [
            ["build", url, "--out", out, "--seq-len", "64", "--skip-invalid", *options],
            ["inspect", out, "--html", str(tmp_path / "report.html"), *options],
            ["train", out, "--model", str(TINY_LLAMA), "--output-dir", str(tmp_path / "run"), "--max-steps", "1",
             "--micro-batch-size", "2", *options],
            # the failures print their URL: a missing object, a refused kind, an unreachable input
            ["build", url.replace("raw.jsonl", "gone.jsonl"), "--out", f"{out}-2", *options],
            ["build", url.replace("raw.jsonl", "raw.csv"), "--out", f"{out}-2", *options],
            ["build", f"s3://AKIAKEY:{SECRETS['url_password']}@{BUCKET}/nothing.jsonl", "--out", f"{out}-2", *options],
        ]
        for args in runs:
            result = CliRunner().invoke(main, args)
            printed.append(result.output)
            assert (result.exit_code == 0) == (runs.index(args) < 3), result.output
    finally:
        storage.configure(s3_options(s3.url))
        http.stop()
    assert http.requests  # the input was read, with the password (the server refuses any other)
    artifacts = {u: b for u, b in _objects(f"s3://{BUCKET}/").items() if "/secret-out" in u}
    artifacts |= {str(p): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert f"{out}/rejects.jsonl" in artifacts and str(tmp_path / "report.html") in artifacts
    assert any(p.endswith("weightprep_train.json") for p in artifacts)
    for where, text in [*((k, v.decode("utf-8", "replace")) for k, v in artifacts.items()), *enumerate(printed)]:
        for kind, secret in SECRETS.items():
            assert secret not in text, f"the {kind} secret is in {where}"
    # and the URL is still recorded and printed, redacted: what it was, not what unlocks it
    manifest = read_manifest(out)
    redacted = f"http://***@127.0.0.1:{http.port}/data/raw.jsonl?token=***"
    assert manifest["inputs"][0]["path"] == redacted
    assert redacted in artifacts[f"{out}/rejects.jsonl"].decode()
    assert "http://***@127.0.0.1" in printed[3] and "raw.csv?token=***" in printed[4]


# ---- 3. --overwrite never leaves nothing -----------------------------------------------------------------------


@pytest.mark.parametrize("denied", ["data-", "state.json", MANIFEST_NAME])
def test_a_persistent_403_during_overwrite_keeps_the_earlier_build(s3, denied):
    out = f"s3://{BUCKET}/denied-{denied.split('.')[0]}"
    build([f"s3://{BUCKET}/in/old.jsonl"], out, _cfg())
    earlier, rows = _objects(out), load_rows(out)
    prefix = f"/{BUCKET}/{out.rsplit('/', 1)[-1]}/"
    s3.fault = lambda method, path, headers: (
        "denied" if method == "PUT" and path.startswith(prefix + denied) else None
    )
    try:
        with pytest.raises(UsageError, match=r"failed \(PermissionError"):  # a 403: not retried
            build([f"s3://{BUCKET}/in/new.jsonl"], out, _cfg(), overwrite=True)
    finally:
        s3.fault = None
    assert _objects(out) == earlier  # undone: the earlier build, object for object
    assert load_rows(out) == rows and read_manifest(out)["counts"]["records"] == OLD.count(b"\n")
    assert not [u for u in storage.find(f"s3://{BUCKET}/") if f"/.{out.rsplit('/', 1)[-1]}.tmp-" in u]


def _build_process(args: list[str], s3) -> subprocess.Popen:
    env = {**os.environ, "WEIGHTPREP_STORAGE_RETRIES": "0"}
    return subprocess.Popen(
        [sys.executable, "-m", "weightprep.cli", "build", *args, "--seq-len", "128", "--executor", "serial",
         "--storage-options", json.dumps(s3_options(s3.url))],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )


@pytest.mark.parametrize("held,expected", [("state.json", "old"), ("DELETE", "new")])
def test_a_kill_9_during_the_commit_leaves_a_loadable_build_that_the_next_build_completes(s3, held, expected):
    """The build process is killed with SIGKILL while the store holds one request of its commit: before its
    state.json (the earlier build is what readers see) or while it removes the earlier build's objects (the new
    one is). The next build to the output finishes or undoes the commit before its own work."""
    out = f"s3://{BUCKET}/killed-{expected}"
    build([f"s3://{BUCKET}/in/old.jsonl"], out, _cfg())
    rows = {"old": load_rows(out)}
    key = f"/{BUCKET}/killed-{expected}/"
    s3.holding.clear()
    s3.release.clear()
    s3.fault = lambda method, path, headers: (
        "hold" if path.startswith(key) and (path.endswith(held) if held != "DELETE" else method == "DELETE") else None
    )
    proc = _build_process([f"s3://{BUCKET}/in/new.jsonl", "--out", out, "--overwrite"], s3)
    try:
        assert s3.holding.wait(120), proc.communicate(timeout=5)[0].decode()
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        s3.fault = None
        s3.release.set()
    assert proc.returncode == -signal.SIGKILL
    seen = load_rows(out)
    build([f"s3://{BUCKET}/in/new.jsonl"], f"s3://{BUCKET}/killed-ref-{expected}", _cfg())
    rows["new"] = load_rows(f"s3://{BUCKET}/killed-ref-{expected}")
    assert seen == rows[expected]
    # the next build (no --overwrite: it is refused, after restoring the output to one whole build)
    with pytest.raises(UsageError, match="already exists"):
        build([f"s3://{BUCKET}/in/new.jsonl"], out, _cfg())
    assert load_rows(out) == rows[expected]
    manifest = read_manifest(out)
    assert sorted(storage.find(out)) == sorted(
        f"{out}/{f}" for f in [s["filename"] for s in manifest["shards"]] + ["dataset_info.json", "state.json", MANIFEST_NAME]
    )
    assert not [u for u in storage.find(f"s3://{BUCKET}/") if f"/.killed-{expected}.tmp-" in u and "publishing" in u]
    build([f"s3://{BUCKET}/in/new.jsonl"], out, _cfg(), overwrite=True, resume=True)
    assert load_rows(out) == rows["new"]
    assert not [u for u in storage.find(f"s3://{BUCKET}/") if f"/.killed-{expected}.tmp-" in u]


def test_the_cli_module_runs_as_a_script():
    """``python -m weightprep.cli`` (what the kill test starts) is the console script's command line."""
    assert Path(REPO / "weightprep" / "cli.py").read_text().rstrip().endswith("run()")
