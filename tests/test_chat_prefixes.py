"""Prefix renders cut from one render of the whole conversation (``weightprep.stages.chat_prefixes``): equal to
transformers' own render of every prefix, with and without the generation prompt, on every template TRL ships and
on templates that would be cut wrongly without each condition of the proof."""

from __future__ import annotations

import pytest
from chat_coverage_support import SHAPES, shape_record, template_messages, template_names, template_text
from transformers.utils import chat_template_utils as ctu

from weightprep.stages import chat_prefixes
from weightprep.stages.chat import _GENERATION_TAG, _Template

KWARGS = {"bos_token": "<s>", "eos_token": "</s>"}


def _truth(template: str, messages: list[dict], tools, k: int, generation: bool) -> str | type:
    """transformers' render of ``messages[:k]`` (the exception's type where it raises)."""
    try:
        rendered, _ = ctu.render_jinja_template(
            conversations=[messages[:k]], tools=tools, chat_template=template, add_generation_prompt=generation, **KWARGS
        )
    except Exception as exc:
        return type(exc)
    return rendered[0]


def _ours(compiled: _Template, prepared, k: int, generation: bool) -> str | type:
    try:
        return compiled.render(prepared, k, generation)[0]
    except Exception as exc:
        return type(exc)


def _check_every_prefix(template: str, messages: list[dict], tools=None) -> bool:
    """Every prefix and generation prompt as transformers renders it; whether they were cut from the whole."""
    compiled = _Template(template, bool(_GENERATION_TAG.search(template)))
    prepared = compiled.prepare(messages, tools, dict(KWARGS))
    n = len(messages)
    order = [(n, False), *((k, g) for k in range(n + 1) for g in (False, True))]  # the whole first, as the stage does
    for k, generation in order:
        want = _truth(template, messages, tools, k, generation)
        got = _ours(compiled, prepared, k, generation)
        if isinstance(want, str):
            assert got == want, (k, generation)
        else:  # the template raises: ours raises the template's error too (as template_error in the stage)
            assert isinstance(got, type), (k, generation, got)
    return bool(prepared.whole and prepared.whole.get("cuts"))


@pytest.mark.parametrize("name", template_names())
def test_every_trl_template_and_shape_renders_every_prefix_as_transformers_does(name):
    text = template_text(name)
    for shape in SHAPES:
        record = shape_record(shape, text)
        _check_every_prefix(text, template_messages(record), record.get("tools"))


CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "a"}, {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"},
    {"role": "user", "content": "d"}, {"role": "assistant", "content": "e"},
]  # fmt: skip


def test_a_chatml_template_is_cut_from_one_render():
    compiled = _Template(CHATML, False)
    assert compiled._shape == chat_prefixes.PrefixShape("<|im_start|>assistant\n")
    calls = []
    render = compiled._render
    compiled._render = lambda *a, **kw: calls.append(1) or render(*a, **kw)  # type: ignore[method-assign]
    prepared = compiled.prepare(CONVERSATION, None, dict(KWARGS))
    for k in range(1, 6):
        for generation in (False, True):
            assert compiled.render(prepared, k, generation)[0] == _truth(CHATML, CONVERSATION, None, k, generation)
    assert len(calls) == 1
    assert _check_every_prefix(CHATML, CONVERSATION)


