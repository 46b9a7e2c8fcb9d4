"""The build reads local tokenizer directories itself (no transformers auto classes, so no torch), exactly as
AutoTokenizer would, and goes through AutoTokenizer wherever it could differ."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from chat_support import chat_tokenizer
from click.testing import CliRunner
from tokenizer_factory import FAMILIES, SAMPLE_TOKENIZER_DIR, bos_eos_distinct

from weightprep.cli import main
from weightprep.tokenizer import TokenizerFiles, direct_load_obstacle, load_tokenizer, tokenizer_summary

TEXT = "Hello, wörld! 東京 😀 <s> two  spaces\n\ttab </s>"


def _saved(tok, directory: Path) -> Path:
    tok.save_pretrained(directory)
    return directory


def _auto(directory: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))


@pytest.mark.parametrize("family", [*sorted(FAMILIES), "sample"])
def test_direct_reading_equals_auto_tokenizer(family, tmp_path):
    directory = SAMPLE_TOKENIZER_DIR if family == "sample" else _saved(FAMILIES[family](), tmp_path / "tok")
    assert direct_load_obstacle(directory) is None
    mine, auto = load_tokenizer(str(directory), direct=True), _auto(directory)
    assert isinstance(mine, TokenizerFiles)
    assert tokenizer_summary(mine) == tokenizer_summary(auto)  # fingerprint, vocabulary size, bos/eos/pad ids, class
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        assert (getattr(mine, key), getattr(mine, f"{key}_id")) == (getattr(auto, key), getattr(auto, f"{key}_id"))
    assert mine.backend_tokenizer.encode(TEXT, add_special_tokens=False).ids == auto(TEXT, add_special_tokens=False)["input_ids"]


def _edit_config(directory: Path, **changes) -> Path:
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return directory


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"tokenizer_class": "LlamaTokenizer"}, "built by its own transformers class"),
        ({"add_bos_token": True}, "sets add_bos_token"),
        ({"pad_token": "<new-pad>"}, "not an added token"),
        ({"added_tokens_decoder": {"0": {"content": "<other>", "special": True}}}, "differs from tokenizer.json"),
    ],
)
def test_where_transformers_would_change_the_tokenizer_auto_tokenizer_loads_it(changes, reason, tmp_path):
    directory = _edit_config(_saved(bos_eos_distinct(), tmp_path / "tok"), **changes)
    assert reason in direct_load_obstacle(directory)
    assert not isinstance(load_tokenizer(str(directory), direct=True), TokenizerFiles)


def test_each_check_of_a_direct_reading_is_its_own_obstacle(tmp_path):
    """Missing files, no post-processor, and added tokens of tokenizer_config.json that tokenizer.json holds
    otherwise (another id, another flag) each make the directory AutoTokenizer's; the same added tokens, as dicts
    or as plain strings, do not."""
    directory = _saved(bos_eos_distinct(), tmp_path / "tok")
    added = {str(i): {"content": t.content, "lstrip": t.lstrip, "rstrip": t.rstrip, "normalized": t.normalized,
                      "single_word": t.single_word, "special": t.special}
             for i, t in load_tokenizer(str(directory), direct=True).added_tokens_decoder.items()}  # fmt: skip
    assert len(added) >= 2
    _edit_config(directory, added_tokens_decoder=added)
    assert direct_load_obstacle(directory) is None
    _edit_config(directory, added_tokens_decoder={i: t["content"] for i, t in added.items()})
    assert direct_load_obstacle(directory) is None
    first, second = sorted(added, key=int)[:2]
    for wrong in ({second: added[first]}, {first: {**added[first], "lstrip": not added[first]["lstrip"]}},
                  {first: {**added[first], "special": not added[first]["special"]}}):  # fmt: skip
        _edit_config(directory, added_tokens_decoder=wrong)
        assert "differs from tokenizer.json" in direct_load_obstacle(directory), wrong
    _edit_config(directory, added_tokens_decoder=added)
    spec = json.loads((directory / "tokenizer.json").read_text())
    (directory / "tokenizer.json").write_text(json.dumps({**spec, "post_processor": None}))
    assert "no post-processor" in direct_load_obstacle(directory)
    (directory / "tokenizer.json").write_text(json.dumps(spec))
    config = (directory / "tokenizer_config.json").read_bytes()
    (directory / "tokenizer_config.json").unlink()
    assert direct_load_obstacle(directory) == "no tokenizer.json + tokenizer_config.json"
    (directory / "tokenizer_config.json").write_bytes(config)
    (directory / "tokenizer.json").unlink()
    assert direct_load_obstacle(directory) == "no tokenizer.json + tokenizer_config.json"


def test_legacy_special_tokens_map_is_read_where_transformers_reads_it(tmp_path):
    directory = _saved(bos_eos_distinct(), tmp_path / "tok")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    for key in ("added_tokens_decoder", "bos_token", "eos_token", "pad_token"):
        config.pop(key, None)
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "pad_token": "<pad>"}))
    mine, auto = load_tokenizer(str(directory), direct=True), _auto(directory)
    assert isinstance(mine, TokenizerFiles) and mine.eos_token == "</s>"
    assert tokenizer_summary(mine) == tokenizer_summary(auto)


def _digests(out: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("*")) if p.is_file()}


def test_the_cli_build_imports_no_torch_pandas_or_transformers_and_writes_what_auto_tokenizer_would(tmp_path, sample_tok):
    from conftest import SAMPLE_RAW

    from weightprep.config import config_from_dict
    from weightprep.pipeline import build

    code = (
        "import sys; from weightprep.cli import main\n"
        "try: main(['build', sys.argv[1], '--out', sys.argv[2], '--tokenizer', sys.argv[3]])\n"
        "except SystemExit as e: assert not e.code, e.code\n"
        "print(sorted(m for m in ('torch', 'pandas', 'transformers', 'rich', 'pyarrow.compute') if m in sys.modules))\n"
    )
    out = tmp_path / "cli"
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}  # stderr: no terminal
    run = subprocess.run([sys.executable, "-c", code, str(SAMPLE_RAW), str(out), str(SAMPLE_TOKENIZER_DIR)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr
    # start-up costs a build does not need (~3 s, ~0.5 s; rich ~0.04 s, for a progress bar it does not draw; pyarrow.compute ~0.04 s)
    assert run.stdout.strip().splitlines()[-1] == "[]"
    cfg = config_from_dict({"tokenizer": {"name": str(SAMPLE_TOKENIZER_DIR)}})
    build([str(SAMPLE_RAW)], tmp_path / "auto", cfg, tokenizer=sample_tok)  # an AutoTokenizer object
    assert _digests(out) == _digests(tmp_path / "auto")  # shards and manifest alike


def _chat_view(tok) -> dict:
    """What the chat stage reads of a tokenizer."""
    from weightprep.stages.chat_control import control_token_list

    template = tok.chat_template if isinstance(tok.chat_template, str) else "{{ '<|im_start|>' }}"
    return {
        "control_tokens": control_token_list(tok, template),
        "specials": tok.special_tokens_map, "added": tok.added_tokens_encoder, "template": tok.chat_template,
        "control": getattr(tok, "chat_control_tokens", None), "eos": tok.eos_token, "bos_id": tok.bos_token_id,
        "size": len(tok),
        "decoder": {i: (t.content, t.special, t.lstrip, t.rstrip, t.normalized, t.single_word)
                    for i, t in tok.added_tokens_decoder.items()},
    }  # fmt: skip


@pytest.mark.parametrize("key", ["extra_special_tokens", "additional_special_tokens"])
def test_special_tokens_beyond_the_named_ones_are_read_directly_where_tokenizer_json_has_them(key, tmp_path):
    """transformers 5 writes ``extra_special_tokens`` (4: ``additional_special_tokens``): where each is a special added
    token of tokenizer.json, the directory is read directly into what AutoTokenizer loads; a dict of named extras, a
    token tokenizer.json lacks, or one it holds as a non-special token are AutoTokenizer's to load."""
    tok = _auto(_saved(chat_tokenizer("chatml"), tmp_path / "tok"))  # a copy: chat_tokenizer's is shared
    tok.add_tokens(["<tool_call>"])  # not special, written by the template, not listed in chat_control_tokens
    tok.chat_template += "{{ '<tool_call>' }}"
    directory = _saved(tok, tmp_path / "tok")
    _edit_config(directory, extra_special_tokens=None)
    _edit_config(directory, **{key: ["<|im_start|>", "<|endoftext|>"], "chat_control_tokens": ["<|im_start|>"]})
    assert direct_load_obstacle(directory) is None
    mine, auto = load_tokenizer(str(directory), direct=True), _auto(directory)
    assert isinstance(mine, TokenizerFiles)
    assert tokenizer_summary(mine) == tokenizer_summary(auto)
    assert _chat_view(mine) == _chat_view(auto)
    for wrong in ({"image_token": "<|im_start|>"}, ["<|im_start|>", "<|absent|>"]):
        _edit_config(directory, **{key: wrong})
        assert "not special added tokens" in direct_load_obstacle(directory)
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    for token in tokenizer["added_tokens"]:
        token["special"] = token["special"] and token["content"] != "<|endoftext|>"
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    _edit_config(directory, **{key: ["<|endoftext|>"]})
    assert "not special added tokens" in direct_load_obstacle(directory)


