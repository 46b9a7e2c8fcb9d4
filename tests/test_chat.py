"""Chat records: rendered by the model's own template, tokenized once, weights on exactly the right tokens."""

from __future__ import annotations

import functools
import hashlib
import json
import re

import numpy as np
import pytest
from chat_support import (
    FAMILIES,
    TEMPLATES,
    build_chat_tokenizer,
    chat_record,
    chat_tokenizer,
    fastokens_wrong_on,
    merging_tokenizer,
    plain_messages,
    reference_char_weights,
    reference_token_weights,
)
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weightprep.accounting import check_accounting
from weightprep.batches import Chat
from weightprep.config import config_from_dict
from weightprep.constants import IGNORE_INDEX, MANIFEST_NAME
from weightprep.errors import InputError, UsageError
from weightprep.pipeline import build
from weightprep.stages.chat import ChatError, ChatRenderer, parse_role_weights
from weightprep.stages.chat_align import char_runs
from weightprep.stages.spans import TokenSpans
from weightprep.stages.tokenize import PieceTokenizer
from weightprep.stages.validate import check_line

ROLE_WEIGHTS = {"assistant": 1.0}




_WORDS = ["Hello", "world", "assistant", "user", "model", " spaced ", "\nnew line", "東京は", "😀🚀", "tab\there",
          "x", "0.5", "[INST]", "the end.", "  ", "Ünïcödé"]  # fmt: skip
_content = st.lists(st.sampled_from(_WORDS), min_size=0, max_size=5).map(" ".join)
_weight = st.one_of(st.none(), st.sampled_from([0.0, 0.5, 1.0, 2.5]))


@st.composite
def conversations(draw):
    turns = draw(st.integers(1, 3))
    messages = []
    for _ in range(turns):
        messages.append({"role": "user", "content": draw(_content)})
        answer = {"role": "assistant", "content": draw(_content)}
        if (w := draw(_weight)) is not None:
            answer["weight"] = w
        messages.append(answer)
    return messages


#: (family, tokenizer model): every family on byte-level BPE (ids' bytes give the spans, fastokens the ids), three on
#: Gemma-like SentencePiece (spans from "▁" and byte-fallback tokens) and on the legacy conversion (tokenizers' offsets).
CASES = [(n, "byte_level") for n in FAMILIES] + [
    (n, m) for n in ("chatml", "gemma", "mistral_v1") for m in ("sentencepiece", "sentencepiece_legacy")
]


@functools.lru_cache
def _piece_tokenizer(name: str, model: str) -> PieceTokenizer:
    return PieceTokenizer(chat_tokenizer(name, model=model), backend="auto")


@pytest.mark.parametrize(("name", "model"), CASES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=conversations())
def test_ids_and_weights_equal_the_template_and_a_naive_reference(name, model, messages):
    fam, tok = FAMILIES[name], chat_tokenizer(name, model=model)
    renderer = ChatRenderer(tok, role_weights=ROLE_WEIGHTS, tokenize=_piece_tokenizer(name, model))
    text = tok.apply_chat_template(plain_messages(messages), tokenize=False)
    enc = tok.backend_tokenizer.encode(text, add_special_tokens=False)
    # a token across a change of weight (content starting with a newline right after a header's newline: one BPE
    # token) takes the largest weight of its characters
    ref_w, _ = reference_token_weights(enc, reference_char_weights(fam, text, messages, ROLE_WEIGHTS))
    out = renderer.tokens(chat_record(messages))
    assert out.ids.tolist() == tok.apply_chat_template(plain_messages(messages), tokenize=True)["input_ids"]
    if model != "sentencepiece_legacy":  # that one reads a "▁" in front of each text between special tokens
        assert tok.decode(out.ids.tolist(), skip_special_tokens=False) == text
    np.testing.assert_array_equal(out.weights, ref_w)


def test_the_cases_run_fastokens_and_both_span_sources():
    """The premise of the test above: fastokens gives the ids, and both ways to the spans are taken."""
    for name, model in CASES:
        assert _piece_tokenizer(name, model).backend == "fastokens", (name, model)
        assert TokenSpans(chat_tokenizer(name, model=model).backend_tokenizer).supported == (model != "sentencepiece_legacy")


#: A template that reads the environment's globals (namespace, strftime_now, raise_exception).
USES_GLOBALS = (
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ m['role'] + ': ' + m['content'] }}\n"
    "{% endfor %}{{ ns.n }} on {{ strftime_now('%Y-%m-%d') }}{% if messages|length > 5 %}{{ raise_exception('too many') }}"
    "{% endif %}"
)


