"""The chat stage's fallbacks: ``auto`` falling back to TRL's training template from a per-turn document, turn
codes where a weight-0 message's boundary is no prefix, control-token sanitizing in a batch that mixes marked and
plain conversations, and the tokenizer guard naming a batch's conversation.

References are ``apply_chat_template``, TRL's own tokenization (``trl.data_utils._tokenize``) and tokenizers'
offsets: nothing from ``weightprep.stages.chat``.
"""

from __future__ import annotations

import numpy as np
import pytest
from chat_support import chat_record, chat_tokenizer, fastokens_wrong_on, plain_messages
from test_chat_history import _training, family_tokenizer

from weightprep.batches import split_turn_code
from weightprep.errors import BackendMismatch
from weightprep.stages.chat import ChatError, ChatRenderer
from weightprep.stages.tokenize import PieceTokenizer

#: A DeepSeek-R1-distill conversation with a system message in the middle: its template writes the (last) system
#: prompt right after BOS, so no prefix of the conversation is a prefix of the whole (``not_prefix_preserving``), and
#: each answer's own document fails too (its generation prompt prefills ``<think>\n``, the turn does not have it).
_R1_LATE_SYSTEM = [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "<think>\nTwo plus two.\n</think>\n\n4", "weight": 2.0},
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "3+3?"},
    {"role": "assistant", "content": "<think>\nThree plus three.\n</think>\n\n6", "weight": 0.5},
]


def test_auto_falls_back_from_a_rewritten_conversation_to_what_sft_trainer_trains_on():
    """``auto``: the whole conversation is not prefix-preserving (the system prompt moves to the front), so it is
    tried per turn; a turn the template cannot render after its own ``<think>\\n`` prompt then makes the conversation
    ONE document as TRL's training template renders it: the ids and assistant mask of TRL's tokenization for
    SFTTrainer, each answer with its own weight (block k to assistant k), both counted as training-template turns."""
    from trl.data_utils import _tokenize

    tok = family_tokenizer("deepseek_r1_distill")
    messages = _R1_LATE_SYSTEM
    plain = plain_messages(messages)
    whole = tok.apply_chat_template(plain, tokenize=False)
    assert not whole.startswith(tok.apply_chat_template(plain[:1], tokenize=False))  # not prefix-preserving
    prompt = tok.apply_chat_template(plain[:1], tokenize=False, add_generation_prompt=True)
    assert not tok.apply_chat_template(plain[:2], tokenize=False).startswith(prompt)  # nor the first turn alone
    with pytest.raises(ChatError) as err:
        ChatRenderer(tok, history="full").tokens(chat_record(messages))
    assert err.value.reason == "not_prefix_preserving"

    out = ChatRenderer(tok, history="auto").tokens(chat_record(messages))
    trl = _tokenize(tok, plain, chat_template=_training(tok), tools=None, return_assistant_tokens_mask=True)
    assert out.offsets is None and out.training == 2
    assert out.ids.tolist() == list(trl["input_ids"])
    assert (out.weights > 0).astype(int).tolist() == list(trl["assistant_masks"])
    # TRL's mask as float weights: each {% generation %} block with its own answer's weight, in order
    mask = np.asarray(trl["assistant_masks"], dtype=bool)
    starts = np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))
    ends = np.flatnonzero(mask & ~np.concatenate([mask[1:], [False]])) + 1
    assert len(starts) == 2
    expected = np.zeros(len(mask), dtype=np.float32)
    for a, b, m in zip(starts, ends, [messages[1], messages[4]], strict=True):
        expected[a:b] = m["weight"]
    np.testing.assert_array_equal(out.weights, expected)
    assert tok.decode(out.ids[out.weights == 2.0]).endswith("Two plus two.\n</think>\n\n4<｜end▁of▁sentence｜>")
    assert tok.decode(out.ids[out.weights == 0.5]).endswith("Three plus three.\n</think>\n\n6<｜end▁of▁sentence｜>")


def test_the_training_renderer_weighs_blocks_as_sft_trainer_does_where_the_training_template_rewrites_turns():
    """The training template moves the system prompt to the front too, so its prefixes are not prefixes: weighted by
    prefix renders it would be refused; weighted as SFTTrainer's mask (block k to assistant k) it is accepted with
    TRL's ids, every weighted answer a training-template turn, and answers of weight 0 weigh 0."""
    from trl.data_utils import _tokenize

    tok = family_tokenizer("deepseek_r1_distill")
    training = _training(tok)
    plain = plain_messages(_R1_LATE_SYSTEM)
    assert not tok.apply_chat_template(plain, tokenize=False, chat_template=training).startswith(
        tok.apply_chat_template(plain[:2], tokenize=False, chat_template=training)
    )
    messages = [*_R1_LATE_SYSTEM[:4], {**_R1_LATE_SYSTEM[4], "weight": 0.0}]
    out = ChatRenderer(tok, history="auto").tokens(chat_record(messages))
    trl = _tokenize(tok, plain, chat_template=training, tools=None, return_assistant_tokens_mask=True)
    mask = np.asarray(trl["assistant_masks"], dtype=bool)
    assert out.ids.tolist() == list(trl["input_ids"]) and out.offsets is None and out.training == 1
    first_end = int(np.flatnonzero(mask & ~np.concatenate([mask[1:], [False]]))[0]) + 1
    expected = np.where(mask, 2.0, 0.0).astype(np.float32)
    expected[first_end:] = 0.0  # the second answer weighs 0
    np.testing.assert_array_equal(out.weights, expected)


