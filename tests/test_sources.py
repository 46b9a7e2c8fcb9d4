"""Several sources in one build (``weightprep.sources``): weights, epochs, mixing, per-source splits and numbers.

- every token's weight is ``float32(W * w)`` of its source's weight W and its own w, exactly (Hypothesis, against
  the pieces tokenized here one by one);
- a record of a source with E epochs is written floor(E) or floor(E) + 1 times, round((E - floor E) * N) records
  once more, and never twice in one row;
- serial, local (2 workers) and Ray (2 workers) write the same bytes for three sources;
- each source's held-out records are the split ``validation_NAME``, which ``datasets`` loads;
- the manifest's per-source numbers satisfy the accounting identity and sum to the build's;
- every bad declaration is exit 2 with its message, before any work.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import SAMPLE_RAW
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weightprep.accounting import check_accounting
from weightprep.batches import Documents
from weightprep.cli import main
from weightprep.config import config_from_dict
from weightprep.distribute.executors import LocalExecutor, RayExecutor, SerialExecutor
from weightprep.distribute.plan import plan_mixed
from weightprep.errors import AccountingError, ConfigError, InputError
from weightprep.pipeline import build
from weightprep.sources import Source, copies, epoch_keys

_ALPHABET = "abcdefghij klmnop.,!?"


def _digests(out: Path) -> dict[str, str]:
    return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.rglob("*")) if p.is_file()}


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _rows(out: Path, split: str | None = None) -> list[dict]:
    import pyarrow as pa

    directory = out / split if split else out
    rows = []
    for shard in sorted(directory.glob("data-*.arrow")):
        with pa.memory_map(str(shard)) as f:
            rows.extend(pa.ipc.open_stream(f).read_all().to_pylist())
    return rows


def _documents(rows: list[dict], bos: int) -> list[tuple[int, tuple[int, ...], np.ndarray]]:
    """(row, token ids, weights) of every document of packed rows: the segments that start with BOS (a pad tail
    starts with the pad id)."""
    docs = []
    for r, row in enumerate(rows):
        start = 0
        for n in row["seq_lengths"]:
            ids = tuple(row["input_ids"][start : start + n])
            if ids[0] == bos:
                docs.append((r, ids, np.asarray(row["weights"][start : start + n], dtype=np.float32)))
            start += n
    return docs


# ---- weights and epochs, exactly ------------------------------------------------------------------------------

_weights = st.one_of(st.just(0.0), st.floats(1e-3, 1e3), st.sampled_from([0.1, 1 / 3, 0.7, 1.0, 2.5]))
_source = st.fixed_dictionaries({
    "weight": st.one_of(st.just(0.0), st.just(1.0), st.floats(1e-3, 1e3), st.sampled_from([0.1, 1 / 3, 3.0])),
    "epochs": st.one_of(st.sampled_from([1.0, 2.0, 0.5, 1.5]), st.floats(0.05, 3.5)),
    "records": st.lists(st.lists(st.tuples(st.text(_ALPHABET, min_size=1, max_size=12), _weights), min_size=1,
                                 max_size=3), min_size=1, max_size=8),
})  # fmt: skip

EOS_WEIGHT = 0.7


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sources=st.lists(_source, min_size=1, max_size=3), part_bytes=st.sampled_from([64, 300, 1 << 20]))
def test_every_token_weighs_its_sources_weight_times_its_own_and_epochs_repeat_records(
    tmp_path_factory, sample_tok, sources, part_bytes
):
    tmp = tmp_path_factory.mktemp("prop")
    declared, expected = [], {}  # token ids of a document -> (source, record, its weights)
    for s, spec in enumerate(sources):
        records = []
        for r, pieces in enumerate(spec["records"]):
            pieces = [(f"<{s}.{r}> " + pieces[0][0], pieces[0][1]), *pieces[1:]]  # every record unique
            records.append({"pieces": [{"text": t, "weight": w} for t, w in pieces]})
            # the independent computation: each piece tokenized alone, its weight times W in float64, then float32
            ids, weights = [sample_tok.bos_token_id], [np.float32(0)]
            for t, w in pieces:
                piece_ids = sample_tok(t, add_special_tokens=False)["input_ids"]
                ids += piece_ids
                weights += [np.float32(spec["weight"] * w)] * len(piece_ids)
            ids.append(sample_tok.eos_token_id)
            weights.append(np.float32(spec["weight"] * EOS_WEIGHT))
            expected[tuple(ids)] = (s, r, np.asarray(weights, dtype=np.float32))
        declared.append(Source(f"s{s}", (str(_write(tmp / f"s{s}.jsonl", records)),), spec["weight"], spec["epochs"]))
    cfg = config_from_dict({"pack": {"seq_len": 128}, "assemble": {"eos_weight": EOS_WEIGHT},
                            "read": {"part_bytes": part_bytes}})  # fmt: skip
    if all(spec["weight"] == 0 for spec in sources):  # nothing would be learned: refused before any work
        with pytest.raises(ConfigError, match="every source has weight 0"):
            build([], tmp / "out", cfg, tokenizer=sample_tok, sources=declared, executor=SerialExecutor())
        assert not (tmp / "out").exists()
        return
    manifest = build([], tmp / "out", cfg, tokenizer=sample_tok, sources=declared, executor=SerialExecutor())
    seen: Counter[tuple[int, int]] = Counter()
    rows_of: dict[tuple[int, int], list[int]] = {}
    for row, ids, weights in _documents(_rows(tmp / "out"), sample_tok.bos_token_id):
        s, r, want = expected[ids]
        assert np.array_equal(weights, want), (s, r, weights, want)  # bit for bit: array_equal on float32
        seen[(s, r)] += 1
        rows_of.setdefault((s, r), []).append(row)
    for key, rows in rows_of.items():
        assert len(rows) == len(set(rows)), f"copies of record {key} share a row: {rows}"
    for s, spec in enumerate(sources):
        n, e = len(spec["records"]), spec["epochs"]
        supervised = {r for (s2, r), (_, _, w) in ((k[:2], v) for k, v in ((v[:2], v) for v in expected.values()))
                      if s2 == s and (w != 0).any()}  # fmt: skip
        for r in range(n):  # a document without any weight is dropped (unsupervised), each copy of it
            allowed = (math.floor(e), math.floor(e) + 1) if r in supervised else (0,)
            assert seen[(s, r)] in allowed, (s, r, seen[(s, r)], e)
        entry = manifest["sources"][s]
        assert entry["records"] == n and entry["documents"] == n
        if len(supervised) == n:
            total = sum(seen[(s, r)] for r in range(n))
            assert abs(total - e * n) <= 1
            assert entry["repeats"] - entry["omitted"] == total - n  # copies beyond one, records left out (E < 1)


# ---- three sources: the same bytes for every executor ---------------------------------------------------------

_SAMPLE = SAMPLE_RAW.read_text(encoding="utf-8").splitlines(keepends=True)


@pytest.fixture
def three(tmp_path) -> list[Source]:
    """The sample data cut into three sources of unequal sizes, with weights and fractional epochs."""
    cuts = [0, 130, 300, len(_SAMPLE)]
    paths = []
    for i, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False)):
        path = tmp_path / f"src{i}.jsonl"
        path.write_text("".join(_SAMPLE[a:b]), encoding="utf-8")
        paths.append(path)
    return [Source("math", (str(paths[0]),), 2.0, 1.0), Source("code", (str(paths[1]),), 1.0, 1.5),
            Source("chat", (str(paths[2]),), 0.5, 2.3)]  # fmt: skip


def _three_cfg(**split):
    return config_from_dict({"pack": {"seq_len": 512}, "read": {"part_bytes": 150_000, "block_bytes": 32768},
                             "split": {"validation_fraction": 0.1, **split}})  # fmt: skip


@pytest.mark.parametrize("kind", ["local", "ray"])
def test_three_sources_write_the_same_bytes_for_every_executor(kind, tmp_path, three, sample_tok, request):
    if kind == "ray":
        request.getfixturevalue("ray_session")
    reference = build([], tmp_path / "serial", _three_cfg(), tokenizer=sample_tok, sources=three,
                      executor=SerialExecutor())  # fmt: skip
    assert len(plan_mixed([list(s.paths) for s in three], 150_000)) > 2  # several mixed parts
    other = LocalExecutor(2) if kind == "local" else RayExecutor(2)
    manifest = build([], tmp_path / kind, _three_cfg(), sources=three, executor=other)
    assert _digests(tmp_path / kind) == _digests(tmp_path / "serial")
    assert manifest["sources"] == reference["sources"]


_part = st.tuples(
    st.lists(st.integers(0, 5), min_size=1, max_size=6),  # document lengths (0: an empty document)
    st.booleans(),  # with turns
    st.booleans(),  # with labels
)


@settings(max_examples=80, deadline=None)
@given(parts=st.lists(_part, min_size=1, max_size=4), seed=st.integers(0, 2**32 - 1))
def test_the_interleaves_merge_is_concat_then_take_in_any_order(parts, seed):
    # Documents.merge scatters each block straight into the interleaved order (one copy instead of concat + take):
    # every column, a block without turns (zeros, as concat gives), blocks without labels (none, where any lacks
    # them, as concat gives) and empty documents included
    rng = np.random.default_rng(seed)
    batches, line = [], 0
    for lengths, with_turns, with_labels in parts:
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        n = int(offsets[-1])
        batches.append(Documents(
            input_ids=rng.integers(0, 1000, n, dtype=np.int32), weights=rng.random(n, dtype=np.float32),
            offsets=offsets, lines=np.arange(line, line + len(lengths), dtype=np.int64),
            labels=rng.integers(-100, 1000, n, dtype=np.int32) if with_labels else None,
            turns=rng.integers(1, 9, n, dtype=np.int32) if with_turns else None,
        ))  # fmt: skip
        line += len(lengths)
    order = rng.permutation(line)
    expected, merged = Documents.concat(batches).take(order), Documents.merge(batches, order)
    for column in ("input_ids", "weights", "offsets", "lines", "labels", "turns"):
        want, got = getattr(expected, column), getattr(merged, column)
        assert (want is None) == (got is None), column
        if want is not None:
            assert got.dtype == want.dtype and np.array_equal(got, want), column


def test_sources_are_mixed_in_every_row_window_not_in_blocks(tmp_path, three, sample_tok):
    # windows of 40 documents: a window that held one source's block would give rows of that source alone
    cfg = config_from_dict({"pack": {"seq_len": 2048, "window": 40}, "read": {"block_bytes": 16384}})
    flat = [Source(s.name, s.paths) for s in three]  # weights 1, one epoch: the same records as a plain build
    build([], tmp_path / "out", cfg, tokenizer=sample_tok, sources=flat, executor=SerialExecutor())
    origin = {}  # a document's ids (BOS, each piece tokenized alone, EOS) -> its source
    for s, source in enumerate(flat):
        for line in Path(source.paths[0]).read_text(encoding="utf-8").splitlines():
            ids = [sample_tok.bos_token_id]
            for piece in json.loads(line)["pieces"]:
                ids += sample_tok(piece["text"], add_special_tokens=False)["input_ids"]
            origin[(*ids, sample_tok.eos_token_id)] = s
    rows = _rows(tmp_path / "out")
    mixed = 0
    for row in rows:
        found = {origin[ids] for _, ids, _ in _documents([row], sample_tok.bos_token_id)}
        mixed += len(found) > 1
    assert mixed >= 3 * len(rows) // 4, f"only {mixed} of {len(rows)} rows hold more than one source"


# ---- validation per source ------------------------------------------------------------------------------------


def test_each_source_holds_out_its_own_validation_split_that_datasets_loads(tmp_path, three, sample_tok):
    import datasets

    manifest = build([], tmp_path / "out", _three_cfg(), tokenizer=sample_tok, sources=three)
    dd = datasets.load_from_disk(str(tmp_path / "out"))
    assert sorted(dd) == ["train", "validation_chat", "validation_code", "validation_math"]
    assert "validation" not in manifest["splits"]
    for s, source in enumerate(three):
        split = manifest["splits"][f"validation_{source.name}"]["counts"]
        assert dd[f"validation_{source.name}"].num_rows == split["rows"] > 0
        by_source = manifest["sources"][s]["splits"][f"validation_{source.name}"]
        assert by_source["tokens"] == split["tokens"] and by_source["documents_written"] == split["documents_written"]
        others = [m["splits"].get(f"validation_{source.name}") for i, m in enumerate(manifest["sources"]) if i != s]
        assert all(o is None or o["tokens"] == 0 for o in others)  # never mixed
        assert split["documents_written"] == split["documents"] - sum(split["dropped"].values())  # never repeated


def test_validation_records_holds_out_n_records_of_each_source(tmp_path, three, sample_tok):
    manifest = build([], tmp_path / "out", _three_cfg(validation_fraction=None, validation_records=7),
                     tokenizer=sample_tok, sources=three)  # fmt: skip
    for source in three:
        assert manifest["splits"][f"validation_{source.name}"]["counts"]["records"] == 7


def test_a_plain_build_keeps_its_validation_split(tmp_path, sample_tok):
    manifest = build([str(SAMPLE_RAW)], tmp_path / "out", _three_cfg(), tokenizer=sample_tok)
    assert sorted(manifest["splits"]) == ["train", "validation"] and "sources" not in manifest


# ---- numbers per source ---------------------------------------------------------------------------------------


def test_per_source_numbers_balance_and_sum_to_the_builds(tmp_path, three, sample_tok):
    manifest = build([], tmp_path / "out", _three_cfg(), tokenizer=sample_tok, sources=three)
    entries = manifest["sources"]
    assert [e["name"] for e in entries] == ["math", "code", "chat"]
    for entry in entries:
        check_accounting(entry["counts"])
    for key in ("records", "documents", "tokens", "supervised_tokens"):
        assert sum(e[key] for e in entries) == manifest["counts"][key]
    assert math.isclose(sum(e["total_weight"] for e in entries), manifest["counts"]["total_weight"], rel_tol=1e-9)
    assert math.isclose(sum(e["weight_share"] for e in entries), 1.0, abs_tol=1e-5)
    train = manifest["splits"]["train"]["counts"]
    for entry, source in zip(entries, three, strict=True):
        assert math.isclose(entry["weight_share"], entry["splits"]["train"]["total_weight"] / train["total_weight"],
                            abs_tol=1e-6)  # fmt: skip
        held = entry["splits"][f"validation_{source.name}"]["records"]
        train_records = entry["splits"]["train"]["records"]
        assert entry["repeats"] == math.floor((source.epochs % 1) * train_records + 0.5) + (
            math.floor(source.epochs) - 1) * train_records  # fmt: skip
        assert train_records + held == entry["records"]
    broken = {**entries[1]["counts"], "documents_repeated": entries[1]["counts"]["documents_repeated"] + 1}
    with pytest.raises(AccountingError):
        check_accounting(broken)


def test_a_weight_zero_source_is_counted_and_writes_nothing(tmp_path, three, sample_tok):
    sources = [three[0], Source("zero", three[1].paths, 0.0, 1.0)]
    manifest = build([], tmp_path / "out", _three_cfg(validation_fraction=None), tokenizer=sample_tok, sources=sources)
    zero = manifest["sources"][1]
    assert zero["records"] == 170
    assert zero["tokens"] == 0 and zero["total_weight"] == 0 and zero["weight_share"] == 0
    assert sum(zero["counts"]["dropped"].values()) == zero["documents"] and zero["counts"]["dropped"]["unsupervised"] > 0


# ---- line numbers ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["serial", "local"])
def test_a_bad_line_is_named_by_its_line_in_its_own_file(kind, tmp_path, three, sample_tok):
    lines = Path(three[1].paths[0]).read_text(encoding="utf-8").splitlines(keepends=True)
    lines[150] = '{"pieces": [{"text": "x", "weight": -1}]}\n'  # line 151, in the file's last part
    Path(three[1].paths[0]).write_text("".join(lines), encoding="utf-8")
    executor = SerialExecutor() if kind == "serial" else LocalExecutor(2)
    with pytest.raises(InputError) as caught:
        build([], tmp_path / "out", _three_cfg(), tokenizer=sample_tok if kind == "serial" else None, sources=three,
              executor=executor)  # fmt: skip
    assert caught.value.path == three[1].paths[0] and caught.value.line == 151
    cfg = config_from_dict({"pack": {"seq_len": 512}, "read": {"part_bytes": 150_000}, "validate": {"on_invalid": "skip"}})
    manifest = build([], tmp_path / "skip", cfg, tokenizer=sample_tok, sources=three)
    rejects = [json.loads(x) for x in (tmp_path / "skip" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["source"], r["line"]) for r in rejects] == [(three[1].paths[0], 151)]
    assert manifest["sources"][1]["rejected"] == {"bad_weight": 1} and manifest["sources"][0]["rejected"] == {}


# ---- chat sources ---------------------------------------------------------------------------------------------


def test_a_chat_sources_message_weights_are_scaled_by_its_weight(tmp_path):
    from chat_support import chat_tokenizer

    tok = chat_tokenizer("chatml")
    chats = [{"messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"},
                           {"role": "user", "content": "more"}, {"role": "assistant", "content": "yes", "weight": 0.25}]}
             for i in range(6)]  # fmt: skip
    path = _write(tmp_path / "chat.jsonl", chats)
    cfg = config_from_dict({"pack": {"seq_len": 256}})
    plain = build([str(path)], tmp_path / "plain", cfg, tokenizer=tok)
    build([], tmp_path / "src", cfg, tokenizer=tok, sources=[Source("c", (str(path),), 3.0, 1.0, role_weights="assistant=0.5")])
    base = {ids: w for _, ids, w in _docs_unpacked_or_packed(tmp_path / "plain", tok)}
    scaled = {ids: w for _, ids, w in _docs_unpacked_or_packed(tmp_path / "src", tok)}
    assert base.keys() == scaled.keys() and plain["counts"]["documents_written"] == 6
    for ids, w in base.items():
        # the plain build's weights are 1 and 0.25 (exact in float32); the source's: 3 * 0.5 and 3 * 0.25
        want = np.where(w == np.float32(1.0), np.float32(3.0 * 0.5), np.where(w == 0, 0, np.float32(3.0 * 0.25)))
        assert np.array_equal(scaled[ids], want.astype(np.float32))


@pytest.mark.parametrize("declared", ["role_weights", "message"])
def test_a_chat_weight_that_the_sources_weight_takes_beyond_float32_names_the_record(declared, tmp_path):
    """100 x 1e37 is inf in float32: the aligner met inf - inf and blamed the template ("token ... crosses a change
    of weight") instead of the weight, whether the 100 is a role weight or a message's own weight."""
    from chat_support import chat_tokenizer

    tok = chat_tokenizer("chatml")
    big = {"weight": 100.0} if declared == "message" else {}
    chats = [{"messages": [{"role": "user", "content": f"question {i}"},
                           {"role": "assistant", "content": f"answer {i}", **(big if i == 2 else {})}]}
             for i in range(4)]  # fmt: skip
    path = _write(tmp_path / "chat.jsonl", chats)
    role_weights = "assistant=100" if declared == "role_weights" else None
    with pytest.raises(InputError) as caught:
        build([], tmp_path / "out", config_from_dict({"pack": {"seq_len": 256}}), tokenizer=tok,
              sources=[Source("c", (str(path),), 1e37, 1.0, role_weights=role_weights)])  # fmt: skip
    assert "beyond float32's largest" in str(caught.value) and "source's weight" in str(caught.value)
    assert caught.value.line == (1 if declared == "role_weights" else 3)
    assert not (tmp_path / "out").exists()


def _docs_unpacked_or_packed(out: Path, tok) -> list:
    rows = _rows(out)
    docs = []
    for r, row in enumerate(rows):
        start = 0
        for n in row["seq_lengths"]:
            ids = tuple(row["input_ids"][start : start + n])
            if any(x != -100 for x in row["labels"][start : start + n]):
                docs.append((r, ids, np.asarray(row["weights"][start : start + n], dtype=np.float32)))
            start += n
    return docs


# ---- declarations: every problem is exit 2 before any work ----------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--source", "a=A,foo=1"], "unknown option 'foo=1'"),
        (["--source", "a=A,weight=-1"], "weight: must be a finite number >= 0, got -1.0"),
        (["--source", "a=A,weight=nan"], "weight: must be a finite number >= 0, got nan"),
        (["--source", "a=A,weight=1e39"], "beyond float32's largest"),
        (["--source", "a=A,epochs=0"], "epochs: must be a finite number > 0, got 0.0"),
        (["--source", "a=A,epochs=inf"], "epochs: must be a finite number > 0, got inf"),
        (["--source", "a=A,epochs=two"], "epochs: expected a number, got 'two'"),
        # a packing pass per copy: 1e19 epochs built for ever (a Packer per pass) instead of an error
        (["--source", "a=A,epochs=1e19"], "epochs: 1e+19 is more than 1000"),
        (["--source", "a=A", "--source", "a=B"], "source 'a' is declared twice"),
        # validation_a and validation_A: one directory on a case-insensitive filesystem
        (["--source", "a=A", "--source", "A=B"], "sources 'a' and 'A' differ only in case"),
        # every token weight 0: the build ran to 0 rows and exit 0 without a word
        (["--source", "a=A,weight=0", "--source", "b=B,weight=0"], "every source has weight 0"),
        # Python's float() reads 1_000 as 1000
        (["--source", "a=A,weight=1_000"], "weight: expected a number, got '1_000'"),
        (["--source", "a.b=A"], "expected a name of letters, digits and '_'"),
        # datasets refuses a split name with '-' (^\w+(\.\w+)*$): the output could not be loaded
        (["--source", "my-set=A"], "expected a name of letters, digits and '_'"),
        # validation_NAME is a directory: a name beyond 255 bytes failed with a traceback after the work began
        (["--source", "x" * 101 + "=A"], "expected a name of letters, digits and '_', at most 100"),
        (["--source", "A"], "expected NAME=PATH"),
        (["--source", "a=nothing-*.jsonl"], "source a: no file matches 'nothing-*.jsonl'"),
        (["--source", "a=missing.jsonl"], "source a: input file not found: missing.jsonl"),
        (["--source", "a=A", "--source", "b=A"], "is given twice"),
        (["--source", "a=A", "B"], "INPUTS (B) and sources are both given"),
        (["--source", "a=A,weight=1e38", "--eos-weight", "10"], "times the EOS weight 10.0 is beyond float32's largest"),
    ],
)
def test_a_bad_source_declaration_is_exit_2_before_any_work(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("A", "B"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "x.jsonl").write_text('{"text": "hi"}\n')
    result = CliRunner().invoke(main, ["build", *args, "--out", "out", "--executor", "serial"])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("sources", "message"),
    [
        ([{"name": "a", "path": "A", "colour": 1}], "sources[0].colour: unknown key"),
        ([{"name": "a", "path": "A", "weight": -0.5}], "sources[0].weight: must be a finite number >= 0"),
        ([{"name": "a", "path": "A", "epochs": -1}], "sources[0].epochs: must be a finite number > 0"),
        ([{"name": "a", "path": "A", "role_weights": "assistant"}], "sources[0].chat.role_weights"),
        ([{"name": "a", "path": "A", "columns": "prompt=q,completion=q"}], "sources[0].columns: column 'q' is mapped twice"),
        ([{"name": "a"}], "sources[0].path: expected a file"),
        ([], "sources: expected a non-empty list"),
    ],
)
def test_a_bad_sources_list_in_a_pipeline_file_is_exit_2(sources, message, tmp_path, monkeypatch):
    import yaml

    monkeypatch.chdir(tmp_path)
    (tmp_path / "A").mkdir()
    (tmp_path / "A" / "x.jsonl").write_text('{"text": "hi"}\n')
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"pack": {"seq_len": 64}, "sources": sources}))
    result = CliRunner().invoke(main, ["build", "--pipeline", "p.yaml", "--out", "out", "--executor", "serial"])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--source", "b=A"], "sources are given both by --source and in p.yaml's sources:"),
        (["A"], "INPUTS (A) and sources are both given"),
    ],
)
def test_a_pipeline_files_sources_with_more_inputs_on_the_command_line_is_exit_2(args, message, tmp_path, monkeypatch):
    import yaml

    monkeypatch.chdir(tmp_path)
    (tmp_path / "A").mkdir()
    (tmp_path / "A" / "x.jsonl").write_text('{"text": "hi"}\n')
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"sources": [{"name": "a", "path": "A"}]}))
    result = CliRunner().invoke(main, ["build", "--pipeline", "p.yaml", *args, "--out", "out", "--executor", "serial"])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("source", "message"),
    [(Source("my-set", ("x.jsonl",)), "name: expected a name"), (Source("a", ("x.jsonl",), 1.0, 1e19), "is more than 1000"),
     (Source("a", ("x.jsonl",), 1.0, -1.0), "epochs: must be a finite number > 0")],
)
def test_a_source_made_in_python_is_checked_as_a_declaration(source, message, tmp_path):
    """build(sources=[Source(...)]) skipped the declaration's checks: '-' gave an output datasets cannot load,
    1e19 epochs built for ever."""
    from weightprep.errors import ConfigError

    (tmp_path / "x.jsonl").write_text('{"text": "hi"}\n')
    with pytest.raises(ConfigError, match=message):
        build([], tmp_path / "out", config_from_dict({"pack": {"seq_len": 64}}),
              sources=[Source(source.name, (str(tmp_path / "x.jsonl"),), source.weight, source.epochs)])  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_a_pipeline_files_sources_build_like_the_same_source_options(tmp_path, monkeypatch):
    import yaml

    monkeypatch.chdir(tmp_path)
    for name, (a, b) in {"a": (0, 200), "b": (200, len(_SAMPLE))}.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(_SAMPLE[a:b]), encoding="utf-8")
    sources = [{"name": "a", "path": "a.jsonl", "weight": 2, "epochs": 1.5}, {"name": "b", "path": ["b.jsonl"]}]
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"pack": {"seq_len": 512}, "sources": sources}))
    run = CliRunner().invoke(main, ["build", "--pipeline", "p.yaml", "--out", "yaml", "--executor", "serial"])
    assert run.exit_code == 0, run.output
    assert any(line.split()[:3] == ["a", "2", "1.5"] for line in run.output.splitlines())  # the composition table
    run = CliRunner().invoke(main, ["build", "--seq-len", "512", "--source", "a=a.jsonl,weight=2,epochs=1.5",
                                    "--source", "b=b.jsonl", "--out", "cli", "--executor", "serial"])  # fmt: skip
    assert run.exit_code == 0, run.output
    assert {k: v for k, v in _digests(tmp_path / "yaml").items() if k.endswith(".arrow")} == {
        k: v for k, v in _digests(tmp_path / "cli").items() if k.endswith(".arrow")
    }