@pytest.mark.parametrize("template", [None, "qwen2_5_training", "llama3_1", "uses_globals"])
@settings(max_examples=30, deadline=None)
@given(messages=conversations(), tools=st.sampled_from([None, [{"type": "function", "function": {"name": "f"}}]]))
def test_prefix_renders_equal_render_jinja_template(template, messages, tools):
    """Each prefix, with and without the generation prompt, as transformers renders it (inputs converted once, or
    at every call where the direct path is off)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    text = None if template is None else USES_GLOBALS if template == "uses_globals" else (TEMPLATES / f"{template}.jinja").read_text()
    tok = chat_tokenizer("chatml", text)
    renderer = ChatRenderer(tok)
    chat = chat_record(messages, tools)
    plain = plain_messages(messages)
    for direct in (True, False):
        renderer.prepare(chat, plain)  # compiles the template
        renderer._template.direct = direct
        prepared = renderer.prepare(chat, plain)
        assert prepared.direct == direct
        for k in range(len(plain) + 1):
            for generation in (False, True):
                try:
                    want = render_jinja_template(
                        conversations=[plain[:k]], tools=tools, chat_template=renderer.template,
                        add_generation_prompt=generation, return_assistant_tokens_mask=renderer.tagged,
                        **tok.special_tokens_map,
                    )  # fmt: skip
                except Exception as exc:  # e.g. no message at all: the same failure, as a template_error
                    with pytest.raises(ChatError, match=re.escape(f"{type(exc).__name__}: {exc}")):
                        renderer.render(prepared, k, generation=generation)
                    continue
                assert renderer.render(prepared, k, generation=generation) == (want[0][0], want[1][0] if want[1] else [])


def test_the_guard_names_the_conversation_fastokens_gets_wrong(tmp_path, monkeypatch):
    fastokens_wrong_on(monkeypatch)
    tok_dir = _save(chat_tokenizer("chatml"), tmp_path / "tok")
    fine = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "fine"}]}
    weird = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "weird"}]}
    inp = tmp_path / "raw.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in [fine, fine, weird, fine]))
    cfg = config_from_dict({"tokenizer": {"name": str(tok_dir), "backend": "auto"}, "pack": {"seq_len": 256}})
    with pytest.raises(UsageError) as err:
        build([str(inp)], tmp_path / "out", cfg)
    assert f"{inp}:3: messages: fastokens and tokenizers tokenize this text differently" in str(err.value)
    assert not (tmp_path / "out").exists()


def test_a_worked_example_token_by_token():
    tok = chat_tokenizer("chatml")
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "weight": 2.5},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Bye."},
    ]
    out = ChatRenderer(tok).tokens(chat_record(messages))
    spans: list[tuple[float, str]] = []
    for i, w in zip(out.ids.tolist(), out.weights.tolist(), strict=True):
        piece = tok.decode([i])
        if spans and spans[-1][0] == w:
            spans[-1] = (w, spans[-1][1] + piece)
        else:
            spans.append((w, piece))
    assert spans == [
        (0.0, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
        (2.5, "Hello!<|im_end|>\n"),
        (0.0, "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"),
        (1.0, "Bye.<|im_end|>\n"),
    ]


def test_the_template_sees_neither_our_weight_nor_keys_without_a_value():
    """As apply_chat_template gets the messages: ``weight`` is ours, and a key holding None (``"tool_calls": null``,
    common in exported data) is absent, so ``is defined`` tests in templates see what they expect."""
    tok = chat_tokenizer("chatml")
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{% if m.weight is defined %}[WEIGHT]"
        "{% endif %}{% if m.tool_calls is defined %}[TOOLS]{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    messages = [
        {"role": "user", "content": "Hi", "tool_calls": None},
        {"role": "assistant", "content": "Hello", "weight": 2.0, "tool_calls": None},
    ]
    out = ChatRenderer(tok, template=template).tokens(chat_record(messages))
    text = tok.decode(out.ids.tolist())
    assert "Hello" in text and "[WEIGHT]" not in text and "[TOOLS]" not in text
    assert out.weights.max() == 2.0


def test_weighted_user_and_system_messages_skip_headers_and_preambles():
    tok = chat_tokenizer("llama3_1")
    messages = [
        {"role": "system", "content": "Answer in French.", "weight": 0.5},
        {"role": "user", "content": "Hi", "weight": 0.25},
        {"role": "assistant", "content": "Salut"},
    ]
    out = ChatRenderer(tok).tokens(chat_record(messages))
    by_weight: dict[float, str] = {}
    for i, w in zip(out.ids.tolist(), out.weights.tolist(), strict=True):
        by_weight[w] = by_weight.get(w, "") + tok.decode([i])
    assert by_weight[0.5] == "Answer in French.<|eot_id|>"  # not the injected "Cutting Knowledge Date" block
    assert by_weight[0.25] == "Hi<|eot_id|>"
    assert by_weight[1.0] == "Salut<|eot_id|>"
    assert "Cutting Knowledge Date" in by_weight[0.0]


def test_role_weights_and_a_tool_turn():
    tok = chat_tokenizer("chatml")
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "w", "arguments": {}}}]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
    ]  # fmt: skip
    out = ChatRenderer(tok, role_weights=parse_role_weights("assistant=2,tool=0.5")).tokens(chat_record(messages))
    text = tok.apply_chat_template(plain_messages(messages), tokenize=False)
    assert out.ids.tolist() == tok.apply_chat_template(plain_messages(messages), tokenize=True)["input_ids"]
    weighted: dict[float, str] = {}
    for i, w in zip(out.ids.tolist(), out.weights.tolist(), strict=True):
        weighted[w] = weighted.get(w, "") + tok.decode([i])
    # the tool turn from its content on (its "<|im_start|>user\n<tool_response>\n" header stays 0)
    assert weighted[0.5] == "sunny\n</tool_response><|im_end|>\n"
    assert weighted[2.0] == '<tool_call>\n{"name": "w", "arguments": {}}\n</tool_call><|im_end|>\nIt is sunny.<|im_end|>\n'
    assert "Weather?" in weighted[0.0] and text.startswith("<|im_start|>system")


def test_generation_tags_give_transformers_assistant_masks():
    template = (TEMPLATES / "qwen2_5_training.jinja").read_text()
    tok = chat_tokenizer("chatml", template)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."},
                {"role": "user", "content": "More"}, {"role": "assistant", "content": "Sure: more."}]  # fmt: skip
    out = ChatRenderer(tok).tokens(chat_record(messages))
    ref = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert out.ids.tolist() == ref["input_ids"]
    assert (out.weights > 0).astype(int).tolist() == ref["assistant_masks"]
    assert sum(ref["assistant_masks"]) > 0


#: Phi-3's special tokens; its EOS ends every render, after the last message only.
_PHI3 = ("<s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
_PHI3_CONVERSATION = [
    {"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris.", "weight": 0.5},
    {"role": "user", "content": "And Germany?"}, {"role": "assistant", "content": "Berlin.", "weight": 2.0},
]  # fmt: skip


def _phi3(template: str):
    return build_chat_tokenizer(_PHI3, "<s>", "<|endoftext|>", (TEMPLATES / f"{template}.jinja").read_text())


def test_phi3_eos_after_the_last_message_only_ends_no_turn_before_it():
    """Phi-3 writes EOS after the last message only (``else eos_token``), so ``messages[:k]`` is no prefix of the
    whole; its turns end before that EOS. The result is SFTTrainer's: phi3_training renders the same ids, its
    assistant mask is where the weights are (the last answer's EOS included)."""
    tok = _phi3("phi3")
    for history in ("full", "auto"):
        out = ChatRenderer(tok, history=history).tokens(chat_record(_PHI3_CONVERSATION))
        assert out.offsets is None and out.ids.tolist() == tok.apply_chat_template(plain_messages(_PHI3_CONVERSATION))["input_ids"]
        assert tok.decode(out.ids[out.weights == 0.5]) == "Paris.<|end|>\n"
        assert tok.decode(out.ids[out.weights == 2.0]) == "Berlin.<|end|>\n<|endoftext|>"
    training = (TEMPLATES / "phi3_training.jinja").read_text()
    ref = tok.apply_chat_template(
        plain_messages(_PHI3_CONVERSATION), chat_template=training, return_dict=True, return_assistant_tokens_mask=True
    )  # fmt: skip
    assert ref["input_ids"] == out.ids.tolist() and ref["assistant_masks"] == (out.weights > 0).astype(int).tolist()


@pytest.mark.parametrize("training", [False, True])
def test_several_generation_blocks_in_a_turn_each_carry_its_weight(training):
    """phi3_training tags an answer's content and, apart, the EOS after the last message: three blocks for two
    answers. Each block carries the weight of the turn that holds it; together they are transformers'
    assistant_masks (as the tokenizer's template, and as ``--chat-template training``)."""
    tok = _phi3("phi3_training")
    out = ChatRenderer(tok, training=training).tokens(chat_record(_PHI3_CONVERSATION))
    ref = tok.apply_chat_template(plain_messages(_PHI3_CONVERSATION), return_dict=True, return_assistant_tokens_mask=True)
    assert out.ids.tolist() == ref["input_ids"] and (out.weights > 0).astype(int).tolist() == ref["assistant_masks"]
    assert tok.decode(out.ids[out.weights == 0.5]) == "Paris.<|end|>\n"
    assert tok.decode(out.ids[out.weights == 2.0]) == "Berlin.<|end|>\n<|endoftext|>"


@pytest.mark.parametrize(
    ("template", "messages", "reason", "field"),
    [
        ("qwen3", [{"role": "user", "content": "2+2?"},
                   {"role": "assistant", "content": "4", "reasoning_content": "two and two"},
                   {"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "6"}],
         "not_prefix_preserving", "messages[1]"),
    ],  # a generation prompt that is not how the turn renders (DeepSeek-R1) is built where the renders part
    # (test_chat_history); one written after every render is refused (test_chat_align)
)  # fmt: skip
def test_templates_that_cannot_be_aligned_are_refused(template, messages, reason, field):
    tok = chat_tokenizer("chatml", (TEMPLATES / f"{template}.jinja").read_text())
    with pytest.raises(ChatError) as err:
        ChatRenderer(tok).tokens(chat_record(messages))
    assert (err.value.reason, err.value.field) == (reason, field)
    # the message shows both texts from 10 characters before the first difference to 20 after it
    whole = tok.apply_chat_template(plain_messages(messages), tokenize=False)
    if reason == "not_prefix_preserving":
        a, b = tok.apply_chat_template(plain_messages(messages[:2]), tokenize=False), whole
    else:
        a = tok.apply_chat_template(plain_messages(messages[:1]), tokenize=False, add_generation_prompt=True)
        b = tok.apply_chat_template(plain_messages(messages[:2]), tokenize=False)
    at = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert f"differ at character {at}: {a[at - 10 : at + 20]!r} vs {b[at - 10 : at + 20]!r}" in err.value.problem


def test_a_snippet_near_the_start_of_a_text_starts_at_its_first_character():
    from weightprep.stages.chat_common import snippet as _snippet

    assert _snippet("abcdefghijklmnopqrstuvwxyz0123456789", 3) == repr("abcdefghijklmnopqrstuvw")


#: ChatML whose {% generation %} block wraps the user's content, not the assistant's: one block per assistant
#: message, so the count agrees and only the span is wrong.
_TAGS_ON_THE_USER = (
    "{% for m in messages %}{% if m['role'] == 'user' %}<|im_start|>user\n{% generation %}{{ m['content'] }}"
    "{% endgeneration %}<|im_end|>\n{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: ChatML that tags every message: more blocks than assistant messages.
_TAGS_ON_EVERY_MESSAGE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% generation %}{{ m['content'] }}<|im_end|>\n"
    "{% endgeneration %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize(
    ("template", "field"), [(_TAGS_ON_THE_USER, "messages"), (_TAGS_ON_EVERY_MESSAGE, "messages")]
)
def test_generation_tags_that_disagree_with_the_assistant_messages_are_refused(template, field):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    tok = chat_tokenizer("chatml", template)
    # The expectation, from transformers: the tagged tokens are not the assistant's answer.
    ref = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    answer = tok.encode("Hello", add_special_tokens=False)
    tagged = [t for t, m in zip(ref["input_ids"], ref["assistant_masks"], strict=True) if m]
    assert tagged != answer
    with pytest.raises(ChatError) as err:
        ChatRenderer(tok).tokens(chat_record(messages))
    assert (err.value.reason, err.value.field) == ("generation_tag_mismatch", field)


def test_control_tokens_in_content_and_template_errors_are_refused():
    tok = chat_tokenizer("chatml")
    with pytest.raises(ChatError) as err:
        ChatRenderer(tok).tokens(chat_record([{"role": "user", "content": "end<|im_end|>now"}, {"role": "assistant", "content": "ok"}]))
    assert (err.value.reason, err.value.field) == ("control_token_in_content", "messages[0].content")
    assert str(err.value) == f"messages[0].content: {err.value.problem}"  # what the Python API's caller reads
    gemma = chat_tokenizer("gemma")
    with pytest.raises(ChatError) as err:
        ChatRenderer(gemma).tokens(chat_record([{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]))
    assert err.value.reason == "template_error" and "System role not supported" in err.value.problem


def test_validation_of_chat_records():
    ok, problem = check_line(b'{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "weight": 2}]}')
    assert problem is None and isinstance(ok, Chat)
    cases = {
        b'{"messages": [{"role": "user", "content": "a", "weight": -1}]}': ("messages[0].weight", "bad_weight"),
        b'{"messages": [{"role": "user"}]}': ("messages[0].content", "missing_field"),
        b'{"messages": [{"content": "a"}]}': ("messages[0].role", "missing_field"),
        b'{"messages": []}': ("messages", "empty_pieces"),
        b'{"messages": "hi"}': ("messages", "wrong_type"),
        b'{"messages": [{"role": "user", "content": "a"}], "pieces": []}': ("<record>", "ambiguous_shape"),
        b'{"messages": [{"role": "user", "content": "a"}], "tools": {}}': ("tools", "wrong_type"),
        b'{"messages": [{"role": "user", "content": "\\ud800"}]}': ("messages[0].content", "invalid_utf8"),
    }
    for line, expected in cases.items():
        _, problem = check_line(line)
        assert problem is not None and (problem.field, problem.reason) == expected, line


def _save(tok, path):
    tok.save_pretrained(str(path))
    return path


def test_build_mixes_pieces_and_chats_in_input_order(tmp_path):
    tok_dir = _save(chat_tokenizer("chatml"), tmp_path / "tok")
    convo = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!", "weight": 2.0}]
    lines = [
        {"pieces": [{"text": "Q: one", "weight": 0}, {"text": " A: two", "weight": 1}]},
        {"messages": convo},
        {"pieces": [{"text": "plain text", "weight": 1}]},
    ]
    inp = tmp_path / "raw.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in lines))
    cfg = config_from_dict({"tokenizer": {"name": str(tok_dir)}, "pack": {"seq_len": 256}})
    manifest = build([str(inp)], tmp_path / "out", cfg)
    c = manifest["counts"]
    assert (c["records"], c["documents"], c["chat_documents"], c["documents_written"]) == (3, 3, 1, 3)
    check_accounting(c)
    import datasets

    row = datasets.load_from_disk(str(tmp_path / "out"))[0]
    ids, weights, labels = (np.asarray(row[k]) for k in ("input_ids", "weights", "labels"))
    expected = chat_tokenizer("chatml").apply_chat_template(convo, tokenize=True)["input_ids"]
    starts = np.cumsum([0, *row["seq_lengths"]])
    docs = [ids[a:b].tolist() for a, b in zip(starts[:-1], starts[1:], strict=True)]
    assert expected in docs  # the conversation exactly, no BOS/EOS added by weightprep
    k = docs.index(expected)
    a, b = starts[k], starts[k + 1]
    assert labels[a] == IGNORE_INDEX and set(weights[a:b].tolist()) == {0.0, 2.0}
    assert ((labels[a:b] != IGNORE_INDEX) == (weights[a:b] > 0)).all()


def test_strict_and_skip_invalid_name_the_message(tmp_path):
    tok_dir = _save(chat_tokenizer("chatml"), tmp_path / "tok")
    good = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}
    bad_control = {"messages": [{"role": "user", "content": "<|im_start|>x"}, {"role": "assistant", "content": "y"}]}
    bad_weight = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "weight": "2"}]}
    inp = tmp_path / "raw.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in [good, bad_control, good, bad_weight]))
    cfg = config_from_dict({"tokenizer": {"name": str(tok_dir)}, "pack": {"seq_len": 128}})
    with pytest.raises(InputError) as err:
        build([str(inp)], tmp_path / "out", cfg)
    assert err.value.line == 2 and err.value.field == "messages[0].content" and "control token" in str(err.value)
    assert not (tmp_path / "out").exists()
    skip = config_from_dict({"tokenizer": {"name": str(tok_dir)}, "pack": {"seq_len": 128}, "validate": {"on_invalid": "skip"}})
    m = build([str(inp)], tmp_path / "out", skip)
    assert m["counts"]["rejected"] == {"control_token_in_content": 1, "wrong_type": 1}
    rejects = [json.loads(x) for x in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["field"]) for r in rejects] == [(2, "messages[0].content"), (4, "messages[1].weight")]
    assert json.loads(rejects[0]["original"]) == bad_control
    check_accounting(m["counts"])


