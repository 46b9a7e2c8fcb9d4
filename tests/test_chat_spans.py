"""Where an assistant turn's weight starts when the generation prompt is not how the template renders the answer
(``weightprep/stages/chat_spans.py``), against the token-level reference of ``chat_coverage_support.answer_start``
(renders compared by token ids, as LLaMA-Factory v1 compares them), over templates whose prompt prefills what the
answer is rendered without, and answers whose content opens with the prefilled marker."""

from __future__ import annotations

import functools
import re

import numpy as np
from chat_coverage_support import reference
from chat_support import build_chat_tokenizer, chat_record
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weightprep.stages.chat import ChatError, ChatRenderer
from weightprep.stages.chat_spans import answer_start, common_prefix, plain_answer, trailer

SPECIALS = ("<|user|>", "<|assistant|>", "<|end|>")
PLAIN = ("<think>", "</think>")
#: (what the generation prompt prefills, what the template writes before an answer)
PREFILLS = [("<think>", "</think>"), ("<think>\n", ""), ("<think>\n\n</think>\n\n", ""), (":", "\n"), ("", ""),
            ("<think>", "<think>"), ("\n", "")]  # fmt: skip


@functools.cache
def _tok(prefill: str, rendered: str):
    template = (
        "{% for m in messages %}<|{{ m.role }}|>{% if m.role == 'assistant' %}" + rendered + "{% endif %}"
        "{{ m.content }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>" + prefill + "{% endif %}"
    )
    return build_chat_tokenizer(SPECIALS, None, "<|end|>", template, plain=PLAIN)


_CONTENT = st.one_of(
    st.text(st.sampled_from("ab \n"), max_size=6),
    st.builds(lambda head, rest: head + rest, st.sampled_from(["<think>", "<think>\n", "</think>", "\n"]),
              st.text(st.sampled_from("xy \n"), min_size=1, max_size=6)),
)  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(template=st.sampled_from(PREFILLS), answers=st.lists(_CONTENT, min_size=1, max_size=2), data=st.data())
def test_the_weights_start_where_the_renders_part(template, answers, data):
    """Ids equal ``apply_chat_template``'s; the weights equal the token-level reference (where a token crosses the
    reference's change of weight, the larger weight of its characters, in both)."""
    tok = _tok(*template)
    messages = []
    for k, answer in enumerate(answers):
        messages += [{"role": "user", "content": f"q{k}"}, {"role": "assistant", "content": answer}]
    record = {"messages": messages}
    ref = reference(tok, record, tok.chat_template)
    assert ref.error is None and ref.whole is not None
    try:
        out = ChatRenderer(tok, history=data.draw(st.sampled_from(["auto", "full"]))).tokens(chat_record(messages))
    except ChatError as exc:
        assert ref.whole.weights is None, exc
        return
    assert out.ids.tolist() == ref.whole.ids
    if ref.whole.weights is None:
        return
    got = out.weights.copy()
    got[0] = 0  # the build leaves a document's first token unlabeled, as the reference does
    np.testing.assert_array_equal(got, ref.whole.weights)


def test_a_prefilled_think_that_the_answer_renders_as_close_weights_the_close():
    """GLM-4.7's shape: the prompt ends ``<think>``, the answer renders ``</think>...``: the weight starts at
    ``</think>`` (the first token that differs), not inside it where the two strings first differ."""
    tok = _tok("<think>", "</think>")
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    out = ChatRenderer(tok).tokens(chat_record(messages))
    assert tok.decode(out.ids[out.weights > 0]) == "</think>a<|end|>"


def test_answer_start_rules_on_strings():
    """Rule 1 (the prompt is a prefix), rule 2 (renders part within the prompt's own text, or before it: the
    prompt's end found again), rule 3 (a marker the content opens with), and refusals (a render that ends with
    the prompt's prefill; no comparison without ``first_difference``)."""
    markers = re.compile(r"<think>|</think>|<\|assistant\|>")
    first = common_prefix  # character-level stand-in: these strings have no token inside a difference
    assert answer_start("U", "UA", "UAx!", "x", markers) == 2
    assert answer_start("U", "UA<think>\n", "UA<think>\nr</think>x!", "<think>\nr</think>x", markers) == 2
    assert answer_start("U", "UA<think>\n", "UAx!", "x", markers) is None  # rule 2 needs first_difference
    assert answer_start("U", "UA<think>\n", "UAx!", "x", markers, first) == 2
    assert answer_start("U.", "U.A", "U.\nAx!", "x", markers, first) == 2  # parts within the prompt's own text
    assert answer_start("U.!", "U.!A", "U.\nAx?", "x", markers, first) == 4  # before it: after the prompt's end
    assert answer_start("U", "UAT", "UAxUAT", "x", markers, first) is None  # the render ends with the prefill
    assert common_prefix("abc", "abd") == 2 and common_prefix("ab", "abc") == 2 and common_prefix("", "a") == 0


