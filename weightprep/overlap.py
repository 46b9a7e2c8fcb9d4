"""Overlap pipeline stages with threads, so reading and writing run while the tokenizer works.

The tokenizer, pyarrow's JSON parser and Arrow writing all release the GIL, so three threads —
read+parse, tokenize+assemble (the caller's), pack+write — keep every core busy on the heavy parts.
Queues are bounded (``depth`` items), so memory stays bounded however fast one side runs; an
exception in any thread stops the others and is re-raised in the caller. Order is preserved, so the
output does not depend on timing.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

__all__ = ["background", "BackgroundSink"]

T = TypeVar("T")
_DONE = object()


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _put(q: queue.Queue, item: object, stop: threading.Event) -> bool:
    """Put unless asked to stop; return False when stopped."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def background(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """Iterate ``items`` in a thread, up to ``depth`` items ahead of the consumer."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                if not _put(q, item, stop):
                    return
            _put(q, _DONE, stop)
        except BaseException as exc:  # handed to the consumer, which re-raises it
            _put(q, _Failure(exc), stop)

    # in a copy of the caller's context: the build's storage session (weightprep.storage) reaches the reads
    thread = threading.Thread(target=contextvars.copy_context().run, args=(produce,), name="weightprep-read", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item
    finally:
        stop.set()
        thread.join()


class BackgroundSink(Generic[T]):
    """Feed items to ``consume`` in a thread; ``close()`` waits for it and re-raises its error."""

    def __init__(self, consume: Callable[[T], None], depth: int = 2) -> None:
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._consume = consume
        self._thread = threading.Thread(  # the caller's context, as background()'s thread
            target=contextvars.copy_context().run, args=(self._run,), name="weightprep-write", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                item = self._q.get(timeout=0.1)
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            if item is _DONE:
                return
            try:
                self._consume(item)
            except BaseException as exc:
                self._error = exc
                self._stop.set()
                return

    def put(self, item: T) -> None:
        if self._error is not None or not _put(self._q, item, self._stop):
            self._raise()

    def close(self) -> None:
        """Wait until everything put has been consumed; re-raise the consumer's error, if any."""
        _put(self._q, _DONE, self._stop)
        self._thread.join()
        self._raise()

    def cancel(self) -> None:
        """Stop without consuming the rest (on an error elsewhere)."""
        self._stop.set()
        self._thread.join(timeout=60)

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error
