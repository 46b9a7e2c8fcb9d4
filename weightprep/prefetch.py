"""fastokens loading a ``tokenizer.json`` file in a thread, started as soon as a build knows the file.

Loading the file is the longest step of a small build's start (about 0.35 s of one core for 50k ids, the GIL
released), so it should overlap everything else the build does before its first block: the imports of the build's
own modules (numpy, pyarrow: about 0.2 s), tokenizers' own load of the tokenizer, the first block's read. The
command line starts it (``start``) right after parsing its options, before it imports the build; the build takes it
(``take``) where it would otherwise start one itself. This module imports nothing but the standard library (and
``weightprep.tokenizer``'s list of classes), so starting the load costs nothing of the imports it overlaps.

A load that no build takes (the pipeline file names another tokenizer, ``--tokenizer-backend hf``, a build that
fails first) runs to its end and is dropped: its thread is not a daemon, because a daemon thread killed in
fastokens' native code at the interpreter's exit aborts the process.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

__all__ = ["FastokensPrefetch", "runs_as_is", "start", "take"]


class FastokensPrefetch:
    """fastokens loading ``path`` in a thread. ``PieceTokenizer(prefetched=...)`` takes it for the start encoder;
    the agreement probes and the guard check it like any fastokens encoder."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._result: Any = None
        self._thread = threading.Thread(target=self._load, name="weightprep-fastokens-file", daemon=False)
        self._thread.start()

    def _load(self) -> None:
        try:
            import fastokens

            tok = fastokens.Tokenizer.from_file(str(self.path))
            tok.no_truncation()  # as PieceTokenizer's copy of the tokenizers backend
            tok.no_padding()
            self._result = tok
        except Exception as exc:  # reported by result(): PieceTokenizer then decides (fall back or refuse)
            self._result = exc

    def close(self) -> None:
        """Wait for the load to end (its result, if never asked for, is dropped)."""
        self._thread.join()

    def result(self) -> Any:
        """The loaded ``fastokens.Tokenizer``; raises what loading raised."""
        self._thread.join()
        if isinstance(self._result, Exception):
            raise self._result
        return self._result


#: Loads started by ``start`` and not yet taken, by the file's real path.
_started: dict[str, FastokensPrefetch] = {}
_lock = threading.Lock()


def runs_as_is(path: str | Path) -> bool:
    """Whether the build may run the ``tokenizer.json`` at ``path`` as it is: a file whose ``tokenizer_config.json``
    names one of ``weightprep.tokenizer.GENERIC_CLASSES`` (another class, or none, is transformers' to build, and
    the build then reads what transformers built: ``weightprep.tokenizer_snapshot``)."""
    from weightprep.tokenizer import GENERIC_CLASSES

    if not os.path.isfile(path):
        return False
    try:
        with open(Path(path).parent / "tokenizer_config.json", encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return True  # the build says what is wrong with it
    return not isinstance(config, dict) or config.get("tokenizer_class") in GENERIC_CLASSES


def start(path: str | Path) -> None:
    """Start loading ``path`` (a ``tokenizer.json``) unless a load of it is already waiting to be taken; nothing if
    the build will not run that file as it is (``runs_as_is``). Call it before the imports it should overlap."""
    if not runs_as_is(path):
        return
    key = os.path.realpath(path)
    with _lock:
        if key not in _started:
            _started[key] = FastokensPrefetch(Path(path))


def take(path: str | Path) -> FastokensPrefetch | None:
    """The load of ``path`` that ``start`` began (once: a second call gets None), else None."""
    with _lock:
        return _started.pop(os.path.realpath(path), None)