def test_plain_answer_is_an_answer_whose_head_holds_no_marker():
    """Rule 3's gate (``plain_answer``): an answer whose content is no string (None for a tool call, content parts)
    or is empty keeps its start; so does one whose first characters (before ``start``, before its last
    character) hold no added token; one that opens with a marker does not."""
    markers = re.compile(r"<think>|</think>")
    parts = [{"type": "text", "text": "<think>x"}, {"type": "text", "text": "y"}]
    for content in (None, parts, ""):
        assert plain_answer(content, 10, markers) is True
    assert plain_answer("<think>\nr</think>x", 10, markers) is False
    assert plain_answer("plain <think> later", 6, markers) is True  # the marker starts past the head
    assert plain_answer("plain <think> later", 13, markers) is False
    assert plain_answer("<think>", 10, markers) is True  # the head stops before the last character
    assert plain_answer("<think>x", 0, markers) is True  # nothing before the start to hold one


def test_trailer_is_the_text_every_render_ends_with_and_the_next_drops():
    """``trailer``: the first candidate end of ``P_1`` that ``P_2``, ``P_3`` end with, and the prompt too or the
    prompt follows, each render less it a prefix of the next; none where every render keeps the one before or the
    prompt neither ends with it nor follows it (Phi-3's EOS after the last message only)."""
    t = "<|a|><|think|>"
    renders = ["<|u|>q<|e|>" + t, "<|u|>q<|e|><|a|>x<|e|>" + t, "<|u|>q<|e|><|a|>x<|e|><|u|>r<|e|>" + t]
    cuts = [len("<|u|>q<|e|>"), len("<|u|>q<|e|><|a|>")]
    assert trailer(renders, renders[0], cuts) == t
    assert trailer(renders, renders[0], cuts[1:]) == ""  # <|think|> alone: P_1 less it is no prefix of P_2
    assert trailer(renders, renders[0] + "<|a|>", cuts) == t  # the prompt follows it (Command R+ tool_use)
    assert trailer(renders, "<|u|>q<|e|><|a|>", cuts) == ""  # the prompt neither ends with it nor follows it
    kept = ["<|u|>q<|e|>\n", "<|u|>q<|e|>\n<|a|>x<|e|>\n"]
    assert trailer(kept, kept[0] + "<|a|>\n", [len("<|u|>q<|e|>")]) == ""  # P_2 keeps P_1 (ChatML's \n): none
    header = ["<|u|>q<|e|><|a|>", "<|u|>q<|e|><|a|>x<|e|><|a|>", "<|u|>q<|e|><|a|>x<|e|><|u|>r<|e|><|a|>"]
    assert trailer(header, header[0], [len("<|u|>q<|e|>")]) == "<|a|>"  # dropped once a user follows an answer
    phi3 = ["<|u|>q<|e|></s>", "<|u|>q<|e|><|a|>x<|e|></s>"]
    assert trailer(phi3, "<|u|>q<|e|><|a|>", [len("<|u|>q<|e|>")]) == ""


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(opener=st.sampled_from(["<|assistant|>", "<|assistant|><think></think>", "<|assistant|>\n"]),
       answers=st.lists(_CONTENT, min_size=1, max_size=2))  # fmt: skip
def test_a_trailer_after_every_render_has_weight_0_and_each_turn_ends_before_it(opener, answers):
    """A template that writes its generation prompt after every render, ``add_generation_prompt`` or not (Command
    R7B tool_use): ids equal ``apply_chat_template``'s, weights the reference's, which reads the trailer from the
    template's source (``chat_coverage_support.trailer_text``), not from renders."""
    template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}" + opener
    tok = _trailing_tok(template)
    messages = []
    for k, answer in enumerate(answers):
        messages += [{"role": "user", "content": f"q{k}"}, {"role": "assistant", "content": answer}]
    ref = reference(tok, {"messages": messages}, tok.chat_template)
    assert ref.error is None and ref.whole is not None and ref.whole.weights is not None
    out = ChatRenderer(tok, history="auto").tokens(chat_record(messages))
    assert out.ids.tolist() == ref.whole.ids == tok.apply_chat_template(messages)["input_ids"]
    assert np.array_equal(out.weights, ref.whole.weights) and not out.weights[-1]


@functools.cache
def _trailing_tok(template: str):
    return build_chat_tokenizer(SPECIALS, None, "<|end|>", template, plain=PLAIN)
