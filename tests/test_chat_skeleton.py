"""A conversation's whole render filled in from its shape's skeleton (``weightprep.stages.chat_skeleton``) is the
template's own render, cut where it is cut, on every template of the tests and of TRL; a template that does anything
with a string but write it keeps no skeleton for that shape."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from chat_support import TEMPLATES as TRL_TEMPLATES
from hypothesis import given, settings
from hypothesis import strategies as st

from weightprep.stages import chat_prefixes, chat_skeleton
from weightprep.stages.chat import _GENERATION_TAG, _Template
from weightprep.stages.chat_skeleton import MARK

FILES = sorted((Path(__file__).parent / "chat_templates").glob("*.jinja")) + sorted(TRL_TEMPLATES.glob("*.jinja"))
SPECIALS = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
#: strings a template that looked at them would treat otherwise than its placeholders: ends of spaces, markers that
#: templates test for, template text, JSON's specials, non-ASCII, a placeholder's own mark
CONTENTS = [
    "Plain text.", "  spaced both ends \n", "<think>\nreasoning\n</think>\n\nanswer", "</think>tail", "[INST] x [/INST]",
    '{"a": "b\\"c"}', "naïve — 東京 🌍", f"holds {MARK}0{MARK} a mark", "\n", "x", "<|im_end|>", "Human:", "a\tb",
    "text first.", "  \n\t ", "ends!", "\n. .\n", "xx", "",
]  # fmt: skip
SHAPES = [
    ("user", "assistant"),
    ("system", "user", "assistant"),
    ("system", "user", "assistant", "user", "assistant"),
    ("user", "assistant", "user", "assistant", "user"),
    ("system", "user"),
]


def _templates(path: Path) -> tuple[_Template, _Template] | None:
    """The template compiled twice: with skeletons, and without (its renders the reference); None where it has
    ``{% generation %}`` spans (rendered by transformers' own function, never filled)."""
    text = path.read_text(encoding="utf-8")
    if _GENERATION_TAG.search(text):
        return None
    with_, without = _Template(text, False), _Template(text, False)
    assert with_._skeletons is not None or "autoescape" in text
    without._skeletons = None
    return with_, without


def _conversations(roles: tuple[str, ...], extra: dict | None = None) -> list[list[dict]]:
    """Conversations of one shape, each string from ``CONTENTS`` in turn (the first builds the skeleton)."""
    out = []
    for shift in range(len(CONTENTS)):
        out.append([{"role": r, "content": CONTENTS[(shift + i) % len(CONTENTS)], **(extra or {})} for i, r in enumerate(roles)])
    return out


def _renders(template: _Template, messages: list[dict]) -> list:
    """Every render the chat stage asks for (each prefix, with and without the generation prompt), or the error's
    type; and the whole render's prefix cuts (``_Template._cut``)."""
    prepared = template.prepare(messages, None, SPECIALS, shared=True)
    out: list = []
    for k in range(len(messages), -1, -1):
        for generation in (False, True):
            try:
                out.append(template.render(prepared, k, generation))
            except Exception as exc:  # noqa: BLE001 - the same error either way
                out.append(type(exc).__name__)
    out.append(prepared.whole.get("cuts", "not cut"))
    return out


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_filled_render_is_the_templates_own(path):
    pair = _templates(path)
    if pair is None:
        pytest.skip("{% generation %} spans: rendered by transformers' function")
    with_, without = pair
    for roles in SHAPES:
        for extra in (None, {"name": "Ann"}, {"reasoning_content": "Because.", "n": 3, "flag": True}):
            for messages in _conversations(roles, extra):
                assert _renders(with_, messages) == _renders(without, messages), (roles, messages)


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_compiled_fill_is_its_skeletons_fill(path):
    """``compiled_fill`` of every skeleton with cuts and no guards that the chat stage makes, on every template, gives
    ``Skeleton.fill``'s render and cuts for every conversation of its shape (strings that look like template text,
    marks, spaces and nothing among them); a skeleton with guards has none (its answers are ``fill``'s)."""
    pair = _templates(path)
    if pair is None:
        pytest.skip("{% generation %} spans: rendered by transformers' function")
    template = pair[0]
    for roles in SHAPES:
        for extra in (None, {"name": "Ann"}):
            for messages in _conversations(roles, extra):
                _renders(template, messages)
                skeleton = template._skeletons.made(chat_skeleton.shape_keys(messages), tracked=True)
                if skeleton is None:
                    continue
                fill = chat_skeleton.compiled_fill(skeleton)
                if skeleton.guards or skeleton.cut_at is None:
                    assert fill is None
                elif skeleton.fill(messages) is not None:
                    assert fill(messages) == skeleton.fill(messages), (roles, messages)


_PLAIN_KEYS = st.permutations(["role", "content", "weight"]).map(tuple) | st.permutations(["role", "content"]).map(tuple)
_PLAIN_MESSAGE = st.tuples(
    _PLAIN_KEYS, st.sampled_from(["user", "assistant", "", "system"]), st.sampled_from(["", " ", "\n\t", "x", " x "]),
    st.sampled_from([0, 1.5, 2]),
).map(lambda t: {k: {"role": t[1], "content": t[2], "weight": t[3]}[k] for k in t[0]})


@settings(max_examples=300, deadline=None)
@given(st.lists(_PLAIN_MESSAGE, max_size=4), st.lists(_PLAIN_MESSAGE, max_size=4))
def test_a_plain_shape_is_one_to_one_with_its_scanned_keys(one, two):
    """``plain_shape``'s key of two conversations of plain messages is the same exactly where their
    ``scan_messages(template=True)`` keys are (whatever their keys' order, a weight anywhere), and its strings are
    the scan's."""
    a, b = chat_skeleton.plain_shape(one), chat_skeleton.plain_shape(two)
    scan_a = chat_skeleton.scan_messages(one, template=True)
    scan_b = chat_skeleton.scan_messages(two, template=True)
    assert (a[0] == b[0]) == (scan_a[2] == scan_b[2])
    assert a[1] == scan_a[1] and b[1] == scan_b[1]


def test_every_plain_message_has_its_own_part_of_the_plain_shape():
    """Over every plain message of a small world (two roles, an empty, a whitespace-only and another content, every
    order of its keys, with a weight and without), and conversations of two of them: two keys are equal exactly where
    the scanned keys are."""
    orders = [*itertools.permutations(["role", "content"]), *itertools.permutations(["role", "content", "weight"])]
    world = [
        {k: {"role": role, "content": content, "weight": 1.0}[k] for k in order}
        for role in ("user", "assistant") for content in ("", " \n", "text") for order in orders
    ]  # fmt: skip
    conversations = [[m] for m in world] + [[a, b] for a in world[::5] for b in world[::7]]
    keys = [chat_skeleton.plain_shape(c)[0] for c in conversations]
    scanned = [tuple(chat_skeleton.scan_messages(c, template=True)[2]) for c in conversations]
    assert len(set(keys)) == len(set(scanned)) == len(set(zip(keys, scanned, strict=True)))


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "a", "name": "Ann"}], [{"role": "user"}], [{"role": "user", "content": ["a"]}],
    [{"role": 1, "content": "a"}], [{"role": "user", "content": "a", "weights": 1}], ["user"], ({"role": "u", "content": "a"},),
    [{"role": "user", "content": "a"}, {"role": "user", "content": None}],
])  # fmt: skip
def test_messages_that_are_not_plain_have_no_plain_shape(messages):
    assert chat_skeleton.plain_shape(messages) is None


