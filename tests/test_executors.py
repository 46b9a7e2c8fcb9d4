"""The executors' own contract, checked in this process: what the build relies on (which executor runs parts here,
how many workers and threads, the context that stops the pool) and the code that runs inside the workers
(``_run_local``, the Ray actor's class), which the distributed tests reach only in other processes."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import pytest
from split_support import PRELOADED, DyingJob, MarkingWarmup, RecordingJob, index_task, slow_elsewhere_task

from weightprep.distribute import executors
from weightprep.distribute.executors import RETRIES, Executor, LocalExecutor, RayExecutor, SerialExecutor
from weightprep.distribute.plan import InputPart
from weightprep.errors import UsageError


def _parts(n: int) -> list[InputPart]:
    return [InputPart(i, 0, f"in{i}.jsonl", 0, 10, 0, True) for i in range(n)]


def test_which_executors_run_parts_in_this_process():
    assert SerialExecutor().in_process(4) is True
    assert Executor().in_process(1) is False  # a new executor runs elsewhere unless it says otherwise
    assert LocalExecutor(1).in_process(4) is True  # --workers 1
    assert LocalExecutor(4).in_process(1) is True  # a single part
    assert LocalExecutor(2).in_process(2) is False
    executor = LocalExecutor(2).start(RecordingJob(), 0)  # no parts (every input empty): nothing to start
    assert executor.in_process(0) and list(executor.map([])) == []


def test_a_serial_build_hands_its_own_tokenizer_to_the_job(tmp_path, monkeypatch):
    """In this process the job uses the tokenizer the build loaded: loading another one would fail here."""
    from conftest import SAMPLE_RAW

    from weightprep.config import BuildConfig
    from weightprep.distribute import job
    from weightprep.pipeline import build

    def no_second_load(*args, **kwargs):
        raise AssertionError("the job loaded a tokenizer of its own")

    monkeypatch.setattr(job, "load_tokenizer", no_second_load)
    summary = build([str(SAMPLE_RAW)], tmp_path / "out", BuildConfig(), executor=SerialExecutor())
    assert summary["counts"]["records"] > 0


@pytest.mark.parametrize("affinity, count, expected", [({0, 1, 2}, 8, 3), (None, 6, 6), (None, None, 1)])
def test_the_cores_counted_are_this_processs(monkeypatch, affinity, count, expected):
    """The cores this process may run on (its affinity, pid 0 = this process), else the machine's, else 1."""
    if affinity is None:
        monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    else:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: affinity if pid == 0 else {0})
    monkeypatch.setattr(os, "cpu_count", lambda: count)
    assert executors._cpus() == expected


@pytest.mark.parametrize(
    "workers, cores, n_parts, processes, threads",
    [(None, 8, 3, 3, 2), (None, 8, 20, 8, 1), (2, 8, 5, 2, 4), (4, 2, 9, 4, 1), (3, 1, 9, 3, 1)],
)
def test_local_workers_and_their_threads(monkeypatch, workers, cores, n_parts, processes, threads):
    """One worker per core (or --workers), at most one per part; the cores shared among them, at least 1 each."""
    monkeypatch.setattr(executors, "_cpus", lambda: cores)
    executor = LocalExecutor(workers).start(RecordingJob(), n_parts)
    assert (executor._processes, executor.job.options) == (processes, {"threads": threads})
    assert executor._pool is None  # started at the first map, not before


def test_an_executor_is_the_context_that_stops_its_workers():
    parts = _parts(3)
    executor = LocalExecutor(2)
    with executor.start(RecordingJob(), len(parts)) as started:
        assert started is executor
        results = sorted(started.map(parts, cut=7), key=lambda r: r["index"])
        pids = {r["pid"] for r in results}
    assert [r["index"] for r in results] == [0, 1, 2]
    assert all(r["options"] == {"threads": results[0]["options"]["threads"], "cut": 7} for r in results)
    assert os.getpid() not in pids
    assert executor._pool is None
    for pid in pids:  # the pool's processes are gone once the context ends
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_serial_map_runs_the_job_or_the_task_with_the_options():
    executor = SerialExecutor().start(RecordingJob({"a": 1}), 2)
    assert [r["options"] for r in executor.map(_parts(2), cut=3)] == [{"a": 1, "cut": 3}] * 2
    ran = list(executor.map(_parts(2), task=index_task))
    assert [(r["index"], r["task"], r["options"]) for r in ran] == [(0, "index_task", {"a": 1}), (1, "index_task", {"a": 1})]


