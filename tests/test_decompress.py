"""Compressed input (``weightprep.stages.read``): every gzip member and zstd frame read, nothing added, a truncated or
corrupt stream refused, and ``InputFile.behind`` -- the compressed bytes behind each block, however far the
buffers read ahead -- in proportion to the decompressed bytes handed on, ending at the file's size."""

from __future__ import annotations

import gzip
import io
import json

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from weightprep.errors import InputError
from weightprep.stages.read import InputFile, read_blocks


def _lines(n: int, tag: str) -> bytes:
    return b"".join(json.dumps({"pieces": [{"text": f"{tag} {i} " + "x" * (i % 37), "weight": 1}]}).encode() + b"\n"
                    for i in range(n))  # fmt: skip


def _compress(kind: str, data: bytes) -> bytes:
    return gzip.compress(data) if kind == "gz" else zstandard.ZstdCompressor().compress(data)


def _read(path, block_bytes: int = 1024) -> tuple[bytes, list[tuple[int, int]], InputFile]:
    """The decompressed bytes handed on, and (block end, ``behind``) of each block."""
    record, out, ends = InputFile(str(path)), [], []
    for block in read_blocks(record, block_bytes):
        out.append(block.data)
        ends.append((block.offset + len(block.data), record.behind))
    return b"".join(out), ends, record


@settings(max_examples=40, deadline=None)
@given(members=st.lists(st.integers(0, 400), min_size=1, max_size=4), kind=st.sampled_from(["gz", "zst"]),
       padding=st.integers(0, 3), block_bytes=st.sampled_from([64, 1024, 1 << 16]))  # fmt: skip
def test_every_member_is_read_and_behind_is_proportional(tmp_path_factory, members, kind, padding, block_bytes):
    """Members (gzip) or frames (zstd) one after another, zero bytes after each gzip member (padding, as gzip
    reads it): the lines of all of them, once each, in order. Each block's ``behind`` never decreases, is off the
    file's size times the block's decompressed share by at most one member (the members consumed so far give the
    ratio), is exactly that for one member (these small ones are consumed by one read), and is the size at the
    last block."""
    parts = [_lines(n, f"m{k}") for k, n in enumerate(members)]
    pad = b"\x00" * padding if kind == "gz" else b""
    packed = [_compress(kind, p) + pad for p in parts]
    raw = b"".join(packed)
    path = tmp_path_factory.mktemp("z") / f"in.jsonl.{kind}"
    path.write_bytes(raw)
    got, ends, record = _read(path, block_bytes)
    data = b"".join(parts)
    assert got == data
    if kind == "gz":
        assert gzip.GzipFile(fileobj=io.BytesIO(raw)).read() == data  # what gzip reads: padding accepted
    assert record.size == len(raw) and record.lines == sum(members)
    if not ends:
        return
    behind = [b for _, b in ends]
    share = [len(raw) * end // len(data) for end, _ in ends]
    assert behind == sorted(behind) and behind[-1] == len(raw)
    assert all(abs(b - s) <= max(map(len, packed)) for b, s in zip(behind, share, strict=True)), (behind, share)
    if len(members) == 1 and not padding:
        assert behind == share


def test_a_large_file_is_behind_by_what_its_blocks_hold_not_by_its_read_ahead(tmp_path):
    """6 MiB of varied lines in 1 MiB blocks: the buffers read megabytes ahead, yet each block's ``behind`` is
    within one read of the compressed size times the decompressed share."""
    import random

    rng = random.Random(3)
    data = b"".join(json.dumps({"pieces": [{"text": "".join(rng.choices("abcdefgh ", k=rng.randint(10, 400))),
                                            "weight": 1}]}).encode() + b"\n" for _ in range(30000))  # fmt: skip
    path = tmp_path / "big.jsonl.gz"
    raw = gzip.compress(data)
    path.write_bytes(raw)
    got, ends, record = _read(path, 1 << 20)
    assert got == data and len(ends) > 3
    assert len(raw) > 2 << 20 and record.size == len(raw)  # counted over many reads of the raw file
    for end, behind in ends:
        assert abs(behind - len(raw) * end / len(data)) <= (1 << 16) + 64, (end, behind)
    assert [b for _, b in ends] == sorted(b for _, b in ends)


@pytest.mark.parametrize("kind", ["gz", "zst"])
@pytest.mark.parametrize("cut", [1, 9, 30])
def test_a_stream_cut_inside_its_second_member_is_refused(kind, cut, tmp_path):
    first, second = _compress(kind, _lines(50, "a")), _compress(kind, _lines(50, "b"))
    path = tmp_path / f"in.jsonl.{kind}"
    path.write_bytes(first + second[:-cut])
    with pytest.raises(InputError) as caught:
        _read(path)
    assert caught.value.reason == "truncated_input"


@pytest.mark.parametrize("tail", [b"garbage after the member\n", b"\x00\x00\x1f"])
def test_bytes_after_a_gzip_member_that_are_no_member_are_refused(tail, tmp_path):
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(gzip.compress(_lines(20, "a")) + tail)
    with pytest.raises(InputError) as caught:
        _read(path)
    assert caught.value.reason == "truncated_input"


def test_zero_bytes_before_the_first_gzip_member_are_refused(tmp_path):
    """Padding follows a member; a file that starts with zeros is not gzip (as ``gzip`` says too)."""
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(b"\x00\x00" + gzip.compress(_lines(5, "a")))
    with pytest.raises(gzip.BadGzipFile):
        gzip.GzipFile(path).read()
    with pytest.raises(InputError):
        _read(path)