#: Templates whose prefixes are not cuts of the whole render, each for one reason the proof checks.
TRAPS = {
    "loop.last": "{% for m in messages %}{{ m.content }}{% if not loop.last %}|{% endif %}{% endfor %}",
    "loop.nextitem": "{% for m in messages %}{{ m.content }}{{ loop.nextitem.content if loop.nextitem }}{% endfor %}",
    "loop['length']": "{% for m in messages %}{{ m.content }}{{ loop['length'] }}{% endfor %}",
    "messages[i + 1]": "{% for m in messages %}{{ m.content }}{% if messages[loop.index0 + 1] is defined %}>{% endif %}"
    "{% endfor %}",
    "messages|length before": "{{ messages|length }}{% for m in messages %}{{ loop.index }}{{ m.content }}{% endfor %}",
    "messages[-1] before": "{{ messages[-1].content }}{% for m in messages %}{{ loop.index }}{{ m.content }}{% endfor %}",
    "text after the loop": "{% for m in messages %}{{ loop.index }}{{ m.content }}{% endfor %}END",
    "generation flag in the loop": "{% for m in messages %}{{ loop.index }}{{ m.content }}"
    "{% if add_generation_prompt %}+{% endif %}{% endfor %}{% if add_generation_prompt %}G{% endif %}",
    "break": "{% for m in messages %}{{ loop.index }}{{ m.content }}{% if m.content == 'e' %}{% break %}{% endif %}"
    "{% endfor %}",
    "a second loop": "{% for m in messages %}{{ loop.index }}{% endfor %}{% for m in messages %}{{ m.content }}"
    "{% endfor %}",
    "messages kept": "{% set all = messages %}{% for m in messages %}{{ loop.index }}{{ all|length }}{% endfor %}",
    "messages[1] before": "{% if messages[1] is defined %}TWO{% endif %}{% for m in messages %}{{ loop.index }}"
    "{{ m.content }}{% endfor %}",
    # a store of ``messages`` (here the first read of it) is refused before the reads after it are looked at
    "messages stored": "{% set messages = messages %}{{ messages|length }}{% for m in messages %}{{ loop.index }}"
    "{{ m.content }}{% endfor %}",
    # the loop written as it is ("<LoopContext 2/5>") reads its length without the environment's getattr: only
    # the syntax tree shows it
    "loop written": "{% for m in messages %}{{ m.content }}{{ loop }}{% endfor %}",
    # an ``elif`` writes where the generation flag is off: a prefix that ends with a user turn gets it (the role
    # kept in a namespace: a read of ``messages[-1]`` after the loop would be seen while rendering)
    "elif after the loop": "{% set ns = namespace(role='') %}{% for m in messages %}{{ loop.index }}{{ m.content }}"
    "{% set ns.role = m.role %}{% endfor %}{% if add_generation_prompt %}G{% elif ns.role == 'user' %}U{% endif %}",
    "raise at the end": "{% for m in messages %}{{ loop.index }}{{ m.content }}{% if m.role == 'user' and loop.last %}"
    "{{ raise_exception('ends with a user turn') }}{% endif %}{% endfor %}",
}  # fmt: skip


@pytest.mark.parametrize("why", TRAPS)
def test_a_template_whose_prefixes_are_not_cuts_is_rendered_prefix_by_prefix(why):
    assert not _check_every_prefix(TRAPS[why], CONVERSATION)


def test_a_one_message_conversation_is_cut_from_one_render():
    assert _check_every_prefix(CHATML, CONVERSATION[:1])


def test_loops_over_other_values_may_look_ahead():
    """``loop.last`` of a loop over the tools (the same for every prefix) does not stop the cuts."""
    template = (
        "{% for t in tools %}{{ t.name }}{% if not loop.last %},{% endif %}{% endfor %}"
        "{% for m in messages %}{{ loop.index }}{{ m.content }}{% endfor %}"
    )
    tools = [{"name": "f"}, {"name": "g"}]
    assert _check_every_prefix(template, CONVERSATION, tools)


def test_a_generation_prompt_that_is_not_constant_is_rendered():
    """Prefixes are cut (without the flag the ``if`` writes nothing); the prompts, which read the last message,
    are rendered."""
    template = (
        "{% for m in messages %}{{ loop.index }}{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}{{ messages[-1].role }}{% endif %}"
    )
    assert _Template(template, False)._shape == chat_prefixes.PrefixShape(None)
    assert _check_every_prefix(template, CONVERSATION)


#: conversations every weighting step meets: answers after their prompts, a weighted system and user message (the
#: probes' step), an answer of weight 0, an answer first, a reasoning marker opening an answer (rule 3 of
#: ``chat_spans``), an empty answer, and the shapes of the coverage tables
_WEIGHED = [
    [{"role": "system", "content": "Be brief.", "weight": 0.5}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello.", "weight": 2.0}],
    [{"role": "user", "content": "Q", "weight": 1.0}, {"role": "assistant", "content": "A"}],
    [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "weight": 0.0},
     {"role": "user", "content": "R"}, {"role": "assistant", "content": "B", "weight": 3.0}],
    [{"role": "assistant", "content": "I speak first."}, {"role": "user", "content": "Fine."}],
    [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "<think>\nhm\n</think>\n\nA"}],
    [{"role": "user", "content": "Q"}, {"role": "assistant", "content": ""}],
]  # fmt: skip


_THINK_PROMPT = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
)


