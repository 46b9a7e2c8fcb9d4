"""What a command prints passes through ``weightprep.redact``: no URL secret reaches a terminal or a log file.

The commands' own messages name URLs as the user gave them (``error: https://***@host/x.jsonl:12: ...``); instead
of each ``echo`` remembering to redact, the command line wraps ``sys.stdout`` and ``sys.stderr`` once
(``redacting_streams``), so that what libraries, warnings, progress lines and tracebacks print is covered too. The
wrapper keeps a partial line until its end (or a ``flush``), so a URL written in pieces is still seen whole.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from weightprep.redact import redact

__all__ = ["RedactingStream", "redacting_streams"]


class RedactingStream:
    """A text stream that writes ``redact(text)`` to ``inner``, a line at a time; everything else is ``inner``'s."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        cut = max(self._pending.rfind("\n"), self._pending.rfind("\r"))
        if cut >= 0:
            self.inner.write(redact(self._pending[: cut + 1]))
            self._pending = self._pending[cut + 1 :]
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self._pending:
            self.inner.write(redact(self._pending))
            self._pending = ""
        self.inner.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding...: the inner stream's
        if name == "buffer":  # bytes written there would pass unredacted: writers (click) fall back to the text
            raise AttributeError(name)
        return getattr(self.inner, name)


@contextlib.contextmanager
def redacting_streams() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` redacted for the duration (nested: the outer wrapping stays)."""
    saved = sys.stdout, sys.stderr
    if not isinstance(sys.stdout, RedactingStream):
        sys.stdout = RedactingStream(sys.stdout)  # type: ignore[assignment]
    if not isinstance(sys.stderr, RedactingStream):
        sys.stderr = RedactingStream(sys.stderr)  # type: ignore[assignment]
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdout, sys.stderr = saved
