"""The plan's cuts of a JSON array (``weightprep.distribute.plan_array``): the state its parallel first pass chains
from chunk summaries is the splitter's, so its cuts are those of a byte-by-byte JSON state machine, wherever the
chunks fall (inside strings, escapes, runs of backslashes, nesting) and on any number of threads."""

from __future__ import annotations

import io
import json

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_json_array_scan import _reference

from weightprep.distribute import plan_array
from weightprep.distribute.plan_array import record_cuts, sequential_cuts
from weightprep.errors import CUT_MISSED


def _separators(data: bytes) -> list[int]:
    """Offsets of the ``,`` that separate the elements of the (valid) array ``data``: the byte-by-byte reference's
    separators less the closing ``]``."""
    return _reference(data)[0][:-1]


def _expected(data: bytes, targets: list[int]) -> list[int]:
    """Just past the first separator at or after ``target - 1``, skipping targets an earlier cut passed."""
    separators, cuts = _separators(data), []
    for target in targets:
        if cuts and cuts[-1] >= target:
            continue
        later = [s for s in separators if s >= target - 1]
        if not later:
            break
        cuts.append(later[0] + 1)
    return cuts


def _cuts(data: bytes, targets: list[int], **kw) -> list[int] | None:
    return record_cuts(io.BytesIO(data), io.BytesIO(data), targets, **kw)


_strings = st.text(st.sampled_from(list('ab"\\\\\n\t,[]{}: ✓日')), max_size=14)
_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | _strings,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_strings, inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(
    records=st.lists(_values, min_size=1, max_size=12),
    indent=st.sampled_from([None, 0, 2, "\t"]),
    lead=st.sampled_from(["", " \n", "\ufeff"]),
    part_bytes=st.integers(1, 300),
    chunk_bytes=st.integers(1, 80),
    threads=st.integers(1, 3),
)
def test_the_cuts_are_those_of_a_byte_by_byte_scan(records, indent, lead, part_bytes, chunk_bytes, threads):
    data = (lead + json.dumps(records, indent=indent, ensure_ascii=False) + "\n").encode()
    targets = list(range(part_bytes, len(data), part_bytes))
    expected = _expected(data, targets)
    assert _cuts(data, targets, chunk_bytes=chunk_bytes, threads=threads) == expected
    assert sequential_cuts(io.BytesIO(data), targets) == expected
    assert sequential_cuts(io.BytesIO(data), targets, chunk_bytes=chunk_bytes) == expected


@pytest.mark.parametrize("chunk_bytes", [7, 64, 1000])
def test_the_first_pass_gives_the_cuts_without_the_sequential_one(monkeypatch, chunk_bytes):
    """Pretty-printed records with quotes, escapes and brackets in their strings: the summaries alone place the cuts
    (the sequential pass, the fallback, is never made)."""

    def fail(*args, **kwargs):
        raise AssertionError("fell back to the sequential pass")

    monkeypatch.setattr(plan_array, "sequential_cuts", fail)
    records = [{"messages": [{"role": "user", "content": f'say "{i}" \\ then [{{}}], ok'}], "n": [i, {"x": "]"}]}
               for i in range(300)]  # fmt: skip
    data = json.dumps(records, indent=2).encode()
    targets = list(range(997, len(data), 997))
    assert _cuts(data, targets, chunk_bytes=chunk_bytes, threads=2) == _expected(data, targets)


@pytest.mark.parametrize(
    "text",
    [
        '[{"a": 1}}, {"a": 2}, {"a": 3}, {"a": 4}]',  # a '}' closes the array early
        '[{"a": 1}] [{"a": 2}, {"a": 3}, {"a": 4}]',  # bytes after it
        '[{"a": 1}, {"a": 2}], {"a": 3}, {"a": 4}]',
    ],
)
@pytest.mark.parametrize("every", [5, 20])  # 20: the array closes and opens again inside one chunk
def test_an_array_whose_brackets_do_not_balance_is_not_cut(text, every):
    data = text.encode()
    assert _cuts(data, list(range(every, len(data), every)), chunk_bytes=64) is None
    assert _cuts(data, list(range(every, len(data), every)), chunk_bytes=4) is None


