"""The command line: click's runner for build/inspect, and one real run of the installed console script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner
from conftest import REPO, SAMPLE_RAW

from weightprep.cli import main
from weightprep.constants import MANIFEST_NAME


def test_build_with_defaults_prints_summary_and_sample_note(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(SAMPLE_RAW, tmp_path / "raw.jsonl")
    result = CliRunner().invoke(main, ["build", "raw.jsonl"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "shards" / MANIFEST_NAME).read_text())
    out = result.output
    assert "wrote shards/" in out
    assert f"records {manifest['counts']['records']:,}" in out
    assert f"{100 * manifest['counts']['fill_ratio']:.2f}%" in out
    assert "overlong" in out  # dropped by reason
    assert "bundled sample tokenizer" in out and "--tokenizer" in out


def test_flags_override_pipeline_file(tmp_path):
    out = tmp_path / "o"
    result = CliRunner().invoke(
        main,
        ["build", str(SAMPLE_RAW), "--pipeline", str(REPO / "pipelines" / "unpacked.yaml"), "--seq-len", "768", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["config"]["pack"] == {"enabled": False, "seq_len": 768, "window": 20000}
    assert manifest["config"]["filter"]["overlong"] == "truncate"
    assert "attention_mask" in manifest["columns"]


def test_every_pipeline_file_loads_and_opens_with_its_command():
    from weightprep.config import load_config

    for path in sorted((REPO / "pipelines").glob("*.yaml")):
        first = path.read_text().splitlines()[0]
        assert first.startswith("# weightprep ") and path.name in first, path
        if path.name == "run.yaml":  # a train config whose build: section is a pipeline
            from weightprep.train.run_file import build_section

            assert build_section(yaml.safe_load(path.read_text()), str(path)) is not None
        elif path.name != "train.yaml":
            load_config(path)


def test_inspect_shows_counts_and_weights(tmp_path):
    out = tmp_path / "s"
    assert CliRunner().invoke(main, ["build", str(SAMPLE_RAW), "--out", str(out)]).exit_code == 0
    result = CliRunner().invoke(main, ["inspect", str(out), "--row", "1", "--no-color"])
    assert result.exit_code == 0, result.output
    assert "fill" in result.output and "── document 1:" in result.output
    assert "[w=0]" in result.output and "[w=1]" in result.output
    result = CliRunner().invoke(main, ["inspect", str(out), "--row", "99999"])
    assert result.exit_code == 2 and "does not exist" in result.output
    result = CliRunner().invoke(main, ["inspect", str(tmp_path)])
    assert result.exit_code == 2 and "weightprep_manifest.json" in result.output


def test_inspect_refuses_other_formats_and_damaged_shards(tmp_path):
    """The one manifest reader: another format version is refused with the fix; a truncated shard is a clear
    error, never a traceback."""
    import json

    out = tmp_path / "s"
    assert CliRunner().invoke(main, ["build", str(SAMPLE_RAW), "--out", str(out)]).exit_code == 0
    manifest_path = out / MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text())
    shard = out / manifest["shards"][0]["filename"]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 3])
    result = CliRunner().invoke(main, ["inspect", str(out), "--row", "0"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert shard.name in result.output and "rebuild them" in result.output
    manifest_path.write_text(json.dumps({**manifest, "format_version": manifest["format_version"] + 1}))
    result = CliRunner().invoke(main, ["inspect", str(out)])
    assert result.exit_code == 2 and f"version {manifest['format_version'] + 1}" in result.output


def test_console_script_subprocess(tmp_path):
    exe = shutil.which("weightprep", path=os.path.dirname(sys.executable)) or shutil.which("weightprep")
    assert exe, "the console script `weightprep` is not installed"
    out = tmp_path / "shards"
    proc = subprocess.run([exe, "build", str(SAMPLE_RAW), "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "wrote" in proc.stdout and (out / MANIFEST_NAME).is_file()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"pieces": [{"text": "a", "weight": -1}]}\n')
    proc = subprocess.run([exe, "build", str(bad), "--out", str(tmp_path / "b")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert f"{bad}:1: pieces[0].weight:" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "b").exists()


def test_an_error_while_the_tokenizer_file_loads_exits_2_not_abort(tmp_path):
    """fastokens reads tokenizer.json in a thread while the build loads the tokenizer; an error before that load
    ended (here a broken tokenizer_config.json; also a URL --out whose work prefix cannot be written) left the
    thread in native code at exit, and the process died with 'FATAL: exception not rethrown' (SIGABRT, 134)."""
    tok = tmp_path / "tok"
    shutil.copytree(REPO / "sample_data" / "tokenizer", tok)
    (tok / "tokenizer_config.json").write_text("{not json")
    cmd = [sys.executable, "-m", "weightprep", "build", str(SAMPLE_RAW), "--tokenizer", str(tok), "--out", str(tmp_path / "o")]
    for _ in range(2):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert "tokenizer_config.json" in proc.stderr and "FATAL" not in proc.stderr
    assert not (tmp_path / "o").exists()


def test_old_names_of_renamed_keys_and_values_still_work_with_a_note(tmp_path):
    """"split" is train/validation only: read.split_bytes is read.part_bytes and filter.overlong split is chunk.
    The old spellings build the same, in a pipeline file and as flags, with a deprecation note each."""
    from weightprep.config import ConfigError, config_from_dict

    with pytest.warns(FutureWarning) as notes:
        cfg = config_from_dict({"read": {"split_bytes": 4096}, "filter": {"overlong": "split"}})
    assert (cfg.read.part_bytes, cfg.filter.overlong) == (4096, "chunk")
    assert sorted(str(n.message) for n in notes) == [
        "filter.overlong: split is deprecated: use chunk", "read.split_bytes is deprecated: use read.part_bytes",
    ]
    with pytest.raises(ConfigError, match="read.split_bytes: renamed read.part_bytes, which is also given"), pytest.warns(FutureWarning):
        config_from_dict({"read": {"split_bytes": 4096, "part_bytes": 4096}})
    pipeline = tmp_path / "old.yaml"
    pipeline.write_text("read: {split_bytes: 150000}\n")
    old = CliRunner().invoke(main, [
        "build", str(SAMPLE_RAW), "--pipeline", str(pipeline), "--overlong", "split", "--seq-len", "512",
        "--out", str(tmp_path / "old"),
    ])
    assert old.exit_code == 0, old.output
    assert "note: read.split_bytes is deprecated: use read.part_bytes" in old.output
    assert "note: filter.overlong: split is deprecated: use chunk" in old.output
    flag = CliRunner().invoke(main, [
        "build", str(SAMPLE_RAW), "--split-bytes", "150000", "--overlong", "chunk", "--seq-len", "512",
        "--out", str(tmp_path / "flag"),
    ])
    assert flag.exit_code == 0, flag.output
    assert "note: --split-bytes is deprecated: use --part-bytes" in flag.output
    assert "--split-bytes" not in CliRunner().invoke(main, ["build", "--help"]).output  # a hidden alias
    old_manifest, flag_manifest = (json.loads((tmp_path / d / MANIFEST_NAME).read_text()) for d in ("old", "flag"))
    assert old_manifest["config"]["read"]["part_bytes"] == 150_000 and old_manifest["config"]["filter"]["overlong"] == "chunk"
    assert len(old_manifest["inputs"][0]["parts"]) == 6
    assert old_manifest["counts"] == flag_manifest["counts"] and old_manifest["counts"]["chunked"] > 0
    assert f"chunked {old_manifest['counts']['chunked']:,} into {old_manifest['counts']['chunks']:,} chunks" in old.output


def test_an_accounting_mismatch_exits_3_and_writes_nothing(tmp_path, monkeypatch):
    """A stage that counts one document too many (a bug, simulated) breaks the documents identity: the build stops
    with exit 3 naming it, before anything is published, and leaves no temporary directory behind."""
    import weightprep.distribute.job as job

    real = job.document_batch

    def one_too_many(*args, **kwargs):
        docs, counts = real(*args, **kwargs)
        counts["documents"] += 1
        return docs, counts

    monkeypatch.setattr(job, "document_batch", one_too_many)
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps({"text": f"record number {i}"}) + "\n" for i in range(3)))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["build", str(raw), "--out", str(out), "--executor", "serial", "--seq-len", "64"])
    assert result.exit_code == 3, result.output
    # 3 records in one block, so 4 counted documents against 3 accepted records.
    assert "accounting does not balance" in result.output
    assert "documents 4 != accepted records 3 - conversations built per turn 0 + their documents 0" in result.output
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw.jsonl"]


_SLOW_BUILD = """
import sys, time
from weightprep.distribute.job import PartJob

