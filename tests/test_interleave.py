"""The mixed part's own rules (``weightprep.distribute.mixed``), each against an independent reference:

- the interleave: every training document of a part goes on in the order ``(t, source, order read)``, and only
  once every source has read past its ``t`` (module docstring, step 2) — ``_Interleave`` under any read schedule
  (Hypothesis), and a real build whose shares are exact binary fractions, so the order is known in advance;
- a weight that the source's weight takes beyond float32 names its record (``_scaled``, ``_check_scaled``);
- the per-source counts of written and repeated documents (``_count_written``, ``_count_repeats``,
  ``_doc_weights``), summed over blocks;
- the bytes of a source a block has consumed (``_source_blocks``), over several files and byte ranges;
- the epoch pass: training records of a cut (``_train_records``), the margin of kept keys (``_kept``), each
  part's smallest epoch keys (``part_epoch_keys``) and the cut of their union (``epoch_cuts_from``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import math
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weightprep.batches import ChatTokens, Documents, Records
from weightprep.config import config_from_dict
from weightprep.constants import IGNORE_INDEX
from weightprep.distribute.executors import SerialExecutor
from weightprep.distribute.mixed import (
    _check_scaled,
    _count_repeats,
    _count_written,
    _doc_weights,
    _Interleave,
    _kept,
    _scaled,
    _source_blocks,
    _train_records,
    epoch_cuts_from,
    mixed_keys,
    part_epoch_keys,
)
from weightprep.distribute.plan import plan_mixed
from weightprep.errors import InputError
from weightprep.pipeline import build
from weightprep.sources import Source, epoch_keys
from weightprep.stages.split import record_keys

_F32_MAX = float(np.finfo(np.float32).max)


def _docs(lengths: list[int], first_line: int, weights: list[float] | None = None) -> Documents:
    """Documents whose ``lines`` number them from ``first_line`` (an id) and whose tokens spell that id."""
    lines = np.arange(first_line, first_line + len(lengths), dtype=np.int64)
    ids = np.concatenate([np.full(n, line, dtype=np.int32) for n, line in zip(lengths, lines, strict=True)] or [[]])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    w = np.asarray(weights if weights is not None else np.ones(int(offsets[-1])), dtype=np.float32)
    return Documents(input_ids=ids.astype(np.int32), weights=w, offsets=offsets, lines=lines)


# ---- the interleave: (t, source, order read), released once every source has read past t ------------------------


@st.composite
def _schedules(draw):
    """A read schedule of a mixed part, as ``run_mixed`` drives ``_Interleave``: sources (ids with gaps) read in
    any order, each block adding documents at ascending ``t`` within [share before, share after] (a block may
    have no width: a compressed file's share is stuck while it is read), then releasing at its share after; each
    source ends with a release at infinity. Shares are multiples of 1/8 and t of 1/32, so ties are frequent."""
    sources = draw(st.lists(st.integers(0, 4), min_size=1, max_size=3, unique=True))
    share = dict.fromkeys(sources, 0)  # in 32nds
    active = sorted(sources)
    steps = []
    for _ in range(draw(st.integers(0, 12))):
        if not active:
            break
        s = draw(st.sampled_from(active))
        if draw(st.integers(0, 5)) == 0:
            steps.append(("end", s, None))
            active.remove(s)
            continue
        before = share[s]
        after = min(32, before + 4 * draw(st.integers(0, 3)))
        n = draw(st.integers(0, 4))
        t = sorted(draw(st.lists(st.integers(before, after), min_size=n, max_size=n)))
        lengths = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
        times = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
        steps.append(("block", s, (before, after, t, lengths, times)))
        share[s] = after
    rest = draw(st.permutations(active))
    steps += [("end", s, None) for s in rest]
    return sources, steps


def _run_schedule(sources, steps):
    """Drive ``_Interleave``; returns the released stream as (line, t, source, times) and checks every release
    against the rule: what goes out is exactly what waits with t below every source's share read."""
    mix = _Interleave(sorted(sources))
    frontier = dict.fromkeys(sources, 0.0)
    waiting: dict[int, tuple[float, int, int]] = {}  # line -> (t, source, times)
    stream: list[tuple[int, float, int, int]] = []
    line = 0
    for kind, s, block in steps:
        if kind == "block":
            before, after, t32, lengths, times = block
            t = np.asarray(t32, dtype=np.float64) / 32
            docs = _docs(lengths, line)
            for i, ti in enumerate(t.tolist()):
                waiting[line + i] = (ti, s, times[i])
            mix.add(s, t, docs, np.asarray(times, dtype=np.int64))
            line += len(lengths)
            share = after / 32
        else:
            share = math.inf
        frontier[s] = share
        released = mix.release(s, share)
        bound = min(frontier.values())
        due = sorted(k for k, (t, _, _) in waiting.items() if t < bound)
        if released is None:
            assert not due, f"{due} are past every source's share {bound} but were not released"
            continue
        docs, times = released
        assert len(docs) == len(times) > 0
        got = docs.lines.tolist()
        assert sorted(got) == due, f"released {got}, due {due} (bound {bound})"
        for d, doc_line in enumerate(got):
            # the tokens and the copies of each document travel with it
            assert docs.input_ids[docs.offsets[d] : docs.offsets[d + 1]].tolist() == [doc_line] * int(docs.lengths[d])
            t, src, copies = waiting.pop(doc_line)
            assert int(times[d]) == copies
            stream.append((doc_line, t, src, copies))
    assert not waiting, f"never released: {sorted(waiting)}"
    return stream


@settings(max_examples=150, deadline=None)
@given(_schedules())
def test_the_interleave_releases_every_document_in_t_source_read_order(schedule):
    sources, steps = schedule
    stream = _run_schedule(sources, steps)
    # the reference: every document of the part, sorted by (t, source, order read); lines number them as read
    reference = sorted(stream, key=lambda d: (d[1], d[2], d[0]))
    assert [d[0] for d in stream] == [d[0] for d in reference]


def _order(steps, sources=(0, 1)):
    return [d[0] for d in _run_schedule(list(sources), steps)]


def test_a_tie_in_t_goes_to_the_earlier_source_even_when_it_is_read_later():
    # source 1 reads its whole slice first (t = 1/4, 3/4); source 0 then gives a document at 3/4 too: it goes first
    steps = [("block", 0, (0, 16, [4, 12], [1, 1], [1, 1])), ("block", 1, (0, 32, [8, 24], [1, 1], [1, 1])),
             ("block", 0, (16, 32, [24], [1], [1])), ("end", 0, None), ("end", 1, None)]  # fmt: skip
    assert _order(steps) == [0, 2, 1, 4, 3]


def test_documents_of_one_source_at_one_t_keep_the_order_read_across_blocks():
    # a compressed file's share stops at its end after its first block: the blocks after it all have t = 1
    steps = [("block", 0, (0, 32, [32, 32], [1, 2], [1, 1])), ("block", 0, (32, 32, [32, 32, 32], [1, 1, 1], [1, 2, 1])),
             ("block", 0, (32, 32, [32], [3], [1])), ("end", 0, None)]  # fmt: skip
    assert _order(steps, sources=(0,)) == [0, 1, 2, 3, 4, 5]
    steps = [("block", 1, (0, 32, [32], [1], [1])), ("block", 1, (32, 32, [32, 32], [1, 1], [1, 1])),
             ("block", 0, (0, 32, [32], [1], [1])), ("block", 0, (32, 32, [32], [1], [1])),
             ("end", 1, None), ("end", 0, None)]  # fmt: skip
    assert _order(steps) == [3, 4, 0, 1, 2]


def test_a_document_at_a_sources_share_waits_until_that_source_reads_past_it():
    mix = _Interleave([0, 1])
    mix.add(1, np.array([0.5]), _docs([2], 10), np.array([1]))
    assert mix.release(1, 1.0) is None  # source 0 has read nothing
    assert mix.release(0, 0.5) is None  # source 0 is at 0.5, not past it: it may still give t = 0.5
    mix.add(0, np.array([0.5]), _docs([1], 20), np.array([2]))  # a block without width, at its share
    docs, times = mix.release(0, 0.75)
    assert docs.lines.tolist() == [20, 10] and times.tolist() == [2, 1]


def test_a_release_cuts_a_block_at_the_bound_and_keeps_its_tail():
    mix = _Interleave([0, 1])
    mix.add(0, np.array([0.1, 0.3, 0.6, 0.9]), _docs([1, 2, 3, 1], 0), np.array([1, 2, 1, 3]))
    mix.add(1, np.array([0.2, 0.7]), _docs([2, 2], 4), np.array([1, 1]))
    assert mix.release(1, 0.5) is None  # source 0 has read nothing yet
    docs, times = mix.release(0, 0.65)  # both past 0.5
    assert docs.lines.tolist() == [0, 4, 1] and times.tolist() == [1, 1, 2]
    assert docs.lengths.tolist() == [1, 2, 2]
    assert mix.release(0, math.inf) is None  # source 1 is still at 0.5
    docs, times = mix.release(1, math.inf)
    assert docs.lines.tolist() == [2, 5, 3] and times.tolist() == [1, 1, 3]
    assert docs.lengths.tolist() == [3, 2, 1]
    assert mix.release(1, math.inf) is None


def _fixed_lines(tag: str, n: int, width: int) -> str:
    """``n`` records of exactly ``width`` bytes a line each (``<tag.r>`` then filler), so a block of ``block_bytes``
    holds exactly ``block_bytes // width`` of them."""
    lines = []
    for r in range(n):
        head = json.dumps({"pieces": [{"text": f"<{tag}.{r}> ", "weight": 1.0}]})
        filler = "lorem ipsum dolor sit amet "
        room = width - len(head) - 1
        text = f"<{tag}.{r}> " + (filler * 50)[: room - 1] + "."
        line = json.dumps({"pieces": [{"text": text, "weight": 1.0}]})
        assert len(line) == width - 1, (len(line), width)
        lines.append(line + "\n")
    return "".join(lines)


def _unpacked_tags(out: Path, tok) -> list[tuple[str, int]]:
    import pyarrow as pa

    tags = []
    for shard in sorted(out.glob("data-*.arrow")):
        with pa.memory_map(str(shard)) as f:
            for row in pa.ipc.open_stream(f).read_all().to_pylist():
                text = tok.decode([i for i, m in zip(row["input_ids"], row["attention_mask"], strict=True) if m])
                found = re.findall(r"<(\w+)\.(\d+)>", text)
                assert len(found) == 1, text  # unpacked: one document a row
                tags.append((found[0][0], int(found[0][1])))
    return tags


def test_a_builds_documents_go_on_in_t_source_read_order(tmp_path, sample_tok):
    """Shares that are exact binary fractions make the order known in advance: 16 records of 256 bytes (4 a block
    of 1024 bytes) in source ``a``, 16 of 128 bytes (8 a block) in ``b`` and 4 of 1024 bytes (one a block) in
    ``c``, so record r is at t = (r + 1/2) / N of its source's N records, and ``b`` reads records 4-7 before
    ``a`` does: ties go to ``a``, the earlier source. A compressed source ``z`` goes on in the order read."""
    a = tmp_path / "a.jsonl"
    a.write_text(_fixed_lines("a", 16, 256), encoding="utf-8")
    b = tmp_path / "b.jsonl"
    b.write_text(_fixed_lines("b", 16, 128), encoding="utf-8")
    c = tmp_path / "c.jsonl"
    c.write_text(_fixed_lines("c", 4, 1024), encoding="utf-8")
    z = tmp_path / "z.jsonl.gz"
    with gzip.open(z, "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps({"pieces": [{"text": f"<z.{r}> zeta {r % 7}", "weight": 1.0}]}) + "\n"
                        for r in range(150)))  # fmt: skip
    cfg = config_from_dict({"pack": {"seq_len": 1024, "enabled": False}, "read": {"block_bytes": 1024}})
    sources = [Source("a", (str(a),)), Source("b", (str(b),)), Source("c", (str(c),)), Source("z", (str(z),))]
    build([], tmp_path / "out", cfg, tokenizer=sample_tok, sources=sources, executor=SerialExecutor())
    tags = _unpacked_tags(tmp_path / "out", sample_tok)
    records = {"a": 16, "b": 16, "c": 4, "z": 150}
    assert Counter(t for t, _ in tags) == records
    plain = [tag for tag in tags if tag[0] != "z"]
    assert plain == sorted(plain, key=lambda tag: ((tag[1] + 0.5) / records[tag[0]], tag[0]))  # (t, source)
    assert [r for t, r in tags if t == "z"] == list(range(150))  # one source: the order read


