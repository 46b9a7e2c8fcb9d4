"""What a long command shows while it works: a rich bar in a terminal, plain lines in a log.

A build (or a training run) redirected to a file (a cluster job, CI, ``nohup``) cannot redraw a bar, and a bar
that is never drawn leaves the log empty until the end. So when stderr is not a terminal, ``ProgressLines``
writes one self-contained line every ``every_s`` seconds or each ``step`` of the work (5 %), whichever comes
first, and a last one at the end; while no update comes (parts that finish in worker processes), a heartbeat thread
repeats the last state every ``every_s``, so a log never goes quiet for longer::

    building: 45% of 120.3 MB, 81,234 records, 9,876,543 tokens (412,345 tokens/s), 0:00:24 elapsed, ETA 0:00:29

The rate and the ETA are averages since the work began (the object's creation, or ``begin``: what a resumed run
did before it does not count), so a slow start does not make the ETA swing. ``Steps`` times the steps of a start-up (listing the inputs, loading the tokenizer, starting the workers)
and writes a line for each that took a second or more, so ten silent seconds before the first bar say where they
go.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["ProgressLines", "Steps", "format_duration", "build_progress", "heartbeat", "may_be_terminal"]


def format_duration(seconds: float) -> str:
    """``H:MM:SS`` (rich's TimeRemainingColumn's form)."""
    s = max(0, round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class ProgressLines:
    """Plain progress lines for a log: ``label: share of total, fields, rate, elapsed, ETA``.

    ``update(done, records=..., tokens=...)`` is called as often as the work likes; a line is written only when
    ``every_s`` seconds passed since the last one or the share done crossed the next multiple of ``step``.
    ``total`` is in the units of ``done``, ``unit`` (``bytes``: shown as MB; else ``45% (45 of 100 steps)``); 0 or
    None: no share and no ETA. ``note`` (``loss 2.31``) ends the line."""

    def __init__(
        self,
        label: str,
        total: float | None,
        write: Callable[[str], None],
        *,
        every_s: float = 10.0,
        step: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        unit: str = "bytes",
    ) -> None:
        self.label, self.total, self.write, self.unit = label, total or 0, write, unit
        self.every_s, self.step, self.clock = every_s, step, clock
        self.start = clock()
        self._first: tuple[float, int] = (0, 0)
        self._last_time = self.start
        self._next_share = step
        self._last: tuple[float, dict[str, int], str] | None = None
        self._written: tuple[float, dict[str, int], str] | None = None
        self._lock = threading.Lock()  # update (the work's thread) and tick (a heartbeat thread)

    def update(self, done: float, note: str = "", **fields: int) -> None:
        with self._lock:
            now = self.clock()
            self._last = (done, fields, note)
            share = done / self.total if self.total else 0.0
            if now - self._last_time >= self.every_s or (self.total and share >= self._next_share):
                self._emit(now)

    def begin(self, done: float, tokens: int = 0) -> None:
        """The work starts now, from ``done`` (a resumed run's earlier steps): the rate and the ETA count from here."""
        with self._lock:
            self.start = self._last_time = self.clock()
            self._first = (done, tokens)

    def tick(self) -> None:
        """A heartbeat: the last state again (elapsed and ETA as of now) when no line was written for ``every_s``,
        or, before the first update, that the work is under way. For work whose updates come seldom (parts that
        finish in worker processes), so that a log still gets a line every ``every_s``."""
        with self._lock:
            now = self.clock()
            if self._last is None:
                if now - self._last_time >= self.every_s:
                    self.write(f"{self.label}: under way, {format_duration(now - self.start)} elapsed")
                    self._last_time = now
            elif now - self._last_time >= self.every_s:
                self._emit(now)

    def close(self) -> None:
        """The last line, if the last update was not written already."""
        with self._lock:
            if self._last is not None and self._last != self._written:
                self._emit(self.clock())

    def _emit(self, now: float) -> None:
        assert self._last is not None
        done, fields, note = self._last
        elapsed = now - self.start
        parts = []
        if self.total:
            share = min(1.0, done / self.total)
            if self.unit == "bytes":
                parts.append(f"{100 * share:.0f}% of {self.total / 1e6:,.1f} MB")
            else:
                parts.append(f"{100 * share:.0f}% ({done:,.0f} of {self.total:,.0f} {self.unit})")
            while self._next_share <= share:
                self._next_share += self.step
        for name, value in fields.items():
            parts.append(f"{value:,} {name}")
        first_done, first_tokens = self._first
        tokens = fields.get("tokens")
        if tokens and elapsed > 0:
            parts[-1] += f" ({(tokens - first_tokens) / elapsed:,.0f} tokens/s)"
        parts.append(f"{format_duration(elapsed)} elapsed")
        if self.total and done < self.total and done > first_done and elapsed > 0:
            parts.append(f"ETA {format_duration(elapsed * (self.total - done) / (done - first_done))}")
        if note:
            parts.append(note)
        self.write(f"{self.label}: {', '.join(parts)}")
        self._last_time = now
        self._written = self._last


class Steps:
    """Times start-up steps: ``with steps("loading the tokenizer"):`` writes ``loading the tokenizer: 3.2 s`` when the
    step took ``threshold_s`` or more (default 1 s); shorter ones say nothing."""

    def __init__(
        self, write: Callable[[str], None], *, threshold_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.write, self.threshold_s, self.clock = write, threshold_s, clock

    @contextlib.contextmanager
    def __call__(self, what: str) -> Iterator[None]:
        start = self.clock()
        yield
        took = self.clock() - start
        if took >= self.threshold_s:
            self.write(f"{what}: {took:.1f} s")


@contextlib.contextmanager
def heartbeat(lines: ProgressLines, period_s: float = 1.0) -> Iterator[None]:
    """``lines.tick()`` every ``period_s`` from a daemon thread while the block runs (``ProgressLines.tick``)."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(period_s):
            lines.tick()

    thread = threading.Thread(target=beat, name="weightprep-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def may_be_terminal(stream: Any) -> bool:
    """Whether rich's ``Console`` writing to ``stream`` may see a terminal: False only where it surely does not
    (``stream`` no tty, and neither ``TTY_COMPATIBLE=1`` nor a non-empty ``FORCE_COLOR``, the settings that make
    rich draw anyway), so that a build logging to a file need not import rich (~0.04 s of its start) to be told."""
    if os.environ.get("TTY_COMPATIBLE") == "1" or os.environ.get("FORCE_COLOR"):
        return True
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream: rich says no terminal too
        return False


@contextlib.contextmanager
def build_progress(total: int, write: Callable[[str], None]) -> Iterator[Callable[..., None]]:
    """The build's progress on stderr: a rich bar (bytes read, records, ETA) when it is a terminal, else
    ``ProgressLines`` through ``write``. Yields ``update(consumed_bytes, records=..., tokens=...)``."""
    console = None
    if may_be_terminal(sys.stderr):
        from rich.console import Console

        console = Console(stderr=True)
    if console is None or not console.is_terminal:
        lines = ProgressLines("building", total, write)
        with heartbeat(lines):
            try:
                yield lines.update
            finally:
                lines.close()
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn("building"),
        BarColumn(),
        DownloadColumn(),
        TextColumn("{task.fields[records]:,} records"),
        TextColumn("{task.fields[tokens]:,} tokens"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("build", total=total, records=0, tokens=0)
        yield lambda consumed, records=0, tokens=0: bar.update(task, completed=consumed, records=records, tokens=tokens)
