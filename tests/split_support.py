"""Helpers of the distributed-build tests that worker processes and Ray actors must be able to unpickle."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from weightprep.distribute.executors import Executor


def wait_for_parts(pid_dir: str, indices: Any, timeout: float = 60.0) -> None:
    """Wait (up to ``timeout`` seconds) until one of the parts ``indices`` has noted its pid in ``pid_dir``."""
    deadline = time.monotonic() + timeout
    while not any(any(Path(pid_dir).glob(f"{i}.*")) for i in indices) and time.monotonic() < deadline:
        time.sleep(0.05)


class DelayedJob:
    """A PartJob that first sleeps ``delays[index]`` seconds and notes its pid in ``pid_dir`` while it runs; with
    ``after`` (part -> part), a part first waits (up to a minute) until the other one has noted its pid, so a test
    that needs two parts running at once does not depend on how fast workers start."""

    def __init__(
        self, job: Any, delays: dict[int, float], pid_dir: str | None = None, after: dict[int, int] | None = None
    ) -> None:
        self.job, self.delays, self.pid_dir, self.after = job, delays, pid_dir, after or {}

    def __getattr__(self, name: str) -> Any:  # the rest of the PartJob (cwd, ...) as it is
        if name == "job":
            raise AttributeError(name)
        return getattr(self.job, name)

    def with_options(self, **changes: Any) -> DelayedJob:
        return DelayedJob(self.job.with_options(**changes), self.delays, self.pid_dir, self.after)

    def __call__(self, part: Any, progress: Any = None) -> dict[str, Any]:
        if self.pid_dir is not None:
            Path(self.pid_dir, f"{part.index}.{os.getpid()}").touch()
            if part.index in self.after:
                wait_for_parts(self.pid_dir, (self.after[part.index],))
        time.sleep(self.delays.get(part.index, 0.0))
        return self.job(part, progress)


class Delaying(Executor):
    """``inner`` with every part delayed (``DelayedJob``); ``order`` records the order parts finished in (every
    pass), ``reused`` the parts an earlier build had finished."""

    def __init__(
        self, inner: Executor, delays: dict[int, float], pid_dir: str | None = None, after: dict[int, int] | None = None
    ) -> None:
        self.inner, self.delays, self.pid_dir, self.after = inner, delays, pid_dir, after
        self.order: list[int] = []
        self.reused: list[int] = []

    def in_process(self, n_parts: int) -> bool:
        return self.inner.in_process(n_parts)

    def start(self, job: Any, n_parts: int) -> Delaying:
        self.inner.start(DelayedJob(job, self.delays, self.pid_dir, self.after), n_parts)
        return self

    def map(self, parts: Any, progress: Any = None, **options: Any) -> Any:
        with contextlib.closing(self.inner.map(parts, progress, **options)) as results:
            for result in results:
                self.order.append(result["index"])
                if result.get("reused"):
                    self.reused.append(result["index"])
                yield result

    def close(self) -> None:
        self.inner.close()


class RecordingJob:
    """A stand-in PartJob for the executors' own tests: ``with_options`` merges into ``options``, a call returns the
    part's index, the options it ran with, the worker's pid and its parent's, which of ``PRELOADED`` it has imported (``cwd``: where a Ray actor moves to)."""

    def __init__(self, options: dict[str, Any] | None = None, cwd: str = "") -> None:
        self.options, self.cwd = dict(options or {}), cwd

    def with_options(self, **changes: Any) -> RecordingJob:
        return RecordingJob({**self.options, **changes}, self.cwd)

    def __call__(self, part: Any, progress: Any = None) -> dict[str, Any]:
        return {"index": part.index, "options": self.options, "pid": os.getpid(), "task": None,
                "warmed": os.environ.get(WARMED), "parent": os.getppid(),
                "preloaded": sorted(m for m in PRELOADED if m in sys.modules)}  # fmt: skip


#: the modules a fork server may import before it forks a worker (``executors.prestart``); a spawned worker that
#: runs ``RecordingJob`` imports neither
PRELOADED = ("weightprep.distribute.forkserver", "weightprep.distribute.job", "weightprep.stages.chat")


#: what ``MarkingWarmup`` sets in a worker's environment: the threads it was given
WARMED = "WEIGHTPREP_TEST_WARMED"


class MarkingWarmup:
    """A stand-in ``job.Warmup``: notes the threads it was given in the worker's environment and as a file
    ``warm-<pid>`` in ``marks``."""

    def __init__(self, marks: str) -> None:
        self.marks = marks

    def __call__(self, threads: int | None) -> None:
        os.environ[WARMED] = str(threads)
        part = Path(self.marks, f".part-{os.getpid()}")  # renamed into place whole: a reader never sees it empty
        part.write_text(str(threads))
        part.rename(Path(self.marks, f"warm-{os.getpid()}"))


def index_task(job: RecordingJob, part: Any) -> dict[str, Any]:
    """A task (``map(..., task=)``) that says it ran, with the job's options."""
    return {"index": part.index, "options": job.options, "pid": os.getpid(), "task": "index_task"}


def slow_elsewhere_task(job: RecordingJob, part: Any) -> dict[str, Any]:
    """``index_task`` that first takes a second in any process but the one of the job's option ``here``."""
    if os.getpid() != job.options.get("here"):
        time.sleep(1.0)
    return index_task(job, part)


class DyingJob(RecordingJob):
    """A RecordingJob whose process kills itself (SIGKILL) when it starts part ``index``, the first ``deaths`` times
    (counted by files in ``marks``, which every process sees)."""

    def __init__(self, marks: str, deaths: int, index: int = 0, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self.marks, self.deaths, self.index = marks, deaths, index

    def with_options(self, **changes: Any) -> DyingJob:
        return DyingJob(self.marks, self.deaths, self.index, {**self.options, **changes})

    def __call__(self, part: Any, progress: Any = None) -> dict[str, Any]:
        if part.index == self.index:
            died = len(list(Path(self.marks).iterdir()))
            if died < self.deaths:
                Path(self.marks, str(died)).touch()
                os.kill(os.getpid(), signal.SIGKILL)
        return super().__call__(part, progress)
