"""The executors' own contract, checked in this process: what the build relies on (which executor runs parts here,
how many workers and threads, the context that stops the pool) and the code that runs inside the workers
(``_run_local``, the Ray actor's class), which the distributed tests reach only in other processes."""

from __future__ import annotations

import os

import pytest
from split_support import RecordingJob, index_task

from weightprep.distribute import executors
from weightprep.distribute.executors import Executor, LocalExecutor, SerialExecutor
from weightprep.distribute.plan import InputPart


def _parts(n: int) -> list[InputPart]:
    return [InputPart(i, 0, f"in{i}.jsonl", 0, 10, 0, True) for i in range(n)]


def test_which_executors_run_parts_in_this_process():
    assert SerialExecutor().in_process(4) is True
    assert Executor().in_process(1) is False  # a new executor runs elsewhere unless it says otherwise
    assert LocalExecutor(1).in_process(4) is True  # --workers 1
    assert LocalExecutor(4).in_process(1) is True  # a single part
    assert LocalExecutor(2).in_process(2) is False


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
    """``_run_local``, what a pool process runs on each part, called here."""
    executors._init_local(RecordingJob({"threads": 2}))
    result = executors._run_local(_parts(3)[2], task, options)
    assert result["index"] == 2
    assert result["options"] == {"threads": 2, **options}
    assert result["task"] == (None if task is None else "index_task")


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