def _write_source(path: Path, texts: list[str], kind: str) -> None:
    """``texts`` as records of one piece: a ``text`` column in batches (row groups) of 64 rows (Parquet, an Arrow
    stream as ``datasets`` writes, an Arrow file), or compressed JSON lines."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if kind in ("gz", "zst"):
        data = "".join(json.dumps({"pieces": [{"text": t, "weight": 1.0}]}) + "\n" for t in texts).encode()
        path.write_bytes(gzip.compress(data) if kind == "gz" else __import__("zstandard").compress(data))
        return
    table = pa.table({"text": texts})
    if kind == "parquet":
        pq.write_table(table, path, row_group_size=64)
        return
    with pa.OSFile(str(path), "wb") as f:
        writer = pa.ipc.new_stream(f, table.schema) if kind == "stream" else pa.ipc.new_file(f, table.schema)
        for batch in table.to_batches(max_chunksize=64):
            writer.write_batch(batch)
        writer.close()


_SUFFIX = {"parquet": "parquet", "stream": "arrow", "file": "arrow", "gz": "jsonl.gz", "zst": "jsonl.zst"}


@pytest.mark.parametrize("kind", list(_SUFFIX))
def test_a_columnar_or_compressed_source_is_mixed_in_proportion_to_what_it_has_read(kind, tmp_path, sample_tok):
    """A source whose bytes behind a block are not its offset: a Parquet or Arrow file read in batches of 64 rows
    (its share: of rows, of the stream's bytes, of batches) and a compressed file, whose buffers read far ahead of
    the blocks (its share: the compressed bytes consumed, in proportion to the decompressed bytes handed on). Its
    256 records spread over the part like the 16 lines of a JSONL source: before line r of ``a`` (t = (r + 1/2) /
    16) come about 256 t of them. (Before, a columnar file's share was 0 until its end and a small compressed
    file's 1 after its first block: all of it first, or all of it after its first block at the end.)"""
    a = tmp_path / "a.jsonl"
    a.write_text(_fixed_lines("a", 16, 256), encoding="utf-8")
    q = tmp_path / f"q.{_SUFFIX[kind]}"
    _write_source(q, [f"<q.{r}> kappa {r % 5}" for r in range(256)], kind)
    cfg = config_from_dict({"pack": {"seq_len": 1024, "enabled": False}, "read": {"block_bytes": 1024}})
    build([], tmp_path / "out", cfg, tokenizer=sample_tok, sources=[Source("a", (str(a),)), Source("q", (str(q),))],
          executor=SerialExecutor())  # fmt: skip
    tags = _unpacked_tags(tmp_path / "out", sample_tok)
    assert Counter(t for t, _ in tags) == {"a": 16, "q": 256}
    assert [r for t, r in tags if t == "q"] == list(range(256))
    before = [sum(t == "q" for t, _ in tags[:i]) for i, tag in enumerate(tags) if tag[0] == "a"]
    expected = [256 * (r + 0.5) / 16 for r in range(16)]
    # exact for rows and batches; bytes are not rows: an Arrow stream's schema, a compressed file's header and its
    # shorter first lines (<q.0> ... <q.9>)
    slack = 0 if kind in ("parquet", "file") else 4
    assert all(abs(got - want) <= slack for got, want in zip(before, expected, strict=True)), (before, expected)


# ---- a weight that the source's weight takes beyond float32 names its record -----------------------------------

# piece weights (each valid alone) that a source's weight may take past float32's largest, and its edges: the
# largest itself and a value a hair above it, which the float32 cast rounds down to it (accepted)
_piece_weights = st.sampled_from([0.0, 0.25, 1.0, 3.0, 1e30, 1e37, 3e38, _F32_MAX, _F32_MAX / 2, _F32_MAX / 3])
_record = st.one_of(st.lists(_piece_weights, min_size=0, max_size=3), st.sampled_from(["chat", "bad chat"]))


def _records(rows: list) -> Records:
    """A block of piece records (a list of piece weights) and rendered conversations (no pieces; ``bad chat``:
    a token weight that is inf), on lines 3, 5, 7, ..."""
    weights, offsets, chats = [], [0], []
    for row in rows:
        if isinstance(row, str):
            w = np.array([1.0, np.inf if row == "bad chat" else 2.0], dtype=np.float32)
            chats.append(ChatTokens(np.array([1, 2], dtype=np.int32), w, None, np.zeros(2, dtype=np.int32)))
        else:
            weights += row
            chats.append(None)
        offsets.append(len(weights))
    return Records(
        path="in.jsonl", lines=np.arange(3, 3 + 2 * len(rows), 2, dtype=np.int64), texts=["x"] * len(weights),
        piece_weights=np.array(weights, dtype=np.float64), piece_offsets=np.array(offsets, dtype=np.int64),
        chats=chats if any(c is not None for c in chats) else None,
    )  # fmt: skip


def _fits_float32(x: float) -> bool:
    with np.errstate(over="ignore"):
        return bool(np.isfinite(np.float32(x)))


@settings(max_examples=120, deadline=None)
@given(rows=st.lists(_record, min_size=1, max_size=5),
       weight=st.sampled_from([0.0, 0.5, 1.0 + 2**-30, 2.0, 3.0, 1e8, 4.0 / 3.0]))  # fmt: skip
def test_a_weight_beyond_float32_after_scaling_names_its_first_record(rows, weight):
    source = Source("mathy", ("in.jsonl",), weight)
    records = _records(rows)

    def bad(row) -> bool:  # the rule, from the weights: float32(W * w) not finite, or a conversation's inf
        if isinstance(row, str):
            return row == "bad chat"
        return not all(_fits_float32(weight * w) for w in row)

    first = next((r for r, row in enumerate(rows) if bad(row)), None)
    if first is None:
        scaled = _scaled(records, source)
        assert scaled.piece_weights.tolist() == [weight * w for w in records.piece_weights.tolist()]
        assert scaled.piece_offsets.tolist() == records.piece_offsets.tolist() and scaled.chats == records.chats
        return
    with pytest.raises(InputError) as caught:
        _scaled(records, source)
    error = caught.value
    assert (error.path, error.line, error.field, error.reason) == ("in.jsonl", 3 + 2 * first, "weight", "bad_weight")
    assert "beyond float32's largest" in error.problem and f"source 'mathy''s weight {weight}" in error.problem


def test_the_float32_edge_of_a_scaled_weight():
    def scaled(w: float, weight: float = 2.0) -> Records:
        return _scaled(_records([[1.0], [w], [1.0]]), Source("s", ("in.jsonl",), weight))

    assert scaled(_F32_MAX / 2).piece_weights[1] == _F32_MAX  # the largest itself
    hair = _F32_MAX * (1 + 2.0**-26)  # rounds down to the largest in the cast
    assert _fits_float32(hair) and scaled(hair / 2).piece_weights[1] == hair
    for over in (_F32_MAX, _F32_MAX * (1 + 2.0**-23) / 2):  # 2x the largest; one float32 step past it
        with pytest.raises(InputError) as caught:
            scaled(over)
        assert caught.value.line == 5
    assert _scaled(_records([[3e38]]), Source("s", ("in.jsonl",), 1.0)).piece_weights.tolist() == [3e38]


def test_the_record_named_is_the_one_holding_the_piece_after_records_without_pieces():
    # piece offsets repeat where a record has no piece (a conversation): the bad piece is the first of line 9
    records = _records([[1.0], "chat", "chat", [1e38, 1.0], [1e30]])
    with pytest.raises(InputError) as caught:
        _check_scaled(_times(records, 10.0), Source("s", ("in.jsonl",), 10.0))
    assert caught.value.line == 9
    with pytest.raises(InputError) as caught:  # a conversation before it is named first
        _check_scaled(_records([[1.0], "bad chat", [np.inf]]), Source("s", ("in.jsonl",), 10.0))
    assert caught.value.line == 5
    with pytest.raises(InputError) as caught:
        _check_scaled(_records([[1.0], [1.0], [np.inf], "bad chat"]), Source("s", ("in.jsonl",), 10.0))
    assert caught.value.line == 7


def _times(records: Records, weight: float) -> Records:
    """``records`` with their piece weights times ``weight`` (what ``_scaled`` hands ``_check_scaled``)."""
    return dataclasses.replace(records, piece_weights=records.piece_weights * weight)


def test_a_build_refuses_a_piece_weight_that_its_sources_weight_takes_beyond_float32(tmp_path, sample_tok):
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"text": f"fine {i}"}) + "\n" for i in range(5)), encoding="utf-8")
    pieces = [{"pieces": [{"text": f"piece {i}", "weight": 1e37 if i == 3 else 1.0}]} for i in range(6)]
    big = tmp_path / "big.jsonl"
    big.write_text("".join(json.dumps(r) + "\n" for r in pieces), encoding="utf-8")
    with pytest.raises(InputError) as caught:
        build([], tmp_path / "out", config_from_dict({"pack": {"seq_len": 64}}), tokenizer=sample_tok,
              sources=[Source("good", (str(good),)), Source("big", (str(big),), 100.0)],
              executor=SerialExecutor())  # fmt: skip
    assert caught.value.path == str(big) and caught.value.line == 4 and caught.value.reason == "bad_weight"
    assert "source 'big''s weight 100.0" in str(caught.value)
    assert not (tmp_path / "out").exists()