def test_chat_templates_are_read_as_transformers_reads_them(tmp_path):
    """tokenizer_config.json's template, a list of named ones, ``chat_template.jinja`` over it, and the files of
    ``additional_chat_templates/`` beside it: the same ``chat_template`` as AutoTokenizer's."""
    directory = _saved(chat_tokenizer("chatml"), tmp_path / "tok")
    own = (directory / "chat_template.jinja").read_text()
    (directory / "chat_template.jinja").unlink()
    steps = [
        lambda: _edit_config(directory, chat_template="{{ 'config' }}"),
        lambda: _edit_config(directory, chat_template=[{"name": "default", "template": "a"}, {"name": "tool_use", "template": "b"}]),
        lambda: (directory / "chat_template.jinja").write_text(own),
        lambda: (directory / "additional_chat_templates").mkdir(),
        lambda: (directory / "additional_chat_templates" / "rag.jinja").write_text("{{ 'rag' }}"),
    ]  # fmt: skip
    seen = []
    for step in steps:
        step()
        mine, auto = load_tokenizer(str(directory), direct=True), _auto(directory)
        assert isinstance(mine, TokenizerFiles) and mine.chat_template == auto.chat_template
        seen.append(json.dumps(auto.chat_template))
    assert len(set(seen)) == 4  # each step but the empty folder changed the template