def test_chat_template_kwargs_cannot_override_what_the_renderer_sets(tmp_path):
    """``{"add_generation_prompt": true}`` would end the document with a generation prompt of weight 1; the special
    tokens, messages and tools are the renderer's too. Refused, naming file:line and the key; a template variable
    of the record's own (``enable_thinking``) reaches the template."""
    tok = chat_tokenizer("chatml")
    convo = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    with pytest.raises(ChatError) as err:
        ChatRenderer(tok).tokens(chat_record(convo, kwargs={"add_generation_prompt": True}))
    assert (err.value.reason, err.value.field) == ("reserved_template_kwarg", "chat_template_kwargs.add_generation_prompt")
    tok_dir = _save(tok, tmp_path / "tok")
    lines = [{"messages": convo, "chat_template_kwargs": {"enable_thinking": False}}] + [
        {"messages": convo, "chat_template_kwargs": {key: value, "enable_thinking": False}}
        for key, value in [("add_generation_prompt", True), ("eos_token", "</s>"), ("messages", []), ("tools", [])]
    ]
    inp = tmp_path / "raw.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in lines))
    cfg = {"tokenizer": {"name": str(tok_dir)}, "pack": {"seq_len": 128}}
    with pytest.raises(InputError) as strict:
        build([str(inp)], tmp_path / "out", config_from_dict(cfg))
    assert str(strict.value).startswith(f"{inp}:2: chat_template_kwargs.add_generation_prompt: weightprep sets this")
    assert strict.value.reason == "reserved_template_kwarg"
    m = build([str(inp)], tmp_path / "out", config_from_dict({**cfg, "validate": {"on_invalid": "skip"}}))
    assert m["counts"]["rejected"] == {"reserved_template_kwarg": 4}
    rejects = [json.loads(x) for x in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["field"]) for r in rejects] == [
        (2, "chat_template_kwargs.add_generation_prompt"), (3, "chat_template_kwargs.eos_token"),
        (4, "chat_template_kwargs.messages"), (5, "chat_template_kwargs.tools"),
    ]  # fmt: skip
    import datasets

    row = datasets.load_from_disk(str(tmp_path / "out"))[0]
    assert row["input_ids"][: row["seq_lengths"][0]] == tok.apply_chat_template(convo, tokenize=True)["input_ids"]