real = PartJob._run

def slow(self, part, tmp, progress):
    if part.index >= 2:
        time.sleep(120)  # parts 0 and 1 finish; the build is interrupted in part 2
    return real(self, part, tmp, progress)

PartJob._run = slow
from weightprep.cli import main
main(prog_name="weightprep")
"""


def test_sigint_prints_the_resume_command_and_a_rerun_keeps_the_parts(tmp_path):
    """The whole story of an interrupted build, as a user lives it with stderr in a log file: progress lines while it
    runs, on SIGINT the exact command that continues it; a plain rerun keeps the parts and says how to reuse them;
    that command reuses them and says so."""
    import shlex
    import signal
    import time

    out = tmp_path / "shards"
    args = ["build", str(SAMPLE_RAW), "--out", str(out), "--seq-len", "512", "--part-bytes", "150000",
            "--executor", "serial"]  # fmt: skip
    log = tmp_path / "build.log"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(log, "w") as stderr:
        # as from a terminal: SIGINT not ignored (pytest-xdist's workers ignore it, and a child inherits that)
        proc = subprocess.Popen([sys.executable, "-c", _SLOW_BUILD, *args], stderr=stderr, stdout=subprocess.DEVNULL,
                                env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list(tmp_path.glob(".shards.tmp-*/parts/00001/result.json")):
            time.sleep(0.05)
        time.sleep(0.5)  # part 1's progress line
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    text = log.read_text()
    assert "building: " in text.split("interrupted:")[0]  # progress lines before the interruption, in the log
    assert f"interrupted: 2 of 6 part(s) had finished; they are kept in {tmp_path}/.shards.tmp-{proc.pid}" in text
    command = text.split("to continue: ")[1].splitlines()[0]
    assert command == shlex.join(["weightprep", *args, "--resume"])
    assert not out.exists()

    again = CliRunner().invoke(main, args)  # no --resume: the parts are kept and the two ways on named
    assert again.exit_code == 2
    assert "left 2 finished part(s)" in again.output and f"to reuse them: {command}" in again.output
    assert "to discard them: " + shlex.join(["weightprep", *args, "--overwrite"]) in again.output
    assert (tmp_path / f".shards.tmp-{proc.pid}" / "parts" / "00001" / "result.json").is_file()

    resumed = CliRunner().invoke(main, shlex.split(command)[1:])
    assert resumed.exit_code == 0, resumed.output
    assert "--resume: 2 of 6 part(s) finished by the interrupted build are reused; 4 left to build" in resumed.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build.log", "shards"]


def test_a_missing_local_tokenizer_or_model_is_a_missing_directory_not_a_bad_repo_id(tmp_path):
    for given in (str(tmp_path / "nope"), "./nope/tokenizer", "~/no/such/dir"):
        result = CliRunner().invoke(main, ["build", str(SAMPLE_RAW), "--out", str(tmp_path / "o"), "--tokenizer", given])
        assert result.exit_code == 2
        assert f"tokenizer {given}: no such directory (a local path; a hub id reads ORG/NAME" in result.output
        assert "Repo id" not in result.output
    result = CliRunner().invoke(main, ["build", str(SAMPLE_RAW), "--out", str(tmp_path / "o"), "--tokenizer", str(SAMPLE_RAW)])
    assert f"tokenizer {SAMPLE_RAW} is a file: give the directory that holds it" in result.output
    result = CliRunner().invoke(main, ["train", str(tmp_path), "--model", "./no/model", "--output-dir", str(tmp_path / "r")])
    assert result.exit_code == 2 and "--model ./no/model: no such directory" in result.output


def test_the_license_is_an_spdx_expression():
    """PEP 639: ``project.license`` a string (setuptools deprecates the table form, to fail from 2027-02-18)."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert not any(c.startswith("License ::") for c in project["project"].get("classifiers", []))