@pytest.mark.parametrize("targets", [[6, 35], [6, 20], [6, 21, 22]])
def test_an_empty_element_is_cut_around(targets):
    """``,,`` leaves the depth as it is: the plan cuts as the byte scan does, and the part holding it names it
    (``test_inputs``)."""
    data = b'[{"a": 1}, {"a": 2},, {"a": 3}, {"a": 4}, {"a": 5}]'
    assert _cuts(data, targets, chunk_bytes=5) == _expected(data, targets)


def _reference_summary(chunk: bytes, inside: bool, carried: int) -> tuple[bool, int, int]:
    """A chunk's summary byte by byte: the splitter's rule (a quote after an odd run of backslashes, ``carried``
    included where the run reaches the chunk's start, is escaped, wherever it is), the depth counted outside
    strings only."""
    run, depth, lowest = carried, 0, plan_array._NO_BRACKET
    for byte in chunk:
        if byte == ord("\\"):
            run += 1
            continue
        if byte == ord('"') and run % 2 == 0:
            inside = not inside
        elif not inside and chr(byte) in "[]{}":
            depth += 1 if chr(byte) in "[{" else -1
            lowest = min(lowest, depth)
        run = 0
    return inside, depth, lowest


@settings(max_examples=500, deadline=None)
@given(st.text(st.sampled_from(list('"\\\\[]{}a,\n')), max_size=40))
def test_a_chunk_summary_is_that_of_a_byte_by_byte_scan(text):
    """Each case of ``_summary`` (outside a string; inside after an even run of backslashes; after an odd one) as
    the byte-by-byte scan from that state; the run of backslashes it ends with."""
    chunk = text.encode()
    summary = plan_array._summary(chunk)
    assert summary.size == len(chunk)
    assert summary.tail == len(chunk) - len(chunk.rstrip(b"\\"))
    assert summary.cases[0] == _reference_summary(chunk, False, 0)
    assert summary.cases[1] == _reference_summary(chunk, True, 0)
    assert summary.cases[2] == _reference_summary(chunk, True, 1)
    assert plan_array._summary(bytearray(chunk)) == summary  # a reused buffer reads the same


_GAPS = [",\n  ", ",\n", ", ", ",", ",\n    ", ",\n\n  ", ",\r\n  "]


def _laid_out(records: list, gaps: list[str], indent, alike: int = 0) -> bytes:
    """The array of ``records`` (each dumped with ``indent``, its lines indented by two spaces) with ``gaps[0]``
    between the first ``alike`` records, then ``gaps[i % len(gaps)]`` between records ``i`` and ``i + 1``."""
    texts = [json.dumps(r, indent=indent, ensure_ascii=False).replace("\n", "\n  ") for r in records]
    body = texts[0] + "".join(gaps[0 if i < alike else i % len(gaps)] + t for i, t in enumerate(texts[1:]))
    return ("[\n  " + body + "\n]\n").encode()


def _first_failing_part(data: bytes, cuts: list[int], checks: list) -> int | None:
    """The first of the parts at ``cuts`` whose reader (``array_blocks``, checking its range) raises, as the build
    meets them: the error of the earliest part in input order is the build's."""
    from weightprep.stages.json_array import array_blocks

    bounds = [0, *cuts, len(data)]
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        stream = io.BytesIO(data[start:end])
        try:
            for _ in array_blocks("data.json", stream, 64, 1 << 20, lambda n, record, offset, s=stream: s.read(n),
                                  origin=start, inside=start > 0, ends_inside=end < len(data), check=checks[i]):  # fmt: skip
                pass
        except Exception as exc:  # noqa: BLE001 -- a part read from a wrong start may fail in any way
            return i if getattr(exc, "reason", None) == CUT_MISSED else -1 - i
    return None