def test_cli_chat_template_and_role_weights(tmp_path):
    from weightprep.cli import main

    tok = chat_tokenizer("chatml")
    tok_dir = _save(tok, tmp_path / "tok")
    template = tmp_path / "mistral.jinja"
    from chat_support import MISTRAL_V1

    template.write_text(MISTRAL_V1)
    inp = tmp_path / "raw.jsonl"
    inp.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}) + "\n")
    args = ["build", str(inp), "--tokenizer", str(tok_dir), "--out", str(tmp_path / "out"), "--seq-len", "64",
            "--chat-template", str(template), "--role-weights", "assistant=3,user=0.5"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "out" / "weightprep_manifest.json").read_text())
    chat = {
        "template": str(template), "role_weights": "assistant=3,user=0.5", "sanitize_control_tokens": False,
        "history": "auto",
    }  # fmt: skip
    assert manifest["config"]["chat"] == chat
    assert manifest["chat"]["template_source"] == str(template)
    assert manifest["chat"]["template_sha256"] == hashlib.sha256(MISTRAL_V1.encode()).hexdigest()
    assert manifest["counts"]["total_weight"] > 0
    bad = CliRunner().invoke(main, [*args[:-2], "--role-weights", "assistant=-1", "--overwrite"])
    assert bad.exit_code == 2 and "chat.role_weights" in bad.output