def test_a_chat_build_from_a_directory_read_directly(tmp_path, write_jsonl):
    """The chat stage renders with the tokenizer read directly (no transformers tokenizer): same rows as given
    AutoTokenizer's."""
    directory = _saved(chat_tokenizer("chatml"), tmp_path / "tok")
    assert direct_load_obstacle(directory) is None
    messages = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello there."}]
    raw = write_jsonl([{"messages": messages}, {"pieces": [{"text": "plain", "weight": 1}]}])
    result = CliRunner().invoke(main, ["build", str(raw), "--tokenizer", str(directory), "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    from weightprep.config import config_from_dict
    from weightprep.pipeline import build

    build([str(raw)], tmp_path / "b", config_from_dict({"tokenizer": {"name": str(directory)}}), tokenizer=_auto(directory))
    assert _digests(tmp_path / "a") == _digests(tmp_path / "b")


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "float32", "float64"])
def test_arrow_buffers_round_trip_without_pandas(dtype):
    import numpy as np
    import pyarrow as pa

    from weightprep.arrow import from_numpy, to_numpy

    values = (np.arange(-5, 20) * 3).astype(dtype)
    arrow = from_numpy(values, pa.from_numpy_dtype(np.dtype(dtype)))
    assert arrow.to_pylist() == values.tolist()
    sliced = arrow.slice(3, 7)  # a view with an offset into the buffer
    assert to_numpy(sliced).tolist() == values[3:10].tolist()
    assert from_numpy(np.array([1, 2], dtype=np.int64), pa.int32()).type == pa.int32()  # cast on the way in
    with pytest.raises(ValueError, match="nulls"):
        to_numpy(pa.array([1, None], pa.int32()))