@pytest.mark.parametrize("task", [None, index_task])
@pytest.mark.parametrize("options", [{}, {"cut": 5}])
def test_a_pool_worker_runs_the_job_or_the_task_with_the_options(task, options):
    """``_run_local``, what a pool process runs on each part, called here: the job read from the pool's queue at
    the first part, and kept for the next ones."""
    import queue

    jobs: queue.Queue = queue.Queue()
    jobs.put(RecordingJob({"threads": 2}))
    executors._init_local(jobs, None, 2)
    for index in (2, 0):
        result = executors._run_local(_parts(3)[index], task, options)
        assert result["index"] == index
        assert result["options"] == {"threads": 2, **options}
        assert result["task"] == (None if task is None else "index_task")
    assert jobs.empty()  # read once


def _marks(directory, n: int) -> dict[int, str]:
    """The ``MarkingWarmup`` files of ``directory`` once there are ``n`` of them: pid -> threads."""
    deadline = time.monotonic() + 60
    while len(found := list(directory.glob("warm-*"))) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return {int(p.name.split("-")[1]): p.read_text() for p in found}


def test_warm_starts_the_workers_before_the_job_and_start_keeps_them(tmp_path, monkeypatch):
    """``warm`` starts every process of the pool now, each running the warm-up (with its threads) before any job
    exists; ``start`` for as many parts keeps them, and the job reaches each of them."""
    monkeypatch.setattr(executors, "_cpus", lambda: 4)
    executor = LocalExecutor(2)
    executor.warm(MarkingWarmup(str(tmp_path)), 3)
    warmed = _marks(tmp_path, 2)
    assert sorted(warmed.values()) == ["2", "2"]  # 4 cores, 2 processes
    with executor.start(RecordingJob({"a": 1}), 3):
        results = list(executor.map(_parts(3)))
        again = list(executor.map(_parts(3), task=index_task))
    assert sorted(r["index"] for r in results) == [0, 1, 2]
    assert {r["pid"] for r in results + again} <= set(warmed)  # no process besides the warmed ones
    assert all(r["options"] == {"a": 1, "threads": 2} and r["warmed"] == "2" for r in results)
    assert len(_marks(tmp_path, 2)) == 2  # each warmed once
    assert executor._pool is None
    for pid in warmed:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_pool_forked_from_the_prestarted_server_runs_as_a_spawned_one(tmp_path, monkeypatch):
    """After ``prestart`` the pool's processes are forked from the fork server (their parent is the server, not this
    process), with the modules of a chat build imported by the server, and run the warm-up and the job as spawned
    ones do; once this process's environment changed (which a forked process would not see), a pool spawns its
    processes again, importing what they need themselves."""
    from multiprocessing import forkserver

    monkeypatch.setattr(executors, "_cpus", lambda: 4)
    monkeypatch.setattr(executors, "_forkserver", None)  # this test's own snapshot of the environment
    assert executors.prestart(chat=True)
    server = forkserver._forkserver._forkserver_pid  # started now, before any pool
    assert server is not None and os.waitpid(server, os.WNOHANG) == (0, 0)
    runs = []
    for changed in (False, True):
        if changed:
            monkeypatch.setenv("WEIGHTPREP_TEST_CHANGED", "1")
            assert executors.prestart(chat=True) is False  # the server cannot see it: not used
        marks = tmp_path / str(changed)
        marks.mkdir()
        executor = LocalExecutor(2)
        executor.warm(MarkingWarmup(str(marks)), 2)
        warmed = _marks(marks, 2)
        with executor.start(RecordingJob({"a": 1}), 2):
            results = list(executor.map(_parts(2)))
        assert sorted(r["index"] for r in results) == [0, 1] and {r["pid"] for r in results} <= set(warmed)
        assert all(r["options"] == {"a": 1, "threads": 2} and r["warmed"] == "2" for r in results)
        runs.append(({r["parent"] for r in results}, {tuple(r["preloaded"]) for r in results}))
    (forked, preloaded), (spawned, imported) = runs
    assert os.getpid() not in forked and spawned == {os.getpid()}
    assert preloaded == {PRELOADED} and imported == {()}
    monkeypatch.delenv("WEIGHTPREP_TEST_CHANGED")
    executors.stop_prestarted()  # this test's server: stopped, waited for
    assert executors._forkserver is None and executors._fork_context() is None


