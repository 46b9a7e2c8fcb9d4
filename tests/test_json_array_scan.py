"""The splitter's scan (``weightprep.stages.json_array.ArrayScanner``) against a byte-by-byte JSON state machine:
wherever the chunks are cut (inside strings, inside runs of backslashes longer than its vectorized walk, between a
backslash and its quote), it finds the separators the state machine finds and turns the newlines outside strings
into spaces."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from weightprep.stages.json_array import ArrayScanner, escaped


def _reference(data: bytes) -> tuple[list[int], bytes]:
    """The separators of the array ``data`` (its depth-1 commas and its closing ']') and its bytes as blocks hold
    them (every newline a tab, inside strings too: a raw one there is invalid JSON, and so is a tab; separators
    newlines), one byte at a time."""
    separators, out, depth, in_string, escape = [], bytearray(data), 0, False, False
    for i, byte in enumerate(data):
        if byte == ord("\n"):
            out[i] = ord("\t")
        if in_string:
            if escape:
                escape = False
            elif byte == ord("\\"):
                escape = True
            elif byte == ord('"'):
                in_string = False
            continue
        if byte == ord('"'):
            in_string = True
        elif byte in b"[{":
            depth += 1
        elif byte in b"]}":
            depth -= 1
            if depth == 0:
                separators.append(i)
        elif byte == ord(",") and depth == 1:
            separators.append(i)
    for i in separators:
        out[i] = ord("\n")
    return separators, bytes(out)


_strings = st.text(st.sampled_from(list('a"\\\\\\,[]{}\n ✓')), max_size=10) | st.builds(
    lambda n, tail: "\\" * n + tail, st.integers(0, 45), st.sampled_from(['"', "", "a", '\\"'])
)
_values = st.recursive(
    st.integers(0, 9) | _strings,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_strings, inner, max_size=2),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    records=st.lists(_values, max_size=6),
    indent=st.sampled_from([None, 2]),
    cuts=st.lists(st.integers(0, 4000), max_size=12),
)
def test_the_scan_finds_what_a_byte_by_byte_state_machine_finds(records, indent, cuts):
    data = json.dumps(records, indent=indent).encode()
    scanner, separators, out, start = ArrayScanner(), [], [], 0
    for end in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        chunk, lo = data[start:end], start
        got, where = scanner.scan(chunk)
        separators += (where + lo).tolist()
        out.append(got.tobytes())
        start = end
    assert (separators, b"".join(out)) == _reference(data)
    assert scanner.closed and scanner.depth == 0 and not scanner.in_string


@given(run=st.integers(0, 60), at=st.integers(0, 70), carried=st.integers(0, 5))
def test_a_quote_is_escaped_by_an_odd_run_of_backslashes_before_it(run, at, carried):
    """The run counted back to the chunk's start, and on into the run carried from before it."""
    chunk = b"a" * max(0, at - run) + b"\\" * min(run, at) + b'"'
    data = np.frombuffer(chunk, dtype=np.uint8)
    quotes = np.flatnonzero(data == ord('"'))
    total = min(run, at) + (carried if run >= at else 0)
    assert escaped(chunk, data, quotes, carried).tolist() == [total % 2 == 1]


def test_a_part_that_starts_with_a_string_element_is_cut_at_its_own_commas():
    """A part of an array starts just after a separating ',' (``inside=True``), outside any string and after no
    backslash: its first byte may be a quote (an array of strings, each then refused as no record), which opens a
    string; the elements are cut where they end, the closing ']' included."""
    chunk = b'"a\\\\",  "b,c" ,{"x": "]"}]'
    _, separators = ArrayScanner(inside=True).scan(chunk)
    assert [chunk[s : s + 1] for s in separators.tolist()] == [b",", b",", b"]"]
    assert separators.tolist() == [chunk.index(b",  "), chunk.index(b" ,{") + 1, len(chunk) - 1]


def test_empty_elements_are_found_across_chunks_and_whitespace_before_a_comma_is_no_empty_element():
    """The empty-element check walks back over whitespace from a separator: a trailing ',' in one chunk and the
    closing ']' first in the next is an empty element (the last byte carried over the chunk); a space before a
    separating ',' is not."""
    import pytest

    from weightprep.stages.json_array import EmptyElement

    scanner = ArrayScanner()
    scanner.scan(b'[{"a": 1},')
    with pytest.raises(EmptyElement):
        scanner.scan(b"]")
    scanner = ArrayScanner()
    scanner.scan(b'[{"a": 1}, ')
    with pytest.raises(EmptyElement):
        scanner.scan(b" \n]")
    scanner = ArrayScanner()
    scanner.scan(b'[{"a": 1},')
    scanner.scan(b"  \n ")  # a chunk of whitespace only carries the ',' on
    with pytest.raises(EmptyElement):
        scanner.scan(b"]")
    scanner = ArrayScanner()
    scanner.scan(b'[{"a": 1}')
    with pytest.raises(EmptyElement):  # the ',' before it is the chunk's first byte
        scanner.scan(b", ]")
    data = b'[{"a": 1} , {"b": 2}\t,\n{"c": 3} ]'
    _, separators = ArrayScanner().scan(data)
    assert separators.tolist() == _reference(data)[0]