def _kept(template_text: str, roles=("user", "assistant")) -> bool:
    """Whether a skeleton is kept for the whole render of a conversation's shape under ``template_text``."""
    template = _Template(template_text, False)
    messages = [{"role": r, "content": f"text {i}"} for i, r in enumerate(roles)]
    prepared = template.prepare(messages, None, SPECIALS, shared=True)
    return template._filled(prepared, len(messages), False, tracked=False) is not None


LOOP = "{%- for message in messages %}BODY{%- endfor %}{%- if add_generation_prompt %}<|assistant|>{%- endif %}"
WRITES = [
    "{{ '<|' + message.role + '|>' + message.content + '<|end|>' }}",
    "<|{{ message['role'] }}|>{{ message['content'] }}",
    "{{ '<|' ~ message.role ~ '|>' ~ message.content ~ '\\n' }}",
    "{% set c %}[{{ message.content }}]{% endset %}{{ c }}",
    "{% macro m(x) %}<{{ x }}>{% endmacro %}{{ m(message.content) }}",
    "{% set ns = namespace(c=message.content) %}{{ ns.c }}",
    "{% if message.content is string and message.content %}{{ message.content }}{% endif %}",
    "{% if message.content is defined and message.content is not none %}{{ message.content }}{% endif %}",
    "{{ message.content if message.content else 'none' }}",
    "{{ loop.index0 ~ ':' ~ message.content }}{{ messages[0].role ~ (messages | length) }}",
    "{% if message.role in ['user', 'system'] %}U{% endif %}{{ message.content }}",
    # stripped of whitespace (a slot of its own), or tested against a literal (a guard of the skeleton)
    "{{ '<|' + message.role + '|>' + message.content | trim + '<|end|>' }}",
    "[{{ message.content.strip() }}|{{ message.content.lstrip() }}|{{ message.content.rstrip() }}]",
    "{% if message.content | trim %}{{ (message.content | trim).rstrip() }}{% else %}EMPTY{% endif %}",
    "{% if message.content == 'x' %}X{% endif %}{{ message.content }}",
    "{% if '0' in message.content %}Z{% endif %}{{ message.content }}",
    "{% if '</think>' not in message.content %}{{ message.content }}{% endif %}",
    "{{ message.content.startswith('<think>') }}{{ message.content.endswith(('.', '!')) }}{{ message.content }}",
    "{{ message.content | string }}",
    "{% set c %}{{ message.content }}{% endset %}{{ c | trim }}",
    "{{ ('  ' ~ message.role ~ '  ') | trim }}:{{ message.content | trim }}:{{ '  x ' | trim('x ') }}",
    "{% if message.content.strip('\\n .') %}[{{ message.content.strip('\\n .') }}]{% endif %}{{ message.content | trim('x') }}",
    "{{ strftime_now('%Y') }}{{ message.content }}",
    "{{ message.content | default('none') }}{% if message.content != none and message.content != 3 %}NN{% endif %}",
]
LOOKS = [
    "{{ message.content | length }}",
    "{{ message.content | tojson }}",
    "{{ messages | tojson }}",
    "{{ messages | map(attribute='content') | join('|') }}",
    "{{ message.content[1:] }}",
    "{% if message.content in 'text 0 text 1' %}IN{% endif %}",
    "{% if 'a' != message.content in 'abc text 0' %}IN{% endif %}",
    "{% if message.content not in ['a'] %}{% endif %}{{ message.content }}",
    "{{ '%s!' % message.content }}",
    "{{ message.content * 2 }}",
    "{% for ch in message.content %}{% endfor %}{{ message.content }}",
    "{% macro m(x) %}{{ x }}{% endmacro %}{{ m(message.content) | upper }}",
    "{{ message.content ~ '' | length }}{{ (message.content ~ 'x') | length }}",
    "{% set d = {message.content: 1} %}{{ message.content }}",
    "{{ message.content is sameas message.content }}",
    "{{ message.content | int }}",
    "{{ '{}'.format(message.content) }}",
    "{{ [message.content] | join }}",
    "{{ message }}",
    "{{ message.content | trim | length }}",
    "{{ message.content.split('x') | first }}",
    "{{ message.content.startswith('t', 1) }}",
    "{{ message.content.strip(chars='x') }}",
    "{{ lipsum(1) }}{{ message.content }}",
    "{{ message.content | trim(message.role ~ '') | length }}",
    "{% set c %}<{{ message.content }}>{% endset %}{{ c | trim }}",
    "{{ (message.content ~ ' x') | trim }}{{ (message.content ~ ' y').strip() }}",
    "{% if (message.content + ('x' | safe)) | length > 3 %}L{% endif %}",
    "{% if (('x' | safe) + message.content) | length > 3 %}L{% endif %}",
    "{% if message.content.startswith(messages[0].content) %}{% endif %}",
]


