"""The chat stage's alignment at its edges (``weightprep.stages.chat``): TRL's training mask where a tagged template
rewrites history, a weighted message the template writes nothing for, empty and stray ``{% generation %}`` blocks,
the error that names where a generation prompt leaves its turn, ``chat_template_kwargs``, a renderer whose results
do not depend on what it rendered before, and how the control tokens are split into turn structure and in-turn
markers. Expectations come from transformers' own renders (``apply_chat_template``)."""

from __future__ import annotations

import numpy as np
import pytest
from chat_support import build_chat_tokenizer, chat_record, plain_messages
from hypothesis import example, given, settings
from hypothesis import strategies as st

from weightprep.stages.chat import ChatError, ChatRenderer
from weightprep.stages.chat_align import char_runs

SPECIALS = ("<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>")


def _tok(template: str, plain: tuple[str, ...] = ()):
    return build_chat_tokenizer(SPECIALS, "<s>", "</s>", template, plain=plain)


def _weighted_text(tok, out, weight: float) -> str:
    return tok.decode(out.ids[out.weights == weight].tolist())


#: Tagged, two blocks an answer (its content, then its end), and an answer's reasoning shown in the last turn only:
#: a rendered prefix ends with the reasoning the whole conversation drops (not prefix-preserving).
REWRITING_TRAINING = (
    "{% for m in messages %}{% if m.role == 'user' %}<|user|>{{ m.content }}<|end|>{% else %}<|assistant|>"
    "{% if loop.last and m.reasoning %}<think>{{ m.reasoning }}</think>{% endif %}"
    "{% generation %}{{ m.content }}{% endgeneration %}{% generation %}<|end|>{% endgeneration %}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.mark.parametrize("answers", [1, 2])
def test_training_templates_that_rewrite_history_weigh_every_block_as_sfttrainer_masks_it(answers):
    """Two blocks an answer, all answers of one weight: every block carries that weight (TRL's assistant mask),
    though the template rewrites earlier turns."""
    tok = _tok(REWRITING_TRAINING, plain=("<think>", "</think>"))
    messages = []
    for k in range(answers):
        messages += [{"role": "user", "content": f"q{k}"}, {"role": "assistant", "content": f"a{k}", "reasoning": f"r{k}"}]
    out = ChatRenderer(tok, role_weights={"assistant": 2.0}, training=True).tokens(chat_record(messages))
    ref = tok.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
    assert out.ids.tolist() == ref["input_ids"]
    assert (out.weights == 2.0).astype(int).tolist() == ref["assistant_masks"]
    assert set(out.weights.tolist()) == {0.0, 2.0}
    if answers == 2:  # the rewrite is real: without the training mask the conversation cannot be aligned
        with pytest.raises(ChatError) as caught:
            ChatRenderer(tok, role_weights={"assistant": 2.0}).tokens(chat_record(messages))
        assert caught.value.reason == "not_prefix_preserving"


#: Writes nothing for a message without content.
SKIPS_EMPTY = (
    "{% for m in messages %}{% if m.content %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_a_weighted_message_the_template_writes_nothing_for_carries_no_weight():
    tok = _tok(SKIPS_EMPTY)
    messages = [{"role": "user", "content": ""}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    out = ChatRenderer(tok, role_weights={"user": 0.5, "assistant": 1.0}).tokens(chat_record(messages))
    assert out.ids.tolist() == tok.apply_chat_template(messages)["input_ids"]
    assert _weighted_text(tok, out, 0.5) == "q<|end|>" and _weighted_text(tok, out, 1.0) == "a<|end|>"


def _diverge(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def test_a_generation_prompt_that_leaves_its_turn_is_built_from_where_the_renders_part():
    """A generation prompt that is not how the template renders the turn (``<|assistant|>:`` vs ``<|assistant|>\\n``):
    the turn's weight starts at the first token where the two renders differ (``chat_spans``), under every
    history mode; the ids are the template's own render."""
    template = (
        "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>:{% endif %}"
    )
    tok = _tok(template)
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                {"role": "user", "content": "next question"}, {"role": "assistant", "content": "b", "weight": 2.0}]  # fmt: skip
    for history in ("auto", "full"):
        out = ChatRenderer(tok, history=history).tokens(chat_record(messages))
        assert out.ids.tolist() == tok.apply_chat_template(messages)["input_ids"]
        assert _weighted_text(tok, out, 1.0) == "\na<|end|>" and _weighted_text(tok, out, 2.0) == "\nb<|end|>"


def test_a_template_that_writes_its_prompt_after_every_render_weights_it_0_and_ends_turns_before_it():
    """A template that appends its generation prompt whatever ``add_generation_prompt`` says (Command R7B's
    tool_use opener) and renders the answer without its prefill: every turn ends before that trailer, the last
    one's included, and the trailer has weight 0 (``chat_spans.trailer``); ids as ``apply_chat_template``'s."""
    template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}<|assistant|><|think|>"
    tok = _tok(template)
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                {"role": "user", "content": "r"}, {"role": "assistant", "content": "b", "weight": 2.0}]  # fmt: skip
    out = ChatRenderer(tok, history="auto").tokens(chat_record(messages))
    assert out.ids.tolist() == tok.apply_chat_template(messages)["input_ids"]
    assert _weighted_text(tok, out, 1.0) == "a<|end|>" and _weighted_text(tok, out, 2.0) == "b<|end|>"
    n = len(tok.encode("<|assistant|><|think|>", add_special_tokens=False))
    assert tok.decode(out.ids[-n:].tolist()) == "<|assistant|><|think|>" and not out.weights[-n:].any()


#: Tagged chatml-like; with a block in the preamble, outside every assistant turn.
TAGGED = (
    "{% for m in messages %}{% if m.role == 'user' %}<|user|>{{ m.content }}<|end|>{% else %}<|assistant|>"
    "{% generation %}{{ m.content }}<|end|>{% endgeneration %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
STRAY = "{% generation %}{{ bos_token }}{% endgeneration %}" + TAGGED
EMPTY_BLOCK = TAGGED.replace("{{ m.content }}<|end|>{% endgeneration %}", "{{ m.content }}{% endgeneration %}<|end|>")


def test_an_empty_generation_block_is_no_stray_block():
    """An answer without content has an empty block (no character): nothing to weigh, nothing refused."""
    tok = _tok(EMPTY_BLOCK)
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""},
                {"role": "user", "content": "r"}, {"role": "assistant", "content": "b"}]  # fmt: skip
    out = ChatRenderer(tok).tokens(chat_record(messages))
    ref = tok.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
    assert out.ids.tolist() == ref["input_ids"] and (out.weights > 0).astype(int).tolist() == ref["assistant_masks"]
    assert _weighted_text(tok, out, 1.0) == "b"


