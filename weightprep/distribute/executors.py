"""Executors: an ordered map of the per-part work (``weightprep.distribute.job.PartJob``) over the part plan.

- ``SerialExecutor``: every part in this process, one after the other (the tokenizer and fastokens still use
  every core).
- ``LocalExecutor`` (the default): a pool of worker processes on this machine, one part at a time each, and on
  the command line this process too (``driver=True``); a single part, or ``--workers 1``, runs in this process
  like ``SerialExecutor``. The pool is started while the build loads its tokenizer (``warm``), its processes forked
  from a fork server that the command line started before its own imports where the inputs make several parts likely
  (``prestart``: their imports made already), else spawned. A worker that dies (killed,
  out of memory) breaks the pool: it is started again and the unfinished parts are run again, up to
  ``RETRIES`` times.
- ``RayExecutor``: one Ray actor per worker on a Ray cluster (``--ray-address`` / ``RAY_ADDRESS``; without one, a
  local cluster sized to the workers). Each actor loads the tokenizer once; Ray restarts an actor that dies and
  retries its part, up to ``RETRIES`` times.

An executor is started once per build, with the build's job (``with executor.start(job, n_parts):``): its pool,
or its actors and the Ray cluster it started, serve every pass over the parts (``--validation-records`` makes
two), and ``map(parts, progress, task, **options)`` runs ``job.with_options(**options)`` on each part (or
``task(job, part)``: another task on the same workers, such as the key pass ``KeyPass``). Executors
yield results as parts finish, in any order; ``run_parts`` orders them, and reports the earliest bad line in
input order whatever finished first. A map left before its end (that error is known, Ctrl-C, a failure)
terminates the parts still running: their processes are killed, and replaced if the build maps again. A part's
result is written whole or not at all (``PartJob``), so a retried part ends with the same bytes and a killed
one leaves no result.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterator
from typing import Any

from weightprep.distribute.plan import InputPart, line_bases, segment_line_bases
from weightprep.errors import BackendMismatch, InputError, UsageError
from weightprep.heap import bound_heap

__all__ = ["Executor", "SerialExecutor", "LocalExecutor", "RayExecutor", "make_executor", "run_parts", "RETRIES"]

#: How often a part whose worker died is run again.
RETRIES = 3

#: (part index, input bytes of that part read so far, records accepted in it so far); only in-process runs report it.
PartProgress = Callable[[int, int, Counter], None]

#: Another task than the job itself, on the same workers: ``task(job, part)`` returns the part's result
#: (picklable: it travels to the workers with each part).
Task = Callable[[Any, InputPart], dict[str, Any]]


class Executor:
    """Runs one build's job on its parts: ``start`` once (a context manager: ``close`` at its end), then ``map``
    for every pass over the parts."""

    job: Any = None

    def in_process(self, n_parts: int) -> bool:
        """Whether all ``n_parts`` parts run in this process."""
        return False

    def in_driver(self, n_parts: int) -> bool:
        """Whether some of ``n_parts`` parts run in this process (then the build hands its own tokenizer to the
        job)."""
        return self.in_process(n_parts)

    def warm(self, warmup: Callable[[int | None], None], n_parts: int) -> None:
        """Start the workers for up to ``n_parts`` parts before their job is known, each calling ``warmup(threads)``
        first (``job.Warmup``: the tokenizer loaded while the driver loads its own and opens the output); the next
        ``start``, for ``n_parts`` parts, keeps them. The default starts nothing: ``start`` does."""

    def start(self, job: Any, n_parts: int) -> Executor:
        """Get ready to run ``job`` on up to ``n_parts`` parts (start the pool, the actors); returns ``self``."""
        self.job = job
        return self

    def map(
        self, parts: list[InputPart], progress: PartProgress | None = None, task: Task | None = None, **options: Any
    ) -> Iterator[dict[str, Any]]:
        """``job.with_options(**options)(part)`` for every part (``task``: ``task(job, part)`` instead, without
        progress), each result yielded as it is done."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop what ``start`` started."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SerialExecutor(Executor):
    def in_process(self, n_parts: int) -> bool:
        return True

    def map(
        self, parts: list[InputPart], progress: PartProgress | None = None, task: Task | None = None, **options: Any
    ) -> Iterator[dict[str, Any]]:
        job = self.job.with_options(**options) if options else self.job
        for part in parts:
            if task is not None:
                yield task(job, part)
                continue
            report = None
            if progress is not None:
                def report(consumed: int, counts: Counter, index: int = part.index) -> None:
                    progress(index, consumed, counts)
            yield job(part, report)


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class LocalExecutor(Executor):
    """A process pool of ``workers`` processes (default: one per core, at most one per part), started at the
    build's first map (or by ``warm``, while the driver loads its tokenizer) and kept for its later ones. The
    job reaches each process through a queue, read at its first part: a pool that ``warm`` started before the
    job was known runs it as one started with it.

    ``driver=True`` (the command line's): this process is one of the workers, running parts in a thread beside
    a pool of one process fewer, with the tokenizer it loaded (``in_driver``; the build adopts it into the job):
    no process started, no tokenizer loaded for that worker. Parts are handed out one at a time, in order, to
    whichever worker is free; a map left before its end stops the part running here at its next block (its
    progress call raises ``_Stopped``) and waits for that. Another task run here (``KeyPass``: a read of its part,
    without progress calls) is waited for to its end."""

    def __init__(self, workers: int | None = None, *, driver: bool = False) -> None:
        self.workers = workers
        self.driver = driver
        self._serial: SerialExecutor | None = None
        self._pool: Any = None
        self._jobs: Any = None  # the running pool's queue of the job, one copy per process
        self._generation = 0  # counts the pools stopped: a part's pool is the running one while it is the same
        self._processes = 1  # the pool's processes
        self._warmup: Callable[[int | None], None] | None = None

    def _size(self, n_parts: int) -> int:
        """Workers (this process among them with ``driver``)."""
        return max(1, min(self.workers or _cpus(), n_parts))

    def _threads(self) -> int:
        return max(1, _cpus() // (self._processes + self.driver))

    def in_process(self, n_parts: int) -> bool:
        return self._size(n_parts) == 1

    def in_driver(self, n_parts: int) -> bool:
        return self.driver or self.in_process(n_parts)

    def warm(self, warmup: Callable[[int | None], None], n_parts: int) -> None:
        self.close()
        if self.in_process(n_parts):
            return
        self._processes, self._warmup = self._size(n_parts) - self.driver, warmup
        pool = self._running_pool()
        for _ in range(self._processes):  # a process per call while none is idle: all of them, now
            pool.submit(os.getpid)

    def start(self, job: Any, n_parts: int) -> LocalExecutor:
        processes = self._size(n_parts) - self.driver
        warmed = self._pool is not None and self._warmup is not None and self._processes == processes
        if not warmed:
            self.close()
        if self.in_process(n_parts):
            self._serial = SerialExecutor().start(job, n_parts)
            return self
        self._processes = processes
        self.job = job.with_options(threads=self._threads())
        if warmed:
            self._send_job()
        return self

    def _send_job(self) -> None:
        for _ in range(self._processes):
            self._jobs.put(self.job)

    def _running_pool(self) -> Any:
        """The build's pool, started at its first use (and again after a worker died or a map was left)."""
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            context = _fork_context() or multiprocessing.get_context("spawn")
            self._jobs = context.Queue()
            self._pool = ProcessPoolExecutor(
                self._processes, mp_context=context, initializer=_init_local,
                initargs=(self._jobs, self._warmup, self._threads()),
            )  # fmt: skip
            if self.job is not None:
                self._send_job()
        return self._pool

    def _stop(self, *, terminate: bool = False) -> None:
        """Shut the pool down; with ``terminate``, kill its processes first instead of waiting for their parts."""
        pool, jobs, self._pool, self._jobs = self._pool, self._jobs, None, None
        if pool is None:
            return
        self._generation += 1
        if terminate:
            if hasattr(pool, "terminate_workers"):  # Python 3.14
                pool.terminate_workers()
            else:  # a running call cannot be cancelled: its process is killed (the pool is then broken, and joined)
                for process in list((getattr(pool, "_processes", None) or {}).values()):
                    process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        jobs.cancel_join_thread()  # copies of the job that no process read (it ran no part) are dropped
        jobs.close()

    def map(
        self, parts: list[InputPart], progress: PartProgress | None = None, task: Task | None = None, **options: Any
    ) -> Iterator[dict[str, Any]]:
        if self._serial is not None:
            yield from self._serial.map(parts, progress, task, **options)
            return
        from concurrent.futures import FIRST_COMPLETED, wait
        from concurrent.futures.process import BrokenProcessPool

        waiting = deque(parts)
        here = self.driver
        running: dict[Any, tuple[InputPart, int | None]] = {}  # future -> its part and its pool (None: here)
        stop = threading.Event()
        breaks = 0
        try:
            while waiting or running:
                in_pool = sum(1 for _, pool in running.values() if pool is not None)
                while waiting and in_pool < self._processes:
                    part = waiting.popleft()
                    future = self._running_pool().submit(_run_local, part, task, options)
                    running[future] = (part, self._generation)
                    in_pool += 1
                if here and waiting and all(pool is not None for _, pool in running.values()):
                    part = waiting.popleft()
                    job = self.job.with_options(**options) if options else self.job
                    running[_run_here(job, part, stop, task)] = (part, None)
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=lambda f: running[f][0].index):
                    part, pool = running.pop(future)
                    try:
                        result = future.result()
                    except BrokenProcessPool:  # its process died: the part runs again, on a new pool
                        waiting.appendleft(part)
                        if pool == self._generation:  # the first of this pool's parts to tell
                            breaks += 1
                            if breaks > RETRIES:
                                raise UsageError(
                                    f"a worker process died {RETRIES + 1} times running the parts; see its error above, "
                                    "or lower --workers if it ran out of memory"
                                ) from None
                            self._stop()
                        continue
                    yield result
        finally:
            if running:  # left before its end: the parts still running are not waited for, but the one here
                stop.set()
                self._stop(terminate=True)
                wait([f for f, (_, pool) in running.items() if pool is None])

    def close(self) -> None:
        self._stop()
        self._serial = None
        self.job = self._warmup = None


