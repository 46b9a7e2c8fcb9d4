"""Fuzz (bounded): random bytes and random JSON through read + validate.

Only clear errors (``InputError``) or quarantined rows may come out, never another exception;
every non-blank line is accepted or rejected, exactly once; the reader loses and adds nothing;
and the fast columnar path accepts a block only when the exact line-by-line path accepts the
same records.
"""

from __future__ import annotations

import gzip
import json

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from weightprep.batches import Block, Reject
from weightprep.errors import InputError
from weightprep.stages.read import InputFile, read_blocks
from weightprep.stages.validate import _parse_exact, _parse_fast, parse_block

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["pieces", "text", "weight", "x"]), inner, max_size=3),
    max_leaves=8,
)
WEIGHT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 10**30), st.booleans(), st.none(), st.text(max_size=3)
)
PIECE = st.one_of(
    st.fixed_dictionaries({"text": st.text(max_size=6), "weight": WEIGHT}),
    st.dictionaries(st.sampled_from(["text", "weight", "role"]), JSON, max_size=3),
    JSON,
)
RECORD = st.one_of(st.fixed_dictionaries({"pieces": st.lists(PIECE, max_size=3)}), JSON)
GOOD = b'{"pieces": [{"text": "a", "weight": 1}]}'
# byte-level damage applied to serialized records: raw invalid UTF-8, a duplicate key, junk, a cut
DAMAGE = st.sampled_from([b"", b"\xff", b"\xe9", b'"pieces": [], ', b"\r", b"  ", b"}", b"{", b"\\ud800", b"\x00", b"\xef\xbb\xbf"])


@st.composite
def lines(draw) -> list[bytes]:
    out = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.integers(0, 3))
        if kind == 0:
            out.append(GOOD)
        elif kind == 1:
            out.append(b"" if draw(st.booleans()) else b" \t\r")
        else:
            line = json.dumps(draw(RECORD), ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
            if kind == 3:
                cut = draw(st.integers(0, len(line)))
                line = line[:cut] + draw(DAMAGE) + line[cut:]
            out.append(line.replace(b"\n", b" "))
    return out


def _nonblank(data: bytes) -> int:
    body = data[3:] if data.startswith(b"\xef\xbb\xbf") else data
    return sum(1 for x in body.split(b"\n") if x.strip(b" \t\r"))


def _read_all(path, *, skip: bool, block_bytes: int, max_line: int):
    rejects: list[Reject] = []
    accepted = 0
    for block in read_blocks(InputFile(str(path)), block_bytes, max_line):
        accepted += len(parse_block(block, rejects if skip else None))
    return accepted, rejects


@FUZZ
@given(data=st.binary(max_size=600), block_bytes=st.integers(1, 64), compress=st.booleans(), skip=st.booleans())
@example(data=b"null\n", block_bytes=64, compress=False, skip=False)  # pyarrow segfaults on this unless guarded
@example(data=b"\xef\xbb\xbf" + GOOD, block_bytes=2, compress=True, skip=True)
def test_random_bytes_give_records_rejects_or_input_error(tmp_path_factory, data, block_bytes, compress, skip):
    path = tmp_path_factory.mktemp("fuzz") / ("raw.jsonl.gz" if compress else "raw.jsonl")
    path.write_bytes(gzip.compress(data) if compress else data)
    try:
        accepted, rejects = _read_all(path, skip=skip, block_bytes=block_bytes, max_line=256)
    except InputError as exc:
        assert not skip and str(exc).startswith(f"{path}:")
        return
    assert accepted + len(rejects) == _nonblank(data)
    assert all(r.path == str(path) and r.reason and r.field for r in rejects)


@FUZZ
@given(parts=lines(), block_bytes=st.integers(1, 200), bom=st.booleans(), final_newline=st.booleans())
@example(parts=[b'\xef\xbb\xbf{"pieces": []}'], block_bytes=1, bom=False, final_newline=False)  # a BOM in the data
def test_reader_loses_and_adds_nothing(tmp_path_factory, parts, block_bytes, bom, final_newline):
    body = b"\n".join(parts) + (b"\n" if final_newline else b"")
    path = tmp_path_factory.mktemp("fuzz") / "raw.jsonl"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + body)
    blocks = list(read_blocks(InputFile(str(path)), block_bytes, 1 << 20))
    joined = b"".join(b.data for b in blocks)
    content = path.read_bytes().removeprefix(b"\xef\xbb\xbf")  # one BOM at the start of the file is not content
    assert joined == (content if content.endswith(b"\n") or not content else content + b"\n")
    assert [b.first_line for b in blocks] == list(np.cumsum([1] + [b.n_lines for b in blocks[:-1]]))[: len(blocks)]
    assert all(body[b.offset - 3 * bom :].startswith(b.data.rstrip(b"\n")) for b in blocks)


@FUZZ
@given(parts=lines())
def test_fast_path_accepts_only_what_the_exact_path_accepts(parts):
    data = b"\n".join(parts) + b"\n"
    block = Block("fuzz.jsonl", 1, len(parts), data)
    exact, rejects = _parse_exact(block)
    fast = _parse_fast(block)
    if fast is not None:
        assert rejects == [], rejects
        assert fast.lines.tolist() == exact.lines.tolist()
        assert fast.texts == exact.texts
        assert fast.piece_offsets.tolist() == exact.piece_offsets.tolist()
        assert fast.piece_weights.astype(np.float32).tolist() == exact.piece_weights.astype(np.float32).tolist()
    assert len(exact) + len(rejects) == sum(1 for p in parts if p.strip(b" \t\r"))
    try:
        strict = parse_block(block)
    except InputError as exc:
        assert rejects and (exc.line, exc.field, exc.reason) == (rejects[0].line, rejects[0].field, rejects[0].reason)
    else:
        assert not rejects and len(strict) == len(exact)