@pytest.mark.parametrize("first", [0.0, 1.0])
def test_a_block_outside_every_answer_is_refused_only_where_every_answer_is_trained(first):
    """SFTTrainer trains on the preamble's block; weightprep cannot tell its weight, so it refuses the conversation
    where every answer weighs > 0. Where one weighs 0 the block is taken as that weight: 0."""
    tok = _tok(STRAY)
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "weight": first},
                {"role": "user", "content": "r"}, {"role": "assistant", "content": "b"}]  # fmt: skip
    render = ChatRenderer(tok)
    if first > 0:
        with pytest.raises(ChatError) as caught:
            render.tokens(chat_record(messages))
        assert caught.value.reason == "generation_tag_mismatch"
        return
    out = render.tokens(chat_record(messages))
    assert out.ids.tolist() == tok.apply_chat_template(plain_messages(messages))["input_ids"]
    assert out.weights[0] == 0.0 and tok.decode(out.ids[:1]) == "<s>"
    assert _weighted_text(tok, out, 1.0) == "b<|end|>"


GREETING = (
    "{% if greeting is defined %}[{{ greeting }}]{% endif %}{% if tools %}[{{ tools | length }} tools]{% endif %}"
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TOOL = {"type": "function", "function": {"name": "f", "parameters": {}}}


def test_chat_template_kwargs_reach_the_template():
    tok = _tok(GREETING)
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    out = ChatRenderer(tok).tokens(chat_record(messages, kwargs={"greeting": "hi"}))
    assert out.ids.tolist() == tok.apply_chat_template(messages, greeting="hi")["input_ids"]
    assert tok.decode(out.ids.tolist()).startswith("[hi]")


_variants = st.tuples(st.sampled_from([None, [TOOL], [TOOL, TOOL]]), st.sampled_from([None, {}, {"greeting": "hi"}]))


@settings(max_examples=25, deadline=None)
@given(order=st.lists(_variants, min_size=2, max_size=5))
@example(order=[(None, {}), (None, {"greeting": "hi"})])  # two keyword sets, no tools: each its own preamble
def test_a_renderer_gives_each_conversation_what_a_fresh_one_gives(order):
    """Whatever the renderer rendered before (its preamble renders are kept per tools and keyword arguments): the
    same ids, weights and turns as a new renderer's. The system message is weighted, so its turn starts after the
    preamble, which the tools and the greeting write."""
    tok = _tok(GREETING)
    messages = [{"role": "system", "content": "s", "weight": 0.5}, {"role": "user", "content": "q"},
                {"role": "assistant", "content": "a"}]  # fmt: skip
    shared = ChatRenderer(tok)
    for tools, kwargs in order:
        chat = chat_record(messages, tools, kwargs)
        got, want = shared.tokens(chat), ChatRenderer(tok).tokens(chat)
        for field in ("ids", "weights", "turns"):
            np.testing.assert_array_equal(getattr(got, field), getattr(want, field))
        preamble = len((f"[{kwargs['greeting']}]" if kwargs else "") + (f"[{len(tools)} tools]" if tools else ""))
        codes = got.turns[: int(np.searchsorted(np.cumsum([len(tok.decode([i])) for i in got.ids]), preamble, "right"))]
        assert not codes.any()  # the preamble's tokens are no message's


#: A template whose turns start with their content (no header before it), ending in a control token; it writes
#: ``<tool_call>`` only for an answer's tool calls.
CONTENT_FIRST = (
    "{% for m in messages %}{{ m.content }}{% if m.tool_calls %}<tool_call>{{ m.tool_calls }}{% endif %}<|end|>"
    "{% endfor %}"
)
#: Only the answers have a header (the user's turn has none before its content).
ANSWER_HEADER = (
    "{% for m in messages %}{% if m.role == 'assistant' %}<|assistant|>{% endif %}{{ m.content }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_turns_that_start_with_their_content_are_read_for_structure():
    """``<|end|>`` ends a turn (structure); ``<tool_call>``, written only inside an answer, is an in-turn marker."""
    render = ChatRenderer(_tok(CONTENT_FIRST, plain=("<tool_call>",)))
    turn, in_turn = render.control_tokens()
    assert in_turn == ("<tool_call>",) and "<|end|>" in turn


def test_a_control_token_that_only_the_preamble_writes_is_turn_structure():
    """What the template writes before any message (``<|sys|>``) is read from the preamble, which no turn holds."""
    template = "<|sys|>" + CONTENT_FIRST
    render = ChatRenderer(build_chat_tokenizer((*SPECIALS, "<|sys|>"), "<s>", "</s>", template))
    turn, in_turn = render.control_tokens()
    assert "<|sys|>" in turn and "<|sys|>" not in in_turn


def test_a_generation_prompt_token_is_a_role_header_even_where_the_user_has_none():
    """The user's turn has no control token before its content, yet an answer's header is one token: at least one
    of the generation prompt's tokens is the assistant's header, so ``<|assistant|>`` is turn structure."""
    render = ChatRenderer(_tok(ANSWER_HEADER))
    turn, in_turn = render.control_tokens()
    assert "<|assistant|>" in turn and in_turn == ()


#: EOS after the last message only where it is a user's: the render of [user] ends with EOS, that of [user,
#: assistant] does not -- not an EOS written after every render (Phi-3's), which turns would end before.
EOS_AFTER_USER = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
    "{% if messages[-1].role == 'user' %}</s>{% endif %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
EOS_AFTER_ASSISTANT = EOS_AFTER_USER.replace("'user'", "'assistant'")
EOS_AFTER_EVERY_RENDER = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}</s>"
#: the same, refusing to render no message (it reads the first message's role)
EOS_AFTER_EVERY_RENDER_OF_SOME = "{% if messages[0]['role'] == 'system' %}[s]{% endif %}" + EOS_AFTER_EVERY_RENDER


@pytest.mark.parametrize(
    ("template", "trails"),
    [(EOS_AFTER_USER, False), (EOS_AFTER_ASSISTANT, False), (EOS_AFTER_EVERY_RENDER, True),
     (EOS_AFTER_EVERY_RENDER_OF_SOME, True)],
)  # fmt: skip
def test_an_eos_is_a_trailer_only_where_every_render_ends_with_it(template, trails):
    assert ChatRenderer(_tok(template))._trails_eos() is trails


# ---- align: the tokens' weights from the characters' (offsets given here, as the two span sources give them) ----


def _align(text: str, char_w: list[float], spans: list[tuple[int, int]], ids=None, exact: bool = True):
    tok = _tok(GREETING)
    chat = chat_record([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
    ids = np.arange(10, 10 + len(spans), dtype=np.int32) if ids is None else np.asarray(ids, dtype=np.int32)
    starts, ends = (np.array([s[k] for s in spans], dtype=np.int64) for k in (0, 1))
    w = np.asarray(char_w, dtype=np.float32)
    runs = char_runs(w, np.zeros(len(text), dtype=np.int32))
    return ChatRenderer(tok).align(chat, text, runs, ids, starts, ends, exact=exact)


@pytest.mark.parametrize(
    ("text", "char_w", "spans", "weights", "straddling"),
    [
        # a multi-byte character split: its first byte alone, then its last with the next character
        ("xy", [0.0, 1.0], [(0, 1), (0, 2)], [0.0, 1.0], 1),
        ("xyz", [0.0, 0.0, 1.0], [(0, 1), (1, 3)], [0.0, 1.0], 1),  # the last token crosses the change
        ("xyz", [0.0, 1.0, 1.0], [(0, 2), (2, 3)], [1.0, 1.0], 1),  # the first one does
        ("xyz", [2.0, 0.0, 1.0], [(0, 3)], [2.0], 0),  # the heaviest first: no heavier than its first character
        ("xyzw", [0.0, 1.0, 2.5, 0.0], [(0, 4)], [2.5], 1),  # two changes up and one down in one token
    ],
)
def test_a_token_across_a_change_of_weight_takes_its_heaviest_characters_weight(
    text, char_w, spans, weights, straddling
):
    """A token across a change of weight is in the mask as transformers' ``assistant_masks`` puts it there (any
    character of it in a generation block): the largest weight of its characters; counted where that is more
    than its first character's."""
    out = _align(text, char_w, spans)
    assert out.weights.tolist() == weights
    assert out.straddling == straddling


def test_tokens_that_end_at_a_change_are_not_across_it():
    out = _align("xyz", [0.0, 1.0, 1.0], [(0, 1), (1, 2), (2, 3)])
    assert out.weights.tolist() == [0.0, 1.0, 1.0]


def test_characters_of_weight_0_in_no_token_are_allowed_where_weighted_ones_are_not():
    """tokenizers' offsets (checked): trailing spaces of weight 0 outside every token are fine."""
    out = _align("ab  ", [1.0, 1.0, 0.0, 0.0], [(0, 2)], exact=False)
    assert out.weights.tolist() == [1.0]
    with pytest.raises(ChatError) as caught:
        _align("ab  ", [1.0, 1.0, 0.5, 0.0], [(0, 2)], exact=False)  # any weight above 0
    assert caught.value.reason == "bad_offsets" and "weighted character 2 " in caught.value.problem


def test_one_bos_or_a_bos_second_is_not_two_leading_bos():
    bos = _tok(GREETING).bos_token_id
    assert _align("<s>", [0.0, 0.0, 0.0], [(0, 3)], ids=[bos]).ids.tolist() == [bos]
    assert _align("x<s>", [0.0] * 4, [(0, 1), (1, 4)], ids=[11, bos]).ids.tolist() == [11, bos]
    with pytest.raises(ChatError) as caught:
        _align("<s><s>", [0.0] * 6, [(0, 3), (3, 6)], ids=[bos, bos])
    assert caught.value.reason == "double_bos"


def test_each_token_takes_its_first_characters_weight_and_an_empty_token_none():
    """A token at the last character takes that character's weight; an empty token (an end offset at its start, as
    tokenizers gives an added EOS) carries nothing, even at the end of the text."""
    assert _align("xyz", [0.0, 1.0, 2.0], [(0, 1), (1, 2), (2, 3)]).weights.tolist() == [0.0, 1.0, 2.0]
    assert _align("x", [1.0], [(0, 1), (1, 1)]).weights.tolist() == [1.0, 0.0]
    assert _align("xy", [1.0, 1.0], [(0, 2), (2, 2)]).weights.tolist() == [1.0, 0.0]


def test_a_token_with_no_characters_takes_the_turn_of_its_place():
    """A token with no characters (an added EOS after the text) weighs nothing and takes the turn of the character
    it stands after, the document's last; in an empty document, turn 0."""
    tok = _tok(GREETING)
    chat = chat_record([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
    renderer = ChatRenderer(tok)
    ids = np.array([10, 11], dtype=np.int32)
    for text, turns in (("x", [5]), ("xy", [5, 6])):
        runs = char_runs(np.ones(len(text), dtype=np.float32), np.array(turns, dtype=np.int32))
        n = len(text)
        out = renderer.align(chat, text, runs, ids, np.array([0, n]), np.array([n, n]))
        assert (out.weights.tolist(), out.turns.tolist()) == ([1.0, 0.0], [5, turns[-1]])
    empty = char_runs(np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int32))
    out = renderer.align(chat, "", empty, ids[:1], np.array([0]), np.array([0]))
    assert (out.weights.tolist(), out.turns.tolist()) == ([0.0], [0])


def test_a_token_across_a_turn_boundary_takes_the_turn_of_its_heaviest_character():
    """One token over the user's turn (weight 0) and the answer's (weight 1) is the answer's: its weight and its
    turn code, those of the first character of the answer's weight."""
    tok = _tok(GREETING)
    chat = chat_record([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
    renderer = ChatRenderer(tok)
    text = "abcdef"
    w = np.array([0, 0, 1, 1, 2, 2], dtype=np.float32)
    turns = np.array([5, 5, 6, 6, 7, 7], dtype=np.int32)
    ids = np.array([10, 11], dtype=np.int32)
    out = renderer.align(chat, text[:4], char_runs(w[:4], turns[:4]), ids, np.array([0, 1]), np.array([1, 4]))
    assert (out.weights.tolist(), out.turns.tolist(), out.straddling) == ([0.0, 1.0], [5, 6], 1)
    out = renderer.align(chat, text, char_runs(w, turns), ids, np.array([0, 1]), np.array([1, 6]))
    assert (out.weights.tolist(), out.turns.tolist(), out.straddling) == ([0.0, 2.0], [5, 7], 1)


def _reference_alignment(char_w: list[float], spans: list[tuple[int, int]]):
    """Per token the largest weight of its characters (0 without characters), the index of its first character of
    that weight (its first character's, clipped to the text, without characters), and how many tokens are heavier
    than their first character: character by character, independently of ``align_tokens``."""
    weights, heaviest, straddling = [], [], 0
    for s, e in spans:
        if e > s:
            top = max(char_w[s:e])
            weights.append(top)
            heaviest.append(s + char_w[s:e].index(top))
            straddling += top > char_w[s]
        else:
            weights.append(0.0)
            heaviest.append(min(s, len(char_w) - 1))
    return weights, heaviest, straddling


_DOCUMENT = st.integers(0, 12).flatmap(
    lambda n: st.tuples(
        st.lists(st.sampled_from([0.0, 1.0, 2.5]), min_size=n, max_size=n),
        # cuts of the text into tokens (forwards, covering it); a cut repeated is a token with no characters
        st.lists(st.integers(0, n), max_size=8).map(lambda cuts: sorted({0, n, *cuts}) if n else [0]),
        st.lists(st.integers(0, 2), max_size=3),  # tokens with no characters at the end (added EOS)
        st.booleans(),  # two leading BOS (where it has two tokens)
        st.booleans(),  # its last token's end past its last character (offsets that overhang; not ``within``)
    )
)


@pytest.mark.parametrize("within", [False, True])
@settings(max_examples=150, deadline=None)
@given(docs=st.lists(_DOCUMENT, max_size=6))
@example(docs=[([1.0, 1.0], [0, 2], [], False, False), ([0.0, 0.0], [0, 2], [], False, False)])  # a change at a start
@example(docs=[([0.0, 1.0], [0, 2], [], False, False), ([], [0], [], True, False)])  # a straddle, then an empty document
@example(docs=[([0.0, 1.0, 1.0], [0, 1, 3], [], False, False), ([2.5], [0, 1], [], False, False)])  # all with characters
@example(docs=[([0.0, 1.0], [0, 1, 2], [0], False, True), ([2.5, 0.0], [0, 2], [], False, False)])  # an overhang
def test_documents_aligned_end_to_end_are_each_aligned_alone(docs, within):
    """``align_tokens`` over documents end to end (what ``tokens_batch`` does for a block): each document's token
    weights, turns, straddling count and double BOS are those of a character-by-character reference of it alone; a
    document's first character is no change of weight, whatever the document before it ends with. The tokens end
    within their documents, as ``within`` says (``TokenSpans``' spans): the same either way."""
    from weightprep.stages.chat_align import align_tokens

    bos = 1
    char_w, turns, ids, starts, ends, char_base, tok_base = [], [], [], [], [], [0], [0]
    expected = []
    for d, (w, cuts, empty, two_bos, overhang) in enumerate(docs):
        spans = [(a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True)] + [(len(w), len(w))] * (len(empty) + 0)
        if overhang and not within and len(cuts) > 1:  # clipped to the document: the reference's slices clip too
            spans[len(cuts) - 2] = (spans[len(cuts) - 2][0], len(w) + 2)
        # two leading BOS, or (every other document) one BOS and then another token
        lead = [bos, bos] if two_bos else [bos] if d % 2 == 0 else []
        doc_ids = (lead + [7 + d] * len(spans))[: len(spans)]
        char_w += w
        turns += [100 * d + c for c in range(len(w))]
        ids += doc_ids
        starts += [s for s, _ in spans]
        ends += [e for _, e in spans]
        char_base.append(char_base[-1] + len(w))
        tok_base.append(tok_base[-1] + len(spans))
        weights, heaviest, straddling = _reference_alignment(w, spans)
        turn = [100 * d + c if w else 0 for c in heaviest]
        expected.append((weights, turn, straddling, len(doc_ids) > 1 and doc_ids[:2] == [bos, bos]))
    found = align_tokens(
        np.array(char_base), np.array(char_w, dtype=np.float32), np.array(turns, dtype=np.int32), np.array(tok_base),
        np.array(ids, dtype=np.int32), np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64), bos,
        within=within,
    )  # fmt: skip
    for d, (weights, turn, straddling, two) in enumerate(expected):
        a, b = tok_base[d], tok_base[d + 1]
        assert found.weights[a:b].tolist() == weights
        assert found.turns[a:b].tolist() == turn
        assert int(found.straddling[d]) == straddling
        assert bool(found.double_bos[d]) == two
        assert bool(found.bad()[d]) == two


#: Role headers written as text (Laguna's ``<assistant>\n``); the prompt prefills ``</think>`` after the header.
TEXT_HEADERS = (
    "{% for m in messages %}<{{ m.role }}>\n{% if m.role == 'assistant' %}</think>\n{% endif %}{{ m.content }}\n"
    "</{{ m.role }}>\n{% endfor %}{% if add_generation_prompt %}<assistant>\n</think>{% endif %}"
)


def test_a_marker_prefilled_after_a_text_role_header_is_in_turn():
    """Where a role header is text, the control token the generation prompt prefills after it is no header: an
    in-turn marker, which an answer's content may hold as the token ``apply_chat_template`` makes of it."""
    tok = _tok(TEXT_HEADERS, plain=("<think>", "</think>"))
    renderer = ChatRenderer(tok, history="auto")
    turn, in_turn = renderer.control_tokens()
    assert "</think>" in in_turn and "</think>" not in turn
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>r</think>a"}]
    out = renderer.tokens(chat_record(messages))
    assert out.ids.tolist() == tok.apply_chat_template(messages)["input_ids"]


@pytest.mark.parametrize("family", ["chatml", "llama3"])  # without BOS, and with one opening every render
def test_a_conversation_longer_than_an_alignment_run_is_aligned_as_its_characters_say(family):
    """``tokens_batch`` aligns a batch's documents in the runs of about ``_CHUNK_TOKENS`` tokens that their spans
    come in (``TokenSpans.runs``, ``ChatRenderer._align_exact``): a conversation longer than a run is a run of its
    own, and every conversation of the batch gets the tokens tokenizers give its render, each weighing the largest
    of its characters' weights (``chat_support.reference_token_weights``)."""
    from chat_support import FAMILIES, chat_tokenizer, reference_char_weights, reference_token_weights
    from tokenizers import AddedToken

    from weightprep.stages import spans

    tok = chat_tokenizer(family)
    tok.add_tokens([AddedToken("<sep>", rstrip=True)])  # no fixed bytes: a conversation holding it is left out
    renderer = ChatRenderer(tok)
    long = "word " * spans._CHUNK_TOKENS
    conversations = [
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello.", "weight": 2.0}],
        [{"role": "user", "content": long}, {"role": "assistant", "content": long + "end.", "weight": 0.5}],
        [{"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Bye."}],
        [{"role": "user", "content": "a <sep>   b"}, {"role": "assistant", "content": "Sep.", "weight": 1.5}],
        [{"role": "user", "content": "Last"}, {"role": "assistant", "content": "One."}],
    ]
    batch = renderer.tokens_batch([chat_record(m) for m in conversations])
    for messages, got in zip(conversations, batch, strict=True):
        text = renderer.char_weights(chat_record(messages))[0]
        enc = tok.backend_tokenizer.encode(text, add_special_tokens=False)
        char_w = reference_char_weights(FAMILIES[family], text, messages, {"assistant": 1.0})
        assert got.ids.tolist() == enc.ids
        assert got.weights.tolist() == reference_token_weights(enc, char_w)[0].tolist()
    assert len(batch[0].ids) + sum(len(c.ids) for c in batch[2:]) < spans._CHUNK_TOKENS < len(batch[1].ids)


@settings(max_examples=150, deadline=None)
@given(docs=st.lists(_DOCUMENT, max_size=6), empty=st.lists(st.tuples(st.integers(0, 80), st.sampled_from([0.0, 3.0, 9.0])), max_size=6))
def test_runs_that_hold_no_character_change_nothing(docs, empty):
    """``align_runs`` over runs with runs of no character among them (a start repeated, or one at the documents'
    end: what a template's cuts give for a message it writes nothing for), of any weight, aligns as the runs of the
    characters alone (``char_runs``): a run of no character is no token's, however heavy."""
    from weightprep.stages.chat_align import Runs, align_runs, char_runs

    char_w, turns, starts, ends, char_base, tok_base = [], [], [], [], [0], [0]
    for d, (w, cuts, _, _, _) in enumerate(docs):
        spans = list(zip(cuts[:-1], cuts[1:], strict=True))
        char_w += w
        turns += [10 * d + c for c in range(len(w))]
        starts += [char_base[-1] + s for s, _ in spans]
        ends += [char_base[-1] + e for _, e in spans]
        char_base.append(char_base[-1] + len(w))
        tok_base.append(tok_base[-1] + len(spans))
    runs = char_runs(np.array(char_w, dtype=np.float32), np.array(turns, dtype=np.int32))
    places = [*runs.starts.tolist(), len(char_w)]  # where a run may hold nothing: at a run's start, or at the end
    rows = [(a, w, t, True) for a, w, t in zip(runs.starts.tolist(), runs.weights.tolist(), runs.turns.tolist(), strict=True)]
    rows += [(places[at % len(places)], weight, 77, False) for at, weight in empty]
    rows.sort(key=lambda row: (row[0], row[3]))  # an empty run before the run of characters that starts there
    padded = Runs([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
    args = (np.array(tok_base), np.zeros(tok_base[-1], dtype=np.int32), np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64), None)
    want = align_runs(np.array(char_base), runs, *args, within=True)
    got = align_runs(np.array(char_base), padded, *args, within=True)
    assert got.weights.tolist() == want.weights.tolist()
    assert got.turns.tolist() == want.turns.tolist()
    assert got.straddling.tolist() == want.straddling.tolist()