class _Stopped(BaseException):
    """Raised in the part that runs in the driver's thread, at its next block, when its map was left."""


def _run_here(job: Any, part: InputPart, stop: threading.Event, task: Task | None = None) -> Any:
    """``job(part)`` (or ``task(job, part)``) in a thread of this process (``LocalExecutor(driver=True)``): its
    future."""
    from concurrent.futures import Future

    future: Future = Future()  # (nothing cancels it: the map waits for it, or stops its part)

    def check(consumed: int, counts: Counter) -> None:
        if stop.is_set():
            raise _Stopped

    def run() -> None:
        try:
            result = task(job, part) if task is not None else job(part, check)
        except BaseException as exc:  # noqa: BLE001 (the map raises it, or has been left)
            future.set_exception(exc)
        else:
            future.set_result(result)

    threading.Thread(target=run, name=f"weightprep-part-{part.index:05d}", daemon=True).start()
    return future


_LOCAL_JOB: Any = None
_LOCAL_JOBS: Any = None  # where this pool process reads the job, at its first part

#: what a pool process imports for its part (``prestart``); a build of conversations, their stage too. First: the
#: module that ends the server itself at once when the build stops it (``weightprep.distribute.forkserver``)
_PRELOAD = ("weightprep.distribute.forkserver", "weightprep.distribute.job")
_PRELOAD_CHAT = ("weightprep.stages.chat",)
#: the fork server's context, once ``prestart`` started it, with this process's environment and ``sys.path`` then
_forkserver: tuple[Any, dict[str, str], list[str]] | None = None


