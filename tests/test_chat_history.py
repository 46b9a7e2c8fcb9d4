"""Templates that rewrite history (Qwen3's and gpt-oss's reasoning stripping, DeepSeek-R1 distills' ``<think>``
prompt): per-turn documents as inference renders each turn, TRL's training template, and the default (``auto``).

The templates are the files TRL ships (``trl/chat_templates``), on byte-level BPE tokenizers built here with each
family's special tokens as added tokens. References are plain ``apply_chat_template`` calls and string slicing:
``reference_documents`` shares nothing with ``weightprep.stages.chat``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import sys

import numpy as np
import pytest
from chat_support import TEMPLATES, chat_record, plain_messages, reference_token_weights
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizer_factory import _byte_level_bpe

from weightprep.accounting import check_accounting
from weightprep.config import config_from_dict
from weightprep.errors import UsageError
from weightprep.pipeline import build
from weightprep.stages import chat_templates
from weightprep.stages.chat import ChatError, ChatRenderer
from weightprep.stages.chat_templates import TrlMissing, resolve_templates


@functools.lru_cache
def family_tokenizer(name: str, template: str | None = None):
    """A byte-level BPE tokenizer with TRL's ``name.jinja`` and the family's tokens: turn markers as special added
    tokens, reasoning and tool-call markers as (non-special) added tokens, as the real tokenizers have them.
    Treat as read-only."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    specials, markers, bos, eos, pad = {
        "qwen3": (["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
                  ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"],
                  None, "<|im_end|>", "<|endoftext|>"),
        "deepseek_r1_distill": (["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"],
                                ["<think>", "</think>"], "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                                "<｜end▁of▁sentence｜>"),
        "gptoss": (["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|start|>", "<|end|>", "<|message|>",
                    "<|channel|>", "<|call|>", "<|constrain|>"], [], "<|startoftext|>", "<|return|>", "<|endoftext|>"),
    }[name]  # fmt: skip
    tok = PreTrainedTokenizerFast(
        tokenizer_object=_byte_level_bpe(specials, 500), bos_token=bos, eos_token=eos, pad_token=pad,
        clean_up_tokenization_spaces=False,
    )  # fmt: skip
    tok.add_special_tokens({"additional_special_tokens": [t for t in specials if t not in (bos, eos, pad)]})
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in markers])
    tok.chat_template = template or (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")
    return tok


def _training(tok) -> str:
    from trl.chat_template_utils import get_training_chat_template

    return get_training_chat_template(tok)



def _weight(m) -> float:
    return m.get("weight", 1.0 if m["role"] == "assistant" else 0.0)


def reference_documents(tok, messages, tools=None, history="per-turn", training=None):
    """``[(text, char_weights)]`` of a conversation, from ``apply_chat_template`` alone: ``full``: the whole
    conversation, each weighted assistant turn from the end of its generation prompt; ``per-turn``: for each weighted
    assistant turn ``i``, ``messages[:i + 1]`` rendered, weighted from the end of the generation prompt of
    ``messages[:i]``; where that prompt does not begin the turn, the prompt then what ``training`` renders after its
    own generation prompt. None where the whole conversation is not prefix-preserving (``full``)."""
    plain = plain_messages(messages)

    def render(k, generation=False, template=None):
        return tok.apply_chat_template(
            plain[:k], tools=tools, tokenize=False, add_generation_prompt=generation, chat_template=template
        )

    weighted = [i for i, m in enumerate(messages) if _weight(m) > 0]
    assert all(messages[i]["role"] == "assistant" for i in weighted)
    if history == "full":
        text = render(len(plain))
        w = np.zeros(len(text), dtype=np.float32)
        for i in weighted:
            before, prompt, after = render(i), render(i, True), render(i + 1)
            if not (text.startswith(after) and after.startswith(prompt) and prompt.startswith(before)):
                return None
            w[len(prompt) : len(after)] = _weight(messages[i])
        return [(text, w)]
    docs = []
    for i in weighted:
        before, prompt, after = render(i), render(i, True), render(i + 1)
        if after.startswith(prompt) and prompt.startswith(before):
            text = after
        else:
            turn_prompt, turn = render(i, True, training), render(i + 1, template=training)
            assert turn.startswith(turn_prompt) and prompt.endswith(turn_prompt[len(render(i, False, training)) :])
            text = prompt + turn[len(turn_prompt) :]
        w = np.zeros(len(text), dtype=np.float32)
        w[len(prompt) :] = _weight(messages[i])
        docs.append((text, w))
    return docs or [(render(len(plain)), np.zeros(len(render(len(plain))), dtype=np.float32))]


def training_documents(tok, messages, training, tools=None):
    """``[(text, char_weights)]``: the whole conversation as TRL's training template renders it, each
    ``{% generation %}`` block (transformers' ``generation_indices``, what ``assistant_masks`` marks) carrying its
    assistant's weight, block ``k`` the ``k``-th assistant's: what SFTTrainer trains on, with float weights."""
    from transformers.utils.chat_template_utils import render_jinja_template

    plain = plain_messages(messages)
    (text,), (spans,) = render_jinja_template(
        conversations=[plain], tools=tools, chat_template=training, return_assistant_tokens_mask=True,
        **tok.special_tokens_map,
    )  # fmt: skip
    assistants = [m for m in messages if m["role"] == "assistant"]
    assert len(spans) == len(assistants)
    w = np.zeros(len(text), dtype=np.float32)
    for (a, b), m in zip(spans, assistants, strict=True):
        w[a:b] = _weight(m)
    return [(text, w)]



def _split(out):
    offsets = out.offsets if out.offsets is not None else [0, len(out.ids)]
    return [(out.ids[a:b], out.weights[a:b]) for a, b in zip(offsets[:-1], offsets[1:], strict=True)]


def check_against_reference(tok, renderer, messages, reference, tools=None):
    """The renderer's documents equal ``reference`` (texts and char weights): ids are the reference texts tokenized
    (``add_special_tokens=False``, as apply_chat_template does), weights the reference's on each token (a token
    across a change of weight, the larger)."""
    encodings = [tok.backend_tokenizer.encode(text, add_special_tokens=False) for text, _ in reference]
    expected = [reference_token_weights(enc, w) for enc, (_, w) in zip(encodings, reference, strict=True)]
    out = renderer.tokens(chat_record(messages, tools))
    docs = _split(out)
    assert len(docs) == len(reference)
    for (ids, weights), enc, (want_w, _) in zip(docs, encodings, expected, strict=True):
        assert ids.tolist() == enc.ids
        np.testing.assert_array_equal(weights, want_w)
    return out


# ----------------------------------------------------------------------------------------------------------------
# conversations

_WORDS = ["Hello", "world", "2+2", "東京は", "😀🚀", " spaced ", "\nnew line", "x", "the end.", "assistant", "think"]
_text = st.lists(st.sampled_from(_WORDS), min_size=1, max_size=4).map(" ".join)
_weight_st = st.one_of(st.none(), st.sampled_from([0.0, 0.5, 1.0, 2.5]))


@st.composite
def reasoning_conversations(draw, family: str):
    """System (sometimes), then 1-3 user/assistant exchanges; each answer's reasoning in ``reasoning_content``, as
    ``<think>...</think>`` in its content, or none (DeepSeek-R1: always in content, the only place its templates read
    it); float weights."""
    messages = [{"role": "system", "content": draw(_text)}] if family != "deepseek_r1_distill" and draw(st.booleans()) else []
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(_text)})
        answer, reasoning = draw(_text), draw(_text)
        style = "content" if family == "deepseek_r1_distill" else draw(st.sampled_from(["field", "content", "none"]))
        if family == "gptoss" and style == "content":
            style = "field"  # gpt-oss reads reasoning from its own channel only
        m = {"role": "assistant", "content": answer}
        if style == "field":
            m["reasoning_content"] = reasoning
        elif style == "content":
            m["content"] = f"<think>\n{reasoning}\n</think>\n\n{answer}"
        if (w := draw(_weight_st)) is not None:
            m["weight"] = w
        messages.append(m)
    return messages