def test_a_directory_loaded_through_auto_tokenizer_is_tokenized_from_what_it_loaded(tmp_path, write_jsonl):
    """The build starts fastokens on tokenizer.json early, but where transformers changes the tokenizer at load time
    (here `add_bos_token`) that file is not used: fastokens gets the loaded backend's JSON; same shards as hf."""
    from weightprep.config import config_from_dict
    from weightprep.pipeline import build

    directory = _edit_config(_saved(bos_eos_distinct(), tmp_path / "tok"), add_bos_token=True)
    assert not isinstance(load_tokenizer(str(directory), direct=True), TokenizerFiles)
    raw = write_jsonl([{"pieces": [{"text": "Q: 2+2?", "weight": 0}, {"text": " A: 4", "weight": 1}]}] * 3)
    manifests = {
        backend: build([str(raw)], tmp_path / backend, config_from_dict(
            {"tokenizer": {"name": str(directory), "backend": backend}, "pack": {"seq_len": 64}}))
        for backend in ("auto", "hf")
    }  # fmt: skip
    assert manifests["auto"]["tokenizer"]["backend"] == "fastokens"
    shards = {b: {p.name: p.read_bytes() for p in (tmp_path / b).glob("*.arrow")} for b in manifests}
    assert shards["auto"] and shards["auto"] == shards["hf"]


_REMEMBERED = """
import json, sys
from weightprep.tokenizer import load_tokenizer, tokenizer_summary
tok = load_tokenizer(sys.argv[1])
text = sys.argv[2]
print(json.dumps({
    "torch": "torch" in sys.modules, "class": type(tok).__name__, "summary": tokenizer_summary(tok),
    "specials": tok.special_tokens_map, "added": sorted(tok.added_tokens_encoder.items()),
    "ids": tok(text)["input_ids"], "plain": tok(text, add_special_tokens=False)["input_ids"],
    "template": tok.chat_template,
}))
"""


def _described(tok) -> dict:
    return {
        "class": type(tok).__name__, "summary": tokenizer_summary(tok), "specials": tok.special_tokens_map,
        "added": sorted(tok.added_tokens_encoder.items()), "ids": tok(TEXT)["input_ids"],
        "plain": tok(TEXT, add_special_tokens=False)["input_ids"], "template": tok.chat_template,
    }  # fmt: skip


def _in_a_new_process(directory: Path, cache: Path) -> dict:
    env = {**__import__("os").environ, "WEIGHTPREP_CACHE": str(cache)}
    run = subprocess.run([sys.executable, "-c", _REMEMBERED, str(directory), TEXT], capture_output=True, text=True,
                         timeout=300, env=env)  # fmt: skip
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["extra special tokens", "model class, byte-level", "add_bos_token"])
def test_the_class_auto_tokenizer_chose_is_loaded_again_without_torch(kind, tmp_path, monkeypatch):
    """A directory only AutoTokenizer may load (its auto classes import torch, ~1.8 s and 260 MB a process) is
    loaded by AutoTokenizer once; later processes load the class it chose, without torch, into the same tokenizer:
    class, fingerprint, special and added tokens, ids with and without special tokens, chat template. A changed
    file is a new directory to AutoTokenizer."""
    import json as _json

    from weightprep import tokenizer_class

    cache = tmp_path / "cache"
    monkeypatch.setenv("WEIGHTPREP_CACHE", str(cache))
    if kind == "extra special tokens":  # one that tokenizer.json lacks: AutoTokenizer adds it
        directory = _edit_config(_saved(chat_tokenizer("chatml"), tmp_path / "tok"),
                                 extra_special_tokens=["<|im_start|>", "<|extra|>"])  # fmt: skip
    elif kind == "model class, byte-level":  # AutoTokenizer loads TokenizersBackend (byte-level tokenizer.json)
        directory = _edit_config(_saved(bos_eos_distinct(), tmp_path / "tok"), tokenizer_class="LlamaTokenizer")
    else:
        directory = _edit_config(_saved(FAMILIES["sentencepiece_legacy"](), tmp_path / "tok"), add_bos_token=True)
    assert direct_load_obstacle(directory) is not None
    auto = _described(_auto(directory))
    first = load_tokenizer(str(directory))
    assert _described(first) == auto
    memory = _json.loads((cache / "tokenizer-classes.json").read_text())
    assert list(memory.values()) == [f"{type(first).__module__}:{type(first).__qualname__}"]
    again = _in_a_new_process(directory, cache)
    assert again.pop("torch") is False
    assert again == _json.loads(_json.dumps(auto))  # (JSON turns the added tokens' pairs into lists)
    _edit_config(directory, model_max_length=12345)  # any change: AutoTokenizer decides again
    assert _in_a_new_process(directory, cache)["torch"] is True
    assert len(_json.loads((cache / "tokenizer-classes.json").read_text())) == 2
    assert tokenizer_class.KEEP >= 2