_EARLY = """
import importlib.abc, json, os, sys
import weightprep.prefetch as P
started, taken, blas = [], [], []
class NumpyImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "numpy" and not blas:
            blas.append(os.environ.get("OPENBLAS_NUM_THREADS"))
sys.meta_path.insert(0, NumpyImport())
start, take = P.start, P.take
def spy_start(path):
    started.append([str(path), "numpy" in sys.modules, "weightprep.pipeline" in sys.modules])
    start(path)
def spy_take(path):
    load = take(path)
    taken.append(load is not None)
    return load
P.start, P.take = spy_start, spy_take
from weightprep.cli import main
try:
    main(sys.argv[1:])
finally:
    print(json.dumps({"started": started, "taken": taken, "left": len(P._started), "blas": blas}))
"""


@pytest.mark.parametrize("how", ["sample", "flag", "two workers", "hf backend", "pipeline file"])
def test_the_command_starts_loading_the_tokenizer_file_before_importing_the_build(tmp_path, how):
    """``weightprep build`` starts fastokens' load of tokenizer.json before it imports the build (numpy, pyarrow,
    weightprep's stages: ~0.2 s the load now overlaps), where its options say which file the build reads; the build
    takes that load (in process) or drops it (workers load their own). No load where the options cannot say
    (a pipeline file may name another tokenizer) or no fastokens runs (--tokenizer-backend hf). numpy is imported
    with OpenBLAS on one thread (a build does no linear algebra; its threads cost ~40 ms of CPU at the import)."""
    from tokenizer_factory import SAMPLE_TOKENIZER_DIR

    out = tmp_path / "out"
    args = ["build", str(SAMPLE_RAW), "--out", str(out)]
    args += {
        "sample": [], "hf backend": ["--tokenizer-backend", "hf"],
        "flag": ["--tokenizer", str(SAMPLE_TOKENIZER_DIR)],
        "two workers": ["--executor", "local", "--workers", "2", "--part-bytes", "4096"],
        "pipeline file": ["--pipeline", str(REPO / "pipelines" / "packed.yaml")],
    }[how]  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", _EARLY, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    spied = json.loads(proc.stdout.strip().splitlines()[-1])
    backend = json.loads((out / MANIFEST_NAME).read_text())["tokenizer"]["backend"]
    assert spied["left"] == 0 and spied["blas"] == ["1"]
    if how in ("hf backend", "pipeline file"):
        assert spied["started"] == [] and spied["taken"] in ([], [False])
        assert backend == ("hf" if how == "hf backend" else "fastokens")
        return
    assert spied["started"] == [[str(SAMPLE_TOKENIZER_DIR / "tokenizer.json"), False, False]]
    assert spied["taken"] == [True, False] and backend == "fastokens"  # the build's, then none left at the close