FAMILY_NAMES = ("qwen3", "deepseek_r1_distill", "gptoss")


@pytest.mark.parametrize("family", FAMILY_NAMES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_per_turn_documents_equal_inference_renders_and_a_per_character_reference(family, data):
    """Each weighted assistant turn is its own document: ``apply_chat_template(messages[:i + 1])`` (the turn after
    the generation prompt of ``messages[:i]``), or for DeepSeek-R1 that prompt then the turn as TRL's training
    template renders it; only that turn weighted, from the end of the generation prompt."""
    messages = data.draw(reasoning_conversations(family))
    tok = family_tokenizer(family)
    training = _training(tok) if family == "deepseek_r1_distill" else None
    reference = reference_documents(tok, messages, history="per-turn", training=training)
    out = check_against_reference(tok, ChatRenderer(tok, history="per-turn"), messages, reference)
    weighted = sum(_weight(m) > 0 for m in messages)
    assert (out.offsets is None) == (weighted == 0)
    assert out.training == (weighted if family == "deepseek_r1_distill" else 0)


@pytest.mark.parametrize("family", FAMILY_NAMES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_auto_is_the_whole_conversation_where_that_is_exact_and_per_turn_elsewhere(family, data):
    """``auto``: the whole conversation where each weighted turn follows its generation prompt in it; else, where
    the template cannot render a turn after its own generation prompt (DeepSeek-R1), the whole conversation as
    TRL's training template renders it, weighted as SFTTrainer's assistant mask; else (a template that rewrites
    earlier turns: Qwen3, gpt-oss) one document per weighted turn."""
    messages = data.draw(reasoning_conversations(family))
    tok = family_tokenizer(family)
    whole = reference_documents(tok, messages, history="full")
    if whole is not None:
        reference = whole
    elif family == "deepseek_r1_distill":  # every weighted answer: the prompt ends in <think>\n, the turn does not
        reference = training_documents(tok, messages, _training(tok))
    else:
        reference = reference_documents(tok, messages, history="per-turn")
    out = check_against_reference(tok, ChatRenderer(tok, history="auto"), messages, reference)
    assert (out.offsets is None) == (len(reference) == 1 and (whole is not None or family == "deepseek_r1_distill"))
    weighted = sum(_weight(m) > 0 for m in messages)
    assert out.training == (weighted if whole is None and family == "deepseek_r1_distill" else 0)


def _qwen3_reasoning():
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Two plus two."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "<think>\nThree plus three.\n</think>\n\n6", "weight": 2.0},
    ]


def test_qwen3_multi_turn_reasoning_is_refused_whole_and_built_per_turn():
    tok = family_tokenizer("qwen3")
    with pytest.raises(ChatError) as err:
        ChatRenderer(tok, history="full").tokens(chat_record(_qwen3_reasoning()))
    assert err.value.reason == "not_prefix_preserving"
    assert "--chat-history per-turn builds one per weighted message" in str(err.value)  # the other modes named
    assert "--chat-history auto (the default)" in str(err.value)
    out = ChatRenderer(tok, history="auto").tokens(chat_record(_qwen3_reasoning()))
    (first, w1), (second, w2) = _split(out)
    # the first turn keeps its reasoning where it is the last turn; the second document shows it stripped, as inference
    assert tok.decode(first[w1 > 0]) == "<think>\nTwo plus two.\n</think>\n\n4<|im_end|>\n"
    assert "Two plus two" not in tok.decode(second)
    assert tok.decode(second[w2 > 0]) == "<think>\nThree plus three.\n</think>\n\n6<|im_end|>\n" and set(w2[w2 > 0]) == {2.0}
    assert second.tolist() == tok.apply_chat_template(plain_messages(_qwen3_reasoning()), tokenize=True)["input_ids"]


def test_deepseek_per_turn_prefilled_think_is_part_of_the_generation_prompt_and_weighs_0():
    """``--chat-history per-turn`` (inference's view): DeepSeek-R1 distills prompt with ``<｜Assistant｜><think>\\n``
    and re-render every answer without its reasoning; the turn comes from TRL's training template, after the
    prompt's ``<think>\\n``, which stays 0 as every generation prompt."""
    tok = family_tokenizer("deepseek_r1_distill")
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nTwo plus two.\n</think>\n\n4"},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "<think>\nThree plus three.\n</think>\n\n6", "weight": 0.5},
    ]
    for history in ("full", "per-turn"):
        renderer = ChatRenderer(tok, history=history, original=None)
        if history == "full":  # one document, the template's own render: weights where the renders part
            whole = renderer.tokens(chat_record(messages))
            assert whole.ids.tolist() == tok.apply_chat_template(plain_messages(messages), tokenize=True)["input_ids"]
            weighted = [tok.decode(whole.ids[whole.weights == w]) for w in (1.0, 0.5)]
            assert weighted == ["\n\n4<｜end▁of▁sentence｜>", "\n\n6<｜end▁of▁sentence｜>"]
            continue
        out = renderer.tokens(chat_record(messages))
    (_, _), (ids, w) = _split(out)
    prompt = tok.apply_chat_template(plain_messages(messages[:3]), tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<｜User｜>3+3?<｜Assistant｜><think>\n")
    assert tok.decode(ids) == prompt + "Three plus three.\n</think>\n\n6<｜end▁of▁sentence｜>"
    assert tok.decode(ids[w == 0]) == prompt and tok.decode(ids[w > 0]) == "Three plus three.\n</think>\n\n6<｜end▁of▁sentence｜>"
    assert "Two plus two" not in tok.decode(ids)  # the earlier turn as inference shows it: reasoning dropped
    assert out.training == 2


def test_deepseek_default_is_what_sft_trainer_trains_on():
    """The default (``auto``) builds a DeepSeek-R1-distill conversation, which its template cannot render after its
    own ``<think>\\n`` prompt, as TRL's training template renders it: the ids and the assistant mask of TRL's own
    tokenization for SFTTrainer with ``assistant_only_loss`` (``<｜Assistant｜>``, the reasoning's ``<think>`` and
    the EOS included), each turn with its own float weight, every turn's reasoning kept."""
    from trl.data_utils import _tokenize

    tok = family_tokenizer("deepseek_r1_distill")
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nTwo plus two.\n</think>\n\n4", "weight": 2.0},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "<think>\nThree plus three.\n</think>\n\n6", "weight": 0.5},
    ]
    out = ChatRenderer(tok, history="auto").tokens(chat_record(messages))
    trl = _tokenize(tok, plain_messages(messages), chat_template=_training(tok), tools=None, return_assistant_tokens_mask=True)
    assert out.offsets is None and out.training == 2 and out.ids.tolist() == list(trl["input_ids"])
    assert (out.weights > 0).astype(int).tolist() == list(trl["assistant_masks"])
    assert tok.decode(out.ids[out.weights == 2.0]) == "<｜Assistant｜><think>\nTwo plus two.\n</think>\n\n4<｜end▁of▁sentence｜>"
    assert tok.decode(out.ids[out.weights == 0.5]) == "<｜Assistant｜><think>\nThree plus three.\n</think>\n\n6<｜end▁of▁sentence｜>"


