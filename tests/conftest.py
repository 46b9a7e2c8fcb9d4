"""Shared fixtures: the sample tokenizer, a JSONL writer, and an in-process build."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# Triton, where installed, runs in its CPU interpreter in this suite: tests that force TRL's Triton kernels
# (test_plan, test_train_kernel) need it set before triton is first imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
# what weightprep remembers between runs (weightprep.tokenizer_class) stays in this run's own folder, never the home's
if "WEIGHTPREP_CACHE" not in os.environ:
    import tempfile

    os.environ["WEIGHTPREP_CACHE"] = tempfile.mkdtemp(prefix="weightprep-cache-")

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/ helpers: reference, tokenizer_factory

REPO = Path(__file__).resolve().parent.parent
SAMPLE_RAW = REPO / "sample_data" / "raw.jsonl"


@pytest.fixture(scope="session")
def sample_tok():
    from tokenizer_factory import sample_tokenizer

    return sample_tokenizer()


@pytest.fixture(scope="session")
def sample_shards(tmp_path_factory, sample_tok) -> Path:
    """The sample data built by the real pipeline, rows of 256 tokens (small rows keep CPU steps short)."""
    from weightprep.config import config_from_dict
    from weightprep.pipeline import build

    out = tmp_path_factory.mktemp("sample") / "shards"
    build([str(SAMPLE_RAW)], out, config_from_dict({"pack": {"seq_len": 256}}), tokenizer=sample_tok)
    return out


@pytest.fixture
def write_jsonl(tmp_path):
    """write_jsonl(records | lines, name) -> path; str items are written verbatim as lines."""

    def write(items, name: str = "raw.jsonl") -> Path:
        path = tmp_path / name
        lines = [it if isinstance(it, str) else json.dumps(it, ensure_ascii=False) for it in items]
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        return path

    return write


def load_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray cluster of 2 CPUs for the whole session (in each xdist worker): Ray allows one ``ray.init``
    per process, so every module that runs on Ray shares it. The tests' helper modules that jobs refer to are
    shipped to the workers by value."""
    ray = pytest.importorskip("ray")
    import split_support

    ray.cloudpickle.register_pickle_by_value(split_support)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


class PartInterrupter:
    """``PartJob._run`` patched to raise ``KeyboardInterrupt`` (Ctrl-C) when it reaches part ``index``, while
    ``interrupt`` is true; ``runs`` lists the parts run, in order (a test of --resume reads what was run again)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, index: int = 1) -> None:
        from weightprep.distribute.job import PartJob

        self.runs: list[int] = []
        self.interrupt = True
        real = PartJob._run

        def run(job, part, tmp, progress):  # type: ignore[no-untyped-def]
            self.runs.append(part.index)
            if part.index == index and self.interrupt:
                raise KeyboardInterrupt
            return real(job, part, tmp, progress)

        monkeypatch.setattr(PartJob, "_run", run)


@pytest.fixture
def mem(monkeypatch):
    """fsspec's ``memory://`` filesystem, emptied before and after the test; store errors retried without waiting."""
    import fsspec

    from weightprep import storage

    fs = fsspec.filesystem("memory")
    fs.store.clear()
    fs.pseudo_dirs.clear()
    fs.pseudo_dirs.append("")
    monkeypatch.setenv("WEIGHTPREP_STORAGE_BACKOFF", "0")
    yield fs
    fs.store.clear()
    storage.configure(None)

