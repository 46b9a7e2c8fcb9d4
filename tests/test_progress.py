"""What long commands show while they work outside a terminal (``weightprep.progress``), and the build's warnings
about what it dropped (``accounting.dropped_warnings``)."""

from __future__ import annotations

import io
import json
import sys

import pytest
from click.testing import CliRunner
from conftest import SAMPLE_RAW
from hypothesis import given
from hypothesis import strategies as st

from weightprep.accounting import dropped_warnings
from weightprep.cli import main
from weightprep.constants import MANIFEST_NAME
from weightprep.progress import ProgressLines, Steps, build_progress, format_duration, may_be_terminal


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_every_few_seconds_and_each_five_percent():
    clock, lines = _Clock(), []
    p = ProgressLines("building", 1000, lines.append, every_s=10, step=0.05, clock=clock)  # the work begins
    p.update(0, records=0, tokens=0)
    assert lines == []
    clock.now += 2
    p.update(10, records=5, tokens=100)  # 1 %, 2 s: nothing yet
    assert lines == []
    clock.now += 2
    p.update(60, records=30, tokens=1200)  # 6 %: a line
    assert lines == ["building: 6% of 0.0 MB, 30 records, 1,200 tokens (300 tokens/s), 0:00:04 elapsed, ETA 0:01:03"]
    clock.now += 9
    p.update(70, records=35, tokens=1400)  # 7 %, 9 s later: nothing
    assert len(lines) == 1
    clock.now += 1
    p.update(80, records=40, tokens=1600)  # 10 s after the last line: a line
    assert len(lines) == 2 and lines[1].startswith("building: 8% of")
    p.update(990, records=99, tokens=2000)  # one jump over many 5 % marks: one line
    assert len(lines) == 3
    p.close()  # the last update was written: no repeat
    assert len(lines) == 3
    p.update(1000, records=100, tokens=2100)
    p.close()
    assert lines[-1].startswith("building: 100% of") and "ETA" not in lines[-1]


@given(st.lists(st.tuples(st.floats(0, 30), st.integers(0, 100)), max_size=60))
def test_lines_come_no_more_often_than_asked(steps):
    """Between two lines either ``every_s`` seconds passed or the share crossed a new 5 % mark: at most 20 lines for
    the shares plus one per 10 s, however the updates come."""
    clock, lines = _Clock(), []
    p = ProgressLines("x", 100, lines.append, every_s=10, step=0.05, clock=clock)
    done = 0
    for dt, more in steps:
        clock.now += dt
        done = min(100, done + more)
        p.update(done, records=done)
    elapsed = sum(dt for dt, _ in steps)
    assert len(lines) <= 21 + elapsed // 10


def test_steps_name_only_the_slow_ones():
    clock, lines = _Clock(), []
    steps = Steps(lines.append, clock=clock)
    with steps("loading the tokenizer"):
        clock.now += 3.25
    with steps("planning"):
        clock.now += 0.5
    assert lines == ["loading the tokenizer: 3.2 s"]
    assert format_duration(3725.4) == "1:02:05"


def test_a_build_to_a_log_writes_plain_progress_lines(tmp_path):
    result = CliRunner().invoke(main, ["build", str(SAMPLE_RAW), "--out", str(tmp_path / "s"), "--part-bytes", "150000",
                                       "--executor", "serial"])  # fmt: skip
    assert result.exit_code == 0, result.output
    progress = [line for line in result.output.splitlines() if line.startswith("building: ")]
    assert len(progress) >= 6  # each part's end crosses a 5 % mark (6 parts)
    assert progress[-1].startswith("building: 100% of 0.8 MB, 402 records, ")
    assert "\x1b[" not in result.output  # no terminal codes in a log


def _counts(documents=100, overlong=0, unsupervised=0, accepted=1000.0, dropped_weight=0.0, truncated=0.0):
    return {"documents": documents, "dropped": {"overlong": overlong, "unsupervised": unsupervised}, "truncated": 3,
            "accounting": {"weight": {"accepted": accepted, "dropped_overlong": dropped_weight,
                                      "cut_truncated": truncated}}}  # fmt: skip


