"""How the ``weightprep`` process ends after a build: at once, without the interpreter's teardown.

At its end a build's process holds tokenizers, numpy's and pyarrow's modules and, for conversations, the chat
stage's compiled templates; the interpreter's finalization frees them object by object, ~20 ms of a 30,000-record
build's ~0.7 s (~30 ms of a chat build's), which the kernel does at once when the process ends
(docs/performance.md). So a build that succeeded asks (``end_at_once``) that its process end with ``os._exit`` once
the command has returned and its click context has closed (the fork server stopped, the early tokenizer load
taken), and ``end`` does so only after what the usual end runs for the program: its ``atexit`` functions
(multiprocessing's, the weakref finalizers' temporary directories, logging's) and a flush of its streams. Where a
thread other than a daemon still runs (the usual end would wait for it), or a stream cannot be flushed (the usual
end reports it), the process ends as usual.

Only the command line's entry (``weightprep.cli.run``: the console script, ``python -m weightprep``) calls ``end``:
``weightprep.cli.main`` run inside another program (click's test runner, a notebook) never ends its process.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

__all__ = ["end", "end_at_once"]

_asked = False


def end_at_once() -> None:
    """Ask that this process end at once when the command line's ``main`` returns with exit code 0 (``end``)."""
    global _asked
    _asked = True


def end(code: object) -> None:
    """End the process now with exit code 0, without the interpreter's teardown, where the command asked for it
    (``end_at_once``) and ``code`` (``SystemExit.code``) is success; else return, and the process ends as usual."""
    if not _asked or code not in (0, None):
        return
    main = threading.main_thread()
    if any(t is not main and t.is_alive() and not t.daemon for t in threading.enumerate()):
        return
    if not _flushed():
        return
    atexit._run_exitfuncs()  # (CPython's own call at finalization; each runs once: os._exit follows)
    os._exit(0 if _flushed() else 120)  # 120: what the interpreter exits with where a flush at its end fails


def _flushed() -> bool:
    """Flush the standard streams; False where one cannot be."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            return False
    return True