@pytest.mark.parametrize("at_once", [True, False])
def test_a_stopped_fork_server_ends_without_the_teardown(tmp_path, monkeypatch, at_once):
    """The build's driver waits for the fork server it stops; the server ends at once (``distribute.forkserver``,
    first of its preload), without freeing what it imported object by object (``tests/teardown_marker.py`` tells
    the teardown); without that module it tears down as usual."""
    from multiprocessing import forkserver

    marker = tmp_path / "teardown"
    monkeypatch.setenv("WEIGHTPREP_TEST_TEARDOWN", str(marker))  # before the server starts: it inherits it
    monkeypatch.setenv("PYTHONPATH", os.path.dirname(__file__))  # where the server finds teardown_marker
    monkeypatch.setattr(executors, "_forkserver", None)
    preload = executors._PRELOAD if at_once else tuple(m for m in executors._PRELOAD if not m.endswith(".forkserver"))
    monkeypatch.setattr(executors, "_PRELOAD", (*preload, "teardown_marker"))
    assert executors.prestart(chat=False)
    server = forkserver._forkserver._forkserver_pid
    assert server is not None and os.waitpid(server, os.WNOHANG) == (0, 0)  # running
    executors.stop_prestarted()  # stopped, waited for
    assert forkserver._forkserver._forkserver_pid is None
    assert marker.read_text() == ("" if at_once else "teardown\n")  # (made by the server's import of the module)


def test_no_fork_server_no_prestart(monkeypatch):
    """Where the platform has no fork server (multiprocessing's ``get_context("forkserver")`` raises ValueError, as
    on Windows), ``prestart`` says so and starts nothing: pools spawn their processes."""
    import multiprocessing

    real = multiprocessing.get_context

    def get_context(method=None):
        if method == "forkserver":
            raise ValueError("cannot find context for 'forkserver'")
        return real(method)

    monkeypatch.setattr(multiprocessing, "get_context", get_context)
    monkeypatch.setattr(executors, "_forkserver", None)
    assert executors.prestart(chat=True) is False
    assert executors._forkserver is None and executors._fork_context() is None


