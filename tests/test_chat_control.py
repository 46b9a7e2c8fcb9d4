"""Control tokens in chat contents: a turn's own markers (``<tool_call>``, ``<think>``) are tokens there, as
``apply_chat_template`` makes them, and carry their message's weight; the tokens that open or close a turn are
refused (``control_token_in_content``) or, with ``--sanitize-control-tokens``, encoded as text exactly as
``apply_chat_template(..., sanitize_control_tokens=True)`` encodes them.

The tokenizers carry each family's real added tokens, special or not as the model's own tokenizer has them. The
weight references share nothing with ``weightprep.stages.chat``: test_chat's per-character search, or the ids of
``apply_chat_template`` itself (a turn's tokens lie between its prompt's ids and its end's)."""

from __future__ import annotations

import copy
import functools
import json
from unittest import mock

import numpy as np
import pytest
from chat_support import (
    FAMILIES,
    MISTRAL_V1,
    TEMPLATES,
    chat_record,
    plain_messages,
    reference_char_weights,
    reference_token_weights,
)
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizer_factory import _byte_level_bpe, _sentencepiece

from weightprep.config import config_from_dict
from weightprep.stages.chat import ChatError, ChatRenderer
from weightprep.stages.chat_control import turn_structure

ROLE_WEIGHTS = {"assistant": 1.0}

QWEN_SPECIALS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>",
)  # fmt: skip
QWEN2_5_PLAIN = ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                 "<|repo_name|>", "<|file_sep|>")  # fmt: skip
QWEN3_PLAIN = (*QWEN2_5_PLAIN, "<tool_response>", "</tool_response>", "<think>", "</think>")
R1_TOOLS = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
            "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>",
            "<｜tool▁sep｜>")  # fmt: skip
LLAMA3 = ("<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|finetune_right_pad_id|>",
          "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>")  # fmt: skip