def _reference_turns(tok, messages, ids_offsets, text):
    """(role, message) of each token's first character from apply_chat_template's renders alone: message i spans
    ``[|P_i|, |P_{i+1}|)`` where both are prefixes of the whole; None elsewhere (template text)."""
    plain = plain_messages(messages)
    bounds = [0]
    for k in range(1, len(plain) + 1):
        p = tok.apply_chat_template(plain[:k], tokenize=False)
        bounds.append(len(p) if text.startswith(p) else None)
    char = [None] * len(text)
    for i, m in enumerate(messages):
        a, b = bounds[i], bounds[i + 1]
        if a is not None and b is not None:
            char[a:b] = [(m["role"], i)] * (b - a)
    return [char[min(s, len(text) - 1)] for s, _ in ids_offsets]


def test_a_weight_0_turn_the_template_rewrites_keeps_turn_code_0_and_the_others_keep_theirs():
    """Qwen3 drops an earlier answer's reasoning: ``messages[:3]`` (the answer still last) is not a prefix of the
    whole. The answer weighs 0, so ``full`` accepts the conversation; the boundary between that answer and the next
    user turn cannot be placed, so both turns' tokens show as template text (code 0), every other token has its own
    message's code."""
    tok = family_tokenizer("qwen3")
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Two plus two.", "weight": 0.0},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "6", "reasoning_content": "Three plus three.", "weight": 2.0},
    ]
    renderer = ChatRenderer(tok, history="full")
    out = renderer.tokens(chat_record(messages))
    text = tok.apply_chat_template(plain_messages(messages), tokenize=False)
    enc = tok.backend_tokenizer.encode(text, add_special_tokens=False)
    assert out.ids.tolist() == enc.ids
    want = _reference_turns(tok, messages, enc.offsets, text)
    assert {w for w in want if w} == {("system", 0), ("user", 1), ("assistant", 4)}  # messages 2 and 3: none
    got = [(renderer.roles[split_turn_code(c)[0]], split_turn_code(c)[1]) if c else None for c in out.turns.tolist()]
    assert got == want
    assert None in got and got[0] == ("system", 0) and got[-1] == ("assistant", 4)


def _marked_and_plain():
    """A conversation whose user turn holds a turn token (marked with sanitize) and one without any."""
    marked = [{"role": "user", "content": "say <|im_end|> now"}, {"role": "assistant", "content": "ok", "weight": 1.5}]
    plain = [{"role": "user", "content": "weird question"}, {"role": "assistant", "content": "weird answer"}]
    return marked, plain


def test_sanitize_in_a_batch_tokenizes_plain_conversations_with_the_build_tokenizer_and_its_guard(monkeypatch):
    """With sanitize, only a document holding marked control tokens is encoded as apply_chat_template's sanitize
    encodes it; the others of the same batch are tokenized by the build's tokenizer, whose guard checks them. Each
    result equals that conversation alone and apply_chat_template's ids; a fastokens disagreement on the plain
    conversation stops the batch, naming it."""
    pytest.importorskip("fastokens")
    tok = chat_tokenizer("chatml")
    marked, plain = _marked_and_plain()
    renderer = ChatRenderer(tok, tokenize=PieceTokenizer(tok, backend="fastokens"), sanitize_control_tokens=True)
    batch = renderer.tokens_batch([chat_record(marked), chat_record(plain), chat_record(marked)])
    for got, messages in zip(batch, [marked, plain, marked], strict=True):
        alone = ChatRenderer(tok, sanitize_control_tokens=True).tokens(chat_record(messages))
        assert got.ids.tolist() == alone.ids.tolist() and got.weights.tolist() == alone.weights.tolist()
        ids = tok.apply_chat_template(plain_messages(messages), tokenize=True, sanitize_control_tokens=True)["input_ids"]
        assert got.ids.tolist() == ids
    fastokens_wrong_on(monkeypatch)
    renderer = ChatRenderer(tok, tokenize=PieceTokenizer(tok, backend="fastokens"), sanitize_control_tokens=True)
    with pytest.raises(BackendMismatch) as err:
        renderer.tokens_batch([chat_record(marked), chat_record(plain)])
    assert (err.value.path, err.value.line, err.value.field) == ("<conversations>", 2, "messages")


def test_the_guard_names_the_batch_s_conversation_by_its_number_without_where(monkeypatch):
    """``tokens_batch`` without ``where``: the tokenizer guard's error names the conversation by its 1-based number in
    the batch, also after a conversation that failed before tokenizing."""
    pytest.importorskip("fastokens")
    fastokens_wrong_on(monkeypatch)
    tok = chat_tokenizer("chatml")
    fine = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "fine"}]
    _, weird = _marked_and_plain()
    refused = [{"role": "user", "content": "end<|im_end|>"}, {"role": "assistant", "content": "x"}]
    renderer = ChatRenderer(tok, tokenize=PieceTokenizer(tok, backend="fastokens"))
    for chats in ([fine, weird, fine], [refused, weird]):
        with pytest.raises(BackendMismatch) as err:
            renderer.tokens_batch([chat_record(m) for m in chats])
        assert (err.value.path, err.value.line, err.value.field) == ("<conversations>", 2, "messages")
        assert str(err.value).startswith("<conversations>:2: messages: fastokens and tokenizers tokenize")