def test_a_build_that_started_the_fork_server_stops_it(tmp_path):
    """A command-line build of two files (two parts: ``_start_workers_early`` starts the fork server) writes what a
    serial build writes, and stops the server at its end, waiting for it (its workers' CPU counted, no process
    left)."""
    from multiprocessing import forkserver

    from click.testing import CliRunner
    from conftest import SAMPLE_RAW

    from weightprep.cli import main

    lines = SAMPLE_RAW.read_text().splitlines(keepends=True)
    inputs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    inputs[0].write_text("".join(lines[: len(lines) // 2]))
    inputs[1].write_text("".join(lines[len(lines) // 2 :]))
    started = []
    real = executors.prestart
    outs = {}
    for name in ("local", "serial"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(executors, "_cpus", lambda: 2)
            patch.setattr(executors, "prestart", lambda chat: started.append(chat) or real(chat))
            args = ["build", *map(str, inputs), "--out", str(tmp_path / name), "--executor", name]
            result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        outs[name] = {p.name: p.read_bytes() for p in (tmp_path / name).glob("*.arrow")}
    assert started == [False]  # the local build's, and only its
    assert outs["local"] == outs["serial"] and len(outs["local"]) == 2
    assert executors._forkserver is None and forkserver._forkserver._forkserver_pid is None


def test_the_command_line_starts_the_workers_early_where_the_inputs_make_several_parts_likely(tmp_path, monkeypatch):
    """``weightprep build`` starts the fork server before its imports where its inputs' sizes make several parts
    likely (``_start_workers_early``): a conversation file over two parts of conversations, a file over a part, two
    files; not a small file, a file of pieces under a part, one worker, or what only the plan can size."""
    from weightprep.commands import build
    from weightprep.distribute.plan import chat_part_bytes

    calls: list[bool] = []
    monkeypatch.setattr(executors, "prestart", lambda chat: calls.append(chat) or True)
    monkeypatch.setattr(executors, "_cpus", lambda: 2)
    part = 64 << 20
    over = chat_part_bytes(part) + 1  # two parts of conversations, not of pieces
    chat, pieces, small = tmp_path / "chat.jsonl", tmp_path / "pieces.jsonl", tmp_path / "small.jsonl"
    chat.write_bytes(b'{"messages": []}\n'.ljust(over, b" "))
    pieces.write_bytes(b'{"pieces": []}\n'.ljust(over, b" "))
    small.write_bytes(b'{"messages": []}\n')
    cases = [
        (([str(chat)], None, part), [True]), (([str(pieces)], None, part), []), (([str(small)], None, part), []),
        (([str(pieces)], None, over - 1), [False]), (([str(small), str(small)], None, part), [False]),
        (([str(chat)], 1, part), []), (([str(tmp_path)], None, part), []), ((["s3://bucket/chat.jsonl"], None, part), []),
    ]  # fmt: skip
    for (inputs, workers, part_bytes), expected in cases:
        calls.clear()
        build._start_workers_early(tuple(inputs), workers, part_bytes)
        assert calls == expected, (inputs, workers, part_bytes)
    monkeypatch.setattr(executors, "_cpus", lambda: 1)
    build._start_workers_early((str(chat),), None, part)
    assert calls == []


def test_a_start_that_cannot_use_the_warm_pool_stops_it(tmp_path):
    """Started for a single part (in this process), the executor stops the processes ``warm`` started."""
    executor = LocalExecutor(2)
    executor.warm(MarkingWarmup(str(tmp_path)), 2)
    warmed = _marks(tmp_path, 2)
    with executor.start(RecordingJob(), 1):
        assert executor._pool is None
        assert [r["pid"] for r in executor.map(_parts(1))] == [os.getpid()]
    for pid in warmed:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert LocalExecutor(2).warm(MarkingWarmup(str(tmp_path)), 1) is None  # one part: nothing to start


@pytest.mark.parametrize("task", [None, index_task])
@pytest.mark.parametrize("options", [{}, {"cut": 5}])
def test_a_ray_actor_runs_the_job_in_the_drivers_directory(tmp_path, monkeypatch, task, options):
    """The actor's class, made here as Ray makes it in a worker: it moves to the driver's directory when that
    exists on its machine, and runs the job or the task with the options."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "driver").mkdir()
    actor = executors._PartActor(RecordingJob({"threads": 1}, cwd=str(tmp_path / "driver")))
    assert os.getcwd() == str(tmp_path / "driver")
    assert actor.pid() == os.getpid()
    result = actor.run(_parts(2)[1], task, options)
    assert (result["index"], result["options"], result["task"]) == (
        1, {"threads": 1, **options}, None if task is None else "index_task",
    )
    monkeypatch.chdir(tmp_path)
    executors._PartActor(RecordingJob(cwd=str(tmp_path / "not-on-this-machine")))
    assert os.getcwd() == str(tmp_path)  # a directory this machine lacks: it stays where it is


def test_starting_again_stops_the_pool_of_the_last_start():
    """An executor started for a second build (the Python API) does not leave the first build's workers behind."""
    executor = LocalExecutor(2)
    with executor.start(RecordingJob(), 2):
        first = {r["pid"] for r in executor.map(_parts(2))}
        assert executor.start(RecordingJob({"second": True}), 2) is executor
        for pid in first:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        assert all(r["options"]["second"] for r in executor.map(_parts(2)))
    in_process = LocalExecutor(1)
    assert in_process.start(RecordingJob(), 3) is in_process  # --workers 1: a serial executor inside
    assert [r["pid"] for r in in_process.map(_parts(3))] == [os.getpid()] * 3


@pytest.mark.parametrize("deaths", [RETRIES, RETRIES + 1])
def test_a_part_whose_worker_dies_runs_again_up_to_retries_times(tmp_path, deaths):
    """A worker that dies breaks the pool: a new one runs the unfinished parts, RETRIES times at most."""
    with LocalExecutor(2).start(DyingJob(str(tmp_path), deaths), 2) as executor:
        if deaths > RETRIES:
            with pytest.raises(UsageError, match=f"a worker process died {RETRIES + 1} times"):
                list(executor.map(_parts(2)))
        else:
            assert sorted(r["index"] for r in executor.map(_parts(2))) == [0, 1]
    assert len(list(tmp_path.iterdir())) == min(deaths, RETRIES + 1)  # part 0 ran once per pool, and no more


# ---- the Ray executor's driver side, on a stand-in for the ray module ------------------------------------------
# (tests/test_distribute.py runs it on a real local Ray cluster; this drives the same code with the cluster's answers
# chosen, quickly and in this process)


class _Ref:
    def __init__(self, call):
        self.call = call


class _FakeRay:
    """The parts of the ``ray`` module that RayExecutor uses. An actor's call runs when ``wait`` hands its reference
    back (one at a time, in submission order); ``nodes`` and ``cluster_resources`` answer what the test set."""

    class exceptions:
        class RayTaskError(Exception):
            def __init__(self, cause=None):
                super().__init__("task failed")
                self.cause = cause

        class RayActorError(Exception):
            pass

    def __init__(self, cpus=4.0, nodes=(4.0,), initialized=False):
        self.cpus, self.node_cpus, self.initialized = cpus, nodes, initialized
        self.inits, self.remote_options, self.killed, self.waited, self.shutdowns = [], [], [], [], 0
        self.actors_made = []
        self.fail_with = {}  # part index -> exception ray.get raises

    def is_initialized(self):
        return self.initialized

    def init(self, **kwargs):
        self.inits.append(kwargs)
        self.initialized = True

    def shutdown(self):
        self.shutdowns += 1
        self.initialized = False

    def cluster_resources(self):
        if isinstance(self.cpus, Exception):
            raise self.cpus
        return {} if self.cpus is None else {"CPU": self.cpus}  # None: Ray reports no CPU resource at all

    def nodes(self):
        return [{"Alive": True, "Resources": {} if c is None else {"CPU": c}} for c in self.node_cpus] + [
            {"Alive": False, "Resources": {"CPU": 1000.0}}
        ]

    def remote(self, **options):
        self.remote_options.append(options)
        fake = self

        def wrap(cls):
            class Handle:
                def __init__(self, obj):
                    self.obj = obj

                    class _Run:
                        @staticmethod
                        def remote(part, task, opts):
                            return _Ref(lambda: (part.index, obj.run(part, task, opts)))

                    self.run = _Run

            class ActorClass:
                @staticmethod
                def remote(job):
                    handle = Handle(cls(job))
                    fake.actors_made.append(handle)
                    return handle

            return ActorClass

        return wrap

    def wait(self, refs, num_returns=1, timeout=None):
        if timeout is not None:
            self.waited.append(len(refs))
            return refs, []
        if num_returns > len(refs):  # as Ray refuses it
            raise ValueError("num_returns cannot be greater than the number of objects provided to ray.wait")
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        index, result = ref.call()
        if index in self.fail_with:
            raise self.fail_with[index]
        return result

    def kill(self, actor):
        self.killed.append(actor)


@pytest.fixture
def fake_ray(monkeypatch):
    import sys

    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return fake


@pytest.mark.parametrize(
    "workers, cluster, nodes, n_parts, actors, cpus",
    [
        (None, 4.0, (4.0,), 10, 4, 1.0),  # one actor per CPU of the cluster
        (None, 8.0, (4.0, 4.0), 3, 3, 8 / 3),  # at most one per part, the CPUs shared among them
        (2, 8.0, (4.0, 4.0), 10, 2, 4.0),  # --workers 2 on two machines of 4: no actor wider than a machine
        (1, 8.0, (4.0, 4.0), 10, 1, 4.0),
        (None, 6.0, (4.0, 2.0), 1, 1, 4.0),  # a single part: as wide as the largest machine
        (3, 2.0, (2.0,), 0, 1, 2.0),  # no parts: still one actor (the build maps nothing)
        (2, 1.0, (1.0,), 10, 2, 0.5),  # half a CPU an actor: still one thread
        (None, None, (None, 4.0), 10, 1, 1.0),  # no CPU resource reported: counted as one
        (None, 1.5, (None, 0.5, 0.5, 0.5), 10, 1, 0.5),  # a node without CPUs is no wider than the others
    ],
)
def test_ray_actors_their_cpus_and_threads(fake_ray, workers, cluster, nodes, n_parts, actors, cpus):
    fake_ray.cpus, fake_ray.node_cpus = cluster, nodes
    executor = RayExecutor(workers).start(RecordingJob(), n_parts)
    assert executor._size == actors
    assert fake_ray.remote_options == [{"num_cpus": cpus, "max_restarts": RETRIES, "max_task_retries": RETRIES}]
    assert executor.job.options == {"threads": max(1, int(cpus))}


def test_ray_starts_a_local_cluster_of_its_workers_and_stops_it(fake_ray, monkeypatch):
    monkeypatch.setattr(executors, "_cpus", lambda: 6)
    for workers, cpus in ((3, 3), (None, 6)):
        executor = RayExecutor(workers)
        with executor.start(RecordingJob(), 4) as started:
            assert started is executor
        assert fake_ray.inits[-1] == {
            "num_cpus": cpus, "include_dashboard": False, "log_to_driver": False, "configure_logging": False,
        }  # fmt: skip
        assert fake_ray.shutdowns == (1 if workers == 3 else 2) and not fake_ray.initialized


def test_ray_joins_the_cluster_it_is_given_and_leaves_it_running(fake_ray, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    executor = RayExecutor(2)
    assert executor.address == "ray://head:10001"
    assert RayExecutor(2, "ray://other:10001").address == "ray://other:10001"  # --ray-address first
    with executor.start(RecordingJob(), 4):
        assert fake_ray.inits == [{
            "address": "ray://head:10001", "include_dashboard": False, "log_to_driver": False,
            "configure_logging": False,
        }]  # fmt: skip
        list(executor.map(_parts(4)))
        actors = list(executor.actors)
    assert fake_ray.shutdowns == 1  # it started the connection, so it ends it
    assert fake_ray.killed == actors  # and its actors are gone
    fake_ray.initialized = True  # a Ray this process had started before the build: used as it is, left running
    with RayExecutor(2).start(RecordingJob(), 4):
        pass
    assert fake_ray.shutdowns == 1 and len(fake_ray.inits) == 1 and fake_ray.initialized


def test_a_ray_map_runs_every_part_on_its_actors_and_keeps_them_for_the_next(fake_ray):
    executor = RayExecutor(2).start(RecordingJob(), 5)
    first = list(executor.map(_parts(5), cut=4))
    assert sorted(r["index"] for r in first) == [0, 1, 2, 3, 4]
    assert all(r["options"] == {"threads": 2, "cut": 4} for r in first)
    assert len(fake_ray.actors_made) == 2
    second = list(executor.map(_parts(3), task=index_task))
    assert sorted(r["index"] for r in second) == [0, 1, 2] and {r["task"] for r in second} == {"index_task"}
    assert len(fake_ray.actors_made) == 2  # the same actors for the second pass
    executor.close()
    assert fake_ray.killed == fake_ray.actors_made and executor.actors == []
    executor.close()  # twice is harmless
    assert fake_ray.shutdowns == 1


def test_a_ray_task_error_is_its_cause_and_a_dead_actor_a_usage_error(fake_ray):
    executor = RayExecutor(2).start(RecordingJob(), 4)
    fake_ray.fail_with = {0: fake_ray.exceptions.RayTaskError(ValueError("bad part"))}
    with pytest.raises(ValueError, match="bad part"):
        list(executor.map(_parts(4)))
    fake_ray.fail_with = {0: fake_ray.exceptions.RayTaskError(None)}  # no cause to give: Ray's own error
    with pytest.raises(fake_ray.exceptions.RayTaskError):
        list(executor.map(_parts(4)))
    fake_ray.fail_with = {1: fake_ray.exceptions.RayActorError("gone")}
    with pytest.raises(UsageError, match=f"restarted {RETRIES} times at most"):
        list(executor.map(_parts(4)))


def test_a_ray_map_left_early_kills_its_actors_and_waits_for_their_parts(fake_ray):
    executor = RayExecutor(2).start(RecordingJob(), 4)
    stream = executor.map(_parts(4))
    assert next(stream)["index"] == 0  # parts in order, one per actor: part 1 is still running
    actors = list(executor.actors)
    stream.close()
    assert fake_ray.killed == actors and executor.actors == []
    assert fake_ray.waited == [1]  # the running part, waited for (with a timeout) so that it writes nothing later
    assert sorted(r["index"] for r in executor.map(_parts(4))) == [0, 1, 2, 3]  # new actors for the next map
    assert len(fake_ray.actors_made) == 4


def test_starting_a_ray_executor_again_ends_what_the_last_start_began(fake_ray):
    executor = RayExecutor(2).start(RecordingJob(), 4)
    list(executor.map(_parts(4)))
    first = list(executor.actors)
    executor.start(RecordingJob(), 4)
    assert fake_ray.killed == first and fake_ray.shutdowns == 1  # its actors and the cluster it had started
    assert len(fake_ray.inits) == 2


def test_ray_stops_the_cluster_it_started_when_sizing_it_fails(fake_ray):
    fake_ray.cpus = RuntimeError("the cluster went away")
    with pytest.raises(RuntimeError, match="went away"):
        RayExecutor(2).start(RecordingJob(), 4)
    assert fake_ray.shutdowns == 1 and not fake_ray.initialized


def test_each_executor_name_makes_its_executor_and_an_unknown_one_is_refused():
    ray = executors.make_executor("ray", 2, "ray://head:10001")
    assert type(ray) is RayExecutor and ray.workers == 2 and ray.address == "ray://head:10001"
    assert type(executors.make_executor("local", 3)) is LocalExecutor
    assert type(executors.make_executor("serial")) is SerialExecutor
    with pytest.raises(UsageError, match="unknown executor 'dask'"):
        executors.make_executor("dask")


class _Slow(RecordingJob):
    """A RecordingJob whose part ``index`` runs until its progress call raises (a part of many blocks), noting in
    ``marks`` that it started and how it ended; ``fail``: raises ValueError instead."""

    def __init__(self, marks: str, index: int, fail: bool = False, options: dict | None = None) -> None:
        super().__init__(options)
        self.marks, self.index, self.fail = marks, index, fail

    def with_options(self, **changes):
        return _Slow(self.marks, self.index, self.fail, {**self.options, **changes})

    def __call__(self, part, progress=None):
        if part.index == self.index:
            if self.fail:
                raise ValueError(f"part {part.index} cannot be read")
            Path(self.marks, "started").touch()
            try:
                for _ in range(6000):
                    progress(0, Counter())
                    time.sleep(0.01)
            except BaseException as exc:
                Path(self.marks, "stopped").write_text(type(exc).__name__)
                raise
        return super().__call__(part, progress)


def test_with_driver_this_process_is_one_of_the_workers(monkeypatch):
    """``driver=True``: a pool of one process fewer, the threads shared by all the workers, and parts run here
    too, each once, with the map's options; other tasks too."""
    monkeypatch.setattr(executors, "_cpus", lambda: 4)
    executor = LocalExecutor(2, driver=True)
    assert executor.in_driver(5) and not executor.in_process(5) and not LocalExecutor(2).in_driver(5)
    with executor.start(RecordingJob(), 5):
        assert (executor._processes, executor.job.options) == (1, {"threads": 2})
        results = list(executor.map(_parts(5), cut=4))
        tasks = list(executor.map(_parts(3), task=index_task))
    assert sorted(r["index"] for r in results) == [0, 1, 2, 3, 4]
    pids = {r["pid"] for r in results}
    assert os.getpid() in pids and len(pids) == 2  # here and in the pool's one process
    assert all(r["options"] == {"threads": 2, "cut": 4} for r in results)
    assert sorted(r["index"] for r in tasks) == [0, 1, 2] and all(r["task"] == "index_task" for r in tasks)
    assert all(r["options"] == {"threads": 2} for r in tasks)


def test_a_map_left_early_stops_the_part_running_here_at_its_next_block(tmp_path):
    """The pool's part finishes first; leaving the map then kills the pool and stops the part running here at its
    next progress call, waited for: no part keeps running once the map is closed."""
    import threading

    executor = LocalExecutor(2, driver=True)
    with executor.start(_Slow(str(tmp_path), 1), 2):
        stream = executor.map(_parts(2))
        first = next(stream)
        assert first["index"] == 0 and first["pid"] != os.getpid()
        assert (tmp_path / "started").exists()
        started = time.monotonic()
        stream.close()
        assert time.monotonic() - started < 30
        assert (tmp_path / "stopped").read_text() == "_Stopped"
        assert not [t for t in threading.enumerate() if t.name.startswith("weightprep-part")]
        assert executor._pool is None


def test_a_part_that_fails_here_fails_the_map():
    executor = LocalExecutor(2, driver=True)
    with executor.start(_Slow("", 1, fail=True), 2), pytest.raises(ValueError, match="part 1 cannot be read"):
        list(executor.map(_parts(2)))
    assert executor._pool is None


def test_the_command_lines_local_executor_runs_parts_in_the_driver_too():
    executor = executors.make_executor("local", 3)
    assert isinstance(executor, LocalExecutor) and executor.driver and executor.workers == 3


class _SlowElsewhere(RecordingJob):
    """A RecordingJob that takes a second in any process but ``here``'s."""

    def __init__(self, here: int, options: dict | None = None) -> None:
        super().__init__(options)
        self.here = here

    def with_options(self, **changes):
        return _SlowElsewhere(self.here, {**self.options, **changes})

    def __call__(self, part, progress=None):
        if os.getpid() != self.here:
            time.sleep(1.0)
        return super().__call__(part, progress)


@pytest.mark.parametrize("workers", [2, 3])
def test_parts_wait_for_a_free_worker_rather_than_behind_a_busy_process(workers):
    """Parts are handed out one at a time: while the pool's processes are busy with their parts, this process,
    free, runs every other part (none is queued behind a busy one)."""
    executor = LocalExecutor(workers, driver=True)
    with executor.start(_SlowElsewhere(os.getpid()), 6):
        results = list(executor.map(_parts(6)))
    here = {r["index"] for r in results if r["pid"] == os.getpid()}
    assert here == set(range(workers - 1, 6))  # the pool's processes took the first ones, one each


def test_warm_stops_the_pool_of_an_earlier_build(tmp_path):
    """An executor used again (the Python API): ``warm`` stops the last build's processes and warms new ones."""
    executor = LocalExecutor(2)
    with executor.start(RecordingJob(), 2):
        first = {r["pid"] for r in executor.map(_parts(2))}
    executor.start(RecordingJob(), 2)
    assert {r["pid"] for r in executor.map(_parts(2))}  # a running pool, then warm
    running = set(executor._pool._processes)
    executor.warm(MarkingWarmup(str(tmp_path)), 2)
    warmed = _marks(tmp_path, 2)
    assert len(warmed) == 2 and not set(warmed) & (first | running)
    for pid in running:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with executor.start(RecordingJob(), 2):
        assert {r["pid"] for r in executor.map(_parts(2))} <= set(warmed)


def test_a_pool_process_runs_the_warm_up_with_its_threads_before_any_part(tmp_path, monkeypatch):
    """``_init_local``, what a pool process runs first, called here: the heap bounded first (``weightprep.heap``),
    then the warm-up, which gets the threads; the job is read only at the first part."""
    import queue

    from split_support import WARMED

    monkeypatch.delenv(WARMED, raising=False)  # restored after: the warm-up sets it in this process
    calls: list[str] = []
    monkeypatch.setattr(executors, "bound_heap", lambda: calls.append("heap") or True)
    jobs: queue.Queue = queue.Queue()
    warm = MarkingWarmup(str(tmp_path))
    executors._init_local(jobs, lambda threads: (calls.append("warm"), warm(threads)), 3)
    assert calls == ["heap", "warm"]  # the heap bounded before the warm-up starts the tokenizer's threads
    assert (tmp_path / f"warm-{os.getpid()}").read_text() == "3" and os.environ[WARMED] == "3"
    jobs.put(RecordingJob({"threads": 3}))
    assert executors._run_local(_parts(1)[0], None, {})["warmed"] == "3"


def test_tasks_too_run_here_while_the_pool_is_busy():
    """Another task (``KeyPass``'s read of the parts) is handed out as parts are: this process runs every part
    that comes while the pool's process is busy."""
    executor = LocalExecutor(2, driver=True)
    with executor.start(RecordingJob({"here": os.getpid()}), 4):
        results = list(executor.map(_parts(4), task=slow_elsewhere_task))
    assert {r["index"] for r in results if r["pid"] == os.getpid()} == {1, 2, 3}
    assert all(r["task"] == "index_task" for r in results)