def _fork_context() -> Any:
    """The fork server's context where ``prestart`` started it and this process's environment and ``sys.path`` are
    still those it started with (a forked process sees those, a spawned one the current ones); else None."""
    if _forkserver is None:
        return None
    context, environ, path = _forkserver
    return context if environ == dict(os.environ) and path == sys.path else None


def prestart(chat: bool) -> bool:
    """Start, now, the process that a build's worker processes will be forked from (multiprocessing's fork
    server), importing what they need while this process imports its own: where a build will start a pool
    (``LocalExecutor.warm``, once its parts are planned, after this process's imports), each of its processes then
    starts its part with its imports made (a 2-part build of 20,000 conversations: 1.66 -> 1.59 s,
    docs/performance.md). The command line calls it where the inputs' sizes make a plan of several parts likely; a
    build that plans one part starts no pool, and the server waits unused. False where the platform has no fork
    server (Windows): pools spawn their processes."""
    global _forkserver
    if _forkserver is not None:  # one server a process (multiprocessing's): usable while nothing it saw changed
        return _fork_context() is not None
    import multiprocessing

    try:
        context = multiprocessing.get_context("forkserver")
    except ValueError:
        return False
    from multiprocessing import forkserver

    context.set_forkserver_preload(list(_PRELOAD + _PRELOAD_CHAT if chat else _PRELOAD))
    forkserver.ensure_running()
    _forkserver = (context, dict(os.environ), list(sys.path))
    return True