# ---- the counts of written and repeated documents ---------------------------------------------------------------


def _docs_of(spec: list[tuple[int, int, float]]) -> Documents:
    """Documents of (tokens, supervised tokens, weight of each token) each; weights in eighths (exact sums)."""
    lengths = [n for n, _, _ in spec]
    labels = np.concatenate([[7] * k + [IGNORE_INDEX] * (n - k) for n, k, _ in spec] or [[]]).astype(np.int32)
    weights = [w for n, _, w in spec for _ in range(n)]
    docs = _docs(lengths, 0, weights)
    return Documents(docs.input_ids, docs.weights, docs.offsets, docs.lines, labels=labels)


_doc = st.tuples(st.integers(1, 5), st.integers(0, 5), st.integers(0, 40).map(lambda x: x / 8)).map(
    lambda d: (d[0], min(d[1], d[0]), d[2])
)


@settings(max_examples=60, deadline=None)
@given(blocks=st.lists(st.lists(st.tuples(_doc, st.integers(0, 3)), max_size=5), min_size=1, max_size=3))
def test_written_and_repeated_counts_add_up_over_blocks(blocks):
    """Each block's documents (one a record, ``copies`` each) add to one source's counters: written = what the
    copies write, repeats/omitted = copies beyond one / records with none, the net repeated = copies - 1."""
    counts: Counter = Counter()
    want: Counter = Counter()
    for block in blocks:
        docs = _docs_of([d for d, _ in block])
        copies = np.array([c for _, c in block], dtype=np.int64)
        _count_written(docs, copies, counts)
        _count_repeats(docs, copies, copies, counts)
        for (n, k, w), c in block:
            want["documents_written"] += c
            want["tokens"] += n * c
            want["supervised_tokens"] += k * c
            want["total_weight"] += n * w * c
            want["repeats"] += max(c - 1, 0)
            want["omitted"] += c == 0
            want["documents_repeated"] += c - 1
            want["tokens_repeated"] += n * (c - 1)
            want["weight_repeated"] += n * w * (c - 1)
    for key in want.keys() | counts.keys():
        assert counts[key] == want[key], key