@pytest.mark.parametrize("body", WRITES)
def test_a_template_that_only_writes_its_strings_keeps_their_shapes_skeleton(body):
    template = LOOP.replace("BODY", body)
    assert _kept(template)
    with_, without = _Template(template, False), _Template(template, False)
    without._skeletons = None
    for messages in _conversations(("user", "assistant", "user")):
        assert _renders(with_, messages) == _renders(without, messages)


@pytest.mark.parametrize("body", LOOKS)
def test_a_template_that_looks_at_a_string_keeps_no_skeleton(body):
    """Each way of reading a string's characters (or the date) is seen: the shape is rendered each time."""
    assert not _kept(LOOP.replace("BODY", body))


@settings(max_examples=60, deadline=None)
@given(contents=st.lists(st.text(max_size=12), min_size=3, max_size=3), trim=st.booleans())
def test_filled_renders_of_any_strings(contents, trim):
    """Strings of any characters, empty ones (part of the shape) included."""
    body = "{{ '<|' + message.role + '|>\\n' + (message.content | trim if TRIM else message.content) + '<|end|>\\n' }}"
    template = LOOP.replace("BODY", body.replace("TRIM", json.dumps(trim).lower()))
    with_, without = _Template(template, False), _Template(template, False)
    without._skeletons = None
    messages = [{"role": r, "content": c} for r, c in zip(("system", "user", "assistant"), contents, strict=True)]
    first = [{"role": r, "content": "seed"} for r in ("system", "user", "assistant")]
    _renders(with_, first)  # the shape's skeleton from other strings
    assert _renders(with_, messages) == _renders(without, messages)