#: A family's tokenizer: its template, special and plain added tokens (as the model's tokenizer marks them), BOS,
#: EOS, pad, and the in-turn markers the rule must find (every other control token is turn structure).
FAMILY = {
    "qwen2_5": ("qwen2_5", QWEN_SPECIALS, QWEN2_5_PLAIN, None, "<|im_end|>", "<|endoftext|>",
                {"<tool_call>", "</tool_call>"}),
    "qwen3": ("qwen3", QWEN_SPECIALS, QWEN3_PLAIN, None, "<|im_end|>", "<|endoftext|>",
              {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}),
    # a template that injects a system turn where there is none (its reasoning-effort preamble): that turn is not the
    # user's header, so the generation prompt's <think> is in the turn, as in Qwen3's
    "qwen3_8": ("qwen3_8", QWEN_SPECIALS, QWEN3_PLAIN, None, "<|im_end|>", "<|endoftext|>",
                {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
                 "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"}),
    "nemotron_3_nano": ("nemotron_3_nano", ("<s>", "</s>", "<|im_start|>", "<|im_end|>"),
                        ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
                        "<s>", "<|im_end|>", None,
                        {"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"}),
    # Qwen3's tokens under Qwen2.5's template: <think> is no control token there (the template never writes it)
    "qwen3_on_qwen2_5": ("qwen2_5", QWEN_SPECIALS, QWEN3_PLAIN, None, "<|im_end|>", "<|endoftext|>",
                         {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"}),
    "llama3": ("llama3", LLAMA3, (), "<|begin_of_text|>", "<|eot_id|>", None, set()),
    "llama3_1": ("llama3_1", LLAMA3, (), "<|begin_of_text|>", "<|eot_id|>", None, {"<|eom_id|>", "<|python_tag|>"}),
    "gemma": ("gemma", ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"), (), "<bos>",
              "<eos>", "<pad>", set()),
    # the generation prompt prefills <think>: in the turn, not its header (<｜Assistant｜>, as long as <｜User｜>)
    "deepseek_r1_distill": ("deepseek_r1_distill", ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"),
                            ("<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", *R1_TOOLS), "<｜begin▁of▁sentence｜>",
                            "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", {"<think>", "</think>", *R1_TOOLS}),
    "gptoss": ("gptoss", ("<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>",
                          "<|end|>", "<|message|>", "<|call|>"), (), "<|startoftext|>", "<|return|>", "<|endoftext|>",
               {"<|channel|>", "<|call|>"}),  # <|constrain|>: special, and this template never writes it
    # a role header of two tokens: <|CHATBOT_TOKEN|> is the assistant's header, not a marker in its turn
    "cohere": ("cohere", ("<BOS_TOKEN>", "<EOS_TOKEN>", "<PAD>", "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>",
                          "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>", "<|SYSTEM_TOKEN|>"), (), "<BOS_TOKEN>", "<EOS_TOKEN>",
               "<PAD>", set()),
    # <|END_RESPONSE|> is not EOS, and the template writes it after the answer only: turn structure all the same
    "cohere2": ("cohere2", ("<BOS_TOKEN>", "<EOS_TOKEN>", "<PAD>", "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>",
                            "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>", "<|SYSTEM_TOKEN|>", "<|START_RESPONSE|>",
                            "<|END_RESPONSE|>", "<|START_THINKING|>", "<|END_THINKING|>"), (), "<BOS_TOKEN>",
                "<|END_OF_TURN_TOKEN|>", "<PAD>", {"<|START_RESPONSE|>"}),
    # contents must be lists of parts: no probe renders, so every control token stays refused (<image> too)
    "smolvlm": ("smolvlm", ("<|im_start|>", "<end_of_utterance>", "<|endoftext|>"), ("<image>",), "<|im_start|>",
                "<end_of_utterance>", "<|endoftext|>", set()),
    "mistral_v1": (None, ("<s>", "</s>", "<unk>", "[INST]", "[/INST]"), (), "<s>", "</s>", None, set()),
}  # fmt: skip


@functools.lru_cache
def family_tokenizer(name: str, model: str = "byte_level") -> object:
    """Family ``name``'s tokenizer (``FAMILY``) on byte-level BPE or the legacy SentencePiece conversion."""
    from transformers import PreTrainedTokenizerFast

    template, specials, plain, bos, eos, pad, _ = FAMILY[name]
    if model == "byte_level":
        backend = _byte_level_bpe(list(specials), 500)
    else:
        backend = _sentencepiece(list(specials), 500, "legacy")
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=bos, eos_token=eos, pad_token=pad, model_max_length=8192,
        clean_up_tokenization_spaces=False,
    )  # fmt: skip
    tok.add_special_tokens({"additional_special_tokens": [t for t in specials if t not in (bos, eos, pad)]})
    tok.add_tokens(list(plain))
    tok.chat_template = MISTRAL_V1 if template is None else (TEMPLATES / f"{template}.jinja").read_text("utf-8")
    return tok




def _ids(tok, messages, **kw) -> list[int]:
    return tok.apply_chat_template(plain_messages(messages), tokenize=True, **kw)["input_ids"]


def _common(a: list[int], b: list[int]) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def prefix_reference(tok, messages, **kw) -> np.ndarray:
    """Token weights from ``apply_chat_template``'s ids alone: a weighted assistant turn holds the tokens after the
    ids of the messages before it with the generation prompt, up to the ids of the messages up to it. Where those
    ids are not prefixes of the whole, a token joins the prompt and the answer (or the answer and what follows): the
    first token where they part holds characters of the answer, and carries its weight."""
    full = _ids(tok, messages, **kw)
    weights = np.zeros(len(full), dtype=np.float32)
    for i, m in enumerate(messages):
        w = m.get("weight", ROLE_WEIGHTS.get(m["role"], 0.0))
        if w:
            start, end = _ids(tok, messages[:i], add_generation_prompt=True, **kw), _ids(tok, messages[: i + 1], **kw)
            a = _common(start, full)
            b = len(end) if full[: len(end)] == end else _common(end, full) + 1
            weights[a:b] = np.maximum(weights[a:b], w)
    return weights


@pytest.mark.parametrize("name", list(FAMILY))
def test_control_tokens_split_into_turn_structure_and_in_turn_markers_from_the_template(name):
    """The rule on real templates: transformers' control tokens, those the template writes inside a turn allowed."""
    tok = family_tokenizer(name)
    turn, in_turn = ChatRenderer(tok).control_tokens()
    assert set(in_turn) == FAMILY[name][-1]
    assert set(turn) | set(in_turn) == set(tok._get_control_tokens(tok.chat_template))
    assert not set(turn) & set(in_turn)
    assert {tok.bos_token, tok.eos_token, tok.pad_token} - {None} <= set(turn)


@pytest.mark.parametrize("name", list(FAMILY))
def test_the_control_tokens_of_a_tokenizer_without_transformers_method_are_the_same(name):
    """Where the tokenizer lacks ``_get_control_tokens`` (transformers < 5), the same rule gives the same tokens."""
    from weightprep.stages.chat_control import control_token_list as _control_token_list

    tok = copy.deepcopy(family_tokenizer(name))
    tok.add_tokens(["\n\n", "  "])  # whitespace added tokens the template writes are no control tokens

    class Older:  # only what a tokenizer of transformers 4 has
        added_tokens_decoder = tok.added_tokens_decoder

    expected = tuple(dict.fromkeys(tok._get_control_tokens(tok.chat_template)))
    assert _control_token_list(tok, tok.chat_template) == expected
    assert set(_control_token_list(Older(), tok.chat_template)) == set(expected)


def test_the_control_token_pattern_tries_a_token_before_the_tokens_it_contains():
    from weightprep.stages.chat_control import token_pattern as _token_pattern

    pattern = _token_pattern(("<a>", "<a>b", "<x>"))
    assert pattern.findall("1<a>b2<a>3<x>") == ["<a>b", "<a>", "<x>"]
    assert _token_pattern(()).search("<a> anything") is None  # no control tokens: it never matches


_WORDS = ["Hello", "world", " spaced ", "\nnew line", "東京は", "😀🚀", "x", "0.5", "the end.", '{"name": "get_weather"}']
_TOOL_MARKERS = ["<tool_call>", "</tool_call>", "\n<tool_call>\n", "\n</tool_call>"]


def _content(markers: list[str]):
    """Text with ``markers`` at random places (and, now and then, next to each other or at either end)."""
    return st.lists(st.sampled_from(_WORDS + markers), min_size=0, max_size=7).map("".join)


@st.composite
def hermes_conversations(draw):
    """Glaive / Hermes-style tool calling for Qwen2.5: tool-call markup in assistant contents, and in the system
    prompt and user messages (tool results as Hermes data sends them) too."""
    messages = []
    if draw(st.booleans()):
        system = "Call tools within <tool_call></tool_call> tags:" + draw(_content(_TOOL_MARKERS))
        messages.append({"role": "system", "content": system})
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(_content(_TOOL_MARKERS))})
        answer = {"role": "assistant", "content": draw(_content(_TOOL_MARKERS))}
        if (w := draw(st.one_of(st.none(), st.sampled_from([0.0, 0.5, 2.5])))) is not None:
            answer["weight"] = w
        messages.append(answer)
    return messages


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=hermes_conversations())
def test_tool_call_markup_in_contents_is_tokenized_as_the_template_does(messages):
    """Qwen2.5 Hermes-style data builds: ids equal apply_chat_template (<tool_call> as its added token), weights
    equal test_chat's per-character reference (the markers carry their message's weight)."""
    tok = family_tokenizer("qwen2_5")
    text = tok.apply_chat_template(plain_messages(messages), tokenize=False)
    enc = tok.backend_tokenizer.encode(text, add_special_tokens=False)
    char_w = reference_char_weights(FAMILIES["chatml"], text, messages, ROLE_WEIGHTS)
    # content starting with a newline right after the header's: one BPE token across the change, with the larger
    ref_w, _ = reference_token_weights(enc, char_w)
    renderer = ChatRenderer(tok, role_weights=ROLE_WEIGHTS)
    out = renderer.tokens(chat_record(messages))
    assert out.ids.tolist() == _ids(tok, messages)
    np.testing.assert_array_equal(out.weights, ref_w)


