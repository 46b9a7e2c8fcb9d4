"""The output contract, end to end on the bundled sample data: columns, invariants, loaders, manifest."""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import shutil

import numpy as np
import pytest
from conftest import SAMPLE_RAW, load_records
from reference import (
    check_rows,
    reference_document,
    reference_documents,
    reference_policy,
    rows_as_numpy,
    same_documents,
    supervised,
)

from weightprep.config import config_from_dict
from weightprep.constants import FORMAT_VERSION, MANIFEST_NAME
from weightprep.errors import InputError
from weightprep.pipeline import build

SEQ = 2048


@pytest.fixture(scope="module")
def sample_build(tmp_path_factory, sample_tok):
    out = tmp_path_factory.mktemp("b") / "shards"
    manifest = build([str(SAMPLE_RAW)], out, config_from_dict({}), tokenizer=sample_tok)
    return out, manifest


def test_packed_rows_match_reference(sample_build, sample_tok):
    import datasets

    out, manifest = sample_build
    ds = datasets.load_from_disk(str(out))
    rows = rows_as_numpy(ds)
    found = check_rows(rows, SEQ, sample_tok.pad_token_id, packed=True)
    expected, dropped = reference_documents(sample_tok, load_records(SAMPLE_RAW), max_length=SEQ)
    same_documents(found, expected)
    counts = manifest["counts"]
    assert counts["records"] == len(load_records(SAMPLE_RAW))
    assert counts["dropped"]["overlong"] == dropped["overlong"] > 0  # the sample has overlong records
    assert counts["documents_written"] == len(expected)
    assert counts["tokens"] == sum(len(d[0]) for d in expected)
    assert counts["supervised_tokens"] == sum(sum(w > 0 for w in d[1]) for d in expected)
    assert counts["total_weight"] == pytest.approx(sum(sum(d[1]) for d in expected), rel=1e-6)
    assert counts["rows"] == len(ds)
    assert counts["fill_ratio"] == pytest.approx(counts["tokens"] / (len(ds) * SEQ))