def test_a_weight_of_minus_zero_is_zero():
    """-0 passed the >= 0 check and stayed -0.0: "-0" in the composition table and the manifest."""
    from weightprep.sources import parse_source_option, sources_from_data

    for source in (parse_source_option("a=x.jsonl,weight=-0"), *sources_from_data([{"name": "a", "path": "x", "weight": -0.0}])):
        assert source.weight == 0 and math.copysign(1.0, source.weight) == 1.0 and json.dumps(source.weight) == "0.0"


def test_epoch_keys_are_independent_of_the_split_keys():
    keys = np.arange(0, 1 << 20, dtype=np.uint64) << np.uint64(40)  # small split keys: all held out by a cut
    below = epoch_keys(keys) < np.uint64(1 << 63)
    assert 0.45 < below.mean() < 0.55


def _splitmix64(state: int) -> int:
    """The first output of Vigna's SplitMix64 (xoshiro's seeder) from ``state``, in Python integers."""
    mask = (1 << 64) - 1
    z = (state + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


@given(st.lists(st.integers(0, (1 << 64) - 1), min_size=1, max_size=50))
@settings(max_examples=50, deadline=None)
def test_epoch_keys_are_splitmix64_of_the_split_keys(keys):
    """The extra copies of a fractional epoch are chosen by SplitMix64 (the build's bytes depend on it)."""
    assert _splitmix64(0) == 0xE220A8397B1DCDAF  # the reference's published first output from seed 0
    got = epoch_keys(np.array(keys, dtype=np.uint64))
    assert [int(k) for k in got] == [_splitmix64(k) for k in keys]


def test_a_record_gets_its_extra_copy_when_its_epoch_key_is_below_the_cut():
    keys = np.array([5, 77, 1 << 40, (1 << 64) - 1], dtype=np.uint64)
    epoch = [int(k) for k in epoch_keys(keys)]
    for i, key in enumerate(epoch):
        at = copies(keys, 2.5, key).tolist()  # the cut at this record's own key: strictly below gets the copy
        assert at[i] == 2 and at == [2 + (other < key) for other in epoch]
        assert copies(keys, 2.5, key + 1).tolist()[i] == 3
    assert copies(keys, 1.5, 0).tolist() == [1] * 4  # a cut of 0: nobody
    assert copies(keys, 1.5, 1 << 64).tolist() == [2] * 4  # the full range: everybody


# ---- the composition in inspect and the report ----------------------------------------------------------------


def test_inspect_and_the_report_show_the_composition(tmp_path, three, sample_tok):
    import re

    manifest = build([], tmp_path / "out", _three_cfg(), tokenizer=sample_tok, sources=three)
    result = CliRunner().invoke(main, ["inspect", str(tmp_path / "out"), "--no-color"])
    assert result.exit_code == 0, result.output
    for src in manifest["sources"]:
        line = next(x for x in result.output.splitlines() if x.split()[:1] == [src["name"]])
        assert f"{100 * src['weight_share']:.1f}%" in line and f"{src['tokens']:,}" in line
        assert line.count("█") == round(30 * src["weight_share"])
    result = CliRunner().invoke(main, ["inspect", str(tmp_path / "out"), "--html", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    bars = dict(re.findall(r'class="source"[^>]*data-source="([^"]+)" data-share="([0-9.]+)"', page))
    assert {k: float(v) for k, v in bars.items()} == pytest.approx({s["name"]: s["weight_share"] for s in manifest["sources"]})
    for src in manifest["sources"]:
        assert f'data-source="{src["name"]}" data-key="tokens">{src["tokens"]:,}<' in page


def test_the_example_pipeline_declares_valid_sources():
    from conftest import REPO

    from weightprep.config import load_config, load_sources

    path = REPO / "pipelines" / "sources.yaml"
    sources = load_sources(path)
    assert [s.name for s in sources] == ["math", "chat", "expert", "qa"]
    assert sources[3] == Source("qa", ("data/qa.parquet",), 0.5, 1.5, "prompt=question,completion=answer")
    assert load_config(path).split.validation_fraction == 0.02


def test_a_parquet_source_renames_its_own_columns_beside_a_jsonl_source(tmp_path, three, sample_tok):
    import pyarrow as pa
    import pyarrow.parquet as pq

    qa = tmp_path / "qa.parquet"
    pq.write_table(pa.table({"question": [f"q{i}? " for i in range(20)], "answer": [f"a{i}." for i in range(20)]}), qa)
    sources = [three[0], Source("qa", (str(qa),), 0.5, 2.0, columns="prompt=question,completion=answer")]
    manifest = build([], tmp_path / "out", config_from_dict({"pack": {"seq_len": 512}}), tokenizer=sample_tok,
                     sources=sources)  # fmt: skip
    entry = manifest["sources"][1]
    assert entry["records"] == 20 and entry["repeats"] == 20
    weights = {w for row in _rows(tmp_path / "out") for w in row["weights"]}
    assert np.float32(0.5 * 1.0) in weights and np.float32(2.0 * 1.0) in weights  # completion and EOS, each source's


def test_validation_records_larger_than_a_source_names_it(tmp_path, three, sample_tok):
    with pytest.raises(Exception, match="source math: --validation-records 500 would leave no training records"):
        build([], tmp_path / "out", _three_cfg(validation_fraction=None, validation_records=500), tokenizer=sample_tok,
              sources=three)  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_a_killed_build_with_sources_resumes_to_the_same_bytes(tmp_path, three, sample_tok):
    import os

    from split_support import Delaying
    from test_distribute import _Killed, _KilledAfter

    reference = build([], tmp_path / "ref", _three_cfg(), tokenizer=sample_tok, sources=three)
    with pytest.raises(_Killed):
        build([], tmp_path / "out", _three_cfg(), tokenizer=sample_tok, sources=three, executor=_KilledAfter(2))
    (tmp_path / f".out.tmp-{os.getpid()}").rename(tmp_path / ".out.tmp-999999999")  # as a dead process leaves it
    resumed = Delaying(SerialExecutor(), {})
    manifest = build([], tmp_path / "out", _three_cfg(), tokenizer=sample_tok, sources=three, executor=resumed, resume=True)
    assert resumed.reused == [0, 1]
    assert _digests(tmp_path / "out") == _digests(tmp_path / "ref") and manifest["sources"] == reference["sources"]


def test_a_build_of_sources_is_cut_finer_where_one_holds_conversations_named_by_its_own_columns(tmp_path, monkeypatch):
    """The build plans its mixed parts with each source's columns (``plan.plan_mixed(columns=...)``): a source of
    conversations under another field name makes K count parts of ``chat_part_bytes``."""
    from chat_support import chat_tokenizer

    from weightprep.distribute import plan as plan_module

    monkeypatch.setattr(plan_module, "CHAT_PART_FLOOR", 1000)
    tok = chat_tokenizer("chatml")
    turns = [{"role": "user", "content": "question " * 10}, {"role": "assistant", "content": "answer " * 20}]
    chats = _write(tmp_path / "chats.jsonl", [{"dialog": turns}] * 40)
    pieces = _write(tmp_path / "pieces.jsonl", [{"pieces": [{"text": "some text " * 30, "weight": 1.0}]}] * 40)
    total = chats.stat().st_size + pieces.stat().st_size
    cfg = config_from_dict({"pack": {"seq_len": 256}, "read": {"part_bytes": 16 * (total // 3 + 1)}})  # K = 3
    sources = [Source("c", (str(chats),), columns="messages=dialog"), Source("p", (str(pieces),))]
    manifest = build([], tmp_path / "out", cfg, tokenizer=tok, sources=sources)
    assert [len(i["parts"]) for i in manifest["inputs"]] == [3, 3]  # each of the 3 parts holds a slice of both
    assert manifest["counts"]["chat_documents"] == 40 and manifest["counts"]["documents_written"] == 80