@pytest.mark.parametrize("corpus", ["trl", "real"])
def test_weights_from_the_cuts_lengths_are_the_renders(corpus, tmp_path):
    """``ChatRenderer._cut_runs`` (the weights and turns from where the prefixes are cut, no render made), and the
    plans it leaves for plain conversations (``_plain_runs``), give what the steps give from the renders themselves,
    or leave it to them, on every template of TRL and of the real corpus, for conversations that reach each step;
    where the prefixes are cut, they serve most of them."""
    from chat_coverage_support import coverage_tokenizer
    from chat_support import chat_record

    from weightprep.stages.chat import ChatRenderer

    served: dict[str, float] = {}
    cases = [(name, template_text(name)) for name in template_names(corpus=corpus)]
    if corpus == "trl":  # ChatML whose prompt opens the reasoning that an answer's content opens too (rule 3)
        cases.append(("qwen3", _THINK_PROMPT))
    for name, template in cases:
        if _GENERATION_TAG.search(template):
            continue  # {% generation %} spans: weighed from the template's spans
        tok = coverage_tokenizer(name, str(tmp_path / name))
        fast, steps = ChatRenderer(tok, template), ChatRenderer(tok, template)
        steps._cut_runs = lambda *args: None  # type: ignore[method-assign]
        taken = fast._cut_runs
        hits = []

        def counted(*args, taken=taken, hits=hits):
            found = taken(*args)
            hits.append(found is not None)
            return found

        fast._cut_runs = counted  # type: ignore[method-assign]
        planned = fast._plain_runs

        def served_plain(chat, planned=planned, hits=hits):
            found = planned(chat)
            if found is not None:  # else ``runs`` takes its steps, ``_cut_runs`` among them (counted there)
                hits.append(True)
            return found

        fast._plain_runs = served_plain  # type: ignore[method-assign]
        records = [{"messages": m} for m in _WEIGHED] + [shape_record(s, template) for s in SHAPES]
        for record in records:
            outs = []
            for renderer in (fast, steps):
                try:
                    text, weights, turns = renderer.char_weights(chat_record(record["messages"], record.get("tools")))
                    outs.append((text, weights.tolist(), turns.tolist()))
                except Exception as exc:  # noqa: BLE001 - the same refusal either way
                    outs.append((type(exc).__name__, str(exc)))
            assert outs[0] == outs[1], (name, record)
        shape = fast._compiled()._shape
        if shape is None or shape.generation is None:
            assert not any(hits), name
        served[template] = sum(hits) / len(hits) if hits else 0.0
    if corpus == "trl":  # ChatML (Qwen2.5's, the benchmark's): cut wherever its answers follow their prompts;
        assert served[template_text("qwen2_5")] > 0.7 and served[_THINK_PROMPT] > 0, served  # the answers that
        # open with ``<think>\n`` follow the reasoning prompt's


def _plain_conversations(control: str) -> list[list[dict]]:
    """Plain conversations (``plain_shape``) of a few shapes, each shape several times (the first leaves its plan),
    among them what a plan must not answer: a weighted user turn, a control token in a string, a weight float32
    cannot hold, contents before roles and weights first, empty and whitespace-only contents, a system turn where
    the template's render of no message (``P_0``) writes another."""
    def exchange(q: str, a: str, w: float = 1.0) -> list[dict]:
        return [{"role": "user", "content": q}, {"role": "assistant", "content": a, "weight": w}]

    out = []
    for k, (q, a) in enumerate([("Hi", "Hello."), ("Why?", "Because."), ("  ", "ok"), ("x", ""), ("Q", f"A{control}B"),
                                ("Long question here", "<think>\nhm\n</think>\n\nA")]):  # fmt: skip
        out.append(exchange(q, a))
        out.append([{"role": "system", "content": "Be brief.", "weight": 0.5}, *exchange(q, a, 2.0), *exchange(a, q, 0.0)])
        out.append([{"role": "system", "content": q}, *exchange(q, a)])  # (not after Qwen2.5's default system turn)
        out.append([{"content": q, "role": "user"}, {"weight": 3, "content": a, "role": "assistant"}])
        out.append([{"role": "user", "content": q, "weight": 1.0}, {"role": "assistant", "content": a}])
        out.append(exchange(q, a, 1e39 if k == 3 else 1.0))
    return out