def test_a_worked_hermes_tool_call_puts_its_markers_as_tokens_with_the_answer_weight():
    tok = family_tokenizer("qwen2_5")
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    messages = [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": call, "weight": 2.0}]
    out = ChatRenderer(tok).tokens(chat_record(messages))
    assert out.ids.tolist() == _ids(tok, messages)
    marker_ids = [tok.convert_tokens_to_ids(t) for t in ("<tool_call>", "</tool_call>")]
    for marker in marker_ids:
        assert out.ids.tolist().count(marker) == 1 and out.weights[out.ids.tolist().index(marker)] == 2.0


@settings(max_examples=40, deadline=None)
@given(
    reasoning=_content(["<tool_call>", "</tool_call>"]).filter(lambda s: "</think>" not in s),
    answer=_content(["<tool_call>", "</tool_call>"]),
    weight=st.sampled_from([0.5, 1.0, 3.0]),
)
def test_think_markers_in_a_qwen3_answer_are_tokens_with_its_weight(reasoning, answer, weight):
    """One Qwen3 turn whose content holds its reasoning in <think>...</think>: ids equal apply_chat_template (which
    re-renders the block), the whole turn after the generation prompt weighted (found by string search)."""
    tok = family_tokenizer("qwen3")
    content = f"<think>\n{reasoning}\n</think>\n\n{answer}"
    messages = [{"role": "user", "content": "Why?"}, {"role": "assistant", "content": content, "weight": weight}]
    text = tok.apply_chat_template(plain_messages(messages), tokenize=False)
    char_w = np.zeros(len(text), dtype=np.float32)
    char_w[text.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n") :] = weight
    enc = tok.backend_tokenizer.encode(text, add_special_tokens=False)
    ref_w, straddle = reference_token_weights(enc, char_w)
    assert not straddle  # <think> is an added token right after the header
    out = ChatRenderer(tok).tokens(chat_record(messages))
    assert out.ids.tolist() == _ids(tok, messages)
    np.testing.assert_array_equal(out.weights, ref_w)
    assert out.weights[out.ids.tolist().index(tok.convert_tokens_to_ids("<think>"))] == weight


def test_tool_results_and_r1_reasoning_markers_are_tokens_in_any_message():
    """Hermes tool results (a tool message or a user message holding <tool_response>) with Qwen3's tokens, and a
    DeepSeek-R1 answer holding its reasoning under the TRL training template: ids equal apply_chat_template, weights
    equal the reference from its ids."""
    tok = family_tokenizer("qwen3_on_qwen2_5")
    messages = [
        {"role": "system", "content": "You may call tools. <tools>[]</tools> Answer in <tool_call></tool_call>."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": '<tool_call>\n{"name": "w", "arguments": {}}\n</tool_call>'},
        {"role": "tool", "content": '{"temp": 20}'},
        {"role": "assistant", "content": "20 degrees."},
        {"role": "user", "content": '<tool_response>\n{"temp": 21}\n</tool_response>'},
        {"role": "assistant", "content": "Now 21.", "weight": 0.5},
    ]
    out = ChatRenderer(tok).tokens(chat_record(messages))
    assert out.ids.tolist() == _ids(tok, messages)
    np.testing.assert_array_equal(out.weights, prefix_reference(tok, messages))
    assert tok.convert_tokens_to_ids("<tool_response>") in out.ids.tolist()
    r1 = family_tokenizer("deepseek_r1_distill")
    training = (TEMPLATES / "deepseek_r1_distill_training.jinja").read_text(encoding="utf-8")
    messages = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "<think>\nadd\n</think>\n\n2"}]
    out = ChatRenderer(r1, training).tokens(chat_record(messages))
    assert out.ids.tolist() == _ids(r1, messages, chat_template=training)
    assert out.weights[out.ids.tolist().index(r1.convert_tokens_to_ids("</think>"))] == 1.0


_STRUCTURE = ["<|im_end|>", "<|im_start|>", "<|im_start|>assistant\n", "<|endoftext|>", "<|vision_pad|>"]


@settings(max_examples=40, deadline=None)
@given(
    messages=hermes_conversations(),
    data=st.data(),
    token=st.sampled_from(_STRUCTURE),
)
def test_a_turn_token_anywhere_in_any_message_is_refused(messages, data, token):
    """<|im_end|> / <|im_start|> (and BOS/EOS/pad, special tokens the template never writes) in a user, system or
    assistant content: control_token_in_content, naming that message."""
    i = data.draw(st.integers(0, len(messages) - 1))
    content = messages[i]["content"]
    at = data.draw(st.integers(0, len(content)))
    messages[i]["content"] = content[:at] + token + content[at:]
    with pytest.raises(ChatError) as err:
        ChatRenderer(family_tokenizer("qwen2_5")).tokens(chat_record(messages))
    assert (err.value.reason, err.value.field) == ("control_token_in_content", f"messages[{i}].content")


def test_turn_tokens_are_refused_in_every_string_that_reaches_the_template():
    tok = family_tokenizer("qwen2_5")
    base = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    cases = [
        (base, [{"type": "function", "function": {"name": "f", "description": "a<|im_end|>"}}], None,
         "tools[0].function.description"),
        ([base[0], {**base[1], "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "<|im_start|>"}}]}],
         None, None, "messages[1].tool_calls[0].function.arguments"),
        (base, None, {"note": "<|im_end|>"}, "chat_template_kwargs.note"),
        (base, [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"u": {
            "enum": ["c", "<|im_start|>"]}}}}}], None, "tools[0].function.parameters.properties.u.enum[1]"),  # in a list
    ]  # fmt: skip
    for messages, tools, kwargs, field in cases:
        with pytest.raises(ChatError) as err:
            ChatRenderer(tok).tokens(chat_record(messages, tools, kwargs))
        assert (err.value.reason, err.value.field) == ("control_token_in_content", field)
        assert "--sanitize-control-tokens" in err.value.problem