def test_a_build_that_fails_before_taking_its_early_load_leaves_none_behind(tmp_path):
    """The command starts fastokens' load before it knows whether the build will run; a build that stops first (a
    bad flag value caught by the configuration) drops the load: nothing stays held in the process."""
    from weightprep import prefetch

    before = set(prefetch._started)
    result = CliRunner().invoke(main, ["build", str(SAMPLE_RAW), "--out", str(tmp_path / "o"), "--seq-len", "0"])
    assert result.exit_code == 2, result.output
    assert set(prefetch._started) == before


#: a command line run as ``weightprep.cli.run`` runs it, with an exit function and an object whose ``__del__`` runs
#: only in the interpreter's teardown, each leaving a line in the file named by the first argument
_ENDING = """
import atexit, os, sys
log = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND)  # no file object: none is closed before the end
atexit.register(os.write, log, b"exit functions\\n")
class Torn:
    def __init__(self, write, fd):
        self.write, self.fd = write, fd
    def __del__(self):
        self.write(self.fd, b"teardown\\n")
torn = Torn(os.write, log)
sys.stdout.write("no newline")  # still in the buffer (a pipe) when the command ends
sys.argv = ["weightprep", *sys.argv[2:]]
from weightprep.cli import run
run()
"""


@pytest.mark.parametrize("command", ["build", "help", "failed build"])
def test_a_command_line_build_ends_its_process_without_the_teardown_after_its_exit_functions(tmp_path, command):
    """A build that succeeded ends its process at once (``commands._ending``: no object freed one by one, ~20 ms),
    its exit functions run and its streams flushed first; any other command, and a build that fails, end as
    usual."""
    out, log = tmp_path / "out", tmp_path / "log"
    args = {
        "build": ["build", str(SAMPLE_RAW), "--out", str(out)],
        "help": ["--help"],
        "failed build": ["build", str(SAMPLE_RAW), "--out", str(out), "--seq-len", "0"],
    }[command]  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", _ENDING, str(log), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == (2 if command == "failed build" else 0), proc.stderr
    assert proc.stdout.startswith("no newline")
    ran = log.read_text().splitlines()
    assert ran == (["exit functions"] if command == "build" else ["exit functions", "teardown"])
    if command == "build":
        assert "wrote" in proc.stdout and (out / MANIFEST_NAME).is_file()