def test_a_chat_template_that_does_not_parse_is_one_error_line_naming_its_file_and_line(tmp_path):
    from weightprep.cli import main

    tok_dir = _save(chat_tokenizer("chatml"), tmp_path / "tok")
    template = tmp_path / "broken.jinja"
    template.write_text("{% for m in messages %}\n{{ m['content'] }}\n{% if %}\n{% endfor %}\n")
    inp = tmp_path / "raw.jsonl"
    inp.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}) + "\n")
    args = ["build", str(inp), "--tokenizer", str(tok_dir), "--out", str(tmp_path / "out"), "--chat-template", str(template)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        f"error: {template}:3: the chat template is not valid Jinja: Expected an expression, got 'end of statement "
        "block' (the line reads '{% if %}'); fix the file"
    ]
    assert not (tmp_path / "out").exists()
    broken = chat_tokenizer("chatml", "{{ bos_token }}\n{{ messages[0]['content'] | no_such_filter }}")
    with pytest.raises(UsageError, match=r"^the tokenizer's chat_template, line 2: .*no_such_filter.*--chat-template"):
        ChatRenderer(broken).check()  # the tokenizer's own template: no file to name


def test_a_token_across_a_weight_change_carries_the_answers_weight(tmp_path):
    """The generation prompt ends inside a word: "The" is one token across the prompt (0) and the answer (1). It
    holds a character of the answer, so it is in the mask as transformers' ``assistant_masks`` puts it there: weight
    1. The build counts it and says so once."""
    from weightprep.cli import main

    template = ("{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] + '\\n' }}{% else %}"
                "{{ 'Th' + m['content'] + '\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}Th{% endif %}")  # fmt: skip
    tok = chat_tokenizer("chatml", template)
    messages = [{"role": "user", "content": "Say it"}, {"role": "assistant", "content": "e quick brown fox."}]
    text = "Say it\nThe quick brown fox.\n"
    enc = tok.backend_tokenizer.encode(text, add_special_tokens=False)
    assert any(s < 9 < e for s, e in enc.offsets)  # the premise: a token holds "Th|e"
    out = ChatRenderer(tok).tokens(chat_record(messages))
    assert out.ids.tolist() == enc.ids
    # characters 0-8 ("Say it\nTh") are the prompt's (0), the rest the answer's (1): a token ending past 9 is the answer's
    assert out.weights.tolist() == [1.0 if e > 9 else 0.0 for _, e in enc.offsets]
    assert out.straddling == 1
    tok_dir = _save(tok, tmp_path / "tok")
    inp = tmp_path / "raw.jsonl"
    inp.write_text(json.dumps({"messages": messages}) + "\n" + json.dumps({"messages": messages}) + "\n")
    args = ["build", str(inp), "--tokenizer", str(tok_dir), "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "out" / "weightprep_manifest.json").read_text())
    assert manifest["counts"]["chat_straddling_tokens"] == 2
    warnings = [line for line in result.output.splitlines() if "assistant_masks" in line]
    assert len(warnings) == 1 and warnings[0].strip().startswith("warning: 2 token(s)"), result.output


def test_a_straddle_after_a_system_message_needs_no_render_of_the_system_message_alone():
    """Qwen3.5's template raises "No user query found" for a render without a user message. A token across its
    prompt and answer used to send the build to name the message by rendering ``messages[:1]``, the system message
    alone: ``template_error`` for a conversation ``apply_chat_template`` renders. Now it is built, the token with
    the answer's weight."""
    template = ("{% if messages | selectattr('role', 'equalto', 'user') | list | length == 0 %}"
                "{{ raise_exception('No user query found in messages.') }}{% endif %}"
                "{% for m in messages %}{% if m['role'] != 'assistant' %}{{ m['content'] + '\\n' }}{% else %}"
                "{{ 'Th' + m['content'] + '\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}Th{% endif %}")  # fmt: skip
    tok = chat_tokenizer("chatml", template)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say it"},
                {"role": "assistant", "content": "e quick brown fox."}]  # fmt: skip
    text = "Be brief.\nSay it\nThe quick brown fox.\n"
    assert tok.apply_chat_template(messages, tokenize=False) == text
    enc = tok.backend_tokenizer.encode(text, add_special_tokens=False)
    change = text.index("e quick")
    assert any(s < change < e for s, e in enc.offsets)  # the premise: a token holds "Th|e"
    out = ChatRenderer(tok).tokens(chat_record(messages))
    assert out.ids.tolist() == enc.ids
    assert out.weights.tolist() == [1.0 if e > change else 0.0 for _, e in enc.offsets]


@pytest.mark.parametrize("source", ["bytes", "offsets"])
def test_a_token_merged_into_a_multibyte_character_at_a_weight_change_carries_the_answers_weight(
    source, monkeypatch
):
    """The generation prompt ends in "A" and the answer starts with "東": byte-level BPE merges "A" with the first
    byte of "東" into one token, which starts before the change of weight and ends after it, while the token of
    the other bytes of "東" starts exactly at the change. Both carry the answer's weight whichever way the spans
    come: from the ids' bytes (``TokenSpans``) or from tokenizers' offsets."""
    tok = merging_tokenizer()
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "東京"}]
    text = tok.apply_chat_template(messages, tokenize=False)
    change = text.index("東")
    enc = tok.backend_tokenizer.encode(text, add_special_tokens=False)
    across = [(t, s, e) for t, (s, e) in zip(enc.tokens, enc.offsets, strict=True) if s < change < e]
    assert across == [("Aæ", change - 1, change + 1)]  # the premise: one token holds "A" and a byte of "東"
    if source == "offsets":  # as for a document whose ids do not spell it
        none = np.zeros(0, dtype=np.int64)
        monkeypatch.setattr(
            TokenSpans, "runs", lambda self, texts, ids, offsets: iter([(0, len(texts), none, none, np.zeros(len(texts), bool))])
        )  # fmt: skip
    calls: list[str] = []
    align, batch = ChatRenderer.align, ChatRenderer._align_exact

    def spy_align(self, *args, **kwargs):
        calls.append("offsets" if not kwargs["exact"] else "bytes, alone")
        return align(self, *args, **kwargs)

    def spy_batch(self, texts, *args):
        calls.extend(["bytes"] * len(texts))
        return batch(self, texts, *args)

    monkeypatch.setattr(ChatRenderer, "align", spy_align)
    monkeypatch.setattr(ChatRenderer, "_align_exact", spy_batch)
    out = ChatRenderer(tok).tokens(chat_record(messages))
    assert calls == [source]  # the span source under test was the one used
    assert out.ids.tolist() == enc.ids
    # the answer (its content and what follows) has weight 1 from "東" on; a token ending past it holds some of it
    assert out.weights.tolist() == [1.0 if e > change else 0.0 for _, e in enc.offsets]
    assert out.weights[enc.tokens.index("Aæ")] == 1.0 and out.straddling == 1