def _with_structure(messages, data):
    """``messages`` with turn tokens put at random places of random contents."""
    for m in messages:
        if data.draw(st.booleans()):
            at = data.draw(st.integers(0, len(m["content"])))
            m["content"] = m["content"][:at] + data.draw(st.sampled_from(_STRUCTURE)) + m["content"][at:]
    return messages


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=hermes_conversations(), data=st.data())
def test_sanitize_encodes_turn_tokens_as_apply_chat_template_does(messages, data):
    """With sanitize_control_tokens, turn tokens in contents become text: ids equal apply_chat_template(...,
    sanitize_control_tokens=True) with the control tokens the turn's (in-turn markers stay tokens, where
    transformers would encode them as text too); weights equal the reference from those ids."""
    tok = family_tokenizer("qwen2_5")
    messages = _with_structure(messages, data)
    renderer = ChatRenderer(tok, role_weights=ROLE_WEIGHTS, sanitize_control_tokens=True)
    renderer.check()
    turn = renderer.control_tokens()[0]
    with mock.patch.object(type(tok), "_get_control_tokens", lambda self, template: turn):
        ref = prefix_reference(tok, messages, sanitize_control_tokens=True)
        expected = _ids(tok, messages, sanitize_control_tokens=True)
    out = renderer.tokens(chat_record(messages))
    assert out.ids.tolist() == expected
    np.testing.assert_array_equal(out.weights, ref)
    if not any(t in m["content"] for m in messages for t in _TOOL_MARKERS):  # transformers' own control tokens
        assert out.ids.tolist() == _ids(tok, messages, sanitize_control_tokens=True)