def stop_prestarted() -> None:
    """Stop the fork server that ``prestart`` started and wait for it (its processes' CPU time is then this
    process's children's, as spawned ones' is); nothing where none runs. multiprocessing has no public call for it:
    its own ``_stop``, where the server has one (else it ends with this process, as it would anyway)."""
    global _forkserver
    if _forkserver is None:
        return
    _forkserver = None
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)
    if stop is not None:
        stop()


def _init_local(jobs: Any, warmup: Callable[[int | None], None] | None, threads: int) -> None:
    global _LOCAL_JOB, _LOCAL_JOBS
    bound_heap()  # first in the process, before the tokenizer's threads (weightprep.heap)
    _LOCAL_JOB, _LOCAL_JOBS = None, jobs
    if warmup is not None:
        warmup(threads)


def _run_local(part: InputPart, task: Task | None, options: dict[str, Any]) -> dict[str, Any]:
    global _LOCAL_JOB
    if _LOCAL_JOB is None:
        _LOCAL_JOB = _LOCAL_JOBS.get()
    job = _LOCAL_JOB.with_options(**options) if options else _LOCAL_JOB
    return task(job, part) if task is not None else job(part)  # type: ignore[no-any-return]


class _PartActor:
    """A Ray actor: the job of the build, and this process's tokenizer once its first part loaded it."""

    def __init__(self, job: Any) -> None:
        self.job = job
        if os.path.isdir(job.cwd):  # the driver's relative paths mean the same here (a shared filesystem)
            os.chdir(job.cwd)

    def run(self, part: InputPart, task: Task | None, options: dict[str, Any]) -> dict[str, Any]:
        job = self.job.with_options(**options) if options else self.job
        return task(job, part) if task is not None else job(part)  # type: ignore[no-any-return]

    def pid(self) -> int:
        return os.getpid()