@settings(max_examples=300, deadline=None)
@given(
    records=st.lists(st.dictionaries(_strings, _values, max_size=2), min_size=3, max_size=16),
    gaps=st.tuples(st.sampled_from([g for g in _GAPS if "\n" in g] + [", "]), st.lists(st.sampled_from(_GAPS), max_size=2)).map(
        lambda t: [t[0], *t[1]]
    ),
    alike=st.integers(2, 12),
    indent=st.sampled_from([None, 2]),
    part_bytes=st.integers(1, 300),
    head_share=st.floats(0.2, 1.0),
)
def test_guessed_cuts_are_the_exact_ones_unless_a_part_reader_says_otherwise(records, gaps, alike, indent, part_bytes,
                                                                              head_share):  # fmt: skip
    """The plan guessed from the layout of the file's head: where its cuts are not the exact plan's, the first
    part that fails is one whose own check fails (the build then plans exactly); where they are, no part fails.
    A file laid out alike throughout is guessed once its head shows four separators."""
    data = _laid_out(records, gaps, indent, alike)
    head_bytes = max(8, int(len(data) * head_share))  # the head: all of the file, or a part of it
    targets = list(range(part_bytes, len(data), part_bytes))
    guessed = plan_array.guessed_cuts(io.BytesIO(data), targets, chunk_bytes=16, head_bytes=head_bytes)
    if guessed is None:  # records on one line and one gap with a newline, shown four times in an open head: guessed
        shown = [s for s in _separators(data) if s + len(gaps[0]) + 1 <= head_bytes]
        assert indent is not None or len(set(gaps)) > 1 or "\n" not in gaps[0] or len(shown) < 4, shown
        event("no guess")
        return
    cuts, checks = guessed
    assert len(checks) == len(cuts) + 1
    used = {gaps[0 if i < alike else i % len(gaps)] for i in range(len(records) - 1)}
    if indent is None and len(used) == 1:  # records on one line each, one gap throughout: the guess is the exact plan
        assert cuts == _expected(data, targets)
    failing = _first_failing_part(data, cuts, checks)
    event(f"guessed {'right' if cuts == _expected(data, targets) else 'wrong'}")
    if cuts == _expected(data, targets):
        assert failing is None
    else:
        assert failing is not None and failing >= 0, (cuts, _expected(data, targets), failing)


def test_a_guess_at_every_target_is_the_exact_cut_where_the_layout_holds():
    """One record a line: for a target at every byte (a separator just before it, at it, after it) and for every
    part size, the guessed cuts are the exact plan's."""
    records = [{"id": i, "text": f"record {i}, {{x}}"} for i in range(12)]
    data = _laid_out(records, [",\n"], None)
    for target in range(1, len(data)):
        assert plan_array.guessed_cuts(io.BytesIO(data), [target])[0] == _expected(data, [target]), target
    for part_bytes in range(1, 120):
        targets = list(range(part_bytes, len(data), part_bytes))
        assert plan_array.guessed_cuts(io.BytesIO(data), targets)[0] == _expected(data, targets), part_bytes


def test_a_layout_is_learnt_only_from_separators_alike_with_a_newline():
    records = [{"messages": [{"role": "user", "content": "a, {b}"}, {"role": "assistant", "content": "c"}], "id": i}
               for i in range(6)]  # fmt: skip
    assert plan_array.layout(io.BytesIO(json.dumps(records, indent=2).encode())) == b",\n  {"
    assert plan_array.layout(io.BytesIO(_laid_out(records, [",\n"], None))) == b",\n{"
    assert plan_array.layout(io.BytesIO(json.dumps(records).encode())) is None  # one line: ", {" nested too
    flat = json.dumps([{"text": f"record {i}"} for i in range(6)]).encode()  # one line, ", {" only between records:
    assert plan_array.layout(io.BytesIO(flat)) is None  # still none (no newline: a string may hold ", {")
    assert plan_array.layout(io.BytesIO(_laid_out(records, [",\n", ",\n  "], None))) is None
    assert plan_array.layout(io.BytesIO(json.dumps(records, indent=0).encode())) is None  # ",\n{" nested too
    assert plan_array.layout(io.BytesIO(json.dumps(records[:3], indent=2).encode())) is None  # 2 separators
    read = io.BytesIO(json.dumps(records, indent=2).encode())
    read.seek(100)  # a stream read before: the head is the file's
    assert plan_array.layout(read) == b",\n  {"