def test_a_shape_is_its_roles_keys_and_empty_strings():
    def shape(messages):
        keys = chat_skeleton.shape_keys(messages)
        return None if keys is None else tuple(keys)

    a = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    assert shape(a) == shape([{"role": "user", "content": "other"}, {"role": "assistant", "content": "z"}])
    others = [
        [{"role": "user", "content": ""}, {"role": "assistant", "content": "y"}],  # an empty string
        [{"role": "system", "content": "x"}, {"role": "assistant", "content": "y"}],  # a role
        [{"content": "x", "role": "user"}, {"role": "assistant", "content": "y"}],  # the keys' order
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "n": 1}],  # a key
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "n": True}],  # True is not 1
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "n": 1.0}],
        [{"role": "user", "content": "x"}],
    ]
    assert len({shape(a), *(shape(m) for m in others)}) == len(others) + 1
    assert shape([{"role": "user", "content": [{"type": "text", "text": "x"}]}]) is None


def test_a_placeholders_mark_written_by_the_template_keeps_no_skeleton():
    """Text holding a placeholder's mark that the skeleton did not place (here the template's own) is refused:
    it would be how a read of a string that no probe saw shows."""
    assert not _kept(LOOP.replace("BODY", f"{MARK}{{{{ message.content }}}}"))


def test_the_tracker_counts_placeholders_without_asking_them():
    sym = chat_skeleton.Sym.make("abc", (0,))
    tracker = chat_prefixes.Tracker([], length=str.__len__)
    assert tracker.render(iter(["xy", sym])) == "xyabc" and tracker.position == 5 and tracker.chunks == ["xy", sym]


@pytest.mark.parametrize("name", [
    "qwen2_5.jinja", "phi3.jinja", "qwen3_instruct_2507.jinja", "mistralai-Mistral-7B-Instruct-v0.2.jinja",
    "ibm-granite-granite-4.0.jinja", "HuggingFaceTB-SmolLM2-135M-Instruct.jinja", "deepseek-ai-DeepSeek-V3.2.jinja",
])  # fmt: skip
def test_common_templates_fill_their_renders(name):
    """Templates that only write a message's strings: every render of a conversation of a seen shape is filled."""
    (path,) = [p for p in FILES if p.name == name]
    template = _Template(path.read_text(encoding="utf-8"), False)
    for roles in SHAPES[:3]:
        messages = [{"role": r, "content": f"text {i}"} for i, r in enumerate(roles)]
        prepared = template.prepare(messages, None, SPECIALS, shared=True)
        assert template._filled(prepared, len(messages), False, tracked=False) is not None
        assert template._filled(prepared, len(messages) - 1, True, tracked=False) is not None
        if template._shape is not None:  # cut from the whole render (chat_prefixes): that render is filled
            assert template._filled(prepared, len(messages), False, tracked=True) is not None


def test_a_skeleton_that_read_the_clock_serves_while_it_reads_the_same():
    """``strftime_now`` (Llama 3's date): its answer guards the skeleton; a later date is rendered again."""
    template = _Template(LOOP.replace("BODY", "{{ strftime_now('%Y-%m-%d') }}|{{ message.content }}"), False)
    messages = [{"role": "user", "content": "a"}]
    prepared = template.prepare(messages, None, SPECIALS, shared=True)
    assert template._filled(prepared, 1, False, tracked=False) is not None
    (skeleton,) = [s for s in template._skeletons._shapes.values() if s is not None]
    (guard,) = skeleton.guards
    assert guard[1] == "call" and skeleton.fill(messages) is not None
    assert skeleton._replace(guards=((*guard[:3], "1999-12-31"),)).fill(messages) is None


