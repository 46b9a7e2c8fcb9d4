"""The chat stage renders with transformers' chat-template file run on its own (``weightprep.stages.chat_jinja``):
the same renders, spans, literal text and errors as transformers' module, on every template of the tests and of
TRL, and transformers' own module wherever the file cannot run alone."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from chat_support import TEMPLATES as TRL_TEMPLATES
from transformers.utils import chat_template_utils as theirs

from weightprep import tokenizer_class
from weightprep.stages import chat_jinja

FILES = sorted((Path(__file__).parent / "chat_templates").glob("*.jinja")) + sorted(TRL_TEMPLATES.glob("*.jinja"))
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "description": "The city."}}, "required": ["city"]}}}  # fmt: skip
GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
CONVERSATIONS = [
    ([{"role": "user", "content": "Hi <b>&</b> é?"}, {"role": "assistant", "content": "Hello."}], None),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
      {"role": "assistant", "content": "4", "reasoning": "Add them."}, {"role": "user", "content": "And 3+3?"}], None),
    ([{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": [CALL]},
      {"role": "tool", "content": "sunny", "tool_call_id": "c1"}, {"role": "assistant", "content": "Sunny."}], [TOOL]),
    ([{"role": "user", "content": [{"type": "text", "text": "Parts."}]}, {"role": "assistant", "content": "Ok."}], None),
]  # fmt: skip


@pytest.fixture(scope="module")
def ours():
    """The file run alone, made by the test (not at import: the mutation tests patch the loader first)."""
    module = chat_jinja._standalone(chat_jinja.module_file())
    assert module is not None
    return module


def _render(module, template: str, messages, tools, generation: bool):
    try:
        return module.render_jinja_template(
            conversations=[messages], tools=tools, chat_template=template, add_generation_prompt=generation,
            return_assistant_tokens_mask=bool(GENERATION_TAG.search(template)), bos_token="<s>", eos_token="</s>",
        )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - an error is a result too: the same type and message
        return type(exc).__name__, str(exc)


def test_the_file_runs_alone_where_transformers_is_installed(ours):
    assert ours is not theirs and ours.__name__ != theirs.__name__
    assert Path(ours.__file__) == Path(theirs.__file__)


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_template_renders_alike_in_both_modules(path, ours):
    template = path.read_text(encoding="utf-8")
    assert ours._get_template_literal_text(template) == theirs._get_template_literal_text(template)
    rendered = 0
    for messages, tools in CONVERSATIONS:
        for generation in (False, True):
            mine, expected = (_render(m, template, messages, tools, generation) for m in (ours, theirs))
            assert mine == expected
            rendered += isinstance(expected[0], list)
    marked = ours._get_control_token_patterns(("<|im_end|>", "<s>"))[1].pattern
    assert marked == theirs._get_control_token_patterns(("<|im_end|>", "<s>"))[1].pattern
    assert rendered or "raise_exception" in template  # a template that renders none of them must refuse them


def test_the_plain_data_and_the_reasoning_aliases_are_transformers_own(ours):
    import numpy as np

    value = {"a": (np.int64(3), np.bool_(False), 1.5, None, [b"x", {"k": "v"}])}
    assert ours._plain_template_data(value) == theirs._plain_template_data(value)
    chat = [{"role": "assistant", "content": "x", "thinking": "t"}, {"role": "user", "content": "y"}]
    assert ours._alias_reasoning_fields(chat) == theirs._alias_reasoning_fields(chat)


def _copy_with(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "chat_template_utils.py"
    path.write_text(chat_jinja.module_file().read_text(encoding="utf-8") + extra, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "extra", ["\nfrom .hub import cached_file\n", "\ndef f():\n    from ..models import auto\n",
              "\nfrom .import_utils import is_pandas_available\n"],  # fmt: skip
)
def test_a_file_that_imports_more_of_its_package_is_not_run_alone(extra, tmp_path):
    assert chat_jinja._standalone(_copy_with(tmp_path, "")) is not None
    assert chat_jinja._standalone(_copy_with(tmp_path, extra)) is None


def test_where_the_file_fails_to_run_alone_transformers_module_is_used(tmp_path, monkeypatch):
    broken = _copy_with(tmp_path, "\nraise RuntimeError('a new transformers')\n")
    monkeypatch.setattr(chat_jinja, "module_file", lambda: broken)
    monkeypatch.delitem(sys.modules, "transformers")
    chat_jinja._loaded.cache_clear()
    try:
        assert chat_jinja._loaded() is None
        assert chat_jinja.template_utils() is theirs
    finally:
        chat_jinja._loaded.cache_clear()


_BUILD = """
import sys
from weightprep.cli import main
try:
    main(["build", sys.argv[1], "--tokenizer", sys.argv[2], "--out", sys.argv[3]])
except SystemExit as e:
    assert not e.code, e.code