@pytest.mark.parametrize("later", [", ", ",\n    "])
@pytest.mark.parametrize("alternate", [False, True])
def test_a_guess_that_skips_a_separator_fails_its_own_part(later, alternate):
    """Records laid out as the head shows, then otherwise: every other record (the guess then cuts past a separator
    it did not see: the part ending there checks that its end is the first separator past its target), or all of
    them (no gap is found: the last part checks that no separator follows its target)."""
    records = [{"id": i, "text": f"record {i}"} for i in range(40)]
    texts = [json.dumps(r) for r in records]
    gaps = [",\n  " if i < 8 or (alternate and i % 2) else later for i in range(len(texts) - 1)]
    data = ("[\n  " + texts[0] + "".join(g + t for g, t in zip(gaps, texts[1:], strict=True)) + "\n]\n").encode()
    targets = list(range(700, len(data), 700))
    cuts, checks = plan_array.guessed_cuts(io.BytesIO(data), targets, head_bytes=200)  # the first 5 records
    assert cuts != _expected(data, targets)
    failing = _first_failing_part(data, cuts, checks)
    assert failing is not None and failing >= 0


def test_find_is_bytes_find_across_reads():
    """The layout's gap searched read by read (the first read small, then doubling up to the chunk size): at every
    alignment of a gap to the reads, a gap spanning two or three reads included, where ``bytes.find`` finds it."""
    from unittest import mock

    gap = b",\n  {"
    for lead in range(12):
        data = b"a" * lead + b",\n " + b"a" + gap + b"aa" + gap  # a near miss, then two gaps
        for first_read in range(1, 7):
            for chunk_bytes in range(1, 9):
                for pos in range(len(data) + 1):
                    with mock.patch.object(plan_array, "_FIRST_READ", first_read):
                        at = plan_array._find(io.BytesIO(data), pos, gap, chunk_bytes)
                    expected = data.find(gap, pos)
                    assert at == (expected if expected >= 0 else None), (lead, first_read, chunk_bytes, pos)


def test_a_cut_found_past_the_first_read_is_the_exact_one():
    """Records of 150 KB: from a target, the splitter reads on over 64 KiB, then 128 KiB, ... to the separator (and,
    after the last record, to the array's close: no cut there)."""
    records = [{"id": i, "text": ("word, [x] \"q\" " * 11000)[: 150_000 - 7 * i]} for i in range(8)]
    data = json.dumps(records, indent=2).encode()
    targets = list(range(70_000, len(data), 100_000))
    assert _cuts(data, targets) == _expected(data, targets)
    assert len(_expected(data, targets)) == 7


@pytest.mark.parametrize("chunk_bytes", [3, 8])
def test_the_sequential_pass_stops_at_its_last_cut(chunk_bytes):
    """A fault in a chunk after the last cut's is not the plan's to find (the last part's reader names it): the pass
    stops once its last target is cut. (A fault in the same chunk makes the file one part, whose reader names it.)"""
    data = b'[{"a": 1}, {"a": 2}, {"a": 3}, {"a": 4}]] trailing'
    assert sequential_cuts(io.BytesIO(data), [5, 12], chunk_bytes=chunk_bytes) == [10, 20] == _expected(data, [5, 12])
    assert sequential_cuts(io.BytesIO(b'[{"a": 1}, {"a": 2}]'), [15], chunk_bytes=chunk_bytes) == []  # none after 14