@settings(max_examples=40, deadline=None)
@given(st.lists(_doc, max_size=6))
def test_doc_weights_are_each_documents_float64_sum(spec):
    weights = _doc_weights(_docs_of(spec))
    assert weights.dtype == np.float64 and weights.tolist() == [n * w for n, _, w in spec]


def test_no_documents_have_no_weights():
    empty = _docs_of([])
    assert _doc_weights(empty).shape == (0,) and _doc_weights(empty).dtype == np.float64
    counts: Counter = Counter()
    _count_repeats(empty, np.zeros(0, dtype=np.int64), np.array([0, 2]), counts)  # two records, none kept
    assert counts["weight_repeated"] == 0 and isinstance(counts["weight_repeated"], float)
    assert counts["omitted"] == 1 and counts["repeats"] == 1


# ---- the bytes of a source that a block has consumed ------------------------------------------------------------


@pytest.mark.parametrize("part_bytes", [1 << 20, 3000])
def test_each_block_gives_the_bytes_of_its_source_read_in_the_part(tmp_path, part_bytes):
    """Lines of one width per file make the reference plain: a block ends after line ``n`` of its segment, so the
    source has consumed its earlier segments in this part and ``n`` lines of this one."""
    widths = {"a1": 64, "a2": 128, "a3": 256, "b1": 128}
    paths = {}
    for name, width in widths.items():
        paths[name] = tmp_path / f"{name}.jsonl"
        paths[name].write_text(_fixed_lines(name, 24 if name != "a3" else 8, width), encoding="utf-8")
    cfg = config_from_dict({"read": {"block_bytes": 1024}})
    parts = plan_mixed([[str(paths[n]) for n in ("a1", "a2", "a3")], [str(paths["b1"])]], part_bytes)
    assert (len(parts) == 1) == (part_bytes > 10_000)
    width_of = {str(p): widths[n] for n, p in paths.items()}
    seen_bytes = [0, 0]
    for part in parts:
        for s in (0, 1):
            files: dict = {}
            mine = [j for j, src in enumerate(part.sources) if src == s]
            blocks = list(_source_blocks(part, s, files, cfg, None))
            assert sorted(files) == mine and sorted({j for j, *_ in blocks}) == mine
            for j, records, rejects, consumed in blocks:
                seg = part.segments[j]
                earlier = sum(part.segments[i].size for i in mine if i < j)
                assert not rejects and consumed == earlier + int(records.lines[-1]) * width_of[seg.path]
            total = sum(part.segments[i].size for i in mine)
            assert blocks[-1][3] == total
            seen_bytes[s] += total
    assert seen_bytes == [24 * 64 + 24 * 128 + 8 * 256, 24 * 128]


# ---- the epoch pass ---------------------------------------------------------------------------------------------


def _plain_records(n: int, tag: str = "r") -> Records:
    return Records(path="in.jsonl", lines=np.arange(1, n + 1, dtype=np.int64), texts=[f"{tag} {i}" for i in range(n)],
                   piece_weights=np.ones(n), piece_offsets=np.arange(n + 1, dtype=np.int64))  # fmt: skip


