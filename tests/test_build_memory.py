"""The README's bound: a build's memory is set by the block size and the packing window, never by the input's size.

Measured in-process, on small settings so the bound shows on small inputs (blocks of 16 KiB, windows of 200
documents): the peak of Python and NumPy allocations (tracemalloc, every thread) plus the peak of Arrow's memory
pool (polled) during a build of N records and of 8 N records. Without the bound the peak grows with the input:
a window that never closes holds every document (about 6x the peak here at 8 N), and so does a reader that runs
ahead of the tokenizer without limit.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from weightprep.config import config_from_dict
from weightprep.pipeline import build

WORDS = ["alpha", "beta", "gamma", "delta", "the", "cat", "sat", "on", "mat", "zeta"]


def _write(path: Path, n: int) -> int:
    """N records as JSON Lines, or (a ``.json`` path) as one pretty-printed JSON array, as LLaMA-Factory writes."""
    rng = np.random.default_rng(0)
    array = path.suffix == ".json"
    with path.open("w") as f:
        f.write("[\n" if array else "")
        for i in range(n):
            body = " ".join(rng.choice(WORDS, int(rng.integers(5, 60))))
            record = {"pieces": [{"text": f"Q{i}: ", "weight": 0}, {"text": body, "weight": 1}]}
            if array:
                f.write(("" if i == 0 else ",\n") + json.dumps(record, indent=2))
            else:
                f.write(json.dumps(record) + "\n")
        f.write("\n]\n" if array else "")
    return path.stat().st_size


def _peak_build_bytes(tmp: Path, n: int, tok, suffix: str = ".jsonl") -> tuple[int, int]:
    """(peak bytes allocated during the build, input bytes)."""
    raw = tmp / f"raw{n}{suffix}"
    size = _write(raw, n)
    cfg = config_from_dict({"pack": {"seq_len": 128, "window": 200}, "read": {"block_bytes": 16384}})
    arrow_peak, done = [pa.total_allocated_bytes()], threading.Event()

    def poll() -> None:
        while not done.wait(0.002):
            arrow_peak[0] = max(arrow_peak[0], pa.total_allocated_bytes())

    base = pa.total_allocated_bytes()
    poller = threading.Thread(target=poll, daemon=True)
    tracemalloc.start()
    poller.start()
    try:
        build([str(raw)], tmp / f"out{n}", cfg, tokenizer=tok)
        python_peak = tracemalloc.get_traced_memory()[1]
    finally:
        done.set()
        poller.join()
        tracemalloc.stop()
    return python_peak + arrow_peak[0] - base, size


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])  # .json: one array, streamed (weightprep.stages.json_array)
def test_build_memory_does_not_grow_with_the_input(tmp_path, sample_tok, suffix):
    _peak_build_bytes(tmp_path, 300, sample_tok, suffix)  # first build: imports and the tokenizer's one-time caches
    small, small_size = _peak_build_bytes(tmp_path, 2000, sample_tok, suffix)
    large, large_size = _peak_build_bytes(tmp_path, 16000, sample_tok, suffix)
    assert large_size > 7 * small_size
    assert large < 1.5 * small + (1 << 20), (small, large)  # 8x the input, about the same memory


_HEAP_SCRIPT = """
import sys, threading
import numpy as np
import pytest
from weightprep.heap import MMAP_THRESHOLD, bound_heap

if sys.argv[1] == "bound":
    assert bound_heap()
pinned = []
size = MMAP_THRESHOLD + (1 << 20)  # arrays the bounded heap maps on their own

def work():  # as a part's threads do: large arrays made and freed between small lasting allocations
    first = np.ones(size + (4 << 20), np.uint8)
    del first  # glibc (unbounded): arrays up to this size now come from this thread's heap (its bound: 32 MiB)
    arrays = []
    for _ in range((200 << 20) // size + 1):
        arrays.append(np.ones(size, np.uint8))
        pinned.append(bytearray(4000))
    del arrays

thread = threading.Thread(target=work)
thread.start()
thread.join()
with open("/proc/self/statm") as f:
    print(int(f.read().split()[1]) * 4096)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_bound_heap_gives_freed_arrays_back():
    """200 MiB of arrays above ``MMAP_THRESHOLD`` made and freed in a thread: without ``bound_heap`` glibc keeps
    them resident (its heap cannot shrink past the small allocations between them); with it, each was its own
    mapping, unmapped."""
    def resident(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _HEAP_SCRIPT, mode], capture_output=True, text=True, check=True)
        return int(out.stdout)

    unbounded, bounded = resident("plain"), resident("bound")
    assert unbounded - bounded > 150 << 20, (unbounded >> 20, bounded >> 20)


_PAGES_SCRIPT = """
import sys
from weightprep.heap import bound_heap

if sys.argv[1] == "first":  # as the build command: before NumPy's import
    bound_heap()
import numpy as np

if sys.argv[1] == "after":  # as a worker whose NumPy is imported already
    bound_heap()
array = np.ones(64 << 20, np.uint8)  # touched whole: every huge page it may have is mapped
at, end = array.ctypes.data, array.ctypes.data + array.nbytes
huge = 0
with open("/proc/self/smaps") as f:  # the mappings that hold the array (madvise splits its own off)
    inside = False
    for line in f:
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo < end and at < hi
        elif inside and head == "AnonHugePages:":
            huge += int(line.split()[1])
print(huge)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps")
@pytest.mark.parametrize("env", [None, "1"])
def test_bound_heap_keeps_numpy_arrays_on_small_pages(env):
    """NumPy madvises huge pages for its large arrays; a build process does not want them (``heap._small_pages``)
    unless ``NUMPY_MADVISE_HUGEPAGE`` asks for them. Skipped where the kernel gives none to a plain process."""
    def huge_kib(mode: str, value: str | None) -> int:
        environ = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
        if value is not None:
            environ["NUMPY_MADVISE_HUGEPAGE"] = value
        out = subprocess.run([sys.executable, "-c", _PAGES_SCRIPT, mode], capture_output=True, text=True, check=True,
                             env=environ)  # fmt: skip
        return int(out.stdout)

    if huge_kib("plain", None) == 0:
        pytest.skip("the kernel maps no transparent huge page for NumPy here (THP off or none free)")
    for when in ("first", "after"):
        bounded = huge_kib(when, env)
        assert (bounded > 0) if env == "1" else (bounded == 0), (when, bounded)


_ARENAS_SCRIPT = """
import ctypes, sys
from weightprep.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
finally:
    sys.stderr.flush()
    ctypes.CDLL("libc.so.6").malloc_stats()  # a block per heap ("Arena N:") on stderr
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc only")
@pytest.mark.parametrize("workers", [1, 2])
def test_a_build_process_allocates_from_the_bounded_heaps_only(tmp_path, workers):
    """``weightprep build`` bounds its heap before fastokens' load starts its threads, each of which would otherwise
    keep a heap of its own for good (glibc fixes a thread's heap at its first allocation): the command's process
    ends with at most ``ARENAS`` heaps, whether it runs the part itself or beside a worker process."""
    from weightprep.heap import ARENAS

    raw = Path(__file__).resolve().parent.parent / "sample_data" / "raw.jsonl"
    out = subprocess.run(
        [sys.executable, "-c", _ARENAS_SCRIPT, "build", str(raw), "--out", str(tmp_path / "out"), "--workers",
         str(workers), "--part-bytes", "4096"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    heaps = [line for line in out.stderr.splitlines() if line.startswith("Arena ")]
    assert 1 <= len(heaps) <= ARENAS, out.stderr[-2000:]