def test_fill_ratio_on_sample_data(sample_build):
    _, manifest = sample_build
    c = manifest["counts"]
    # a lower bound for any packing: ceil(tokens / seq_len) rows; BFD should be within one row of it
    assert c["rows"] <= -(-c["tokens"] // SEQ) + 1
    assert c["fill_ratio"] > 0.95


def test_features_and_loaders(sample_build):
    import datasets
    from datasets import List, Value

    out, _ = sample_build
    ds = datasets.load_from_disk(str(out))
    expected = {
        "input_ids": List(Value("int32"), length=SEQ),
        "labels": List(Value("int32"), length=SEQ),
        "weights": List(Value("float32"), length=SEQ),
        "position_ids": List(Value("int32"), length=SEQ),
        "seq_lengths": List(Value("int32")),
    }
    assert dict(ds.features) == expected
    assert "attention_mask" not in ds.column_names
    arrow = datasets.load_dataset("arrow", data_files=sorted(glob.glob(str(out / "*.arrow"))), split="train")
    assert dict(arrow.features) == expected
    assert arrow["input_ids"][:3] == ds["input_ids"][:3]


def test_batch_converts_to_tensors_without_padding(sample_build):
    import datasets
    import torch

    out, _ = sample_build
    ds = datasets.load_from_disk(str(out)).with_format("torch", columns=["input_ids", "labels", "weights", "position_ids"])
    batch = ds[:4]
    assert isinstance(batch["input_ids"], torch.Tensor) and batch["input_ids"].shape == (4, SEQ)
    assert batch["weights"].dtype == torch.float32
    assert batch["position_ids"].shape == (4, SEQ)
    # fixed-size lists come out as one 2-D array of the stored dtype: no per-row lists, no padding
    import pyarrow as pa

    col = datasets.load_from_disk(str(out)).with_format("arrow")[:4]["input_ids"].combine_chunks()
    assert col.type == pa.list_(pa.int32(), SEQ)
    flat = col.flatten().to_numpy(zero_copy_only=True)  # raises if a copy were needed
    assert torch.as_tensor(flat.reshape(4, SEQ).copy()).dtype == torch.int32


def test_manifest(sample_build, sample_tok):
    from weightprep.tokenizer import tokenizer_fingerprint

    out, manifest = sample_build
    on_disk = json.loads((out / MANIFEST_NAME).read_text())
    assert on_disk == manifest
    assert manifest["format"] == "weightprep-shards" and manifest["format_version"] == FORMAT_VERSION
    assert manifest["tokenizer"]["fingerprint"] == tokenizer_fingerprint(sample_tok)
    assert manifest["config"]["pack"]["seq_len"] == SEQ
    (inp,) = manifest["inputs"]
    assert inp["bytes"] == SAMPLE_RAW.stat().st_size
    assert inp["sha256"] == hashlib.sha256(SAMPLE_RAW.read_bytes()).hexdigest()
    assert sum(s["rows"] for s in manifest["shards"]) == manifest["counts"]["rows"]
    assert "chat" not in manifest  # no conversation, no template used


@pytest.mark.parametrize("source", ["tokenizer", "file"])
def test_manifest_records_the_chat_template_used(source, tmp_path):
    """Beside chat.template's path ("tokenizer": the tokenizer's own), the SHA-256 of the template text that rendered the
    conversations: a file edited in place keeps its path, not its hash."""
    from chat_support import MISTRAL_V1, chat_tokenizer

    tok = chat_tokenizer("chatml")
    tok.save_pretrained(str(tmp_path / "tok"))
    template = tmp_path / "chat.jinja"
    template.write_text(MISTRAL_V1)
    raw = tmp_path / "raw.jsonl"
    convo = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    raw.write_text(json.dumps({"messages": convo}) + "\n" + json.dumps({"pieces": [{"text": "x", "weight": 1}]}) + "\n")
    path = str(template) if source == "file" else None
    cfg = config_from_dict({"tokenizer": {"name": str(tmp_path / "tok")}, "pack": {"seq_len": 64}, "chat": {"template": path}})
    manifest = build([str(raw)], tmp_path / "out", cfg)
    used = MISTRAL_V1 if source == "file" else tok.chat_template
    assert manifest["chat"]["template_source"] == (path or "tokenizer")
    assert manifest["chat"]["template_sha256"] == hashlib.sha256(used.encode()).hexdigest()


def test_rerun_is_byte_identical(sample_build, sample_tok, tmp_path):
    out, _ = sample_build
    again = tmp_path / "again"
    build([str(SAMPLE_RAW)], again, config_from_dict({}), tokenizer=sample_tok)
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:
        assert (out / name).read_bytes() == (again / name).read_bytes(), name


def test_unpacked_rows(sample_tok, tmp_path):
    import datasets

    cfg = config_from_dict({"pack": {"enabled": False, "seq_len": 512}})
    manifest = build([str(SAMPLE_RAW)], tmp_path / "u", cfg, tokenizer=sample_tok)
    ds = datasets.load_from_disk(str(tmp_path / "u"))
    assert ds.features["attention_mask"].feature.dtype == "int8"
    rows = rows_as_numpy(ds)
    found = check_rows(rows, 512, sample_tok.pad_token_id, packed=False)
    expected, _ = reference_documents(sample_tok, load_records(SAMPLE_RAW), max_length=512)
    assert [d[0] for d in found] == [d[0] for d in expected]  # input order kept, one per row
    same_documents(found, expected)
    assert manifest["counts"]["rows"] == len(expected)
    assert (rows["attention_mask"].sum(1) == [len(d[0]) for d in expected]).all()


def test_shards_are_size_capped_and_gzip_input_is_read(sample_tok, tmp_path):
    import datasets

    gz = tmp_path / "raw.jsonl.gz"
    with gzip.open(gz, "wb") as f:
        f.write(SAMPLE_RAW.read_bytes())
    cfg = config_from_dict({"write": {"max_shard_bytes": 200_000}, "pack": {"seq_len": 1024}})
    manifest = build([str(gz)], tmp_path / "s", cfg, tokenizer=sample_tok)
    shards = manifest["shards"]
    assert len(shards) > 3
    assert all(s["bytes"] <= 200_000 for s in shards)
    assert [s["filename"] for s in shards] == [f"data-{i:05d}-of-{len(shards):05d}.arrow" for i in range(len(shards))]
    ds = datasets.load_from_disk(str(tmp_path / "s"))
    assert len(ds) == manifest["counts"]["rows"]
    assert manifest["inputs"][0]["sha256"] == hashlib.sha256(gz.read_bytes()).hexdigest()
    assert manifest["counts"]["records"] == len(load_records(SAMPLE_RAW))


@pytest.mark.parametrize("policy", ["truncate", "chunk"])
def test_overlong_policies_match_reference(policy, sample_tok, tmp_path):
    import datasets

    cfg = config_from_dict({"filter": {"overlong": policy}, "pack": {"seq_len": 1024}})
    manifest = build([str(SAMPLE_RAW)], tmp_path / policy, cfg, tokenizer=sample_tok)
    rows = rows_as_numpy(datasets.load_from_disk(str(tmp_path / policy)))
    found = check_rows(rows, 1024, sample_tok.pad_token_id, packed=True)
    full = [reference_document(sample_tok, r["pieces"]) for r in load_records(SAMPLE_RAW)]
    parts = [p for doc in full for p in reference_policy(doc, 1024, policy)]
    expected = supervised(parts)
    same_documents(found, expected)
    c = manifest["counts"]
    n_long = sum(len(d[0]) > 1024 for d in full)
    assert n_long > 0 and c["dropped"]["overlong"] == 0
    assert c["dropped"]["unsupervised"] == len(parts) - len(expected)
    if policy == "truncate":
        assert c["truncated"] == n_long
    else:
        assert c["chunked"] == n_long
        assert c["chunks"] == sum(-(-len(d[0]) // 1024) for d in full if len(d[0]) > 1024)


def test_failed_build_leaves_nothing(sample_tok, tmp_path, write_jsonl):
    bad = write_jsonl([{"pieces": [{"text": "ok", "weight": 1}]}, '{"pieces": [{"text": "x", "weight": -1}]}'])
    out = tmp_path / "out"
    with pytest.raises(Exception, match="weight"):
        build([str(bad)], out, config_from_dict({}), tokenizer=sample_tok)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["raw.jsonl"]


def test_error_mid_build_stops_every_thread(sample_tok, tmp_path, monkeypatch):
    """An error in the tokenizing thread while the reader still has blocks to go: both background
    threads are stopped and joined before the error reaches the caller, and nothing is written."""
    import threading

    from weightprep.stages.tokenize import PieceTokenizer

    calls = {"n": 0}
    real_call = PieceTokenizer.__call__

    def failing_call(self, records):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("tokenizer exploded")
        return real_call(self, records)

    monkeypatch.setattr(PieceTokenizer, "__call__", failing_call)
    cfg = config_from_dict({"read": {"block_bytes": 4096}})
    out = tmp_path / "out"
    try:
        build([str(SAMPLE_RAW)], out, cfg, tokenizer=sample_tok)
    except RuntimeError as exc:  # checked while the error (and its traceback) is still alive
        assert "exploded" in str(exc)
        assert not [t.name for t in threading.enumerate() if t.name.startswith("weightprep-")]
    else:
        pytest.fail("the build did not raise")
    assert not out.exists() and not list(tmp_path.iterdir())


def test_overwrite_replaces_only_on_success(sample_tok, tmp_path, write_jsonl):
    from weightprep.errors import UsageError

    good = write_jsonl([{"pieces": [{"text": "hello there", "weight": 1}]}])
    out = tmp_path / "out"
    build([str(good)], out, config_from_dict({}), tokenizer=sample_tok)
    with pytest.raises(UsageError, match="already exists"):
        build([str(good)], out, config_from_dict({}), tokenizer=sample_tok)
    before = (out / MANIFEST_NAME).read_bytes()
    bad = write_jsonl(['{"pieces": 3}'], "bad.jsonl")
    with pytest.raises(Exception, match="pieces"):
        build([str(bad)], out, config_from_dict({}), tokenizer=sample_tok, overwrite=True)
    assert (out / MANIFEST_NAME).read_bytes() == before  # the old output survives a failed overwrite
    shutil.rmtree(out)


@pytest.mark.parametrize("packed", [True, False])
def test_hand_written_features_equal_datasets_own(packed):
    from datasets import Features, List, Value

    from weightprep.constants import PACKED_COLUMNS, UNPACKED_COLUMNS
    from weightprep.stages.write import arrow_schema, features

    dtypes = {"input_ids": "int32", "labels": "int32", "weights": "float32", "position_ids": "int32", "attention_mask": "int8"}
    cols = PACKED_COLUMNS if packed else UNPACKED_COLUMNS
    theirs = Features(
        {c: List(Value("int32")) if c == "seq_lengths" else List(Value(dtypes[c]), length=96) for c in cols}
    )
    assert features(96, packed=packed) == theirs.to_dict()
    assert Features.from_dict(features(96, packed=packed)) == theirs
    ours = arrow_schema(96, packed=packed)
    assert ours.equals(theirs.arrow_schema, check_metadata=False)
    assert json.loads(ours.metadata[b"huggingface"]) == json.loads(theirs.arrow_schema.metadata[b"huggingface"])


def test_no_pickle_in_the_data_path(tmp_path, monkeypatch):
    """A serial in-process build and an inspect of its output run with pickle unusable, and what they write is
    Arrow and JSON only: no dataset, manifest or state is a pickle a reader would have to trust."""
    import pickle

    import pyarrow as pa
    from chat_support import chat_tokenizer
    from click.testing import CliRunner

    from weightprep.cli import main

    def refuse(*args, **kwargs):
        raise AssertionError("pickle used in the data path")

    class Refused:
        def __init__(self, *args, **kwargs):
            refuse()

    raw = tmp_path / "raw.jsonl"
    chat = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
    raw.write_text(SAMPLE_RAW.read_text() + json.dumps(chat) + "\n")
    chat_tokenizer("chatml").save_pretrained(str(tmp_path / "tok"))
    args = ["build", str(raw), "--tokenizer", str(tmp_path / "tok"), "--executor", "serial", "--seq-len", "256", "--out"]
    runner = CliRunner()
    # A first build imports what the build imports: some modules pickle a constant at import (jinja2's bytecode
    # cache header), which is no data. The build that counts runs after.
    assert runner.invoke(main, [*args, str(tmp_path / "warm")]).exit_code == 0
    assert runner.invoke(main, ["inspect", str(tmp_path / "warm")]).exit_code == 0
    for name in ("dumps", "dump", "loads", "load"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(pickle, "Pickler", Refused)
    monkeypatch.setattr(pickle, "Unpickler", Refused)
    out = tmp_path / "out"
    result = runner.invoke(main, [*args, str(out)])
    assert result.exit_code == 0, result.output
    shown = runner.invoke(main, ["inspect", str(out)])
    assert shown.exit_code == 0 and "── document 1" in shown.output, shown.output
    files = sorted(p for p in out.rglob("*") if p.is_file())
    assert any(p.suffix == ".arrow" for p in files) and (out / MANIFEST_NAME) in files
    for path in files:
        data = path.read_bytes()
        assert not data.startswith(b"\x80"), f"{path} is a pickle"
        if path.suffix == ".arrow":
            assert pa.ipc.open_stream(pa.BufferReader(data)).read_all().num_rows > 0, path
        elif path.suffix == ".jsonl":
            [json.loads(line) for line in data.splitlines()]
        else:
            assert path.suffix == ".json", path
            json.loads(data)


def test_trust_remote_code_is_off_unless_asked_for(tmp_path, monkeypatch):
    """Every tokenizer load of a build goes to transformers with trust_remote_code=False, and with True only
    after --trust-remote-code."""
    from click.testing import CliRunner
    from transformers import AutoTokenizer

    from weightprep.cli import main
    from weightprep.tokenizer import SAMPLE_TOKENIZER_DIR

    # "legacy" makes the build load through AutoTokenizer (not read tokenizer.json directly), so the call is seen.
    tok_dir = shutil.copytree(SAMPLE_TOKENIZER_DIR, tmp_path / "tok")
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    (tok_dir / "tokenizer_config.json").write_text(json.dumps({**config, "legacy": True}))
    real = AutoTokenizer.from_pretrained.__func__
    calls: list[object] = []

    def spy(cls, *args, **kwargs):
        calls.append(kwargs.get("trust_remote_code", "not passed"))
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", classmethod(spy))
    args = ["build", str(SAMPLE_RAW), "--tokenizer", str(tok_dir), "--executor", "serial", "--seq-len", "256"]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "default")])
    assert result.exit_code == 0, result.output
    assert calls and set(calls) == {False}, calls
    calls.clear()
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "trusted"), "--trust-remote-code"])
    assert result.exit_code == 0, result.output
    assert calls and set(calls) == {True}, calls