def test_a_template_that_escapes_has_no_skeletons():
    """``{% autoescape %}`` copies a string's text into ``Markup`` where no probe sees it: never filled."""
    template = _Template(LOOP.replace("BODY", "{% autoescape true %}{{ message.content }}{% endautoescape %}"), False)
    assert template._skeletons is None


def test_shapes_that_do_not_recur_stop_being_made():
    """After ``_TRIAL`` shapes, a renderer whose skeletons served fewer than two renders each makes no more (each
    costs a render); the ones it has still serve."""
    template = _Template(LOOP.replace("BODY", "{{ message.content }}"), False)
    made = []
    for n in range(chat_skeleton._TRIAL + 5):
        messages = [{"role": "user", "content": "a", "n": n}]  # every conversation a shape of its own
        prepared = template.prepare(messages, None, SPECIALS, shared=True)
        made.append(template._filled(prepared, 1, False, tracked=False) is not None)
    assert all(made[: chat_skeleton._TRIAL]) and not any(made[chat_skeleton._TRIAL :])
    again = template.prepare([{"role": "user", "content": "b", "n": 0}], None, SPECIALS, shared=True)
    assert template._filled(again, 1, False, tracked=False) == ("b", None)


def test_a_string_stripped_of_characters_then_of_whitespace_is_guarded():
    """``"x  ".strip("x")`` is whitespace only: stripped again it is empty, though the string was not; the
    skeleton made from another string does not serve it."""
    body = "{% set s = message.content.strip('x') | trim %}{% if s %}[{{ s }}]{% else %}EMPTY{% endif %}"
    with_, without = _Template(LOOP.replace("BODY", body), False), _Template(LOOP.replace("BODY", body), False)
    without._skeletons = None
    for content in ("x text x", "x  ", "xx", "  x  ", "text"):
        messages = [{"role": "user", "content": content}]
        assert _renders(with_, messages) == _renders(without, messages), content


def test_whitespace_only_strings_strip_to_nothing_in_the_skeleton():
    """A string of whitespace only is a shape of its own, whose stripped placeholder is the empty string: filled,
    and equal to the template's render, for any such string."""
    body = "[{{ message.content | trim }}|{{ message.content.rstrip() }}]{% if message.content | trim %}X{% endif %}"
    with_, without = _Template(LOOP.replace("BODY", body), False), _Template(LOOP.replace("BODY", body), False)
    without._skeletons = None
    for content in ("  ", "\n\t", " \u3000 "):
        messages = [{"role": "user", "content": content}]
        prepared = with_.prepare(messages, None, SPECIALS, shared=True)
        assert with_._filled(prepared, 1, False, tracked=False) is not None
        assert _renders(with_, messages) == _renders(without, messages)


def test_shapes_keep_being_made_while_they_serve_two_renders_each(monkeypatch):
    """The bounds of the rule above: skeletons that served exactly two renders each keep new shapes coming; at
    ``MAX_SHAPES`` no more are made, whatever they served."""
    template = _Template(LOOP.replace("BODY", "{{ message.content }}"), False)

    def fill(n: int, content: str = "a"):
        prepared = template.prepare([{"role": "user", "content": content, "n": n}], None, SPECIALS, shared=True)
        return template._filled(prepared, 1, False, tracked=False)

    for n in range(chat_skeleton._TRIAL):
        assert fill(n) is not None and fill(n, "b") is not None
    assert fill(chat_skeleton._TRIAL) == ("a", None) and fill(chat_skeleton._TRIAL, "b") == ("b", None)
    monkeypatch.setattr(chat_skeleton, "MAX_SHAPES", chat_skeleton._TRIAL + 1)
    assert fill(chat_skeleton._TRIAL + 1) is None and fill(0, "c") == ("c", None)


