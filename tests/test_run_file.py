"""One YAML file for a run (``weightprep.train.run_file``): ``weightprep train --config run.yaml`` with a ``build:``
section builds the shards when they are missing or were built from another configuration, inputs or sources, and
otherwise leaves them as they are; then it trains."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from conftest import REPO, SAMPLE_RAW

from weightprep.constants import MANIFEST_NAME
from weightprep.errors import ConfigError
from weightprep.train.run_file import BuildSection, ensure_built, stale_reason

TINY_LLAMA = REPO / "sample_data" / "tiny-llama"


def _section(**data) -> BuildSection:
    return BuildSection({"inputs": [str(SAMPLE_RAW)], "pack": {"seq_len": 256}, **data}, "run.yaml")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "shards"
    assert ensure_built(_section(), out, lambda m: None)
    return out


def test_missing_shards_are_built_and_the_same_section_is_up_to_date(built, tmp_path):
    assert stale_reason(_section(), tmp_path / "none") == f"{tmp_path / 'none'} holds no build yet"
    assert stale_reason(_section(), built) is None
    notes, calls = [], []
    assert not ensure_built(_section(), built, notes.append, build=lambda *a, **k: calls.append(a))
    assert calls == [] and "is up to date with the config's build: section" in notes[0]


def test_another_configuration_inputs_or_sources_rebuild(built, tmp_path):
    reason = stale_reason(_section(pack={"seq_len": 512}, filter={"overlong": "chunk"}), built)
    assert reason == f"{built} was built with another configuration (filter.overlong, pack.seq_len differ)"
    copy = tmp_path / "raw.jsonl"
    shutil.copy(SAMPLE_RAW, copy)
    assert "built from other inputs" in stale_reason(BuildSection({"inputs": str(copy), "pack": {"seq_len": 256}}, "r"), built)
    sources = [{"name": "all", "path": str(SAMPLE_RAW), "weight": 2}]
    reason = stale_reason(BuildSection({"sources": sources, "pack": {"seq_len": 256}}, "r"), built)
    assert reason == f"{built} was built from other sources (names, weights or epochs differ)"  # the same file
    notes, calls = [], []
    assert ensure_built(_section(pack={"seq_len": 512}), built, notes.append, build=lambda *a, **k: calls.append((a, k)))
    (inputs, out, cfg), options = calls[0]
    assert inputs == [str(SAMPLE_RAW)] and out == built and cfg.pack.seq_len == 512 and options["overwrite"] is True
    assert notes[0].startswith(f"building {built}: {built} was built with another configuration (pack.seq_len")


def test_a_bad_build_section_names_its_keys():
    with pytest.raises(ConfigError, match="give inputs .* or sources, exactly one"):
        BuildSection({"pack": {"seq_len": 256}}, "run.yaml")
    with pytest.raises(ConfigError, match=r"build\.pack\.seq_len"):
        BuildSection({"inputs": "x.jsonl", "pack": {"seq_len": "2k"}}, "run.yaml")


@pytest.mark.slow
def test_one_file_builds_then_trains_and_a_rerun_does_not_rebuild(tmp_path):
    """The cookbook's recipe, end to end on CPU: the first run builds and trains, the second finds the shards up to
    date (not a byte rewritten) and trains again."""
    from weightprep.cli import main

    if not (TINY_LLAMA / "config.json").is_file():
        pytest.skip("sample_data/tiny-llama missing: python sample_data/make_model.py")
    run = {"model": str(TINY_LLAMA), "output_dir": str(tmp_path / "runs"), "shards": str(tmp_path / "shards"),
           "max_steps": 2, "micro_batch_size": 2, "save_steps": 2, "lr": 1e-3,
           "build": {"inputs": [str(SAMPLE_RAW)], "pack": {"seq_len": 256}, "split": {"validation_fraction": 0.1}}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
    first = CliRunner().invoke(main, ["train", "--config", str(tmp_path / "run.yaml")])
    assert first.exit_code == 0, first.output
    assert f"building {tmp_path / 'shards'}: {tmp_path / 'shards'} holds no build yet" in first.output
    assert f"wrote {tmp_path / 'shards'}/: " in first.output and "trained 2 steps" in first.output
    manifest = json.loads((tmp_path / "shards" / MANIFEST_NAME).read_text())
    assert manifest["config"]["pack"]["seq_len"] == 256 and set(manifest["splits"]) == {"train", "validation"}
    stamp = (tmp_path / "shards" / MANIFEST_NAME).stat().st_mtime_ns
    again = CliRunner().invoke(main, ["train", "--config", str(tmp_path / "run.yaml"), "--output-dir", str(tmp_path / "r2")])
    assert again.exit_code == 0, again.output
    assert "is up to date with the config's build: section" in again.output and "trained 2 steps" in again.output
    assert (tmp_path / "shards" / MANIFEST_NAME).stat().st_mtime_ns == stamp