def test_deepseek_reasoning_content_its_templates_do_not_read_it():
    """Neither DeepSeek-R1 template reads ``reasoning_content``: per turn (after the ``<think>\\n`` prompt) that is
    refused, saying so; the default trains on the answer as SFTTrainer does, without it."""
    tok = family_tokenizer("deepseek_r1_distill")
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", "reasoning_content": "Two."}]
    with pytest.raises(ChatError) as err:
        ChatRenderer(tok, history="per-turn").tokens(chat_record(messages))
    assert (err.value.reason, err.value.field) == ("generation_prompt_mismatch", "messages[1]")
    assert "'<｜Assistant｜><think>\\n'" in err.value.problem and "reasoning_content" in err.value.problem
    out = ChatRenderer(tok, history="auto").tokens(chat_record(messages))
    assert tok.decode(out.ids[out.weights > 0]) == "<｜Assistant｜>4<｜end▁of▁sentence｜>"


def test_spliced_documents_keep_each_token_s_message():
    """A DeepSeek-R1 per-turn document: the context's tokens belong to the messages the original template renders
    them for (BOS to none), the generation prompt and the turn to the turn's message."""
    from weightprep.batches import split_turn_code

    tok = family_tokenizer("deepseek_r1_distill")
    messages = [
        {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>\nTwo.\n</think>\n\n4"},
        {"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "<think>\nThree.\n</think>\n\n6"},
    ]  # fmt: skip
    renderer = ChatRenderer(tok, history="per-turn")
    out = renderer.tokens(chat_record(messages))
    second = slice(int(out.offsets[1]), int(out.offsets[2]))
    by_message: dict[int, list[int]] = {}
    for i, code in zip(out.ids[second].tolist(), out.turns[second].tolist(), strict=True):
        by_message.setdefault(split_turn_code(code)[1] if code else -1, []).append(i)
    assert {k: tok.decode(v) for k, v in by_message.items()} == {
        -1: "<｜begin▁of▁sentence｜>",
        0: "<｜User｜>2+2?",
        1: "<｜Assistant｜>\n\n4<｜end▁of▁sentence｜>",
        2: "<｜User｜>3+3?",
        3: "<｜Assistant｜><think>\nThree.\n</think>\n\n6<｜end▁of▁sentence｜>",
    }
    assert [renderer.roles[split_turn_code(c)[0]] for c in out.turns[second].tolist() if c][-1] == "assistant"


def test_per_turn_refuses_what_no_template_can_render_and_tries_trl_only_for_a_generation_prompt_mismatch(
    monkeypatch,
):
    # Qwen3, two answers in a row: alone, the first is rendered with an empty reasoning block, followed by the
    # second without: the context of the second cannot be rendered; no training template is tried
    tok = family_tokenizer("qwen3")
    tried = []
    monkeypatch.setattr(ChatRenderer, "_training_renderer", lambda self: tried.append(1))
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "One."},
                {"role": "assistant", "content": "Two."}]  # fmt: skip
    with pytest.raises(ChatError) as err:
        ChatRenderer(tok, history="per-turn").tokens(chat_record(messages))
    assert err.value.reason == "not_prefix_preserving" and not tried
    monkeypatch.undo()
    # a template (a file) TRL has no training template for: the original refusal, no training template mentioned
    odd = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}A: {% endif %}"
    convo = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    with pytest.raises(ChatError) as err:
        ChatRenderer(tok, odd, history="per-turn").tokens(chat_record(convo))
    assert err.value.reason == "generation_prompt_mismatch" and "training template" not in err.value.problem