def test_a_prefix_cut_where_the_render_starts_is_filled():
    """A first message the template writes nothing for (here a system message): the second one's prefix cut is at
    character 0, which the skeleton places too."""
    body = "{% if message.role != 'system' %}<{{ message.content }}>{% endif %}"
    with_, without = _Template(LOOP.replace("BODY", body), False), _Template(LOOP.replace("BODY", body), False)
    without._skeletons = None
    assert with_._shape is not None
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    prepared = with_.prepare(messages, None, SPECIALS, shared=True)
    assert with_._filled(prepared, 3, False, tracked=True) == ("<u><a>", [0, 3, 6])
    assert _renders(with_, messages) == _renders(without, messages)


_SCAN_VALUES = st.one_of(
    st.none(), st.text(max_size=6), st.integers(-2, 2), st.floats(allow_nan=False, width=32), st.booleans(),
    st.lists(st.text(max_size=3), max_size=2), st.dictionaries(st.sampled_from(["type", "text"]), st.text(max_size=3)),
)  # fmt: skip
_SCAN_KEYS = st.sampled_from(["role", "content", "weight", "name", "reasoning_content", "thinking", "tool_call_id"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(_SCAN_KEYS, _SCAN_VALUES, max_size=4), max_size=4))
def test_scan_messages_is_the_steps_it_stands_for(messages):
    """``scan_messages(template=True)``: ``template_messages``, transformers' plain data and reasoning aliases (which
    leave such messages as they are), ``string_values`` and ``shape_keys``, one after the other; None exactly where a
    message holds something else than exact JSON scalars, or a reasoning field."""
    from weightprep.batches import Chat
    from weightprep.stages.chat_common import template_messages
    from weightprep.stages.chat_control import string_values
    from weightprep.stages.chat_jinja import template_utils

    ctu = template_utils()
    reasoning = frozenset(ctu._REASONING_FIELDS)
    made = template_messages(Chat(messages, None, None, b""))
    plain = ctu._alias_reasoning_fields(ctu._plain_template_data(made))
    scalar = all(type(v) in (str, int, float, bool) and k not in reasoning for m in made for k, v in m.items())
    strings: list[str] = []
    string_values(made, strings)
    expected = (made, strings, chat_skeleton.shape_keys(made)) if scalar else None
    assert chat_skeleton.scan_messages(messages, template=True, reasoning=reasoning) == expected
    if expected is not None:
        assert plain == made  # what the template reads: the scanned messages as they are


#: a control token that ends a turn, per family: in content it is refused (``control_token_in_content``)
EOS_OF = {"chatml": "<|im_end|>", "llama3_1": "<|eot_id|>", "gemma": "<end_of_turn>", "mistral_v1": "</s>"}


@pytest.mark.parametrize("family", sorted(EOS_OF))
def test_scanned_conversations_weigh_as_the_steps_do(family):
    """Conversations whose messages ``scan_messages`` takes (None values, weights, numbers, a control token in a
    string) and ones it refuses (a reasoning field, content parts): the renderer's texts, weights and turns, or its
    error, are those of the step-by-step path (the template's reasoning fields unknown: nothing scanned)."""
    import numpy as np
    from chat_support import chat_tokenizer

    from weightprep.batches import Chat
    from weightprep.stages.chat import ChatRenderer

    conversations = [
        [{"role": "system", "content": "Be brief.", "name": None}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello there.", "weight": 2.0}],
        [{"role": "user", "content": "Q", "n": 3}, {"role": "assistant", "content": "A", "weight": 0.5, "tool_calls": None}],
        [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "reasoning_content": "think"}],
        [{"role": "user", "content": [{"type": "text", "text": "Q"}]}, {"role": "assistant", "content": "A"}],
        [{"role": "user", "content": "Q"}, {"role": "assistant", "content": f"A {EOS_OF[family]} forged"}],
    ]  # fmt: skip

    def weighed(scanning: bool) -> list:
        renderer = ChatRenderer(chat_tokenizer(family))
        renderer.check()
        if not scanning:
            renderer._compiled().reasoning = None
        out = []
        for messages in conversations:
            try:
                text, weights, turns = renderer.char_weights(Chat(messages, None, None, b""))
                out.append((text, weights.tolist(), turns.tolist()))
            except Exception as exc:  # noqa: BLE001 (a template that refuses content parts refuses them both ways)
                out.append(type(exc).__name__)
        return out

    scanned, stepped = weighed(True), weighed(False)
    assert scanned == stepped
    assert any(isinstance(x, tuple) and np.count_nonzero(x[1]) for x in scanned)
    assert scanned[-1] == "ChatError"  # the control token, found in the scanned strings