def test_dropping_more_than_five_percent_warns_with_the_fix():
    assert dropped_warnings(_counts(overlong=5, dropped_weight=50.0), 512) == []  # 5 % exactly: no warning
    (w,) = dropped_warnings(_counts(overlong=6, dropped_weight=10.0), 512)
    assert w.startswith("6.0% of the documents (6 of 100) and 1.0% of the weight were dropped as longer than 512")
    assert "--overlong chunk" in w and "--seq-len" in w
    (w,) = dropped_warnings(_counts(overlong=1, dropped_weight=51.0), 2048)  # few documents, much weight
    assert "5.1% of the weight" in w and "2,048 tokens" in w
    (w,) = dropped_warnings(_counts(truncated=60.0), 512)
    assert w.startswith("6.0% of the weight was cut off by truncation") and "--overlong chunk" in w
    (w,) = dropped_warnings(_counts(unsupervised=6), 512)
    assert "dropped as unsupervised" in w


def test_the_seq_len_512_build_warns_at_build_time(tmp_path):
    result = CliRunner().invoke(main, ["build", str(SAMPLE_RAW), "--out", str(tmp_path / "s"), "--seq-len", "512"])
    assert result.exit_code == 0, result.output
    counts = json.loads((tmp_path / "s" / MANIFEST_NAME).read_text())["counts"]
    share = counts["dropped"]["overlong"] / counts["documents"]
    assert share > 0.05  # the premise
    assert f"warning: {100 * share:.1f}% of the documents" in result.output and "--overlong chunk" in result.output


def test_an_interrupted_run_names_its_last_complete_checkpoint(tmp_path):
    from weightprep.train.report import interrupted_message

    assert interrupted_message(tmp_path / "missing", 500, "weightprep train ... --resume").startswith(
        "interrupted before the first checkpoint (one every --save-steps 500 steps): no checkpoint in"
    )
    for step in (2, 4, 10):
        (tmp_path / f"checkpoint-{step}").mkdir()
    for step in (2, 4):  # checkpoint-10 was cut short: no trainer_state.json (written last)
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 1200}))
    message = interrupted_message(tmp_path, 2, "weightprep train S --resume")
    assert message == (f"interrupted: the last checkpoint is {tmp_path / 'checkpoint-4'} (step 4 of 1,200); the final "
                       "model was not saved\n  to continue from it: weightprep train S --resume")  # fmt: skip