_ENDING_DIRECTLY = """
import sys, threading, time
from weightprep.commands import _ending
how = sys.argv[2]
if how == "thread":  # not a daemon: the usual end waits for it
    def late():
        time.sleep(0.3)
        open(sys.argv[1], "w").write("done")
    threading.Thread(target=late).start()
if how in ("unflushable", "unflushable at the end"):  # at once, or only once the exit functions have run
    class Closed:
        flushes = 0
        def write(self, text): return len(text)
        def flush(self):
            self.flushes += 1
            if how == "unflushable" or self.flushes > 1:
                raise OSError("closed pipe")
    sys.stdout = Closed()
if how == "no stdout":  # as under pythonw
    sys.stdout = None
sys.stderr.write("in the buffer")  # no newline: a pipe's buffer holds it until a flush
_ending.end_at_once()
_ending.end(2 if how == "failed" else 0)
sys.__stderr__.write(" / ended as usual")
"""


@pytest.mark.parametrize("how", ["plain", "no stdout", "thread", "unflushable", "unflushable at the end", "failed"])
def test_a_process_ends_at_once_only_with_success_no_thread_running_and_its_streams_flushed(tmp_path, how):
    marker = tmp_path / "marker"
    proc = subprocess.run([sys.executable, "-c", _ENDING_DIRECTLY, str(marker), how], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    at_once = how in ("plain", "no stdout", "unflushable at the end")
    # 120: the interpreter's own exit code where a flush at the end fails, which os._exit then gives as well
    assert proc.returncode == (120 if how.startswith("unflushable") else 0), proc.stderr
    assert proc.stderr.startswith("in the buffer" + ("" if at_once else " / ended as usual"))
    assert (proc.stderr == "in the buffer") == at_once and marker.is_file() == (how == "thread")