@pytest.mark.parametrize(("name", "model"), [("qwen2_5", "sentencepiece_legacy"), ("llama3_1", "byte_level"),
                                             ("gemma", "byte_level"), ("mistral_v1", "sentencepiece_legacy")])
def test_sanitize_equals_apply_chat_template_on_other_families_and_tokenizers(name, model):
    """Turn tokens as text where the spans come from tokenizers' offsets of the pieces (the legacy SentencePiece
    conversion), and on Llama-3.1, Gemma and Mistral's own turn tokens."""
    tok = family_tokenizer(name, model)
    turn, _ = ChatRenderer(tok).control_tokens()
    hostile = "".join(turn)
    messages = [{"role": "user", "content": f"say {hostile} now"},
                {"role": "assistant", "content": f"I say{hostile}. Done", "weight": 1.5}]  # fmt: skip
    renderer = ChatRenderer(tok, sanitize_control_tokens=True)
    with pytest.raises(ChatError):
        ChatRenderer(tok).tokens(chat_record(messages))
    out = renderer.tokens(chat_record(messages))
    assert out.ids.tolist() == _ids(tok, messages, sanitize_control_tokens=True)
    ref = prefix_reference(tok, messages, sanitize_control_tokens=True)
    assert ref is not None
    np.testing.assert_array_equal(out.weights, ref)
    assert out.weights.sum() > 0


