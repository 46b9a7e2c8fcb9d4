"""A build process's heap: glibc's allocator held to what a part's work needs (``bound_heap``)."""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["MMAP_THRESHOLD", "ARENAS", "bound_heap"]

#: glibc's ``mallopt`` parameters (malloc.h): the size from which an allocation is its own mapping, and the
#: most heaps (arenas) that threads allocate from.
_M_MMAP_THRESHOLD, _M_ARENA_MAX = -3, -8
#: Allocations of this size and more get their own mapping, returned to the system when freed. A block's arrays
#: below it (a fastokens block's ids, a document batch's columns) are reused from the heaps rather than mapped,
#: zeroed by the kernel and unmapped again for every block: at 1 MiB the kernel's share of a build was 30-40% of its
#: CPU (docs/performance.md, "Memory").
MMAP_THRESHOLD = 16 << 20
#: The most heaps the process's threads share.
ARENAS = 2


def bound_heap() -> bool:
    """Keep a build process's resident memory at what it holds, not at what it once held (glibc only; False
    elsewhere). Call it first in the process, before any thread starts: see below.

    A part's arrays are megabytes each and short-lived, made and freed by three threads (read, tokenize, pack and
    write) and the tokenizer's own. glibc raises its mapping threshold each time such an array is freed (up to
    32 MiB), so the next ones come from the threads' heaps, which are returned to the system only from their top:
    a build's resident memory then grows with the input to well above what it holds at any time (653 MiB peak for
    30k records, 801 MiB for 300k). A fixed threshold (``MMAP_THRESHOLD``: larger arrays, the window and the rows,
    are their own mappings, unmapped when freed) and ``ARENAS`` heaps for all threads keep it near the working set
    and flat (docs/performance.md).

    The limit on heaps binds only the threads that start after it: a thread that allocated before has its own heap
    for good (glibc gives each new thread one, up to 8 per core), so fastokens' load, its thread pool and the
    build's threads must start after this call. Made where a worker was set up, after the tokenizer's load had
    started those threads, a conversation build held ~140 MiB more (``weightprep build`` and each local worker
    process now call it first).
    Arrow's own pool (mimalloc, the JSON parse's buffers) is left as it is: moved to this heap it saved ~60 MiB of
    peak but made the parse 1.5-2x slower (the reader thread's work).

    NumPy's arrays are held to small pages too (``_small_pages``)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl): its allocator is left as it is
        bounded = False
    else:
        bounded = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_ARENA_MAX, ARENAS))
    _small_pages()
    return bounded


def _small_pages() -> None:
    """No transparent huge pages for NumPy's arrays, unless ``NUMPY_MADVISE_HUGEPAGE`` says otherwise.

    NumPy asks the kernel for huge pages (``madvise(MADV_HUGEPAGE)``) for every array of 4 MiB and more. A build's
    arrays are streamed once and freed: a huge page is zeroed whole (2 MiB) at its first touch, and where the kernel
    compacts memory to find one (``defrag`` ``madvise``, the default of many distributions) the fault waits for
    it. On a virtual machine whose host had taken freed memory back, a 30k-record build spent ~0.2 s less of system
    time with small pages (0.30 s against 0.50 s; 0.08 s less wall time, median of 10 interleaved pairs;
    docs/performance.md), and no more where it had not. Said through the environment, which NumPy reads at its
    import (not imported here: OpenBLAS would start its threads; the worker processes inherit it), or to NumPy
    itself where it is already imported."""
    if "NUMPY_MADVISE_HUGEPAGE" in os.environ:  # the user's choice, or this process's parent's
        return
    os.environ["NUMPY_MADVISE_HUGEPAGE"] = "0"
    if "numpy" in sys.modules:
        try:
            from numpy._core.multiarray import _set_madvise_hugepage  # NumPy 2
        except ImportError:
            try:
                from numpy.core.multiarray import _set_madvise_hugepage  # type: ignore[no-redef]  # NumPy 1
            except ImportError:
                return
        _set_madvise_hugepage(False)