from weightprep.stages.chat_jinja import template_utils
print(sorted(m for m in ("transformers", "torch") if m in sys.modules), template_utils().__name__)
"""


def test_a_chat_build_with_a_tokenizer_read_directly_never_imports_transformers(tmp_path, write_jsonl):
    from chat_support import chat_tokenizer
    from test_tokenizer_files import _auto, _digests

    from weightprep.config import config_from_dict
    from weightprep.pipeline import build

    directory = tmp_path / "tok"
    chat_tokenizer("chatml").save_pretrained(str(directory))  # extra_special_tokens: special added tokens
    weights = [0, 1, 2]
    raw = write_jsonl([{"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Count to {n}."},
        {"role": "assistant", "content": " ".join(map(str, range(n))), "weight": weights[n % 3]}]} for n in range(1, 40)
    ])  # fmt: skip
    run = subprocess.run([sys.executable, "-c", _BUILD, str(raw), str(directory), str(tmp_path / "a")],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[] weightprep.stages._transformers_chat_template_utils"
    cfg = config_from_dict({"tokenizer": {"name": str(directory)}})
    build([str(raw)], tmp_path / "b", cfg, tokenizer=_auto(directory))  # rendered by transformers' module
    assert _digests(tmp_path / "a") == _digests(tmp_path / "b")
    manifest = json.loads((tmp_path / "a" / "weightprep_manifest.json").read_text())
    assert manifest["counts"]["chat_documents"] == 39


def test_the_major_version_is_read_without_importing_transformers(monkeypatch, tmp_path):
    import transformers

    from weightprep.tokenizer import TokenizerFiles, chat_tokenizer

    assert tokenizer_class.transformers_major() == int(transformers.__version__.split(".")[0])
    directory = tmp_path / "tok"
    from chat_support import chat_tokenizer as family_tokenizer

    family_tokenizer("chatml").save_pretrained(str(directory))
    files = TokenizerFiles(directory)
    assert chat_tokenizer(files) is files  # transformers 5: the named special tokens only, as TokenizerFiles
    assert not isinstance(chat_tokenizer(files, full=True), TokenizerFiles)
    monkeypatch.setattr(tokenizer_class, "transformers_major", lambda: 4)  # 4 passes additional_special_tokens too
    assert not isinstance(chat_tokenizer(TokenizerFiles(directory)), TokenizerFiles)


def test_the_files_logger_warns_once_through_python_logging():
    """The file's ``logger.warning_once`` (transformers' logging adds it): a template without ``{% generation %}``
    asked for its assistant spans warns, once; the logger is Python's own otherwise."""
    import logging

    ours = chat_jinja._standalone(chat_jinja.module_file())  # its own: warning_once remembers what it said
    said: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger(ours.__name__)
    logger.addHandler(handler)
    try:
        for _ in range(2):
            ours.render_jinja_template(conversations=[[{"role": "user", "content": "x"}]], chat_template="{{ 1 }}",
                                       return_assistant_tokens_mask=True)  # fmt: skip
    finally:
        logger.removeHandler(handler)
    assert said == ["return_assistant_tokens_mask==True but chat template does not contain `{% generation %}` keyword."]
    assert ours.logger.name == ours.__name__ and ours.logger.isEnabledFor(logging.ERROR)


def test_torch_and_pillow_types_are_unknown_to_the_file_run_alone(ours):
    """The stand-ins say torch and Pillow are not there: the file imports neither, and only the JSON schema of a
    Python function's parameters would differ (tensors, images); the build's tools are JSON, never functions."""
    import torch

    assert ours._get_json_schema_type(int) == theirs._get_json_schema_type(int) == {"type": "integer"}
    assert ours._get_json_schema_type(torch.Tensor) is None
    assert not hasattr(ours, "Image")


def test_transformers_module_is_used_once_transformers_is_imported(monkeypatch):
    """Imported (by a tokenizer's load, say): its own module, one environment for the process. Not imported: the
    file run alone, loaded once."""
    assert chat_jinja.template_utils() is theirs
    monkeypatch.delitem(sys.modules, "transformers")
    chat_jinja._loaded.cache_clear()
    try:
        alone = chat_jinja.template_utils()
        assert alone is not theirs and alone.__name__ == "weightprep.stages._transformers_chat_template_utils"
        assert chat_jinja.template_utils() is alone
        assert alone.render_jinja_template(conversations=[[{"role": "user", "content": "x"}]],
                                           chat_template="{{ messages[0].content }}!") == (["x!"], [])  # fmt: skip
    finally:
        chat_jinja._loaded.cache_clear()


def test_no_transformers_file_means_transformers_import_decides(monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec

    class Spec:
        submodule_search_locations = [str(tmp_path)]  # a transformers without utils/chat_template_utils.py

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: Spec() if name == "transformers" else real(name, *a))
    assert chat_jinja.module_file() is None
    chat_jinja._loaded.cache_clear()
    try:
        assert chat_jinja._loaded() is None
    finally:
        chat_jinja._loaded.cache_clear()