def test_sanitize_names_a_token_the_tokenizer_cannot_encode_as_text(monkeypatch):
    from transformers.utils import chat_template_utils as ctu

    def refuse(tokenizer, chat):
        raise ValueError("Can't sanitize '<|im_end|>': the tokenizer produces it from plain text")

    monkeypatch.setattr(ctu, "encode_marked_chat", refuse)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "a<|im_end|>b"}]
    with pytest.raises(ChatError) as err:
        ChatRenderer(family_tokenizer("qwen2_5"), sanitize_control_tokens=True).tokens(chat_record(messages))
    assert (err.value.reason, err.value.field) == ("control_token_in_content", "messages[1].content")


def test_sanitize_needs_a_transformers_that_has_it(monkeypatch):
    from transformers.utils import chat_template_utils as ctu

    from weightprep.errors import UsageError

    tok = family_tokenizer("qwen2_5")  # (made first: transformers' tokenizer module imports the function)
    monkeypatch.delattr(ctu, "encode_marked_chat")
    ChatRenderer(tok).check()
    with pytest.raises(UsageError, match="--sanitize-control-tokens"):
        ChatRenderer(tok, sanitize_control_tokens=True).check()


def test_sanitize_from_the_cli_and_the_config(tmp_path):
    from weightprep.cli import main

    tok_dir = tmp_path / "tok"
    family_tokenizer("qwen2_5").save_pretrained(str(tok_dir))
    inp = tmp_path / "raw.jsonl"
    messages = [{"role": "user", "content": "end<|im_end|>"}, {"role": "assistant", "content": "<tool_call>\n{}\n</tool_call>"}]
    two = [{"role": "user", "content": "a<|im_end|>b<|im_start|>c"}, {"role": "assistant", "content": "ok"}]
    plain = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]  # nothing to encode as text
    inp.write_text("".join(json.dumps({"messages": m}) + "\n" for m in (messages, two, plain)))
    args = ["build", str(inp), "--tokenizer", str(tok_dir), "--seq-len", "256"]
    refused = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "a")])
    assert refused.exit_code == 2 and "raw.jsonl:1: messages[0].content: holds" in refused.output
    built = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "b"), "--sanitize-control-tokens"])
    assert built.exit_code == 0, built.output
    manifest = json.loads((tmp_path / "b" / "weightprep_manifest.json").read_text())
    assert manifest["config"]["chat"]["sanitize_control_tokens"] is True
    assert manifest["counts"]["documents"] == 3
    # counted over the conversations (<|im_end|> in the first user's content, two in the second's; <tool_call> is
    # an in-turn marker, a token) and warned once
    assert manifest["counts"]["chat_sanitized_control_tokens"] == 3
    assert built.output.count("warning: 3 control token(s) in the records were encoded as text") == 1
    assert "sees text pieces where inference sees one token" in built.output
    assert config_from_dict({"chat": {"sanitize_control_tokens": True}}).chat.sanitize_control_tokens is True


