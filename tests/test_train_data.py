"""Shards that cannot train a model are refused with one clear message (no traceback), and the ``train``
command's YAML config follows the rules: flags override the file, unknown keys are errors naming the key.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import train_support as ts
from click.testing import CliRunner

from weightprep.constants import FORMAT_NAME, FORMAT_VERSION, MANIFEST_NAME
from weightprep.errors import ConfigError, UsageError
from weightprep.train import load_shards

REPO = Path(__file__).resolve().parent.parent
TINY_LLAMA = REPO / "sample_data" / "tiny-llama"
SEQ = 48


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    from weightprep.tokenizer import load_tokenizer, tokenizer_summary

    summary = tokenizer_summary(load_tokenizer(None))  # the sample tokenizer, the one tiny-llama ships with
    rows = ts.random_rows(1, 3, SEQ, 96, packed=True)
    return ts.write_shards(tmp_path_factory.mktemp("good") / "shards", rows, SEQ, tokenizer=summary)


def _copy(good: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(good, tmp_path / "shards"))


def _edit_manifest(path: Path, **changes) -> None:
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    manifest.update(changes)
    (path / MANIFEST_NAME).write_text(json.dumps(manifest))


def test_good_shards_load(good):
    shards = load_shards(good)
    assert shards.seq_len == SEQ and shards.packed and len(shards.dataset) == 3
    assert repr(shards) == f"Shards(path={str(good)!r}, rows=3, seq_len={SEQ}, packed=True)"  # not the manifest


def test_missing_manifest(good, tmp_path):
    path = _copy(good, tmp_path)
    (path / MANIFEST_NAME).unlink()
    with pytest.raises(UsageError, match=f"no {MANIFEST_NAME}.*weightprep build"):
        load_shards(path)


def test_other_format_version(good, tmp_path):
    path = _copy(good, tmp_path)
    _edit_manifest(path, format_version=99)
    with pytest.raises(UsageError, match=f"version 99, expected 'weightprep-shards' version {FORMAT_VERSION}"):
        load_shards(path)


@pytest.mark.parametrize("version", [1, 2])
def test_version_2_shards_are_still_read_and_version_1_refused(good, tmp_path, version):
    """Version 3 changed what builds with sources and DeepSeek-R1-style chat hold, nothing a version-2 build has:
    those are read as they are; version 1 (SentencePiece continuations tokenized wrongly) must be rebuilt."""
    path = _copy(good, tmp_path)
    _edit_manifest(path, format_version=version)
    if version == 2:
        assert len(load_shards(path).dataset) == 3
    else:
        with pytest.raises(UsageError, match="version 1, expected"):
            load_shards(path)


def test_missing_column(tmp_path):
    rows = ts.random_rows(1, 2, SEQ, 96)
    for row in rows:
        del row["weights"]
    import datasets
    import numpy as np

    cols = {k: [np.asarray(r[k]).tolist() for r in rows] for k in rows[0]}
    datasets.Dataset.from_dict(cols).save_to_disk(str(tmp_path / "s"))
    (tmp_path / "s" / MANIFEST_NAME).write_text(
        json.dumps({"format": "weightprep-shards", "format_version": FORMAT_VERSION, "config": {"seq_len": SEQ}})
    )
    with pytest.raises(UsageError, match="lack column.*weights"):
        load_shards(tmp_path / "s")


def test_model_vocabulary_smaller_than_shards_tokenizer(good):
    model = ts.tiny_llama(64)  # the sample tokenizer has 4096 ids
    with pytest.raises(UsageError, match="vocabulary of 64 ids.*4096 ids"):
        load_shards(good, model_config=model.config)


def test_tokenizer_fingerprint_mismatch_names_both(good):
    from tokenizer_factory import bos_eos_distinct

    from weightprep.tokenizer import tokenizer_fingerprint

    other = bos_eos_distinct()
    manifest_fp = json.loads((good / MANIFEST_NAME).read_text())["tokenizer"]["fingerprint"]
    with pytest.raises(UsageError, match="tokenizer mismatch") as err:
        load_shards(good, model_config=ts.tiny_llama(4096).config, tokenizer=other)
    assert manifest_fp[:16] in str(err.value) and tokenizer_fingerprint(other)[:16] in str(err.value)


def test_sequence_length_beyond_model_maximum(good):
    model = ts.tiny_llama(4096, max_position_embeddings=32)
    with pytest.raises(UsageError, match="rows of 48 tokens exceed .*max_position_embeddings = 32"):
        load_shards(good, model_config=model.config)


def test_cli_reports_errors_without_traceback(good, tmp_path):
    from weightprep.cli import main

    path = _copy(good, tmp_path)
    _edit_manifest(path, format="something-else")
    result = CliRunner().invoke(main, ["train", str(path), "--model", str(TINY_LLAMA), "--output-dir", "x"])
    assert result.exit_code != 0
    assert "expected 'weightprep-shards'" in result.output and "Traceback" not in result.output


def _resolve(argv: list[str]):
    from weightprep.train.command import resolve_options, train

    ctx = train.make_context("train", argv)
    return resolve_options(ctx, dict(ctx.params))


def test_config_file_with_flag_overrides(tmp_path):
    cfg = tmp_path / "train.yaml"
    cfg.write_text("model: some/model\noutput-dir: runs/x\nlr: 0.5\nmicro_batch_size: 3\nnormalize: tokens\n")
    opts = _resolve(["shards", "--config", str(cfg), "--lr", "0.1"])
    assert opts["lr"] == 0.1  # the flag wins
    assert opts["micro_batch_size"] == 3 and opts["normalize"] == "tokens" and opts["model"] == "some/model"
    assert opts["output_dir"] == Path("runs/x") and opts["grad_accum"] == 1  # defaults stay


def test_config_file_unknown_and_bad_keys_are_reported_together(tmp_path):
    cfg = tmp_path / "train.yaml"
    cfg.write_text("model: m\nlearning_rate: 0.1\nmicro_batch_size: many\nnormalize: mean\n")
    with pytest.raises(ConfigError) as err:
        _resolve(["shards", "--config", str(cfg), "--output-dir", "o"])
    text = str(err.value)
    assert "learning_rate: unknown key" in text and "micro_batch_size" in text and "normalize" in text


def test_pipelines_train_yaml_is_valid():
    path = REPO / "pipelines" / "train.yaml"
    first = path.read_text().splitlines()[0]
    assert first.startswith("#") and "weightprep train" in first
    opts = _resolve(["--config", str(path)])
    assert opts["model"] and opts["output_dir"]


def test_train_refuses_a_setup_the_plan_says_will_not_fit(tmp_path):
    """The GPU pre-flight check (run only with CUDA) refuses with the plan's advice; a faked 24 GiB GPU here."""
    from dataclasses import replace
    from types import SimpleNamespace

    from transformers import LlamaConfig

    from weightprep.plan.presets import PRESETS
    from weightprep.train.device import DevicePolicy, preflight_memory_check

    (tmp_path / MANIFEST_NAME).write_text(
        json.dumps({"format": FORMAT_NAME, "format_version": FORMAT_VERSION,
                    "config": {"pack": {"seq_len": 4096, "enabled": True}}, "counts": {"rows": 10, "supervised_tokens": 30000}})
    )
    shards = SimpleNamespace(path=tmp_path, seq_len=4096, packed=True)
    config = LlamaConfig(**{k: v for k, v in PRESETS["llama-2-7b"].items() if k != "model_type"})
    opts = {"micro_batch_size": 8, "strategy": "ddp", "lora_r": 0, "grad_accum": 1}
    policy = DevicePolicy(
        device="cuda:0", gpu_name="fake", capability=(8, 0), total_memory=24 * 2**30, precision="bf16",
        attn_implementation="sdpa", gradient_checkpointing=True, load_dtype="float32",
    )  # fmt: skip
    with pytest.raises(UsageError) as err:
        preflight_memory_check(policy, shards, config, opts)
    assert "does NOT fit" in str(err.value) and "--skip-memory-check" in str(err.value)
    preflight_memory_check(replace(policy, total_memory=2000 * 2**30), shards, config, opts)  # fits: no error