@given(st.integers(1, 5000), st.integers(1, 16), st.integers(1, 16), st.integers(1, 8), st.sampled_from([0.5, 1, 2, 3]))
def test_optimizer_steps_count_short_batches_and_accumulations(rows, micro, accum, processes, epochs):
    from weightprep.train.report import optimizer_steps

    batches = -(-rows // (micro * processes))  # every row is in a batch, the last may be short
    per_epoch = max(1, -(-batches // accum))
    steps = optimizer_steps(rows, micro, accum, processes, epochs, -1)
    assert steps == -(-int(epochs * 2 * per_epoch) // 2)  # ceil(epochs x per_epoch), epochs in halves
    assert optimizer_steps(rows, micro, accum, processes, epochs, 7) == 7


def test_the_doctests_of_the_message_helpers():
    import doctest

    from weightprep import accounting
    from weightprep.commands import _rerun

    for module in (accounting, _rerun):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_the_resume_command_replaces_a_given_checkpoint():
    import click

    from weightprep.commands._rerun import KeepsArguments, rerun_command

    @click.command("train", cls=KeepsArguments)
    @click.argument("shards")
    @click.option("--resume", is_flag=False, flag_value="last", default=None)
    @click.option("--lr")
    def train(shards, resume, lr):
        click.echo(rerun_command("--resume", drop_with_value=("--resume",)))

    for flags in (["--resume", "run/checkpoint-2", "--lr", "1e-4"], ["--resume=run/checkpoint-2", "--lr", "1e-4"],
                  ["--resume", "--lr", "1e-4"]):  # fmt: skip
        result = CliRunner().invoke(train, ["s h", *flags])
        assert result.output == "weightprep train 's h' --lr 1e-4 --resume\n", flags


def test_the_start_summary_adds_the_memory_plan_on_a_gpu():
    from weightprep.train.report import start_summary

    manifest = {"counts": {"supervised_tokens": 1, "total_weight": 1.0},
                "splits": {"train": {"counts": {"supervised_tokens": 90, "total_weight": 120.5}}}}  # fmt: skip
    common = dict(model="m", parameters=1000, trainable=10, lora_r=8, rows=100, seq_len=2048, packed=True,
                  manifest=manifest, steps=13, epochs=1, max_steps=-1, micro_batch=4, grad_accum=2, processes=1,
                  device="cuda:0", gpu="H100", precision="bf16", attention="sdpa", gradient_checkpointing=True,
                  normalize="weight")  # fmt: skip
    lines = start_summary(**common).splitlines()
    assert lines[0] == "training m: 1,000 parameters, 10 trainable (LoRA r=8)"
    assert lines[1] == "  data: 100 rows of 2,048 tokens (packed), 90 supervised tokens, weight 120.5"  # the train split's
    assert lines[2].startswith("  steps: 13 (1 epoch(s) of 13 steps), effective batch 8 rows = 16,384 tokens")
    assert len(lines) == 4
    with_plan = start_summary(**common, memory=(int(21.5 * 2**30), 80 * 2**30, 22)).splitlines()
    assert with_plan[:4] == lines
    assert with_plan[4] == "  memory plan: 21.5 of 80.0 GiB per GPU predicted (weightprep plan), up to micro-batch 22"


def test_a_heartbeat_keeps_the_log_going_between_seldom_updates():
    clock, lines = _Clock(), []
    p = ProgressLines("building", 1000, lines.append, every_s=10, clock=clock)
    clock.now += 9
    p.tick()
    assert lines == []
    clock.now += 1
    p.tick()  # no update yet: under way
    assert lines == ["building: under way, 0:00:10 elapsed"]
    clock.now += 5
    p.update(10, records=1, tokens=100)  # 1 %: nothing yet
    clock.now += 4
    p.tick()  # 9 s after the last line
    assert len(lines) == 1
    clock.now += 1
    p.tick()  # 10 s: the last state, as of now
    assert lines[-1] == "building: 1% of 0.0 MB, 1 records, 100 tokens (5 tokens/s), 0:00:20 elapsed, ETA 0:33:00"


def test_a_resumed_run_counts_its_rate_from_where_it_began():
    clock, lines = _Clock(), []
    p = ProgressLines("training", 100, lines.append, every_s=10, clock=clock, unit="steps")
    clock.now += 30  # loading
    p.begin(40)  # resumed at step 40
    clock.now += 10
    p.update(50)
    assert lines == ["training: 50% (50 of 100 steps), 0:00:10 elapsed, ETA 0:00:50"]


def test_the_heartbeat_thread_ticks_and_stops():
    import threading
    import time

    from weightprep.progress import heartbeat

    ticks = []

    class Lines:
        def tick(self):
            ticks.append(threading.current_thread().name)

    with heartbeat(Lines(), period_s=0.01):
        time.sleep(0.2)
    n = len(ticks)
    assert n >= 3 and set(ticks) == {"weightprep-progress"}
    time.sleep(0.05)
    assert len(ticks) == n  # stopped with the block


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        if self.closed:
            raise ValueError("I/O operation on closed file")  # as a real stream's
        return self.tty


@pytest.mark.parametrize(
    ("tty", "env", "expected"),
    [
        (False, {}, False), (True, {}, True),
        (False, {"TTY_COMPATIBLE": "1"}, True), (True, {"TTY_COMPATIBLE": "0"}, True),  # rich decides that one
        (False, {"FORCE_COLOR": "1"}, True), (False, {"FORCE_COLOR": ""}, False), (False, {"TTY_COMPATIBLE": "2"}, False),
    ],
)  # fmt: skip
def test_rich_is_asked_only_where_it_may_see_a_terminal(monkeypatch, tty, env, expected):
    """``may_be_terminal`` is False only where rich's Console would surely say "no terminal" too."""
    from rich.console import Console

    for key in ("TTY_COMPATIBLE", "FORCE_COLOR"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    stream = _Stream(tty)
    assert may_be_terminal(stream) is expected
    if not expected:
        assert not Console(file=stream).is_terminal
    closed = _Stream(tty)
    closed.close()
    assert may_be_terminal(closed) is (bool(env.get("FORCE_COLOR")) or env.get("TTY_COMPATIBLE") == "1")


def test_the_build_progress_is_lines_in_a_log_and_a_bar_where_rich_sees_a_terminal(monkeypatch):
    for key in ("TTY_COMPATIBLE", "FORCE_COLOR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(sys, "stderr", _Stream(False))
    lines: list[str] = []
    with build_progress(1000, lines.append) as update:
        update(1000, records=3, tokens=40)
    assert lines and lines[-1].startswith("building: 100% of") and "3 records" in lines[-1]
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich draws its bar (on stderr), no line is written
    bar, lines = _Stream(False), []
    monkeypatch.setattr(sys, "stderr", bar)
    with build_progress(1000, lines.append) as update:
        update(500, records=3, tokens=40)
    assert not lines and "building" in bar.getvalue()