class RayExecutor(Executor):
    """Ray actors, ``workers`` of them (default: one per CPU of the cluster, at most one per part).

    ``address``: the cluster to join (default ``RAY_ADDRESS``; without either, a local cluster of ``workers``
    CPUs is started for this build and stopped after it). A Ray already initialized in this process is used as
    it is. Workers read inputs and write the output by path: on a cluster, a filesystem every machine mounts at
    the same path."""

    #: How long a map left before its end waits for the actors it killed to be gone.
    KILL_WAIT_S = 30.0

    def __init__(self, workers: int | None = None, address: str | None = None) -> None:
        self.workers = workers
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        #: the build's actors (tests kill one to check the retry)
        self.actors: list[Any] = []
        self._ray: Any = None
        self._owned = False
        self._actor_class: Any = None
        self._size = 1

    def start(self, job: Any, n_parts: int) -> RayExecutor:
        self.close()
        try:
            import ray
        except ImportError:
            raise UsageError("--executor ray needs Ray: pip install 'weightprep[ray]'") from None
        self._ray, self._owned = ray, not ray.is_initialized()
        if self._owned:
            init: dict[str, Any] = {"address": self.address} if self.address else {"num_cpus": self.workers or _cpus()}
            ray.init(**init, include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            total = float(ray.cluster_resources().get("CPU", 1))
            largest = max((float(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n.get("Alive")), default=total)
            self._size = max(1, min(self.workers or int(total), n_parts))
            cpus = min(total / self._size, largest)
            self._actor_class = ray.remote(num_cpus=cpus, max_restarts=RETRIES, max_task_retries=RETRIES)(_PartActor)
            self.job = job.with_options(threads=max(1, int(cpus)))
        except BaseException:
            self.close()
            raise
        return self

    def _kill(self, pending: list[Any] | None = None) -> None:
        """Kill the actors; wait (a while) for the parts they were running, ``pending``, to end with them, so that
        none of them still writes once the build has moved on (or removed its directory)."""
        for actor in self.actors:
            self._ray.kill(actor)
        self.actors = []
        if pending:
            self._ray.wait(list(pending), num_returns=len(pending), timeout=self.KILL_WAIT_S)

    def map(
        self, parts: list[InputPart], progress: PartProgress | None = None, task: Task | None = None, **options: Any
    ) -> Iterator[dict[str, Any]]:
        ray = self._ray
        if not self.actors:  # the build's first map (or the first after one was left)
            self.actors = [self._actor_class.remote(self.job) for _ in range(self._size)]
        idle = list(self.actors)
        queue = list(reversed(parts))
        pending: dict[Any, Any] = {}
        try:
            while queue or pending:
                while queue and idle:
                    actor = idle.pop()
                    pending[actor.run.remote(queue.pop(), task, options)] = actor
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
        finally:
            if pending:  # left before its end: the parts still running are not waited for
                self._kill(list(pending))

    def close(self) -> None:
        if self._ray is None:
            return
        self._kill()
        if self._owned:
            self._ray.shutdown()
        self._ray, self._owned = None, False


def make_executor(name: str, workers: int | None = None, ray_address: str | None = None) -> Executor:
    """The executor of ``--executor NAME``."""
    if name == "serial":
        return SerialExecutor()
    if name == "local":
        return LocalExecutor(workers, driver=True)
    if name == "ray":
        return RayExecutor(workers, ray_address)
    raise UsageError(f"unknown executor {name!r}: expected local, ray or serial")


def run_parts(
    executor: Executor,
    parts: list[InputPart],
    progress: Callable[[int, Counter], None] | None,
    **options: Any,
) -> list[dict[str, Any]]:
    """Every part's result (``job.with_options(**options)``, or ``options["task"]``, on the started ``executor``), in
    part order. A part that met a bad line (strict mode, or, in either mode, input that cannot be read at all) ends
    the build with the earliest such line in input order, numbered within its file, once every part before it has finished; parts
    after it are not waited for (the executor terminates those still running)."""
    results: dict[int, dict[str, Any]] = {}
    first_error: int | None = None
    finished_bytes, finished = 0, Counter()  # bytes, records (accepted) and tokens of the finished parts

    def report_partial(index: int, consumed: int, counts: Counter) -> None:
        if progress is not None:
            progress(finished_bytes + consumed, finished + Counter(accepted=counts["accepted"], tokens=counts["tokens"]))

    with contextlib.closing(executor.map(parts, report_partial if progress is not None else None, **options)) as stream:
        for result in stream:
            index = result["index"]
            results[index] = result
            if result.get("error") is not None and (first_error is None or index < first_error):
                first_error = index
            if first_error is not None and all(i in results for i in range(first_error)):
                break  # the earliest error is known: leaving the map stops the later parts
            finished_bytes += parts[index].size
            for c in result.get("counts", {}).values():
                finished.update(accepted=c.get("accepted", 0), tokens=c.get("tokens_accepted", 0))
            if progress is not None:
                progress(finished_bytes, +finished)
    if first_error is not None:
        e = results[first_error]["error"]
        if "segment" in e:  # a mixed part (a build with sources): numbered within its segment's file
            seen = [[i["lines"] for i in results[s.index]["inputs"]] for s in parts[:first_error]]
            here = [0] * len(parts[first_error].segments)
            line = e["line"] + segment_line_bases(parts[: first_error + 1], [*seen, here])[first_error][e["segment"]]
        else:
            earlier = [results[s.index]["input"]["lines"] for s in parts[:first_error]]
            line = e["line"] + line_bases(parts[: first_error + 1], [*earlier, 0])[first_error]
        if e["type"] == "backend_mismatch":
            raise BackendMismatch(e["path"], line, e["field"], e["problem"])
        raise InputError(e["path"], line, e["field"], e["problem"], reason=e["reason"], offset=e["offset"])
    return [results[i] for i in range(len(parts))]