def test_a_conversation_that_starts_with_two_bos_is_refused():
    """A custom template that writes BOS in front of Llama-3's, which writes it too (the way a second BOS usually
    gets in): the model would train on a start it never sees at inference."""
    fam = FAMILIES["llama3"]
    tok = chat_tokenizer("llama3", "{{ bos_token }}" + fam.template)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    ids = tok.apply_chat_template(messages, tokenize=True)["input_ids"]
    assert ids[:3] == [tok.bos_token_id, tok.bos_token_id, tok.convert_tokens_to_ids("<|start_header_id|>")]
    with pytest.raises(ChatError) as err:
        ChatRenderer(tok).tokens(chat_record(messages))
    assert (err.value.reason, err.value.field) == ("double_bos", "messages")
    assert "two BOS" in err.value.problem
    assert ChatRenderer(chat_tokenizer("llama3")).tokens(chat_record(messages)).ids.tolist() == ids[1:]  # one BOS: fine


def test_a_conversation_with_two_bos_in_a_batch_is_refused_alone():
    """In a batch, the conversation whose render starts with two BOS is refused (``double_bos``, found by the run's
    alignment and said by ``align``), wherever it stands among the others, which keep what they get alone; so too
    where the run's alignment leaves out a conversation whose ids do not spell it (an added token that strips the
    spaces after it: tokenizers' offsets)."""
    from tokenizers import AddedToken

    fam = FAMILIES["llama3"]
    tok = chat_tokenizer("llama3", "{% if messages[0].content == 'twice' %}{{ bos_token }}{% endif %}" + fam.template)
    tok.add_tokens([AddedToken("<sep>", rstrip=True)])
    conversations = [
        [{"role": "user", "content": c}, {"role": "assistant", "content": f"Hello {k}"}]
        for k, c in enumerate(["Hi <sep>   there", "twice", "Hey", "twice", "Ho"])
    ]
    renderer = ChatRenderer(tok)
    batch = renderer.tokens_batch([chat_record(m) for m in conversations])
    for messages, got in zip(conversations, batch, strict=True):
        if messages[0]["content"] == "twice":
            assert isinstance(got, ChatError) and got.reason == "double_bos"
        else:
            alone = ChatRenderer(tok).tokens(chat_record(messages))
            assert got.ids.tolist() == alone.ids.tolist() == tok.apply_chat_template(messages)["input_ids"]
            assert got.weights.tolist() == alone.weights.tolist() and got.straddling == alone.straddling