def test_remote_code_is_never_remembered_and_a_damaged_memory_is_ignored(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("WEIGHTPREP_CACHE", str(cache))
    directory = _saved(chat_tokenizer("chatml"), tmp_path / "tok")
    cache.mkdir()
    (cache / "tokenizer-classes.json").write_text("{not json")
    auto = _described(_auto(directory))
    assert _described(load_tokenizer(str(directory))) == auto  # AutoTokenizer, and the memory written anew
    assert len(json.loads((cache / "tokenizer-classes.json").read_text())) == 1
    (cache / "tokenizer-classes.json").write_text(json.dumps({k: "transformers.nowhere:Gone" for k in
                                                              json.loads((cache / "tokenizer-classes.json").read_text())}))  # fmt: skip
    assert _described(load_tokenizer(str(directory))) == auto  # a class that no longer imports: AutoTokenizer
    remote = _edit_config(_saved(chat_tokenizer("chatml"), tmp_path / "remote"),
                          auto_map={"AutoTokenizer": ["x.Tok", None]})  # fmt: skip
    before = (cache / "tokenizer-classes.json").read_text()
    from weightprep import tokenizer_class

    assert tokenizer_class._key(remote) is None
    assert (cache / "tokenizer-classes.json").read_text() == before


def test_the_memory_lives_in_weightprep_cache_else_the_xdg_cache_else_the_home(tmp_path, monkeypatch):
    from weightprep.tokenizer_class import cache_dir

    monkeypatch.setenv("WEIGHTPREP_CACHE", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("WEIGHTPREP_CACHE")
    assert cache_dir() == tmp_path / "xdg" / "weightprep"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == tmp_path / "home" / ".cache" / "weightprep"


def test_the_key_reads_every_file_but_weights_and_the_memory_keeps_the_newest(tmp_path, monkeypatch):
    """The key changes with any file a tokenizer's loading may read, not with the weights beside them (gigabytes,
    never read by it); a folder beside them is no obstacle. The memory keeps other directories' classes, the newest
    ``KEEP`` of them, and only transformers' own classes."""
    from weightprep import tokenizer_class

    monkeypatch.setenv("WEIGHTPREP_CACHE", str(tmp_path / "cache"))
    directory = _saved(chat_tokenizer("chatml"), tmp_path / "tok")
    (directory / "checkpoint-10").mkdir()
    key = tokenizer_class._key(directory)
    assert key is not None
    (directory / "model.safetensors").write_bytes(b"weights")
    (directory / "pytorch_model.bin").write_bytes(b"weights")
    assert tokenizer_class._key(directory) == key
    (directory / "merges.txt").write_text("a b\n")
    assert tokenizer_class._key(directory) not in (key, None)
    import shutil

    shutil.copytree(directory, tmp_path / "copy")  # the same files elsewhere: AutoTokenizer may read the path
    assert tokenizer_class._key(tmp_path / "copy") not in (tokenizer_class._key(directory), None)

    class NotTransformers:
        pass

    tokenizer_class._remember("elsewhere", NotTransformers)  # a local class (its qualname holds "<locals>")
    tokenizer_class._remember("elsewhere", json.JSONDecoder)  # a class another package names as transformers does
    assert tokenizer_class._read() == {}
    auto = type(_auto(directory))
    monkeypatch.setattr(tokenizer_class, "KEEP", 3)
    for k in ("a", "b", "c", "d"):
        tokenizer_class._remember(k, auto)
    assert list(tokenizer_class._read()) == ["b", "c", "d"]
    tokenizer_class._remember("b", auto)  # remembered again: now the newest
    assert list(tokenizer_class._read()) == ["c", "d", "b"]
    assert tokenizer_class._remembered("d") is auto and tokenizer_class._remembered("zz") is None


def test_a_remembered_directory_is_loaded_without_auto_tokenizer(tmp_path, monkeypatch):
    """In process as in a new one: once remembered, the directory's class loads it; AutoTokenizer is not called."""
    import transformers

    from weightprep import tokenizer_class

    monkeypatch.setenv("WEIGHTPREP_CACHE", str(tmp_path / "cache"))
    directory = _saved(chat_tokenizer("chatml"), tmp_path / "tok")
    expected = _described(tokenizer_class.load(str(directory)))  # AutoTokenizer, remembered

    def refuse(*args, **kwargs):
        raise AssertionError("AutoTokenizer called for a remembered directory")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    assert _described(tokenizer_class.load(str(directory))) == expected


def test_the_memory_is_written_where_no_folder_was_and_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    """A fresh home has no ~/.cache: the memory makes its folders. A write that fails leaves neither a memory nor
    its temporary file; remote code (trust_remote_code) is never remembered."""
    from weightprep import tokenizer_class

    monkeypatch.setenv("WEIGHTPREP_CACHE", str(tmp_path / "a" / "b" / "cache"))
    directory = _saved(chat_tokenizer("chatml"), tmp_path / "tok")
    auto = type(_auto(directory))
    tokenizer_class._remember("k", auto)
    assert tokenizer_class._read() == {"k": f"{auto.__module__}:{auto.__qualname__}"}

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(tokenizer_class.json, "dump", broken)
    tokenizer_class._remember("other", auto)
    monkeypatch.undo()
    monkeypatch.setenv("WEIGHTPREP_CACHE", str(tmp_path / "a" / "b" / "cache"))
    assert sorted(p.name for p in (tmp_path / "a" / "b" / "cache").iterdir()) == ["tokenizer-classes.json"]
    assert tokenizer_class._read() == {"k": f"{auto.__module__}:{auto.__qualname__}"}
    tokenizer_class.load(str(directory), trust_remote_code=True)
    assert list(tokenizer_class._read()) == ["k"]


@pytest.mark.parametrize("family", [*sorted(FAMILIES), "sample"])
def test_a_directory_read_directly_decodes_as_auto_tokenizer(family, tmp_path):
    """``decode`` (what `inspect` and the report show): the backend's, as transformers 5 decodes where no clean-up of
    tokenization spaces is set; with it set (or asked for), transformers' tokenizer decodes."""
    directory = SAMPLE_TOKENIZER_DIR if family == "sample" else _saved(FAMILIES[family](), tmp_path / "tok")
    spec = json.loads((directory / "tokenizer.json").read_text())
    if (spec.get("decoder") or {}).get("cleanup"):  # WordPiece's decoder cleans up itself: not here, so that
        spec["decoder"]["cleanup"] = False  # transformers' clean-up (not BPE's) is what differs
        (directory / "tokenizer.json").write_text(json.dumps(spec))
    mine, auto = load_tokenizer(str(directory), direct=True), _auto(directory)
    assert isinstance(mine, TokenizerFiles)
    ids = auto(TEXT + " Hello , world . It 's")["input_ids"]
    ids = [*ids, *auto.all_special_ids, *ids[:3]]
    for skip in (False, True):
        assert mine.decode(ids, skip_special_tokens=skip) == auto.decode(ids, skip_special_tokens=skip)
        assert mine.decode(ids, skip, clean_up_tokenization_spaces=True) == auto.decode(
            ids, skip_special_tokens=skip, clean_up_tokenization_spaces=True
        )
    if family != "sample":
        for setting in (True, None):  # set, and not set (transformers 5's default: no clean-up)
            _edit_config(directory, clean_up_tokenization_spaces=setting)
            mine, auto = load_tokenizer(str(directory), direct=True), _auto(directory)
            assert isinstance(mine, TokenizerFiles) and mine.decode(ids) == auto.decode(ids)
            assert (mine._full is None) == (setting is None)  # the backend's own decode needs no transformers


def test_under_transformers_4_its_tokenizer_decodes(monkeypatch):
    from weightprep import tokenizer_class

    mine = load_tokenizer(str(SAMPLE_TOKENIZER_DIR), direct=True)
    mine.decode([1, 2, 3])
    assert mine._full is None
    monkeypatch.setattr(tokenizer_class, "transformers_major", lambda: 4)
    assert mine.decode([1, 2, 3]) == _auto(SAMPLE_TOKENIZER_DIR).decode([1, 2, 3])
    assert mine._full is not None


def test_inspect_of_a_build_imports_no_transformers(tmp_path):
    from conftest import SAMPLE_RAW

    out = tmp_path / "s"
    assert CliRunner().invoke(main, ["build", str(SAMPLE_RAW), "--out", str(out)]).exit_code == 0
    code = (
        "import sys; from weightprep.cli import main\n"
        "try: main(['inspect', sys.argv[1], '--row', '1', '--no-color'])\n"
        "except SystemExit as e: assert not e.code, e.code\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    run = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert lines[-1] == "[]"
    shown = CliRunner().invoke(main, ["inspect", str(out), "--row", "1", "--no-color"])  # the whole row was shown
    assert shown.exit_code == 0 and "\n".join(lines[:-1]) == shown.output.rstrip("\n")


def test_the_transformers_version_is_read_off_its_init_file():
    """What ``importlib.metadata`` says (its import costs ~35 ms), read without it or transformers."""
    import importlib.metadata

    from weightprep import tokenizer_class

    tokenizer_class.transformers_version.cache_clear()
    try:
        assert tokenizer_class.transformers_version() == importlib.metadata.version("transformers")
    finally:
        tokenizer_class.transformers_version.cache_clear()


def test_the_version_falls_back_to_the_package_metadata(monkeypatch, tmp_path):
    """An ``__init__.py`` without the version line: the installed distribution's; no transformers at all: None
    (major version 0, and no key for a remembered class or a snapshot)."""
    import importlib.metadata
    import importlib.util

    import transformers

    from weightprep import tokenizer_class

    real = importlib.util.find_spec
    (tmp_path / "__init__.py").write_text("from .version import __version__\n")

    class Spec:
        submodule_search_locations = [str(tmp_path)]  # a transformers whose __init__.py does not say its version

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: Spec() if name == "transformers" else real(name, *a))
    tokenizer_class.transformers_version.cache_clear()
    try:
        assert tokenizer_class.transformers_version() == importlib.metadata.version("transformers") == transformers.__version__
        tokenizer_class.transformers_version.cache_clear()
        (tmp_path / "__init__.py").unlink()  # a namespace package: no __init__.py to read
        assert tokenizer_class.transformers_version() == transformers.__version__
        tokenizer_class.transformers_version.cache_clear()

        def missing(name):
            raise importlib.metadata.PackageNotFoundError(name)

        monkeypatch.setattr(importlib.metadata, "version", missing)
        assert tokenizer_class.transformers_version() is None
        tokenizer_class.transformers_version.cache_clear()
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a))
        assert tokenizer_class.transformers_version() is None and tokenizer_class.transformers_folder() is None
        assert tokenizer_class.transformers_major() == 0 and tokenizer_class._key(tmp_path) is None
    finally:
        tokenizer_class.transformers_version.cache_clear()
