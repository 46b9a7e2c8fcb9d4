"""``_Template``'s own render path (``weightprep.stages.chat``) against transformers' ``render_jinja_template``: the
inputs converted to plain data once per conversation (``_plain_messages``), the dict lookups answered before the
sandbox's (``_dict_getattr``), tools that are not JSON schemas yet, keyword arguments per conversation, and the
errors of a template that does not parse."""

from __future__ import annotations

import collections
import enum
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2.runtime import Undefined
from transformers.utils import chat_template_utils as ctu

from weightprep.errors import UsageError
from weightprep.stages.chat import (
    ChatRenderer,
    _dict_getattr,
    _plain_messages,
    _Template,
)
from weightprep.stages.chat_control import template_literal_text as _template_literal_text

KWARGS = {"bos_token": "<s>", "eos_token": "</s>"}


class Shade(str, enum.Enum):
    RED = "red"


def _typed(value):
    """``value`` with the exact type of every part: ``==`` of two of them is equality of types too."""
    if isinstance(value, dict):
        return ("dict", type(value).__name__, {_typed(k): _typed(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_typed(v) for v in value))
    return (type(value).__name__, value)


_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.floats(-2, 2), st.text(max_size=3),
    st.sampled_from([Shade.RED, np.int64(3), np.bool_(False), np.float32(0.5), np.str_("s")]),
)  # fmt: skip
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.tuples(inner, inner),
        st.dictionaries(st.one_of(st.text(max_size=2), st.integers(0, 3)), inner, max_size=3),
    ),  # fmt: skip
    max_leaves=6,
)
_message = st.dictionaries(st.sampled_from(["role", "content", "n", "flag", 7, Shade.RED]), _values, max_size=4)
_messages = st.lists(
    st.one_of(
        _message, _message.map(collections.OrderedDict), _message.map(types.MappingProxyType),
        st.sampled_from([("role", "user"), None, "text"]),
    ),  # fmt: skip
    max_size=4,
)


@settings(max_examples=300, deadline=None)
@given(messages=_messages, container=st.sampled_from([list, tuple]))
def test_plain_messages_are_what_transformers_converts_them_to(messages, container):
    """The copy of plain messages is what ``_plain_template_data`` returns, type for type, whatever the messages
    hold (str and int subclasses, numpy scalars, tuples, non-str keys, mappings that are not dicts)."""
    given_ = container(messages)
    assert _typed(_plain_messages(ctu._plain_template_data, given_)) == _typed(ctu._plain_template_data(given_))