def test_the_training_records_of_a_cut_are_those_whose_key_is_not_below_it():
    records = _plain_records(40)
    keys = record_keys(records, 7)
    order = np.argsort(keys)
    for cut in (None, 0, int(keys[order[0]]), int(keys[order[17]]), int(keys[order[17]]) + 1, 1 << 63,
                int(keys[order[-1]]), (1 << 64) - 1, 1 << 64):  # fmt: skip
        train, train_keys = _train_records(records, cut, 7)
        kept = [i for i in range(40) if cut is None or int(keys[i]) >= cut]  # held out: key below the cut
        assert train.texts == [records.texts[i] for i in kept] and train_keys.tolist() == keys[kept].tolist()
    assert int(keys.max()) >= (1 << 63)  # the cut at 2**63 splits them (SplitMix-like keys spread over 64 bits)


@pytest.mark.parametrize("fraction", [0.001, 0.1, 0.5, 0.9, 0.999])
def test_a_part_keeps_its_share_of_keys_and_six_standard_deviations_more(fraction):
    for count in (0, 1, 4, 30, 100, 1000, 10**6):
        kept = _kept(count, fraction)
        sigma = math.sqrt(count * fraction * (1 - fraction))  # of its count below the cut, keys spread evenly
        assert isinstance(kept, int) and min(count, fraction * count + 6 * sigma) <= kept <= count


def _job(cfg, sources):
    return SimpleNamespace(cfg=cfg, sources=sources, worker=None)


def _file_records(path: Path) -> Records:
    """A file's records, as the validate stage makes them from its ``pieces`` (the reference's own parse)."""
    texts, weights, offsets = [], [], [0]
    for line in path.read_text(encoding="utf-8").splitlines():
        for piece in json.loads(line)["pieces"]:
            texts.append(piece["text"])
            weights.append(piece["weight"])
        offsets.append(len(texts))
    return Records(str(path), np.arange(1, len(offsets), dtype=np.int64), texts, np.array(weights, dtype=np.float64),
                   np.array(offsets, dtype=np.int64))  # fmt: skip


def _segment_keys(part, s: int, records_of: dict[str, Records], seed: int) -> np.ndarray:
    """The split keys of source ``s``'s records in ``part``, from the files' own records and the segments' lines."""
    keys = []
    for seg, src in zip(part.segments, part.sources, strict=True):
        if src == s:
            records = records_of[seg.path]
            text = Path(seg.path).read_bytes()
            first = text[: seg.start].count(b"\n")
            n = text[seg.start : seg.end].count(b"\n")
            keys.append(record_keys(records.where(np.isin(np.arange(len(records)), np.arange(first, first + n))), seed))
    return np.concatenate(keys) if keys else np.zeros(0, np.uint64)


def test_each_part_returns_its_training_records_and_smallest_epoch_keys(tmp_path):
    paths = []
    for i, n in enumerate((60, 25, 40)):
        path = tmp_path / f"s{i}.jsonl"
        path.write_text(_fixed_lines(f"s{i}", n, 128), encoding="utf-8")
        paths.append(path)
    records_of = {str(p): _file_records(p) for p in paths}
    cfg = config_from_dict({"read": {"block_bytes": 1024}, "split": {"seed": 3}})
    sources = [Source("s0", (str(paths[0]),), 1.0, 1.3), Source("s1", (str(paths[1]),), 1.0, 2.0),
               Source("s2", (str(paths[2]),), 1.0, 0.5)]  # fmt: skip
    parts = plan_mixed([[str(p)] for p in paths], 6000)
    assert len(parts) == 3
    all_keys = [[], [], []]
    for part in parts:
        for cut, n in ((None, None), ([None, None, 1 << 62], None), (None, [5, 0, 70]), ([1 << 63, None, 0], [3, 9, 1])):
            result = part_epoch_keys(_job(cfg, sources), part, cut, n)
            assert result["index"] == part.index
            assert result["records"][1] == 0 and result["keys"][1] == []  # whole epochs: nothing to find
            for s in (0, 2):
                split = _segment_keys(part, s, records_of, 3)
                train = split if cut is None or cut[s] is None else split[split >= np.uint64(cut[s])]
                smallest = sorted(int(k) for k in epoch_keys(train))
                take = min(n[s], len(train)) if n is not None else _kept(len(train), sources[s].epochs % 1)
                assert result["records"][s] == len(train) and result["keys"][s] == smallest[:take]
                if cut is None and n is None:
                    all_keys[s] += smallest
            lines = [Path(seg.path).read_bytes()[seg.start : seg.end].count(b"\n") if src != 1 else 0
                     for seg, src in zip(part.segments, part.sources, strict=True)]  # fmt: skip
            assert [i["lines"] for i in result["inputs"]] == lines
    assert [len(k) for k in all_keys] == [60, 0, 40]


def test_the_first_pass_of_validation_records_gives_each_sources_count_and_smallest_keys(tmp_path):
    paths = []
    for i, n in enumerate((30, 12)):
        path = tmp_path / f"s{i}.jsonl"
        path.write_text(_fixed_lines(f"s{i}", n, 128), encoding="utf-8")
        paths.append(path)
    records_of = {str(p): _file_records(p) for p in paths}
    sources = [Source("s0", (str(paths[0]),)), Source("s1", (str(paths[1]),))]
    for wanted in (None, 4):
        cfg = config_from_dict({"read": {"block_bytes": 1024}, "split": {"seed": 5, "validation_records": wanted}})
        for part in plan_mixed([[str(p)] for p in paths], 2500):
            result = mixed_keys(_job(cfg, sources), part, render=False)
            assert result["index"] == part.index
            for s in (0, 1):
                keys = sorted(int(k) for k in _segment_keys(part, s, records_of, 5))
                assert result["records"][s] == len(keys)
                assert sorted(result["keys"][s]) == keys[: wanted or 0]
            assert [i["lines"] for i in result["inputs"]] == [
                Path(seg.path).read_bytes()[seg.start : seg.end].count(b"\n") for seg in part.segments]


_epochs = st.sampled_from([1.0, 2.0, 0.5, 1.5, 0.3, 2.7, 0.01, 0.999])