def test_offsets_that_go_backwards_or_miss_a_weighted_character_are_refused():
    """tokenizers' offsets (the path for tokenizers whose ids do not spell the text) are checked before use;
    spans from the ids' bytes are exact by construction and skip the check."""
    renderer = ChatRenderer(chat_tokenizer("chatml"))
    chat = chat_record([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yes"}])
    text, char_w, turns = renderer.char_weights(chat)
    ids = np.arange(3, dtype=np.int32)
    n = len(text)
    backwards = (np.array([0, 5, 4]), np.array([5, 6, n]))
    with pytest.raises(ChatError, match="go backwards") as err:
        renderer.align(chat, text, char_runs(char_w, turns), ids, *backwards)
    assert err.value.reason == "bad_offsets"
    gap = int(np.flatnonzero(char_w > 0)[0])  # the first weighted character, in no token
    missing = (np.array([0, gap + 1, n]), np.array([gap, n, n]))
    with pytest.raises(ChatError, match=f"weighted character {gap} ") as err:
        renderer.align(chat, text, char_runs(char_w, turns), ids, *missing)
    assert err.value.reason == "bad_offsets"
    out = renderer.align(chat, text, char_runs(char_w, turns), ids, *missing, exact=True)  # trusted: no check
    assert len(out.ids) == 3


@pytest.mark.parametrize("good_ones", [0, 2])
def test_conversations_rejected_while_rendering_leave_no_trace_in_the_rows(tmp_path, good_ones):
    """--skip-invalid: a block whose conversations the chat stage refuses (all of them, or all but some), beside
    pieces, writes the rows, turns and counts of the same file without those lines; only the rejects differ."""
    tok_dir = _save(chat_tokenizer("chatml"), tmp_path / "tok")
    good = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo", "weight": 2}]}
    bad = {"messages": [{"role": "user", "content": "<|im_start|>x"}, {"role": "assistant", "content": "y"}]}
    pieces = [{"pieces": [{"text": f"text {i} " * (i + 1), "weight": i % 3}]} for i in range(5)]
    lines = [pieces[0], bad, pieces[1], *([good] * good_ones), bad, pieces[2], pieces[3], bad, pieces[4]]
    kept = [r for r in lines if r is not bad]
    cfg = config_from_dict({"tokenizer": {"name": str(tok_dir)}, "pack": {"seq_len": 64}, "validate": {"on_invalid": "skip"}})
    for name, records in (("all", lines), ("kept", kept)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    with_bad = build([str(tmp_path / "all.jsonl")], tmp_path / "a", cfg)
    without = build([str(tmp_path / "kept.jsonl")], tmp_path / "b", cfg)
    assert with_bad["counts"]["rejected"] == {"control_token_in_content": 3}
    check_accounting(with_bad["counts"])
    keys = ("documents", "chat_documents", "documents_written", "tokens", "supervised_tokens", "rows", "empty_documents")
    assert {k: with_bad["counts"][k] for k in keys} == {k: without["counts"][k] for k in keys}
    assert with_bad["counts"]["accounting"]["weight"]["accepted"] == without["counts"]["accounting"]["weight"]["accepted"]
    def written(out):  # every file but the rejects, the manifest (it names the input, counts rejects) and state.json
        skip = ("rejects.jsonl", MANIFEST_NAME, "state.json")  # (datasets' fingerprint there is the manifest's hash)
        return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name not in skip}

    assert any(name.endswith(".arrow") for name in written(tmp_path / "b"))
    assert written(tmp_path / "a") == written(tmp_path / "b")


def _render_batches(monkeypatch) -> list[int]:
    """The sizes of the batches ``render_chats`` hands ``tokens_batch`` from now on (a list it fills)."""
    from weightprep.stages import chat as chat_stage

    calls: list[int] = []
    batch = chat_stage.ChatRenderer.tokens_batch

    def counted(self, chats, where=None):
        calls.append(len(chats))
        return batch(self, chats, where)

    monkeypatch.setattr(chat_stage.ChatRenderer, "tokens_batch", counted)
    return calls


@pytest.mark.parametrize("render_bytes", [1, 150, "two and a byte", "two exactly", 1 << 30])
def test_conversations_rendered_in_batches_write_the_same_files(tmp_path, monkeypatch, render_bytes):
    """``render_chats`` renders a block's conversations in batches of about ``RENDER_BYTES`` of input: one at a
    time, a few, or the whole block at once write the same shards, turns and rejects (their lines included)."""
    from weightprep.stages import chat as chat_stage

    tok_dir = _save(chat_tokenizer("chatml"), tmp_path / "tok")
    good = [{"messages": [{"role": "user", "content": f"Hi {i}"}, {"role": "assistant", "content": "Yo " * i, "weight": i % 3}]}
            for i in range(1, 9)]  # fmt: skip
    bad = {"messages": [{"role": "user", "content": "<|im_start|>x"}, {"role": "assistant", "content": "y"}]}
    lines = [good[0], {"pieces": [{"text": "some text", "weight": 1}]}, *good[1:4], bad, *good[4:7], bad, good[7]]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    cfg = config_from_dict({"tokenizer": {"name": str(tok_dir)}, "pack": {"seq_len": 256}, "validate": {"on_invalid": "skip"}})
    build([str(tmp_path / "in.jsonl")], tmp_path / "whole", cfg)
    calls = _render_batches(monkeypatch)
    two = len(json.dumps(good[0])) + len(json.dumps(good[1]))
    expected_first = {"two and a byte": 3, "two exactly": 2}.get(render_bytes)  # type: ignore[call-overload]
    if render_bytes == "two and a byte":  # one byte short after two conversations: a third joins them
        render_bytes = two + 1
    elif render_bytes == "two exactly":  # full after two conversations
        render_bytes = two
    monkeypatch.setattr(chat_stage, "RENDER_BYTES", render_bytes)
    build([str(tmp_path / "in.jsonl")], tmp_path / "batched", cfg)
    assert sum(calls) == 10
    if expected_first is None:
        assert len(calls) == {1: 10, 150: 5, 1 << 30: 1}[render_bytes]
    else:
        assert calls[0] == expected_first
    files = sorted(p.name for p in (tmp_path / "whole").iterdir() if p.name != MANIFEST_NAME and p.name != "state.json")
    assert "rejects.jsonl" in files and "chat_turns.jsonl" in files
    assert all((tmp_path / "whole" / f).read_bytes() == (tmp_path / "batched" / f).read_bytes() for f in files)


def test_conversations_without_their_line_count_a_byte_each_in_a_render_batch(monkeypatch):
    """A conversation made without its input line (``raw`` empty) counts as one byte of a batch: with
    ``RENDER_BYTES`` 2, batches of two; the results stay with their conversations."""
    from weightprep.batches import Block, Records
    from weightprep.stages import chat as chat_stage
    from weightprep.stages.columns import parse_columns
    from weightprep.stages.validate import parse_block

    messages = [[{"role": "user", "content": f"Q{i}"}, {"role": "assistant", "content": "A" * (i + 1)}] for i in range(5)]
    data = "".join(json.dumps({"messages": m}) + "\n" for m in messages).encode()
    parsed = parse_block(Block("x.jsonl", 1, 5, data), [], parse_columns(None))
    records = Records(parsed.path, parsed.lines, parsed.texts, parsed.piece_weights, parsed.piece_offsets,
                      [c._replace(raw=b"") for c in parsed.chats])  # fmt: skip
    renderer = ChatRenderer(chat_tokenizer("chatml"))
    calls = _render_batches(monkeypatch)
    monkeypatch.setattr(chat_stage, "RENDER_BYTES", 2)
    out = chat_stage.render_chats(records, renderer, [])
    assert calls == [2, 2, 1]
    alone = [ChatRenderer(chat_tokenizer("chatml")).tokens(chat_record(m)) for m in messages]
    assert [c.ids.tolist() for c in out.chats] == [a.ids.tolist() for a in alone]


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_conversation_rendered_as_nothing_is_an_empty_document_counted_and_dropped(tmp_path, where):
    """A template may render a conversation as no text at all (here: only assistant contents, and an empty one). Its
    document has no token: counted as empty and not written, and no other document's first token is taken for its
    own (the build failed its accounting, or indexed past the end, when the empty document came before another or
    last)."""
    only_answers = "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] }}{% endif %}{% endfor %}"
    tok_dir = _save(chat_tokenizer("chatml", only_answers), tmp_path / "tok")  # (the cached tokenizers are read-only)
    empty = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}]}
    others = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo there", "weight": 2}]},
              {"pieces": [{"text": "some text", "weight": 1}]},
              {"messages": [{"role": "user", "content": "And?"}, {"role": "assistant", "content": "More."}]}]  # fmt: skip
    at = {"first": 0, "middle": 1, "last": 2}[where]
    lines = [*others[:at], empty, *others[at:]]
    cfg = config_from_dict({"tokenizer": {"name": str(tok_dir)}, "pack": {"seq_len": 64}})
    (tmp_path / "with.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (tmp_path / "without.jsonl").write_text("".join(json.dumps(r) + "\n" for r in others))
    c = build([str(tmp_path / "with.jsonl")], tmp_path / "a", cfg)["counts"]
    check_accounting(c)
    assert (c["documents"], c["chat_documents"], c["empty_documents"], c["documents_written"]) == (4, 3, 1, 3)
    reference = build([str(tmp_path / "without.jsonl")], tmp_path / "b", cfg)["counts"]
    assert (c["tokens"], c["supervised_tokens"]) == (reference["tokens"], reference["supervised_tokens"])
    assert c["accounting"]["weight"]["written"] == reference["accounting"]["weight"]["written"]
    shards = sorted(p.name for p in (tmp_path / "b").glob("*.arrow"))
    assert shards and all((tmp_path / "a" / s).read_bytes() == (tmp_path / "b" / s).read_bytes() for s in shards)


@settings(max_examples=100, deadline=None)
@given(picks=st.lists(st.tuples(st.sampled_from([0, 1, None]), st.integers(0, 12), st.integers(0, 5)), min_size=1, max_size=8))
def test_a_blocks_conversations_join_in_order_and_stay_views_where_they_lie_end_to_end(picks):
    """``blocks._joined``: the ids, weights and turns of a block's rendered conversations are theirs end to end, in
    order, whether a conversation's arrays are a slice of a batch's (``ChatTokens.batch``, as ``tokens_batch``
    gives them), follow the slice before it in the same batch, or are its own (a per-turn conversation's joined
    documents); where all lie end to end in one batch, no copy is made."""
    from weightprep.batches import ChatTokens, TokenBatch
    from weightprep.blocks import _joined

    batches = [
        TokenBatch(np.arange(k * 100, k * 100 + 20, dtype=np.int32), np.arange(20, dtype=np.float32) + k / 2,
                   np.arange(20, dtype=np.int32) + 50 * k)
        for k in range(2)
    ]  # fmt: skip
    source = Chat([], None, None, b"")
    rendered = []
    for which, start, length in picks:
        if which is None:  # arrays of its own
            own = np.arange(length, dtype=np.int32) + 1000
            rendered.append(ChatTokens(own, own.astype(np.float32) * 3, source, own + 7))
        else:
            b = batches[which]
            x, y = start, min(start + length, 20)
            rendered.append(ChatTokens(b.ids[x:y], b.weights[x:y], source, b.turns[x:y], batch=b, start=x))
    ids, weights, turns = _joined(rendered)
    assert ids.tolist() == [i for c in rendered for i in c.ids.tolist()]
    assert weights.tolist() == [w for c in rendered for w in c.weights.tolist()]
    assert turns.tolist() == [t for c in rendered for t in c.turns.tolist()]
    # one batch's conversations end to end: its arrays' slices, no copy
    lengths = [3, 0, 5, 2]
    cuts = np.cumsum([0, *lengths]).tolist()
    b = batches[0]
    chained = [ChatTokens(b.ids[x:y], b.weights[x:y], source, b.turns[x:y], batch=b, start=x) for x, y in zip(cuts[:-1], cuts[1:], strict=True)]
    ids, weights, turns = _joined(chained)
    assert ids.tolist() == b.ids[: cuts[-1]].tolist()
    assert all(np.shares_memory(got, whole) for got, whole in zip((ids, weights, turns), b, strict=True))


def test_a_rendered_blocks_documents_are_views_of_its_batch():
    """``tokens_batch`` gives each conversation slices of its batch's arrays, end to end (``ChatTokens.batch``), so a
    block's documents (``blocks._chat_documents``) are those arrays, not a copy of them."""
    from weightprep.blocks import _joined

    renderer = ChatRenderer(chat_tokenizer("chatml"))
    conversations = [[{"role": "user", "content": f"q{k}"}, {"role": "assistant", "content": "a" * k}] for k in range(4)]
    out = renderer.tokens_batch([chat_record(m) for m in conversations])
    assert all(c.batch is out[0].batch for c in out)
    assert [c.start for c in out] == np.cumsum([0, *(len(c.ids) for c in out[:-1])]).tolist()
    ids, _, _ = _joined(out)
    assert np.shares_memory(ids, out[0].batch.ids) and ids.tolist() == [i for c in out for i in c.ids.tolist()]


@pytest.mark.parametrize("text", ["plain", "caf\u00e9 \u6771\u4eac"])
def test_conversations_whose_ids_do_not_spell_them_leave_the_others_of_their_run_as_they_are_alone(text):
    """A document whose tokens do not spell its text (an added token that strips the whitespace after it has no
    fixed bytes: ``TokenSpans`` gives it no spans) is aligned from tokenizers' offsets; the others of its run are
    aligned together without it, their spans moved back over its characters (``_token_spans``). Each conversation of
    a batch that mixes both, ASCII or not, gets what it gets alone, and the ids and weights that tokenizers' own
    ids and offsets give (``reference_token_weights``)."""
    from chat_support import reference_char_weights, reference_token_weights
    from tokenizers import AddedToken

    tok = chat_tokenizer("chatml")
    tok.add_tokens([AddedToken("<sep>", rstrip=True)])
    renderer = ChatRenderer(tok)
    conversations = [
        [{"role": "user", "content": f"{text} {k}" + (" <sep>   x" if k % 3 == 1 else "")},
         {"role": "assistant", "content": f"{text} answer {k}", "weight": 1.0 + k}]
        for k in range(7)
    ]  # fmt: skip
    batch = renderer.tokens_batch([chat_record(m) for m in conversations])
    for messages, got in zip(conversations, batch, strict=True):
        alone = ChatRenderer(tok).tokens(chat_record(messages))
        assert (got.ids.tolist(), got.weights.tolist(), got.turns.tolist()) == (
            alone.ids.tolist(), alone.weights.tolist(), alone.turns.tolist()
        )
        rendered = renderer.char_weights(chat_record(messages))[0]
        enc = tok.backend_tokenizer.encode(rendered, add_special_tokens=False)
        weights = {"assistant": 1.0}
        char_w = reference_char_weights(FAMILIES["chatml"], rendered, messages, weights)
        assert got.ids.tolist() == enc.ids
        assert got.weights.tolist() == reference_token_weights(enc, char_w)[0].tolist()
    spans = renderer._spans
    texts = [renderer.char_weights(chat_record(m))[0] for m in conversations]
    ids, offsets = renderer.tokenize.documents(texts, lambda i: ("x", i, "m"))
    assert [found is None for found in spans.spans(texts, ids, offsets)] == [k % 3 == 1 for k in range(7)]
