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
from weightprep.cli import main
from weightprep.config import config_from_dict
from weightprep.distribute.executors import LocalExecutor, RayExecutor, SerialExecutor
from weightprep.distribute.plan import plan_mixed
from weightprep.errors import AccountingError, InputError
from weightprep.pipeline import build
from weightprep.sources import Source, epoch_keys

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