FIELDS = (
    "{% for m in messages %}{{ m.role }}:{{ m.content }}|{{ m.n }}|{{ m.flag }}{% if m.missing is defined %}!{% endif %}"
    "{% for k in m.keys() %}<{{ k }}>{% endfor %}{{ m.get('content', 'none') }};{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)  # fmt: skip


def _truth(template, messages, tools, k, generation, **kwargs):
    rendered, _ = ctu.render_jinja_template(
        conversations=[messages[:k]], tools=tools, chat_template=template, add_generation_prompt=generation,
        **{**KWARGS, **kwargs},
    )  # fmt: skip
    return rendered[0]


def _every_prefix_as_transformers_renders_it(template, messages, tools=None, **kwargs):
    compiled = _Template(template, False)
    prepared = compiled.prepare(messages, tools, {**KWARGS, **kwargs})
    for k in range(1, len(messages) + 1):
        for generation in (False, True):
            want = _truth(template, messages, tools, k, generation, **kwargs)
            assert compiled.render(prepared, k, generation)[0] == want, (k, generation)


def test_messages_with_values_that_are_not_plain_render_as_transformers_renders_them():
    """A str enum renders as its value and a numpy bool as False, as transformers converts them; a message's
    ``keys()``/``get`` are the dict's methods, a missing field is undefined."""
    messages = [
        {"role": "user", "content": Shade.RED, "n": np.int64(3), "flag": np.bool_(False)},
        {"role": "assistant", "content": "plain", "n": 2, "flag": True, "missing": None},
        {"role": "user", "content": ("a", "b"), "n": [np.float32(0.5)], "flag": {"k": Shade.RED}},
    ]
    _every_prefix_as_transformers_renders_it(FIELDS, messages)
    assert "red" in _truth(FIELDS, messages, None, 1, False) and "Shade" not in _truth(FIELDS, messages, None, 1, False)


def test_tools_given_as_python_functions_are_described_as_transformers_describes_them():
    """A tool that is not a dict (a function with a docstring) goes to transformers, which writes its JSON schema."""

    def weather(city: str) -> str:
        """The weather.

        Args:
            city: where
        """
        return city

    template = "{% for t in tools %}[{{ t.function.name }}:{{ t.function.description }}]{% endfor %}" + FIELDS
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    _every_prefix_as_transformers_renders_it(template, messages, [weather])
    assert "[weather:The weather.]" in _truth(template, messages, [weather], 1, False)


def test_each_conversation_renders_with_its_own_keyword_arguments():
    """The converted keyword arguments are kept for the next conversation only when they are the same object; the
    template sees them converted (a str enum as its value)."""
    template = "{{ greeting }}" + FIELDS
    compiled = _Template(template, False)
    messages = [{"role": "user", "content": "x"}]
    shared = {**KWARGS, "greeting": "hi"}
    for kwargs in (shared, shared, {**KWARGS, "greeting": Shade.RED}, shared):
        got = compiled.render(compiled.prepare(messages, None, kwargs), 1, False)[0]
        assert got == _truth(template, messages, None, 1, False, greeting=kwargs["greeting"])


@pytest.mark.parametrize(
    "obj", [{"role": "r", "items": "an item", "get": 1}, collections.OrderedDict(role="r"), types.SimpleNamespace(role="r")]
)
@pytest.mark.parametrize("name", ["role", "items", "get", "keys", "missing", "__class__", "mro"])
def test_dict_lookups_answer_as_the_sandbox_does(obj, name):
    """An attribute of a dict (``items``) is the method, not the key of that name; a key is its value; a missing
    one is undefined; anything but a plain dict is the sandbox's to answer."""
    env = _Template("{{ 1 }}", False)._compiled.environment
    sandboxed = env.getattr
    lookup = _dict_getattr(env, sandboxed)
    want, got = sandboxed(obj, name), lookup(obj, name)
    if isinstance(want, Undefined):
        assert isinstance(got, Undefined) and got._undefined_name == name
    else:
        assert got == want
    if type(obj) is dict and name == "items":
        assert callable(got)  # the method: m.items() in a template loops over the message


def test_the_template_literal_text_is_the_whole_source_where_transformers_lacks_it(monkeypatch):
    template = "{# <|x|> in a comment #}{{ '<|y|>' }}{{ messages }}"
    literal = _template_literal_text(template)
    assert "<|y|>" in literal and "<|x|>" not in literal  # transformers' literal strings
    monkeypatch.delattr(ctu, "_get_template_literal_text")
    assert _template_literal_text(template) == template


@pytest.mark.parametrize(
    ("template", "line", "text"), [("line one\n{% if %}\n", 2, "{% if %}"), ("{% if %}\nline two", 1, "{% if %}")]
)
def test_control_tokens_of_a_template_that_does_not_parse_are_a_usage_error_naming_the_file(template, line, text):
    """The file, the line Jinja names (the first line too), that line's text and Jinja's own message."""
    from tokenizer_factory import bos_eos_distinct

    render = ChatRenderer(bos_eos_distinct(), template, source="bad.jinja")
    with pytest.raises(UsageError) as caught:
        render.control_tokens()
    assert str(caught.value) == (
        f"bad.jinja:{line}: the chat template is not valid Jinja: Expected an expression, got 'end of statement "
        f"block' (the line reads {text!r}); fix the file"
    )
