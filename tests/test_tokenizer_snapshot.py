"""A directory only transformers may load is kept, once transformers has built its tokenizer, as a snapshot the
next builds read without transformers (``weightprep.tokenizer_snapshot``): the same tokenizer in everything the
build reads, the same shards, and transformers again wherever the snapshot would differ or cannot be read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from chat_support import chat_tokenizer
from test_tokenizer_files import TEXT, _auto, _digests, _edit_config, _saved
from tokenizer_factory import FAMILIES, bos_eos_distinct

from weightprep import tokenizer_snapshot
from weightprep.tokenizer import TokenizerFiles, direct_load_obstacle, load_tokenizer


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WEIGHTPREP_CACHE", str(tmp_path / "cache"))


def _directory(kind: str, where: Path) -> Path:
    if kind == "model class":  # transformers 5 rebuilds Qwen2Tokenizer from the vocabulary
        return _edit_config(_saved(chat_tokenizer("chatml"), where), tokenizer_class="Qwen2Tokenizer")
    if kind == "add_bos_token":  # transformers changes the backend's post-processor
        return _edit_config(_saved(FAMILIES["sentencepiece_legacy"](), where), add_bos_token=True)
    # an extra special token tokenizer.json lacks: transformers adds it
    return _edit_config(_saved(chat_tokenizer("chatml"), where), extra_special_tokens=["<|im_start|>", "<|extra|>"])


def _snapshots(tmp_path: Path) -> list[Path]:
    home = tmp_path / "cache" / "tokenizers"
    return sorted(p for p in home.iterdir() if not p.name.startswith(".")) if home.is_dir() else []


@pytest.mark.parametrize("kind", ["model class", "add_bos_token", "extra special token"])
def test_the_second_load_reads_the_snapshot_of_what_transformers_built(kind, tmp_path):
    directory = _directory(kind, tmp_path / "tok")
    assert direct_load_obstacle(directory) is not None
    auto = _auto(directory)
    first = load_tokenizer(str(directory), direct=True)
    assert not isinstance(first, TokenizerFiles) and len(_snapshots(tmp_path)) == 1
    again = load_tokenizer(str(directory), direct=True)
    assert isinstance(again, TokenizerFiles)
    assert (again.name_or_path, again.class_name) == (str(directory), type(auto).__name__)
    assert tokenizer_snapshot.differences(again, auto) == []
    for special in (True, False):
        assert again.backend_tokenizer.encode(TEXT, add_special_tokens=special).ids == auto(
            TEXT, add_special_tokens=special
        )["input_ids"]
    assert again.file != directory / "tokenizer.json"  # fastokens must not read the directory's own file


def test_what_would_read_back_otherwise_is_not_kept(tmp_path, monkeypatch):
    directory = _directory("model class", tmp_path / "tok")
    real = tokenizer_snapshot._config
    monkeypatch.setattr(tokenizer_snapshot, "_config", lambda tok: {**real(tok), "chat_template": None})
    assert tokenizer_snapshot.remember(directory, _auto(directory)) is False
    monkeypatch.setattr(tokenizer_snapshot, "_config", lambda tok: {**real(tok), "pad_token": None})
    assert tokenizer_snapshot.remember(directory, _auto(directory)) is False
    assert _snapshots(tmp_path) == [] and tokenizer_snapshot.recall(directory) is None
    monkeypatch.undo()
    assert tokenizer_snapshot.remember(directory, _auto(directory))
    assert tokenizer_snapshot.recall(directory) is not None


def test_the_differences_name_what_differs(tmp_path):
    tok = _auto(_saved(chat_tokenizer("chatml"), tmp_path / "tok"))  # a copy: chat_tokenizer's is shared
    tok.add_tokens(["<tool_call>"])  # not special: a control token where the template writes it
    tok.chat_template = tok.chat_template + "{{ '<tool_call>' }}"
    directory = _edit_config(_saved(tok, tmp_path / "tok"), tokenizer_class="Qwen2Tokenizer")
    auto = _auto(directory)
    assert tokenizer_snapshot.remember(directory, auto)
    kept = tokenizer_snapshot.recall(directory)
    assert tokenizer_snapshot.differences(kept, auto) == []
    kept.chat_template = "{{ messages }}"
    kept.special_tokens_map = {**kept.special_tokens_map, "unk_token": "<|im_start|>"}
    kept.class_name = "Other"
    found = tokenizer_snapshot.differences(kept, auto)
    assert found == ["summary", "special_tokens_map", "chat_template"]
    kept = tokenizer_snapshot.recall(directory)
    kept.chat_control_tokens = []  # control tokens: the special ones only, not <tool_call>
    kept.decode = lambda ids: "other"
    found = tokenizer_snapshot.differences(kept, auto)
    assert found[0] == "decode" and found[1].startswith("control tokens of a template") and len(found) == 2


def test_a_changed_directory_a_damaged_snapshot_and_remote_code_go_to_transformers(tmp_path):
    directory = _directory("model class", tmp_path / "tok")
    load_tokenizer(str(directory), direct=True)
    [folder] = _snapshots(tmp_path)
    kept = folder.stat().st_ino
    assert tokenizer_snapshot.remember(directory, _auto(directory))  # another process's, made meanwhile: it stays,
    assert folder.stat().st_ino == kept  # so that no reader finds it missing
    (folder / "tokenizer.json").write_text("{not json")
    assert tokenizer_snapshot.recall(directory) is None
    assert not isinstance(load_tokenizer(str(directory), direct=True), TokenizerFiles)  # and kept anew
    assert isinstance(load_tokenizer(str(directory), direct=True), TokenizerFiles)
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]  # the damaged one moved aside, removed
    _edit_config(directory, model_max_length=4321)  # another key
    assert tokenizer_snapshot.recall(directory) is None
    assert not isinstance(load_tokenizer(str(directory), direct=True), TokenizerFiles)
    assert len(_snapshots(tmp_path)) == 2
    remote = _edit_config(_directory("model class", tmp_path / "remote"), auto_map={"AutoTokenizer": ["x.Tok", None]})
    assert tokenizer_snapshot.remember(remote, _auto(directory)) is False
    assert tokenizer_snapshot.recall(remote) is None
    assert not isinstance(load_tokenizer(str(directory), direct=False), TokenizerFiles)  # not for the build: as loaded


def test_only_a_builds_load_of_code_it_trusts_keeps_a_snapshot(tmp_path):
    """``direct=False`` (train, another tool's tokenizer) and ``--trust-remote-code`` load as transformers does and
    keep nothing."""
    directory = _directory("model class", tmp_path / "tok")
    load_tokenizer(str(directory), direct=False)
    load_tokenizer(str(directory), direct=True, trust_remote_code=True)
    assert _snapshots(tmp_path) == []
    load_tokenizer(str(directory), direct=True)
    assert len(_snapshots(tmp_path)) == 1


def test_the_snapshots_used_last_are_kept(tmp_path, monkeypatch):
    import os

    monkeypatch.setattr(tokenizer_snapshot, "KEEP", 2)
    dirs = [_directory("model class", tmp_path / f"tok{i}") for i in range(3)]
    home = tmp_path / "cache" / "tokenizers"
    for i, d in enumerate(dirs[:2]):
        assert tokenizer_snapshot.remember(d, _auto(d))
        os.utime(home / tokenizer_snapshot._name(d), (i, i))  # made long ago, in this order
    assert tokenizer_snapshot.recall(dirs[0]) is not None  # used now: newer than dirs[1]'s
    stale, writing = home / ".new-stale", home / ".new-writing"  # a writer that stopped an hour ago; one at work
    for folder, when in ((stale, 1.0), (writing, None)):
        folder.mkdir()
        os.utime(folder, None if when is None else (when, when))
    assert tokenizer_snapshot.remember(dirs[2], _auto(dirs[2]))
    assert [tokenizer_snapshot.recall(d) is not None for d in dirs] == [True, False, True]
    assert not stale.exists() and writing.exists()


def test_an_unwritable_cache_keeps_nothing_and_the_load_goes_on(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("WEIGHTPREP_CACHE", str(blocker / "cache"))  # under a file: no folder can be made
    directory = _directory("model class", tmp_path / "tok")
    assert tokenizer_snapshot.remember(directory, _auto(directory)) is False
    assert not isinstance(load_tokenizer(str(directory), direct=True), TokenizerFiles)


_BUILD = """
import sys
from weightprep.cli import main
try:
    main(["build", sys.argv[1], "--tokenizer", sys.argv[2], "--out", sys.argv[3]])
except SystemExit as e:
    assert not e.code, e.code
print(sorted(m for m in ("transformers", "torch") if m in sys.modules))
"""


def test_a_build_from_a_snapshot_imports_no_transformers_and_writes_the_same_bytes(tmp_path, write_jsonl):
    """Pieces and conversations: the first build loads through transformers and keeps the snapshot; the next, in
    a new process, imports neither transformers nor torch and writes the first one's bytes, manifest included."""
    directory = _directory("model class", tmp_path / "tok")
    messages = [{"role": "user", "content": "Hi, how are you?"}, {"role": "assistant", "content": "Hello there."}]
    raw = write_jsonl([{"messages": messages}, {"pieces": [{"text": "plain", "weight": 1}]}] * 5)
    outs = []
    for run in range(2):
        outs.append(tmp_path / f"out{run}")
        done = subprocess.run([sys.executable, "-c", _BUILD, str(raw), str(directory), str(outs[-1])],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr
        imported = done.stdout.strip().splitlines()[-1]
        assert imported == ("['torch', 'transformers']" if run == 0 else "[]")
    assert _digests(outs[0]) == _digests(outs[1])
    manifest = json.loads((outs[1] / "weightprep_manifest.json").read_text())
    assert manifest["tokenizer"]["class"] == "Qwen2Tokenizer" and manifest["counts"]["chat_documents"] == 5


def test_a_tokenizer_read_directly_needs_no_snapshot(tmp_path):
    directory = _saved(bos_eos_distinct(), tmp_path / "tok")
    assert isinstance(load_tokenizer(str(directory), direct=True), TokenizerFiles)
    assert _snapshots(tmp_path) == []


def test_a_tokenizer_that_cannot_be_compared_is_not_kept(tmp_path, monkeypatch):
    directory = _directory("model class", tmp_path / "tok")
    auto = _auto(directory)

    def broken(*args, **kwargs):
        raise RuntimeError("a decode that fails")

    monkeypatch.setattr(tokenizer_snapshot, "differences", broken)
    assert tokenizer_snapshot.remember(directory, auto) is False
    assert not isinstance(load_tokenizer(str(directory), direct=True), TokenizerFiles)  # and the load goes on
    assert _snapshots(tmp_path) == [] and not list((tmp_path / "cache" / "tokenizers").iterdir())


#: BertTokenizer rebuilds a WordPiece model that has no [UNK] for the byte-level families: transformers' tokenizer
#: itself cannot encode with it, so there is nothing to compare
_BERT_RUNS = ("sentencepiece_legacy", "sentencepiece_metaspace", "wordpiece_like")


@pytest.mark.parametrize(
    ("family", "cls"),
    [(f, c) for f in sorted(FAMILIES) for c in ("LlamaTokenizer", "GPT2Tokenizer", "BertTokenizer", "Qwen2Tokenizer")
     if c != "BertTokenizer" or f in _BERT_RUNS],
)  # fmt: skip
def test_every_family_under_a_model_class_reads_back_as_transformers_built_it_or_is_not_kept(family, cls, tmp_path):
    """Whatever transformers 5 makes of a family's files under a model's class (rebuilt from the vocabulary, or
    the file as it is), the snapshot, where one is kept, encodes and decodes as that tokenizer does."""
    directory = _edit_config(_saved(FAMILIES[family](), tmp_path / "tok"), tokenizer_class=cls)
    auto = _auto(directory)
    kept = tokenizer_snapshot.remember(directory, auto)
    files = tokenizer_snapshot.recall(directory)
    assert (files is not None) is kept
    if files is None:
        return
    texts = [TEXT, " leading space", "tabs\tand\nnewlines  ", "数字 123 ½", ""]
    for text in texts:
        for special in (True, False):
            ids = auto(text, add_special_tokens=special)["input_ids"]
            assert files.backend_tokenizer.encode(text, add_special_tokens=special).ids == ids
            assert files.decode(ids) == auto.decode(ids)
    assert tokenizer_snapshot.differences(files, auto) == []