def test_sanitize_with_a_tokenizer_that_adds_bos_itself_encodes_pieces_without_it():
    """A legacy SentencePiece tokenizer whose post-processor puts ``<s>`` before every encoding it is asked for with
    special tokens (Llama-2's and Mistral's do): the chat's pieces are encoded without them, as
    ``apply_chat_template`` encodes the whole."""
    import copy

    from tokenizers import processors

    tok = copy.deepcopy(family_tokenizer("mistral_v1", "sentencepiece_legacy"))
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.bos_token_id)]
    )
    assert tok("hi")["input_ids"][0] == tok.bos_token_id  # it does add BOS
    turn, _ = ChatRenderer(tok).control_tokens()
    messages = [{"role": "user", "content": f"say {''.join(turn)} now"},
                {"role": "assistant", "content": f"I say{''.join(turn)}.\nDone", "weight": 1.5}]  # fmt: skip
    out = ChatRenderer(tok, sanitize_control_tokens=True).tokens(chat_record(messages))
    assert out.ids.tolist() == _ids(tok, messages, sanitize_control_tokens=True)
    np.testing.assert_array_equal(out.weights, prefix_reference(tok, messages, sanitize_control_tokens=True))


def _fake_template(header: dict[str, str], end: str | dict[str, str] = "<|e|>", first: str = "", refuse=lambda msgs: False):
    """A template as ``turn_structure`` calls it: each message its role's ``header``, its content, ``end`` (or its
    role's); the generation prompt the assistant's header; ``first`` before everything; ``refuse(messages)``: raises
    for those."""
    ends = end if isinstance(end, dict) else dict.fromkeys(header, end)

    def render(messages, k, generation, tools):
        if refuse(messages[:k]):
            raise ValueError("refused")
        text = first + "".join(header[m["role"]] + m["content"] + ends[m["role"]] for m in messages[:k])
        return text + (header["assistant"] if generation else "")

    return render


def test_an_assistant_header_counts_only_the_control_tokens_its_turn_starts_with():
    """The rule (module docstring): an assistant's header tokens are the first control tokens of its generation
    prompt, as many as the user's header has, and only those the turn starts with (BOS and such not counted): after
    text (``A`` below), a control token is an in-turn marker."""
    control = ("<s>", "<|u|>", "<|v|>", "<|a|>", "<|t|>", "<|e|>")
    two = {"system": "<|u|><|v|>", "user": "<|u|><|v|>", "assistant": "<s><|a|>A<|t|>"}  # a BOS, a token, text, one
    assert turn_structure(_fake_template(two), control, {"<s>"}) == {"<|u|>", "<|v|>", "<|a|>", "<|e|>"}
    one = {"system": "<|u|>", "user": "<|u|>", "assistant": "A<|a|>"}  # a single character before the token
    assert turn_structure(_fake_template(one), control, {"<s>"}) == {"<|u|>", "<|e|>"}