@settings(max_examples=150, deadline=None)
@given(data=st.data(), epochs=st.lists(_epochs, min_size=1, max_size=3), n_parts=st.integers(1, 3))
def test_the_epoch_cut_is_one_above_the_round_f_n_th_smallest_key_of_every_part(data, epochs, n_parts):
    """Each part returns, per source, its count and some of its smallest keys (all, a few: the first pass; the
    round(f * N) smallest: the exact pass). The cut is known exactly or asked for again, never wrong."""
    sources = [Source(f"s{s}", ("x",), 1.0, e) for s, e in enumerate(epochs)]
    keys = [[sorted(data.draw(st.lists(st.integers(0, 60), max_size=8))) for _ in sources] for _ in range(n_parts)]
    exact = data.draw(st.booleans())
    results = []
    for part_keys in keys:
        if exact:  # each part's smallest round(f * N) keys
            kept = [k[: math.floor((e % 1) * sum(len(p[s]) for p in keys) + 0.5)] for s, (k, e) in
                    enumerate(zip(part_keys, epochs, strict=True))]  # fmt: skip
        else:
            kept = [k[: data.draw(st.integers(0, len(k)))] for k in part_keys]
        results.append({"records": [len(k) for k in part_keys], "keys": kept})
    cuts, again = epoch_cuts_from(sources, results)
    assert len(cuts) == len(sources) and again == sorted(again)
    for s, e in enumerate(epochs):
        every = sorted(k for part_keys in keys for k in part_keys[s])
        k = math.floor((e % 1) * len(every) + 0.5)  # round(f * N), halves up
        if e % 1 == 0:
            assert cuts[s] is None and s not in again  # whole epochs: no cut
        elif k == 0:
            assert cuts[s] == 0 and s not in again  # nobody gets a copy more
        elif cuts[s] is None:
            assert s in again and not exact  # the exact pass always knows
            assert any(len(r["keys"][s]) < r["records"][s] for r in results)  # a part kept fewer than it has
        else:
            assert s not in again and cuts[s] == every[k - 1] + 1
            assert sum(key < cuts[s] for key in every) >= k
        if all(len(r["keys"][s]) == r["records"][s] for r in results):
            assert s not in again  # every key seen


# ---- one mixed part, run here: splits, copies, rejects, progress and a clean failure -------------------------------


def _split_tags(directory: Path, tok) -> Counter:
    """How often each ``<tag.r>`` document is in the rows (packed or not) of ``directory``'s shards."""
    import pyarrow as pa

    found: Counter = Counter()
    for shard in sorted(directory.glob("shard-*.arrow")):
        with pa.memory_map(str(shard)) as f:
            for row in pa.ipc.open_stream(f).read_all().to_pylist():
                start = 0
                for n in row["seq_lengths"]:
                    tags = re.findall(r"<(\w+)\.(\d+)>", tok.decode(row["input_ids"][start : start + n]))
                    assert len(tags) <= 1
                    found.update((t, int(r)) for t, r in tags)
                    start += n
    return found


def _mixed_inputs(tmp_path: Path, bad_line: int | None, records: tuple[int, int, int] = (16, 14, 10)):
    """Sources a (epochs 2), b (0.5, with a malformed line when ``bad_line``) and c (1), lines of 128 bytes."""
    texts = {name: _fixed_lines(name, n, 128) for name, n in zip("abc", records, strict=True)}
    if bad_line is not None:
        lines = texts["b"].splitlines(keepends=True)
        texts["b"] = "".join(lines[: bad_line - 1] + ["{not json\n"] + lines[bad_line - 1 :])
    paths = {}
    for name, text in texts.items():
        paths[name] = tmp_path / f"{name}.jsonl"
        paths[name].write_text(text, encoding="utf-8")
    sources = [Source("a", (str(paths["a"]),), 1.0, 2.0), Source("b", (str(paths["b"]),), 1.0, 0.5),
               Source("c", (str(paths["c"]),), 1.0, 1.0)]  # fmt: skip
    return paths, sources