def test_a_write_that_fails_stops_the_build_and_publishes_nothing(sample_tok, tmp_path, monkeypatch):
    """Rows are written in their own thread while the next chunk is made: a write that fails (a full disk) is the
    build's error, raised once, with no thread left writing and no dataset published; the chunks written before it
    were written in order, each as it was made."""
    import threading
    import time

    from weightprep.stages import pack, write

    monkeypatch.setattr(pack, "chunk_rows", lambda seq_len: 3)  # many chunks: several in flight at the failure
    real, written = write.ShardWriter.write, []

    def failing(self, rows, name=None):
        if len(written) == 5:
            raise OSError(28, "No space left on device")
        time.sleep(0.02)  # a slow disk: the chunks made meanwhile must not be made in the arrays being written
        written.append(rows.input_ids.copy())
        return real(self, rows, name)

    monkeypatch.setattr(write.ShardWriter, "write", failing)
    cfg = config_from_dict({"pack": {"seq_len": 256}})
    with pytest.raises(OSError, match="No space left"):
        build([str(SAMPLE_RAW)], tmp_path / "out", cfg, tokenizer=sample_tok)
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()
    assert not [t for t in threading.enumerate() if t.name.startswith("weightprep-")]
    monkeypatch.setattr(write.ShardWriter, "write", real)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(SAMPLE_RAW.read_bytes() + b'{"pieces": 3}\n')  # an error elsewhere: the writer is stopped too
    with pytest.raises(InputError):
        build([str(bad)], tmp_path / "bad", cfg, tokenizer=sample_tok)
    assert not [t for t in threading.enumerate() if t.name.startswith("weightprep-")]
    build([str(SAMPLE_RAW)], tmp_path / "whole", cfg, tokenizer=sample_tok)
    import datasets

    ids = np.asarray(datasets.load_from_disk(str(tmp_path / "whole"))["input_ids"])
    assert len(written) == 5 and np.array_equal(np.concatenate(written), ids[: 5 * 3])