def test_a_prefix_the_template_refuses_ends_the_turn_before_it_after_that_turns_content():
    """A template that cannot render some prefix (Nemotron Nano v2 refuses a lone system message): the turn before
    the refused prefix ends after its content, so the shapes with a system turn are still read and its header
    (written nowhere else) is a turn token; the empty conversation refused too changes nothing."""
    control = ("<|s|>", "<|u|>", "<|a|>", "<|e|>", "<|m|>")
    header = {"system": "<|s|>", "user": "<|u|>", "assistant": "<|a|><|m|>"}  # <|m|>: prefilled after the header
    expected = {"<|s|>", "<|u|>", "<|a|>", "<|e|>"}
    assert turn_structure(_fake_template(header), control, set()) == expected
    lone_system = _fake_template(header, refuse=lambda msgs: bool(msgs) and all(m["role"] == "system" for m in msgs))
    assert turn_structure(lone_system, control, set()) == expected
    nothing = _fake_template(header, refuse=lambda msgs: not msgs or all(m["role"] == "system" for m in msgs))
    assert turn_structure(nothing, control, set()) == expected


def test_a_preamble_s_first_and_last_control_tokens_are_turn_tokens_and_a_text_header_counts_as_one():
    """What a template writes before the first message (a default system turn) is a turn of its own: its first
    control tokens (as many as the user's header) and its last (as many as the user's turn ends with) are turn
    tokens, found nowhere else here; and a user header written as text still lets the assistant's header have
    one control token (the count is at least one)."""
    control = ("<|d|>", "<|f|>", "<|u|>", "<|a|>", "<|e|>", "<|x|>")
    header = {"system": "<|u|>", "user": "<|u|>", "assistant": "<|a|>"}
    preamble = _fake_template(header, first="<|d|>default<|x|>prompt<|f|>")  # <|x|>: an in-turn marker
    assert turn_structure(preamble, control, set()) == {"<|d|>", "<|f|>", "<|u|>", "<|a|>", "<|e|>"}
    text_user = {"system": "S: ", "user": "U: ", "assistant": "<|a|>"}
    assert turn_structure(_fake_template(text_user), control, set()) == {"<|a|>", "<|e|>"}


def test_the_last_answer_s_end_counts_where_no_answer_is_followed_and_a_text_end_counts_as_one_token():
    """Where the shapes read hold no answer that another message follows (a template that refuses two answers),
    what follows the last answer is its end of turn: its tokens are turn tokens. And where the user's turn ends
    with text, not a control token, the preamble's end still counts one token, not all of them."""
    control = ("<|u|>", "<|a|>", "<|e|>", "<|ae|>", "<|d|>", "<|x|>", "<|f|>")
    header = {"system": "<|u|>", "user": "<|u|>", "assistant": "<|a|>"}
    one_answer = _fake_template(header, end={"system": "<|e|>", "user": "<|e|>", "assistant": "<|ae|>"},
                                refuse=lambda msgs: sum(m["role"] == "assistant" for m in msgs) > 1)  # fmt: skip
    assert turn_structure(one_answer, control, set()) == {"<|u|>", "<|a|>", "<|e|>", "<|ae|>"}
    text_end = _fake_template(header, end={"system": "\n", "user": "\n", "assistant": "<|e|>"},
                              first="<|d|>default<|x|>prompt<|f|>")  # fmt: skip
    assert turn_structure(text_end, control, set()) == {"<|d|>", "<|f|>", "<|u|>", "<|a|>", "<|e|>"}


def test_a_user_turn_s_end_is_counted_after_its_content_however_long_its_header():
    """The turn-end count is read after the user's content: a header longer than the content (its control tokens
    past the content's length from the turn's start) adds none to it, so only a preamble's last token is an end."""
    control = ("<|u|>", "<|v|>", "<|a|>", "<|e|>", "<|d|>", "<|p|>", "<|y|>", "<|f|>")
    long_user = "<|u|>" + "h" * 40 + "<|v|>"  # longer than a probe's content (28 characters)
    header = {"system": long_user, "user": long_user, "assistant": "<|a|>"}
    template = _fake_template(header, first="<|d|>a<|p|>b<|y|>c<|f|>")  # a preamble of four tokens
    # the preamble's first two (the user's header has two) and its last; <|y|> is an in-turn marker
    assert turn_structure(template, control, set()) == {"<|d|>", "<|p|>", "<|f|>", "<|u|>", "<|v|>", "<|a|>", "<|e|>"}