def _tag_keys(path: Path, seed: int) -> dict[int, int]:
    """Each record's split key by its tag's number (the records of the file's valid lines, parsed here)."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith('{"')]
    texts = [json.loads(line)["pieces"][0]["text"] for line in lines]
    records = Records(str(path), np.arange(1, len(texts) + 1, dtype=np.int64), texts, np.ones(len(texts)),
                      np.arange(len(texts) + 1, dtype=np.int64))  # fmt: skip
    keys = record_keys(records, seed)
    return {int(re.search(r"\.(\d+)>", text).group(1)): int(key) for text, key in zip(texts, keys, strict=True)}


@pytest.mark.parametrize(("validation", "packed"), [(True, True), (False, False)])
def test_a_mixed_part_writes_each_split_its_copies_and_its_rejects(tmp_path, sample_tok, validation, packed):
    from weightprep.distribute.job import PartJob
    from weightprep.distribute.mixed import run_mixed

    seed = 11
    paths, sources = _mixed_inputs(tmp_path, bad_line=5)
    keys = {name: _tag_keys(paths[name], seed) for name in "abc"}
    a_high = min(k for k in keys["a"].values() if k >= 1 << 63)  # a cut in the upper half, at a record's own key
    cut = [a_high, 0, 1 << 64] if validation else None  # c: every record held out
    held = {name: {r for r, k in keys[name].items() if cut is not None and k < cut[s]} for s, name in enumerate("abc")}
    if validation:  # a: some held out, its cut's own record not; b: none; c: all
        assert 0 < len(held["a"]) < 15 and min(keys["a"], key=lambda r: abs(keys["a"][r] - a_high)) not in held["a"]
        assert held["b"] == set() and len(held["c"]) == 10
    b_train = sorted(epoch_keys(np.array([k for r, k in keys["b"].items() if r not in held["b"]], dtype=np.uint64)))
    epoch_cut = int(b_train[len(b_train) // 2])  # epochs 0.5: half of b's training records get their one copy
    copies = {
        "a": {r: 0 if r in held["a"] else 2 for r in keys["a"]},
        "b": {r: 0 if r in held["b"] else int(int(epoch_keys(np.array([k], dtype=np.uint64))[0]) < epoch_cut)
              for r, k in keys["b"].items()},
        "c": {r: 0 if r in held["c"] else 1 for r in keys["c"]},
    }  # fmt: skip
    split = {"train": "train", **{name: f"validation_{name}" for name in "abc"}} if validation else {"train": ""}
    cfg = config_from_dict({"pack": {"seq_len": 512, "enabled": packed}, "read": {"block_bytes": 1024},
                            "split": {"seed": seed}, "validate": {"on_invalid": "skip"}})  # fmt: skip
    job = PartJob(cfg, sample_tok, tmp_path / "work", cut, sources=sources)
    job.epoch_cuts = [None, epoch_cut, None]
    job.adopt(sample_tok)
    (part,) = plan_mixed([list(s.paths) for s in sources], 1 << 20)
    progress = []
    try:
        out = tmp_path / "part"
        out.mkdir()
        result = run_mixed(job, part, out, lambda size, accepted: progress.append((size, accepted["accepted"])))
    finally:
        job.release()
    train = _split_tags(out / split["train"] if validation else out, sample_tok)
    assert train == Counter({(name, r): n for name in "abc" for r, n in copies[name].items() if n})
    for s, name in enumerate("abc"):
        counts = result["sources"][s][split["train"]]
        train_records = [r for r in keys[name] if r not in held[name]]
        assert counts["accepted"] == len(train_records)
        assert counts["documents_written"] == sum(copies[name].values())
        assert counts.get("repeats", 0) == sum(max(n - 1, 0) for r, n in copies[name].items() if r not in held[name])
        assert counts.get("omitted", 0) == sum(copies[name][r] == 0 for r in train_records)
        if validation:
            written = _split_tags(out / f"validation_{name}", sample_tok)
            assert written == Counter({(name, r): 1 for r in held[name]})  # once each, never mixed
            assert result["sources"][s][f"validation_{name}"].get("documents_written", 0) == len(held[name])
            assert result["counts"][f"validation_{name}"].get("documents_written", 0) == len(held[name])
    rows = result["counts"][split["train"]]
    assert rows["documents_written"] == sum(train.values()) and rows["rows"] == sum(
        r for _, r in result["written"][split["train"]]["shards"])
    # the malformed line: skipped, counted for b alone, written to b's segment's rejects
    reasons = [json.loads(x)["reason"] for x in (out / "segment-00001" / "rejects.jsonl").read_text().splitlines()]
    assert len(reasons) == 1 and result["rejected"] == {reasons[0]: 1}
    assert result["source_rejected"] == [{}, {reasons[0]: 1}, {}]
    assert result["rejects_files"] == [None, "segment-00001/rejects.jsonl", None]
    assert json.loads((out / "segment-00001" / "rejects.jsonl").read_text())["line"] == 5
    assert [i["lines"] for i in result["inputs"]] == [16, 15, 10]
    # progress: the bytes read so far and the records accepted so far, to every one of them
    assert [a for _, a in progress] == sorted(a for _, a in progress) and progress[-1][1] == 16 + 14 + 10
    assert progress[-1][0] == sum(p.stat().st_size for p in paths.values())
    assert len(progress) >= 16 * 128 // 1024 + 14 * 128 // 1024 + 10 * 128 // 1024


def test_a_failing_part_leaves_no_thread_and_no_open_file(tmp_path, sample_tok):
    import os
    import threading

    from weightprep.distribute.job import PartJob
    from weightprep.distribute.mixed import run_mixed

    # strict: the bad line of b's second block raises, with many blocks still to read
    paths, sources = _mixed_inputs(tmp_path, bad_line=12, records=(80, 80, 80))
    cfg = config_from_dict({"pack": {"seq_len": 512, "enabled": False}, "read": {"block_bytes": 1024},
                            "split": {"seed": 1}})  # fmt: skip
    job = PartJob(cfg, sample_tok, tmp_path / "work", [1 << 62, 1 << 62, 1 << 62], sources=sources)
    job.adopt(sample_tok)
    (part,) = plan_mixed([list(s.paths) for s in sources], 1 << 20)
    out = tmp_path / "part"
    out.mkdir()
    skip = dataclasses.replace(cfg, validate=dataclasses.replace(cfg.validate, on_invalid="skip"))
    def open_under(directory: Path) -> list[str]:
        """The files under ``directory`` this process holds open (Linux's /proc; elsewhere not checked)."""
        links = []
        for fd in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else []:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
                links.append(os.readlink(f"/proc/self/fd/{fd}"))
        return [link for link in links if link.startswith(str(directory))]

    try:
        with pytest.raises(InputError) as caught:
            run_mixed(job, part, out, None)
        assert caught.value.line == 12
        # when the error comes out, what the part ran and wrote is stopped and closed (a worker retries the part, or
    # goes on to others: no thread left running, no file of the part's directory left open)
        assert not [t.name for t in threading.enumerate() if t.name.startswith("weightprep-")]
        assert not open_under(out)  # its shards
        # with --skip-invalid, the rejects files too (a write of rows that fails)
        out2 = tmp_path / "part2"
        out2.mkdir()
        job.cfg = skip
        with pytest.raises(ZeroDivisionError) as caught:  # the fourth block's progress fails (held: as above)
            run_mixed(job, part, out2, lambda size, accepted: 1 / (accepted["accepted"] < 24))
        assert not [t.name for t in threading.enumerate() if t.name.startswith("weightprep-")]
        assert not open_under(out2)  # its shards and rejects files
    finally:
        job.release()


def test_the_smallest_epoch_keys_of_a_large_part_and_of_a_part_without_the_source(tmp_path):
    """2,000 records: the smallest keys come from a partial selection (``np.partition``), whose boundary must be
    exactly ``n`` (234 and 236 are sizes where one off would be seen here, with seed 3); a compressed source goes whole
    to one part, so the other parts have none of its records."""
    big = tmp_path / "big.jsonl"
    big.write_text(_fixed_lines("big", 2000, 64), encoding="utf-8")
    small = tmp_path / "small.jsonl.gz"
    with gzip.open(small, "wt", encoding="utf-8") as f:
        f.write(_fixed_lines("small", 30, 64))
    cfg = config_from_dict({"read": {"block_bytes": 8192}, "split": {"seed": 3}})
    sources = [Source("big", (str(big),), 1.0, 1.3), Source("small", (str(small),), 1.0, 0.5)]
    parts = plan_mixed([[str(big)], [str(small)]], 50_000)
    assert len(parts) == 3 and [1 in p.sources for p in parts] == [True, False, False]
    every = sorted(int(k) for k in epoch_keys(_segment_keys(parts[1], 0, {str(big): _file_records(big)}, 3)))
    for n in ([234, 5], [236, 5], None):
        result = part_epoch_keys(_job(cfg, sources), parts[1], None, n)
        take = n[0] if n is not None else _kept(len(every), 0.3)
        assert 0 < take < len(every) and result["keys"][0] == every[:take]
        assert result["records"] == [len(every), 0] and result["keys"][1] == []
        assert [i["lines"] for i in result["inputs"]] == [len(every)]


def test_a_part_whose_kept_keys_end_below_the_union_s_kth_asks_again():
    """A part that kept fewer keys than it has may hold unseen ones below the k-th of the union: the cut is not
    known then (a guess from the union would give records beyond round(f * N) their copy)."""
    source = [Source("s", ("x",), 1.0, 1.5)]
    # full keys: [1, 2, 3, 50] and [10, 11]: k = 3, the cut is 4; the union of kept keys [1, 10, 11] says 12
    assert epoch_cuts_from(source, [{"records": [4], "keys": [[1]]}, {"records": [2], "keys": [[10, 11]]}]) == (
        [None], [0])
    # a part that kept none of its 4 keys, beside one that kept its 5: k = 5 of 9
    assert epoch_cuts_from(source, [{"records": [4], "keys": [[]]}, {"records": [5], "keys": [[10, 11, 12, 13, 14]]}]) == (
        [None], [0])
    # enough: the part's last kept key is at or past the union's k-th
    assert epoch_cuts_from(source, [{"records": [4], "keys": [[1, 2]]}, {"records": [2], "keys": [[2, 9]]}]) == ([3], [])


def test_a_mixed_parts_result_names_the_chat_template_as_a_plain_parts_does(tmp_path):
    """The first source holds no conversation (its chat stage rendered nothing): the template is the one the chat
    source's conversations were rendered with, as a plain part of that file says (the driver compares the parts')."""
    from chat_support import chat_tokenizer

    from weightprep.distribute.job import PartJob
    from weightprep.distribute.mixed import run_mixed
    from weightprep.distribute.plan import plan_parts

    tok = chat_tokenizer("chatml")
    pieces = tmp_path / "pieces.jsonl"
    pieces.write_text("".join(json.dumps({"text": f"plain {i}"}) + "\n" for i in range(3)), encoding="utf-8")
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q {i}"},
                                                      {"role": "assistant", "content": f"a {i}"}]}) + "\n"
                             for i in range(3)), encoding="utf-8")  # fmt: skip
    cfg = config_from_dict({"pack": {"seq_len": 128}})
    mixed = PartJob(cfg, tok, tmp_path / "work", sources=[Source("p", (str(pieces),)), Source("c", (str(chats),))])
    plain = PartJob(cfg, tok, tmp_path / "plain")
    (tmp_path / "plain").mkdir()
    mixed.adopt(tok)
    plain.adopt(tok)
    try:
        (tmp_path / "part").mkdir()
        result = run_mixed(mixed, plan_mixed([[str(pieces)], [str(chats)]], 1 << 20)[0], tmp_path / "part", None)
        reference = plain(plan_parts([str(chats)], 1 << 20)[0])
    finally:
        mixed.release()
        plain.release()
    assert reference["chat_template"] and result["chat_template"] == reference["chat_template"]