_DEFAULT_SYSTEM = (
    "{%- if messages[0] is not defined or messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nDefault.<|im_end|>\\n' }}"
    "{%- endif %}{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.mark.parametrize("corpus", ["trl", "real"])
def test_plain_conversations_from_their_shapes_plans_are_the_steps(corpus, tmp_path):
    """A conversation of plain messages whose shape has a plan (``ChatRenderer._plain_runs``: learnt where
    ``_cut_runs`` answered one of its shape) gets the text, weights and turns, or the refusal, that the steps give
    without plans, on every template of TRL and of the real corpus; ChatML's plans serve many of them."""
    from chat_coverage_support import coverage_tokenizer
    from chat_support import chat_record

    from weightprep.stages.chat import ChatRenderer

    served: dict[str, int] = {}
    cases = [(name, name, template_text(name)) for name in template_names(corpus=corpus)]
    if corpus == "trl":  # a render of no message (``P_0``) that a conversation with a system turn does not start with
        cases.append(("default_system", "qwen2_5", _DEFAULT_SYSTEM))
    for name, family, template in cases:
        if _GENERATION_TAG.search(template):
            continue
        tok = coverage_tokenizer(family, str(tmp_path / name))
        planned, steps = ChatRenderer(tok, template), ChatRenderer(tok, template)
        steps._learn_plain = lambda *args: None  # type: ignore[method-assign]  # (no plans: the steps every time)
        taken, hits = planned._plain_runs, []

        def counted(chat, taken=taken, hits=hits):
            found = taken(chat)
            hits.append(found is not None)
            return found

        planned._plain_runs = counted  # type: ignore[method-assign]
        control = next(iter(planned.control_tokens()[0]), "<|im_end|>")
        for messages in _plain_conversations(control):
            outs = []
            for renderer in (planned, steps):
                try:
                    text, weights, turns = renderer.char_weights(chat_record(messages))
                    outs.append((text, weights.tolist(), turns.tolist()))
                except Exception as exc:  # noqa: BLE001 - the same refusal either way
                    outs.append((type(exc).__name__, str(exc)))
            assert outs[0] == outs[1], (name, messages)
        assert planned.roles == steps.roles, name  # turn codes given in the same order
        served[name] = sum(hits)
    if corpus == "trl":
        assert served["qwen2_5"] > len(_plain_conversations("")) // 4 and served["default_system"], served


def test_a_plans_renders_count_as_its_skeletons(tmp_path):
    """Each conversation a plan renders counts as a render its shape's skeleton served (``Skeletons.served``), as one
    filled by ``Skeletons.fill`` does: a renderer keeps making the skeletons of new shapes while they serve two
    renders each, whichever way they were filled."""
    from chat_coverage_support import coverage_tokenizer
    from chat_support import chat_record

    from weightprep.stages.chat import ChatRenderer

    renderer = ChatRenderer(coverage_tokenizer("qwen2_5", str(tmp_path / "tok")), template_text("qwen2_5"))
    served = []
    for n in range(12):
        renderer.runs(chat_record([{"role": "user", "content": f"Q{n}"}, {"role": "assistant", "content": f"A{n}"}]))
        served.append(renderer._compiled()._skeletons._filled)
    assert renderer._plain and served == list(range(1, 13))


def test_a_message_the_template_writes_nothing_for_gets_no_turn_code():
    """Cut from the whole render (``ChatRenderer._cut_runs``), a message the template writes nothing for holds no
    character: its role gets no turn code (``roles`` grows only with roles that hold text, as the renders' steps
    give them), and every conversation's tokens are those the steps give from the renders themselves."""
    from chat_support import chat_record, chat_tokenizer

    from weightprep.stages.chat import ChatRenderer

    template = (
        "{% for m in messages %}{% if m.role != 'note' %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tok = chat_tokenizer("chatml")
    fast, steps = ChatRenderer(tok, template), ChatRenderer(tok, template)
    steps._cut_runs = lambda *args: None  # type: ignore[method-assign]
    taken: list[bool] = []
    cut = fast._cut_runs
    fast._cut_runs = lambda *args: taken.append(cut(*args) is not None) or cut(*args)  # type: ignore[method-assign]
    conversations = [
        [{"role": "note", "content": "n"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        [{"role": "user", "content": "q"}, {"role": "note", "content": "m"}, {"role": "assistant", "content": "b"}],
    ]
    for messages in conversations:
        got, want = fast.tokens(chat_record(messages)), steps.tokens(chat_record(messages))
        assert (got.ids.tolist(), got.weights.tolist(), got.turns.tolist()) == (
            want.ids.tolist(), want.weights.tolist(), want.turns.tolist()
        )
    assert all(taken) and taken  # the cut path served them
    assert "note" not in fast.roles and fast.roles == steps.roles == ["user", "assistant"]