def test_a_template_that_keeps_history_gives_one_document_in_auto_as_in_full():
    tok = family_tokenizer("qwen3", (TEMPLATES / "qwen2_5.jinja").read_text())
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": "More"}, {"role": "assistant", "content": "Sure", "weight": 2.0}]  # fmt: skip
    auto, full = (ChatRenderer(tok, history=h).tokens(chat_record(messages)) for h in ("auto", "full"))
    assert auto.offsets is None and auto.ids.tolist() == full.ids.tolist() and auto.weights.tolist() == full.weights.tolist()
    per_turn = ChatRenderer(tok, history="per-turn").tokens(chat_record(messages))
    # per-turn: the same two turns, each after its own context; the last document is the whole conversation
    (a, wa), (b, wb) = _split(per_turn)
    assert b.tolist() == full.ids.tolist() and wb[: len(a)].sum() == 0 and wb.tolist()[len(a) :] == full.weights.tolist()[len(a) :]
    assert a.tolist() == tok.apply_chat_template(messages[:2], tokenize=True)["input_ids"]


def test_per_turn_gives_a_weighted_tool_result_its_own_document():
    tok = family_tokenizer("qwen3")
    tools = [{"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "", "reasoning_content": "Use the tool.",
         "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]},
        {"role": "tool", "content": "4", "weight": 0.5},
        {"role": "assistant", "content": "4", "reasoning_content": "It said 4."},
    ]  # fmt: skip
    out = ChatRenderer(tok, history="per-turn").tokens(chat_record(messages, tools))
    docs = _split(out)
    assert len(docs) == 3
    ids, w = docs[1]
    assert ids.tolist() == tok.apply_chat_template(plain_messages(messages[:3]), tools=tools, tokenize=True)["input_ids"]
    assert tok.decode(ids[w > 0]) == "4\n</tool_response><|im_end|>\n" and set(w[w > 0]) == {0.5}


# ----------------------------------------------------------------------------------------------------------------
# --chat-template training


@pytest.mark.parametrize("family", FAMILY_NAMES)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_training_template_ids_and_mask_are_what_sft_trainer_trains_on(family, data):
    """``--chat-template training``: the ids and the assistant mask of TRL's own tokenization for SFTTrainer
    (``trl.data_utils._tokenize`` with the template ``get_training_chat_template`` gives, assistant_only_loss)."""
    from trl.data_utils import _tokenize

    messages = data.draw(reasoning_conversations(family))
    tok = family_tokenizer(family)
    chosen = resolve_templates(tok, "training")
    assert chosen.template == _training(tok) and chosen.original == tok.chat_template
    renderer = ChatRenderer(tok, chosen.template, history="auto", original=chosen.original, training=chosen.training)
    trl = _tokenize(tok, plain_messages(messages), chat_template=chosen.template, tools=None, return_assistant_tokens_mask=True)
    out = renderer.tokens(chat_record(messages))
    assert out.offsets is None and out.ids.tolist() == list(trl["input_ids"])
    roles = [m for m in messages if m["role"] == "assistant"]
    if all(_weight(m) in (0.0, 1.0) for m in roles) and len({_weight(m) for m in roles}) == 1:
        mask = (out.weights > 0).astype(int).tolist()
        assert mask == (list(trl["assistant_masks"]) if _weight(roles[0]) else [0] * len(mask))


def test_training_per_turn_renders_the_context_with_the_original_and_the_turn_with_the_training_template():
    tok = family_tokenizer("qwen3")
    chosen = resolve_templates(tok, "training")
    renderer = ChatRenderer(tok, chosen.template, history="per-turn", original=chosen.original, training=True)
    out = renderer.tokens(chat_record(_qwen3_reasoning()))
    (_, _), (ids, w) = _split(out)
    prompt = tok.apply_chat_template(plain_messages(_qwen3_reasoning()[:4]), tokenize=False, add_generation_prompt=True)
    assert "Two plus two" not in prompt and tok.decode(ids[w == 0]) == prompt
    assert tok.decode(ids[w > 0]) == "<think>\nThree plus three.\n</think>\n\n6<|im_end|>\n"
    assert out.training == 0  # the template itself renders the turns: none came from a fallback
    # a weighted tool result: its document is the original's render, weighted from its content
    messages = [*_qwen3_reasoning()[:3], {"role": "tool", "content": "ok", "weight": 0.5}]
    ids, w = _split(renderer.tokens(chat_record(messages)))[1]
    assert ids.tolist() == tok.apply_chat_template(plain_messages(messages), tokenize=True)["input_ids"]
    assert tok.decode(ids[w > 0]) == "ok\n</tool_response><|im_end|>\n"
    # a turn the training template does not start with the generation prompt: named as such
    ds = family_tokenizer("deepseek_r1_distill")
    chosen = resolve_templates(ds, "training")
    renderer = ChatRenderer(ds, chosen.template, history="per-turn", original=chosen.original, training=True)
    with pytest.raises(ChatError, match="this turn starts: the training template renders the turn as") as err:
        renderer.tokens(chat_record([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]))
    assert err.value.reason == "generation_prompt_mismatch"


def test_training_is_refused_without_a_training_template_or_without_trl(monkeypatch):
    tok = family_tokenizer("qwen3", "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    with pytest.raises(UsageError, match="TRL has no training template for this tokenizer's chat_template") as err:
        resolve_templates(tok, "training")
    assert err.value.exit_code == 2
    monkeypatch.setitem(sys.modules, "trl", None)  # import trl raises ImportError
    monkeypatch.setattr(chat_templates, "_FOUND", {})  # nothing looked up yet
    with pytest.raises(TrlMissing, match=re.escape("pip install 'weightprep[train]'")):
        resolve_templates(family_tokenizer("qwen3"), "training")
    # without TRL, a template that cannot render a turn after its own prompt (DeepSeek-R1) is built from its own
    # render, the weights where the renders part (chat_spans): TRL's training template is a choice, not a need
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello"}]
    deepseek = family_tokenizer("deepseek_r1_distill")
    built = ChatRenderer(deepseek, history="auto").tokens(chat_record(messages))
    assert built.ids.tolist() == deepseek.apply_chat_template(plain_messages(messages), tokenize=True)["input_ids"]
    assert deepseek.decode(built.ids[built.weights > 0]) == "\n\nHello<｜end▁of▁sentence｜>" and built.training == 0
    assert ChatRenderer(family_tokenizer("qwen3"), history="auto").tokens(chat_record(_qwen3_reasoning())).offsets is not None


def test_resolve_templates_the_tokenizers_a_file_and_trl_training_ones(tmp_path):
    tok = family_tokenizer("qwen3")
    assert resolve_templates(tok, None) == (tok.chat_template, None, "tokenizer", None, False)
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert resolve_templates(tok, str(path)) == (path.read_text(), None, str(path), str(path), False)
    # a template TRL already trains on as it is (prefix-preserving, {% generation %} tags): itself
    lfm = family_tokenizer("qwen3", (TEMPLATES / "lfm2_2_5.jinja").read_text())
    assert resolve_templates(lfm, "training") == (
        lfm.chat_template, None, "training: the tokenizer's own (TRL trains on it as is)", None, True
    )


def test_a_deepseek_template_file_on_a_tokenizer_with_another_template_finds_its_training_template(monkeypatch):
    """TRL reads the template off the tokenizer: the one given (``--chat-template FILE``) is what it maps."""
    monkeypatch.setattr(chat_templates, "_FOUND", {})  # looked up here, not remembered from another test
    tok = family_tokenizer("deepseek_r1_distill", (TEMPLATES / "qwen2_5.jinja").read_text())
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"}]
    template = (TEMPLATES / "deepseek_r1_distill.jinja").read_text()
    out = ChatRenderer(tok, template, history="auto").tokens(chat_record(messages))
    ids, w = _split(out)[0]
    assert out.training == 1 and tok.decode(ids[w > 0]) == "<｜Assistant｜><think>\nadd\n</think>\n\n4<｜end▁of▁sentence｜>"


# ----------------------------------------------------------------------------------------------------------------
# builds: manifest and accounting


def _rows(out_dir):
    """Each document of an unpacked build: (ids, weights) without its padding."""
    import datasets

    rows = datasets.load_from_disk(str(out_dir))
    return sorted(
        (tuple(r["input_ids"][: sum(r["attention_mask"])]), tuple(r["weights"][: sum(r["attention_mask"])])) for r in rows
    )


def _write(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.mark.parametrize("family", ["qwen3", "deepseek_r1_distill"])
def test_default_build_of_multi_turn_reasoning_is_exact_and_counted(tmp_path, family):
    tok = family_tokenizer(family)
    convos = [_qwen3_reasoning()] if family == "qwen3" else []
    convos += [
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>\nA greeting.\n</think>\n\nHello!"}],
        [{"role": "user", "content": "1?"}, {"role": "assistant", "content": "<think>\none\n</think>\n\n1", "weight": 1.5},
         {"role": "user", "content": "2?"}, {"role": "assistant", "content": "<think>\ntwo\n</think>\n\n2"},
         {"role": "user", "content": "3?"}, {"role": "assistant", "content": "<think>\nthree\n</think>\n\n3"}],
    ]  # fmt: skip
    inp = _write(tmp_path / "convos.jsonl", [{"messages": c} for c in convos])
    cfg = config_from_dict({"pack": {"enabled": False, "seq_len": 256}})
    m = build([str(inp)], tmp_path / "out", cfg, tokenizer=tok)
    training = _training(tok) if family == "deepseek_r1_distill" else None
    expected, per_turn, extra, trained = [], [0, 0], 0, 0
    for c in convos:
        whole = reference_documents(tok, c, history="full")
        if whole is None and training is not None:  # DeepSeek-R1: the whole conversation, as SFTTrainer sees it
            whole = training_documents(tok, c, training)
            trained += sum(_weight(m) > 0 for m in c)
        docs = whole if whole is not None else reference_documents(tok, c)
        encoded = [(tok.backend_tokenizer.encode(t, add_special_tokens=False), w) for t, w in docs]
        for enc, w in encoded:
            weights, straddle = reference_token_weights(enc, w)
            assert not straddle
            weights[0] = 0.0  # nothing before a document's first token predicts it
            expected.append((tuple(enc.ids), tuple(weights.tolist())))
        if whole is None:
            per_turn = [per_turn[0] + 1, per_turn[1] + len(docs)]
            extra += sum(len(enc.ids) for enc, _ in encoded[:-1])
    assert _rows(tmp_path / "out") == sorted(expected)
    c = m["counts"]
    assert (c["chat_history_conversations"], c["chat_history_documents"]) == tuple(per_turn)
    assert c["chat_history_extra_tokens"] == extra and (extra > 0) == (family == "qwen3")
    assert c["documents"] == c["accepted"] - per_turn[0] + per_turn[1] == len(expected)
    assert c["chat_training_template_turns"] == trained == (4 if family == "deepseek_r1_distill" else 0)
    check_accounting(c)
    sha = hashlib.sha256(tok.chat_template.encode()).hexdigest()
    assert m["chat"]["template_source"] == "tokenizer" and m["chat"]["template_sha256"] == sha
    assert m["chat"]["history"] == "auto" and m["config"]["chat"]["history"] == "auto"
    if family == "deepseek_r1_distill":
        assert m["chat"]["turn_template_sha256"] == hashlib.sha256(training.encode()).hexdigest()
        assert m["chat"]["turn_template_source"].endswith("chat_templates/deepseek_r1_distill_training.jinja")
    else:
        assert m["chat"]["turn_template_sha256"] is None


def test_accounting_refuses_documents_that_per_turn_counts_do_not_explain(tmp_path):
    tok = family_tokenizer("qwen3")
    inp = _write(tmp_path / "c.jsonl", [{"messages": _qwen3_reasoning()}])
    m = build([str(inp)], tmp_path / "out", config_from_dict({"pack": {"seq_len": 256}}), tokenizer=tok)
    c = m["counts"]
    assert (c["accepted"], c["documents"], c["chat_history_conversations"], c["chat_history_documents"]) == (1, 2, 1, 2)
    from weightprep.errors import AccountingError

    with pytest.raises(AccountingError, match="conversations built per turn"):
        check_accounting({**c, "chat_history_documents": 1})


def test_cli_training_template_and_history_flags(tmp_path):
    from weightprep.cli import main

    tok = family_tokenizer("qwen3")
    tok.save_pretrained(str(tmp_path / "tok"))
    inp = _write(tmp_path / "c.jsonl", [{"messages": _qwen3_reasoning()}])
    args = ["build", str(inp), "--tokenizer", str(tmp_path / "tok"), "--out", str(tmp_path / "out"), "--seq-len", "256"]
    result = CliRunner().invoke(main, [*args, "--chat-template", "training"])
    assert result.exit_code == 0, result.output
    m = json.loads((tmp_path / "out" / "weightprep_manifest.json").read_text())
    training = _training(tok)
    assert m["chat"]["template_sha256"] == hashlib.sha256(training.encode()).hexdigest()
    assert m["chat"]["template_source"].endswith("chat_templates/qwen3_training.jinja")
    assert "training_alternative" not in m["chat"]  # no per-turn documents: nothing to offer instead
    m_training_source = m["chat"]["template_source"]
    assert m["chat"]["context_template_sha256"] == hashlib.sha256(tok.chat_template.encode()).hexdigest()
    assert m["counts"]["chat_history_conversations"] == 0 and m["counts"]["documents"] == 1
    result = CliRunner().invoke(main, [*args, "--chat-history", "full", "--overwrite"])
    assert result.exit_code == 2 and "not_prefix_preserving" not in result.output and "prefix-preserving" in result.output
    result = CliRunner().invoke(main, [*args, "--chat-history", "per-turn", "--overwrite"])
    assert result.exit_code == 0, result.output
    m = json.loads((tmp_path / "out" / "weightprep_manifest.json").read_text())
    assert m["chat"]["history"] == "per-turn" and m["counts"]["chat_history_documents"] == 2
    # repeated context of half the tokens or more: the summary names it and the alternative
    from weightprep.commands.build import format_summary

    c = m["counts"]
    large = {**m, "counts": {**c, "chat_history_extra_tokens": c["tokens"] // 2}}
    small = {**m, "counts": {**c, "chat_history_extra_tokens": c["tokens"] // 2 - 1}}
    line = f"warning: per-turn documents repeat their context: {c['tokens'] // 2:,} extra tokens for {c['tokens']:,}"
    assert m["chat"]["training_alternative"] == m_training_source  # found for the template the build rendered with
    assert line in format_summary(large, "out")
    assert f"--chat-template training renders each conversation once ({m_training_source[10:]})" in format_summary(
        large, "out"
    )  # fmt: skip
    assert "repeat their context" not in format_summary(small, "out")
    # where TRL has no training template for it, the warning says so rather than offering the flag
    none = {**large, "chat": {**large["chat"], "training_alternative": None}}
    assert line in format_summary(none, "out") and "--chat-template training" not in format_summary(none, "out")
    assert "TRL has none for this chat template" in format_summary(none, "out")
    bad = CliRunner().invoke(main, [*args, "--chat-history", "sometimes", "--overwrite"])
    assert bad.exit_code == 2
    with pytest.raises(Exception, match="chat.history"):
        config_from_dict({"chat": {"history": "sometimes"}})


# a template that writes the generation prompt "A: " but renders an answer without it (so the renders decide
# where an answer starts: ``derive``), and, with ``_BRACKETS``, an answer followed by more messages in brackets
# (so it rewrites a weighted turn: ``auto`` builds such a conversation per turn); no TRL training template
_PLAIN_PROMPT = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}A: {% endif %}"
_BRACKETS = (
    "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}[{{ m['content'] }}]{% else %}"
    "{{ m['content'] }}{% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}A: {% endif %}"
)


@pytest.mark.parametrize("history", ["full", "auto"])
def test_an_answer_placed_by_the_renders_is_one_document_not_per_turn_ones(history):
    """A conversation whose answer starts where the renders say (``derive``: the generation prompt is not how the
    template renders an answer) is still one document: no per-turn offsets, no history counted."""
    tok = family_tokenizer("qwen3")
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo there"}]
    out = ChatRenderer(tok, _PLAIN_PROMPT, history=history).tokens(chat_record(messages))
    assert out.offsets is None and out.training == 0
    assert tok.decode(out.ids[out.weights > 0]).strip() == "Yo there"


def test_auto_builds_a_rewritten_conversation_per_turn_with_each_turn_placed_by_its_renders():
    """``auto`` on a template that rewrites an answer once more messages follow (not prefix-preserving) and renders
    each answer without its generation prompt: per-turn documents, each answer placed by its renders (``_turn``'s
    ``derive``: there is no training template to take instead)."""
    tok = family_tokenizer("qwen3")
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "One"},
                {"role": "user", "content": "Q"}, {"role": "assistant", "content": "Two", "weight": 2.0}]  # fmt: skip
    with pytest.raises(ChatError) as err:
        ChatRenderer(tok, _BRACKETS, history="full").tokens(chat_record(messages))
    assert err.value.reason == "not_prefix_preserving"  # the premise
    out = ChatRenderer(tok, _BRACKETS, history="auto").tokens(chat_record(messages))
    assert out.offsets is not None and len(out.offsets) == 3 and out.training == 0
    (a, b, c) = out.offsets.tolist()
    first, second = slice(a, b), slice(b, c)
    for part, text in ((first, "Hi\nOne\n"), (second, "Hi\n[One]\nQ\nTwo\n")):  # each as inference renders it
        assert out.ids[part].tolist() == tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(out.ids[first][out.weights[first] > 0]).strip() == "One"
    assert set(out.weights[first].tolist()) == {0.0, 1.0}
    assert tok.decode(out.ids[second][out.weights[second] > 0]).strip() == "Two"
    assert set(out.weights[second].tolist()) == {0.0, 2.0}


def test_auto_refuses_with_the_renders_reason_where_they_cannot_place_an_answer_either():
    """``auto`` where the generation prompt is not how the template renders an answer and the renders cannot place
    it (the generation prompt rewrites what comes before it): refused with the renders' own reason, not taken to
    per-turn documents (which the same template cannot render either) nor to TRL's training template."""
    odd = (
        "{% if add_generation_prompt %}PROMPT:{% for m in messages %}{{ m['content'] }}{% endfor %}{% else %}"
        "{% for m in messages %}{{ m['content'] }}\n{% endfor %}{% endif %}"
    )
    tok = family_tokenizer("qwen3")
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    with pytest.raises(ChatError) as err:
        ChatRenderer(tok, odd, history="auto").tokens(chat_record(messages))
    assert (err.value.reason, err.value.field) == ("generation_prompt_mismatch", "messages[1]")
    assert "cannot be aligned (chat_spans)" in err.value.problem and "training template" not in err.value.problem
