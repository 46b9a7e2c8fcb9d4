"""Executors: an ordered map of the per-split work (``weightprep.pipeline.SplitJob``) over the split plan.

- ``SerialExecutor``: every split in this process, one after the other (the tokenizer and fastokens still use
  every core).
- ``LocalExecutor`` (the default): a pool of worker processes on this machine, one split at a time each; a
  single split, or ``--workers 1``, runs in this process like ``SerialExecutor``. A worker that dies (killed,
  out of memory) breaks the pool: it is started again and the unfinished splits are run again, up to
  ``RETRIES`` times.
- ``RayExecutor``: one Ray actor per worker on a Ray cluster (``--ray-address`` / ``RAY_ADDRESS``; without one, a
  local cluster sized to the workers). Each actor loads the tokenizer once; Ray restarts an actor that dies and
  retries its split, up to ``RETRIES`` times.

Executors yield results as splits finish, in any order; ``run_splits`` orders them, and reports the earliest bad
line in input order whatever finished first. A split's result is written whole or not at all
(``SplitJob``), so a retried split ends with the same bytes.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from weightprep.distribute.plan import InputSplit
from weightprep.errors import BackendMismatch, InputError, UsageError

__all__ = ["Executor", "SerialExecutor", "LocalExecutor", "RayExecutor", "make_executor", "run_splits", "RETRIES"]

#: How often a split whose worker died is run again.
RETRIES = 3

#: (split index, input bytes of that split read so far, records accepted in it so far); only in-process runs report it.
SplitProgress = Callable[[int, int, int], None]


class Executor:
    """Runs ``job(split)`` for every split; ``map`` yields each result as it is done."""

    def in_process(self, n_splits: int) -> bool:
        """Whether ``n_splits`` splits run in this process (then the build hands its own tokenizer to the job)."""
        return False

    def map(self, job: Any, splits: list[InputSplit], progress: SplitProgress | None = None) -> Iterator[dict[str, Any]]:
        raise NotImplementedError


class SerialExecutor(Executor):
    def in_process(self, n_splits: int) -> bool:
        return True

    def map(self, job: Any, splits: list[InputSplit], progress: SplitProgress | None = None) -> Iterator[dict[str, Any]]:
        for split in splits:
            report = None
            if progress is not None:
                def report(consumed: int, counts: Counter, index: int = split.index) -> None:
                    progress(index, consumed, counts["accepted"])
            yield job(split, report)


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class LocalExecutor(Executor):
    """A process pool of ``workers`` processes (default: one per core, at most one per split)."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers

    def _size(self, n_splits: int) -> int:
        return max(1, min(self.workers or _cpus(), n_splits))

    def in_process(self, n_splits: int) -> bool:
        return self._size(n_splits) == 1

    def map(self, job: Any, splits: list[InputSplit], progress: SplitProgress | None = None) -> Iterator[dict[str, Any]]:
        if self.in_process(len(splits)):
            yield from SerialExecutor().map(job, splits, progress)
            return
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
        from concurrent.futures.process import BrokenProcessPool

        size = self._size(len(splits))
        job = job.with_options(threads=max(1, _cpus() // size))
        todo = {s.index: s for s in splits}
        for attempt in range(RETRIES + 1):
            pool = ProcessPoolExecutor(size, mp_context=multiprocessing.get_context("spawn"), initializer=_init_local, initargs=(job,))
            try:
                futures = {pool.submit(_run_local, s): s.index for s in todo.values()}
                while futures:
                    done, _ = wait(futures, return_when=FIRST_COMPLETED)
                    for f in done:
                        index = futures.pop(f)
                        try:
                            result = f.result()
                        except BrokenProcessPool:
                            if attempt == RETRIES:
                                raise UsageError(
                                    f"a worker process died {RETRIES + 1} times running the splits; see its error above, "
                                    "or lower --workers if it ran out of memory"
                                ) from None
                            continue
                        del todo[index]
                        yield result
                if not todo:
                    return
            finally:
                pool.shutdown(wait=True, cancel_futures=True)


_LOCAL_JOB: Any = None


def _init_local(job: Any) -> None:
    global _LOCAL_JOB
    _LOCAL_JOB = job


def _run_local(split: InputSplit) -> dict[str, Any]:
    return _LOCAL_JOB(split)  # type: ignore[no-any-return]


class _SplitActor:
    """A Ray actor: the job of the build, and this process's tokenizer once its first split loaded it."""

    def __init__(self, job: Any) -> None:
        self.job = job
        if os.path.isdir(job.cwd):  # the driver's relative paths mean the same here (a shared filesystem)
            os.chdir(job.cwd)

    def run(self, split: InputSplit) -> dict[str, Any]:
        return self.job(split)  # type: ignore[no-any-return]

    def pid(self) -> int:
        return os.getpid()


class RayExecutor(Executor):
    """Ray actors, ``workers`` of them (default: one per CPU of the cluster, at most one per split).

    ``address``: the cluster to join (default ``RAY_ADDRESS``; without either, a local cluster of ``workers``
    CPUs is started for this build and stopped after it). A Ray already initialized in this process is used as
    it is. Workers read inputs and write the output by path: on a cluster, a filesystem every machine mounts at
    the same path."""

    def __init__(self, workers: int | None = None, address: str | None = None) -> None:
        self.workers = workers
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        #: the actors of the running map (tests kill one to check the retry)
        self.actors: list[Any] = []

    def map(self, job: Any, splits: list[InputSplit], progress: SplitProgress | None = None) -> Iterator[dict[str, Any]]:
        try:
            import ray
        except ImportError:
            raise UsageError("--executor ray needs Ray: pip install 'weightprep[ray]'") from None
        owned = not ray.is_initialized()
        if owned:
            init: dict[str, Any] = {"address": self.address} if self.address else {"num_cpus": self.workers or _cpus()}
            ray.init(**init, include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            yield from self._map(ray, job, splits)
        finally:
            for actor in self.actors:
                ray.kill(actor)
            self.actors = []
            if owned:
                ray.shutdown()

    def _map(self, ray: Any, job: Any, splits: list[InputSplit]) -> Iterator[dict[str, Any]]:
        total = float(ray.cluster_resources().get("CPU", 1))
        largest = max((float(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n.get("Alive")), default=total)
        size = max(1, min(self.workers or int(total), len(splits)))
        cpus = min(total / size, largest)
        actor_class = ray.remote(num_cpus=cpus, max_restarts=RETRIES, max_task_retries=RETRIES)(_SplitActor)
        job = job.with_options(threads=max(1, int(cpus)))
        self.actors = [actor_class.remote(job) for _ in range(size)]
        idle = list(self.actors)
        queue = list(reversed(splits))
        pending: dict[Any, Any] = {}
        while queue or pending:
            while queue and idle:
                actor = idle.pop()
                pending[actor.run.remote(queue.pop())] = actor
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                idle.append(pending.pop(ref))
                try:
                    yield ray.get(ref)
                except ray.exceptions.RayTaskError as exc:
                    cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else None
                    if cause is not None:
                        raise cause from None
                    raise
                except ray.exceptions.RayActorError as exc:
                    raise UsageError(f"a Ray worker failed (it is restarted {RETRIES} times at most): {exc}") from None


def make_executor(name: str, workers: int | None = None, ray_address: str | None = None) -> Executor:
    """The executor of ``--executor NAME``."""
    if name == "serial":
        return SerialExecutor()
    if name == "local":
        return LocalExecutor(workers)
    if name == "ray":
        return RayExecutor(workers, ray_address)
    raise UsageError(f"unknown executor {name!r}: expected local, ray or serial")


def run_splits(
    executor: Executor,
    job: Any,
    splits: list[InputSplit],
    progress: Callable[[int, Counter], None] | None,
) -> list[dict[str, Any]]:
    """Every split's result, in split order. A split that met a bad line (strict mode, or, in either mode, input
    that cannot be read at all) ends the build with the earliest such line in input order, numbered within its file, once every
    split before it has finished; splits after it are not waited for."""
    results: dict[int, dict[str, Any]] = {}
    first_error: int | None = None
    finished_bytes, finished_records = 0, 0
    partial: dict[int, tuple[int, int]] = {}

    def report_partial(index: int, consumed: int, accepted: int) -> None:
        partial[index] = (consumed, accepted)
        if progress is not None:
            progress(finished_bytes + consumed, Counter(accepted=finished_records + accepted))

    stream = executor.map(job, splits, report_partial if progress is not None else None)
    try:
        for result in stream:
            index = result["index"]
            results[index] = result
            partial.pop(index, None)
            if result.get("error") is not None and (first_error is None or index < first_error):
                first_error = index
            if first_error is not None and all(i in results for i in range(first_error)):
                break
            finished_bytes += splits[index].size
            finished_records += sum(c.get("accepted", 0) for c in result.get("counts", {}).values())
            if progress is not None:
                progress(finished_bytes, Counter(accepted=finished_records))
    finally:
        stream.close()
    if first_error is not None:
        e = results[first_error]["error"]
        split = splits[first_error]
        base = sum(results[s.index]["input"]["lines"] for s in splits[:first_error] if s.file == split.file)
        if e["type"] == "backend_mismatch":
            raise BackendMismatch(e["path"], e["line"] + base, e["field"], e["problem"])
        raise InputError(e["path"], e["line"] + base, e["field"], e["problem"], reason=e["reason"], offset=e["offset"])
    return [results[i] for i in range(len(splits))]