def _reference_mixed(sources: list[list[bytes]], part_bytes: int) -> list[list[tuple[int, int, int, int]]]:
    """The mixed plan of JSON Lines sources (``sources[s]``: its files' bytes) by its docstring's rule, written
    afresh: K parts from the total size; each source's bytes taken as one stream and cut near k/K of its size,
    just past the first newline at or after ``target - 1`` inside each file; a range goes to the part of the
    target interval its start falls in. (source, file, start, end) per range, parts without ranges left out."""
    import bisect

    k_parts = max(1, math.ceil(sum(len(f) for files in sources for f in files) / part_bytes))
    parts: list[list[tuple[int, int, int, int]]] = [[] for _ in range(k_parts)]
    file_index = 0
    for s, files in enumerate(sources):
        total = sum(len(f) for f in files)
        targets = [k * total // k_parts for k in range(1, k_parts)]
        base = 0
        for data in files:
            starts = {0}
            for t in targets:
                if base < t < base + len(data):
                    nl = data.find(b"\n", t - base - 1)
                    if 0 <= nl < len(data) - 1:
                        starts.add(nl + 1)
            bounds = [*sorted(starts), len(data)]
            for a, b in zip(bounds[:-1], bounds[1:], strict=True):
                parts[bisect.bisect_right(targets, base + a)].append((s, file_index, a, b))
            base += len(data)
            file_index += 1
    return [p for p in parts if p]


@settings(max_examples=150, deadline=None)
@given(
    sources=st.lists(
        st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=12), min_size=1, max_size=3), min_size=1, max_size=3
    ),
    part_bytes=st.integers(20, 400),
)
def test_the_mixed_plan_cuts_each_source_near_k_over_k_of_its_size(sources, part_bytes):
    """``plan_mixed`` against the rule written afresh, over sources of one to three files of lines of any length:
    the same ranges in the same parts, segments and parts numbered in order."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        contents = [[b"".join(b"x" * n + b"\n" for n in lines) for lines in files] for files in sources]
        paths = []
        for s, files in enumerate(contents):
            paths.append([])
            for f, data in enumerate(files):
                path = Path(tmp) / f"s{s}-{f}.jsonl"
                path.write_bytes(data)
                paths[-1].append(str(path))
        plan = plan_mixed(paths, part_bytes)
    got = [[(part.sources[j], seg.file, seg.start, seg.end) for j, seg in enumerate(part.segments)] for part in plan]
    assert got == _reference_mixed(contents, part_bytes)
    assert [p.index for p in plan] == list(range(len(plan)))
    assert [seg.index for p in plan for seg in p.segments] == list(range(sum(len(p.segments) for p in plan)))
    flat = [seg for p in plan for seg in p.segments]
    assert all(seg.whole == (sum(1 for other in flat if other.file == seg.file) == 1) for seg in flat)


def test_the_mixed_plan_of_a_source_of_conversations_counts_parts_of_chat_part_bytes(tmp_path, monkeypatch):
    """As for one file (``plan.chat_part_bytes``): where a source's first file holds conversations (named by that
    source's own columns), K counts parts 16 times smaller; sources of pieces alone keep ``part_bytes``."""
    from weightprep.distribute import plan as plan_module
    from weightprep.distribute.plan import chat_part_bytes
    from weightprep.stages.columns import parse_columns

    monkeypatch.setattr(plan_module, "CHAT_PART_FLOOR", 1000)
    turns = [{"role": "user", "content": "question " * 20}, {"role": "assistant", "content": "answer " * 40}]
    chats, pieces = tmp_path / "chats.jsonl", tmp_path / "pieces.jsonl"
    chats.write_text("".join(json.dumps({"dialog": turns}) + "\n" for _ in range(60)))
    pieces.write_text("".join(json.dumps({"pieces": [{"text": "x " * 200, "weight": 1}]}) + "\n" for _ in range(60)))
    total = chats.stat().st_size + pieces.stat().st_size
    part_bytes = 4 * total  # one part as pieces
    named = [parse_columns("messages=dialog"), None]
    fine = plan_mixed([[str(chats)], [str(pieces)]], part_bytes, columns=named)
    assert len(fine) == -(-total // chat_part_bytes(part_bytes)) > 1  # every part holds a slice of both sources
    assert all(set(part.sources) == {0, 1} for part in fine)
    assert len(plan_mixed([[str(chats)], [str(pieces)]], part_bytes)) == 1  # "dialog" unnamed: no conversation
    assert len(plan_mixed([[str(pieces)]], part_bytes)) == 1


def test_the_mixed_plan_of_empty_sources_is_one_part(tmp_path):
    """No bytes at all still make one mixed part (its segments empty): the build then says the input holds no
    records, rather than the plan failing."""
    empty = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    for path in empty:
        path.write_bytes(b"")
    (part,) = plan_mixed([[str(p)] for p in empty], 1000)
    assert [(s.start, s.end) for s in part.segments] == [(0, 0), (0, 0)] and part.sources == (0, 1)
