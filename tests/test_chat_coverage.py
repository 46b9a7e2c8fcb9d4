"""The chat coverage harness (``benchmarks/chat_coverage.py``, ``docs/chat-coverage.md``): its tokenizers, its
reference and its classification; and, since every pair that apply_chat_template renders is now built exactly
under both flags (issue 22's goal), that this stays so (``test_every_template_is_classified``)."""

from __future__ import annotations

import numpy as np
import pytest
from chat_coverage_support import (
    OK,
    REJECTED_CORRECTLY,
    REJECTED_WRONGLY,
    SHAPES,
    STATUSES,
    UNVERIFIED,
    WRONG,
    Built,
    Doc,
    Reference,
    Rejected,
    attribute,
    candidates,
    classify,
    coverage_tokenizer,
    family_tokens,
    reference,
    run_coverage,
    shape_record,
    template_text,
    totals,
)
from chat_support import FAMILIES, plain_messages, reference_char_weights, reference_token_weights

SAMPLE = ["qwen2_5", "qwen3", "deepseek_r1_distill"]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("coverage")


def _tok(work, name):
    return coverage_tokenizer(name, str(work / "tokenizers" / name))


@pytest.mark.parametrize(
    ("name", "special", "plain", "text"),
    [
        (
            "qwen3",
            ["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
            ["<think>", "</think>", "<tool_call>"],
            ["<tools>"],
        ),
        (
            "deepseek_r1_distill",
            ["<｜Assistant｜>", "<｜begin▁of▁sentence｜>"],
            ["<｜tool▁sep｜>", "<think>"],
            [],
        ),
        ("gemma4", ["<|turn>", "<turn|>", '<|"|>', "<bos>"], [], []),
        ("llava_next", ["[INST]", "[/INST]", "<s>", "</s>"], [], []),
        ("phi3", ["<|user|>", "<|assistant|>", "<|end|>"], [], []),
    ],
)
def test_family_tokens_are_the_templates_control_tokens(work, name, special, plain, text):
    """Each family's markers are one added token each (special or not, as the real vocabularies have them); XML-like
    words the real vocabularies hold as text are not added."""
    fam = family_tokens(name, template_text(name))
    assert set(special) <= set(fam.specials) and set(plain) <= set(fam.plain)
    assert not set(text) & set(fam.specials + fam.plain)
    tok = _tok(work, name)
    by_content = {t.content: t for t in tok.added_tokens_decoder.values()}
    for t in special + plain:
        assert len(tok.encode(t, add_special_tokens=False)) == 1, t
        assert by_content[t].special == (t in special), t
    assert len(tok.encode("<tools>", add_special_tokens=False)) > 1


@pytest.mark.parametrize(
    ("family", "template"), [("chatml", "qwen2_5"), ("llama3", "llama3"), ("gemma", "gemma")]
)
@pytest.mark.parametrize("shape", ["one_turn", "multi_turn", "float_weights", "cjk_emoji"])
def test_the_reference_agrees_with_the_naive_string_search_reference(work, family, template, shape):
    """The prefix-render reference gives the weights that ``chat_support``'s search for each family's turn markers
    gives (the first token unlabeled, as every built document)."""
    tok, text = _tok(work, template), template_text(template)
    record = shape_record(shape, text)
    ref = reference(tok, record, text)
    assert ref.error is None and ref.whole is not None and ref.whole.weights is not None
    rendered = tok.apply_chat_template([{k: v for k, v in m.items() if k != "weight"} for m in
    record["messages"]],
                                       tokenize=False)  # fmt: skip
    enc = tok.backend_tokenizer.encode(rendered, add_special_tokens=False)
    naive, straddle = reference_token_weights(
        enc, reference_char_weights(FAMILIES[family], rendered, record["messages"], {"assistant": 1.0})
    )
    naive[0] = 0.0
    assert not straddle and not ref.whole.straddle
    np.testing.assert_array_equal(ref.whole.weights, naive)
    if shape == "float_weights":
        assert {0.5, 2.0} <= set(ref.whole.weights.tolist())


def test_the_tagged_reference_is_what_sfttrainer_masks(work):
    """Under a training template, the reference weighs exactly transformers' assistant_masks (float weights per
    generation block), and per turn only that turn's block."""
    from chat_coverage_support import assistant_masks

    tok = _tok(work, "qwen3")
    training = template_text("qwen3_training")
    record = shape_record("float_weights", training)
    ref = reference(tok, record, training)
    masks = assistant_masks(tok, record, training)
    assert (ref.whole.weights[1:] > 0).tolist() == [bool(m) for m in masks[1:]]
    assert set(ref.whole.weights.tolist()) == {0.0, 0.5, 2.0}
    first, second = ref.per_turn
    assert set(first.weights.tolist()) == {0.0, 0.5} and set(second.weights.tolist()) == {0.0, 2.0}


def test_generation_blocks_before_an_answer_s_content_are_its_turn_s(work):
    """Gemma's training template tags a turn's thinking channel, content and ``<turn|>`` apart: per turn, every
    block of the last turn (the thinking channel before its content too) carries its weight, which is then what
    ``assistant_masks`` marks in that turn; blocks of an earlier turn none."""
    from chat_coverage_support import _block_owners

    name = "diffusion_gemma_training"
    tok, text = _tok(work, name), template_text(name)
    record = shape_record("reasoning_multi", text)
    ref = reference(tok, record, text)
    assert ref.per_turn is not None and len(ref.per_turn) == 2
    last = ref.per_turn[1]
    assert "<|channel>" in tok.decode([t for t, w in zip(last.ids, last.weights, strict=True) if w > 0])
    # the rule itself: a block that ends before the assistant's content belongs to the turn that starts before it
    turns = [(1, {"content": "B"}), (3, {"content": "D"})]
    text, blocks = "A" * 10 + "xByD", [(10, 11), (11, 12), (12, 13), (13, 14)]  # x, B, y, D: two per turn
    assert _block_owners(text, blocks, turns, float, None, {1: 9, 3: 12}) == [1, 1, 3, 3]
    assert isinstance(_block_owners(text, blocks, turns, float, None), str)  # by contents alone: x has no owner


@pytest.fixture(scope="module")
def sample(work):
    return run_coverage(SAMPLE, work=work), run_coverage(SAMPLE, training_run=True, work=work)


#: (template, shape) cells classified wrong: none. A DeepSeek-R1 conversation, which its template cannot render after
#: its own ``<think>\n`` prompt, is built by default as TRL's training template renders it, weighted as SFTTrainer's
#: assistant mask (``<｜Assistant｜>`` and a reasoning's ``<think>`` included), and compared with that render. Listed
#: exactly: a new wrong cell fails the tests until it is fixed or listed here with its reason.
KNOWN_WRONG: set[tuple[str, str]] = set()


def test_the_sample_is_classified_in_full(sample):
    default, training = sample
    for rows in (default, training):
        assert [r.template for r in rows] == SAMPLE
        for row in rows:
            assert list(row.cells) == list(SHAPES), row.template
            assert all(c.status in STATUSES for c in row.cells.values())
        t = totals(rows)
        assert t.pairs == 3 * len(SHAPES) and sum(t.statuses.values()) == t.pairs
        assert t.exact <= t.renderable <= t.pairs
        wrong = {(r.template, s) for r in rows for s, c in r.cells.items() if c.status == WRONG}
        assert wrong <= KNOWN_WRONG, wrong  # built but not equal to apply_chat_template / the reference: a bug
    assert {(r.template, s) for r in default for s, c in r.cells.items() if c.status == WRONG} == {
        k for k in KNOWN_WRONG if k[0] in SAMPLE
    }
    # a known-good pair (the issue's own table: Qwen2.5, one turn)
    assert default[0].cells["one_turn"].status == OK
    assert all(r.note.startswith(f"`{r.template}_training`") for r in training)


def test_the_report_of_the_sample(sample):
    """benchmarks/chat_coverage.py's Markdown: both tables, their totals and the work list."""
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("chat_coverage", REPO / "benchmarks" / "chat_coverage.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    default, training = sample
    real = run_coverage(["GLM-4.7-Flash", "CohereForAI-c4ai-command-r7b-12-2024-tool_use"], ["one_turn"])
    text = bench.report("python benchmarks/chat_coverage.py --templates X", list(SHAPES), default, training, real)
    assert text.count("| template | one_turn | multi_turn |") == 3
    assert "| `qwen3` | ok |" in text and "`qwen3_training` |" in text
    assert "| `GLM-4.7-Flash` | ok |" in text  # the real templates' table, and what their refusals say
    assert "| `CohereForAI-c4ai-command-r7b-12-2024-tool_use` | ok |" in text
    t = totals(default)
    assert f"**{t.exact} of {t.renderable} renderable pairs built exactly ({t.percent:.1f}%)**" in text


def test_a_corrupted_build_is_classified_wrong(work):
    """The real build's outcome, altered before classification: a weight changed, a token changed, or a reject
    of a renderable conversation."""

    def corrupt(shape, outcome):
        assert isinstance(outcome, Built) and len(outcome.docs) == 1
        ids, weights = outcome.docs[0]
        if shape == "one_turn":
            weights = weights.copy()
            weights[-1] *= 2
        elif shape == "multi_turn":
            ids = [*ids[:-1], ids[-1] + 1]
        else:
            return Rejected("not_prefix_preserving", "messages[1]", "made up")
        return Built([(ids, weights)])

    (row,) = run_coverage(["qwen2_5"], ["one_turn", "multi_turn", "cjk_emoji"], work=work, corrupt=corrupt)
    weight, ids, refused = (row.cells[s] for s in ("one_turn", "multi_turn", "cjk_emoji"))
    assert (
        weight.status == WRONG
        and "render document 0: token" in weight.detail
        and "weight 2.0 instead of 1.0" in weight.detail
    )
    assert ids.status == WRONG and "equal no candidate" in ids.detail
    assert refused.status == REJECTED_WRONGLY and refused.text == "`not_prefix_preserving`"


def test_the_exact_forms_of_a_history_rewriting_template(work):
    """Qwen3, several turns: the whole render has no reference (earlier turns re-rendered), so a build equal to it is
    unverified; the training render and one document per turn are exact; a refusal is wrong (†)."""
    tok = _tok(work, "qwen3")
    record = shape_record("multi_turn", template_text("qwen3"))
    ref = reference(tok, record, template_text("qwen3"))
    train = reference(tok, record, template_text("qwen3_training"))
    assert ref.whole.weights is None and "differently once later messages follow" in ref.whole.why
    assert [name for name, _ in candidates(ref, train)] == ["render", "training", "per-turn"]
    as_docs = lambda docs: Built([(d.ids, d.weights) for d in docs])  # noqa: E731
    assert classify(ref, as_docs(ref.per_turn), train).text == "ok (per-turn)"
    assert classify(ref, as_docs([train.whole]), train).text == "ok (training)"
    assert classify(ref, as_docs([train.whole]), None).status == WRONG  # the training render is not asked for
    whole = Built([(ref.whole.ids, np.zeros(len(ref.whole.ids), np.float32))])
    assert classify(ref, whole, train).status == UNVERIFIED
    refused = classify(ref, Rejected("not_prefix_preserving", "messages[1]", "..."), train)
    assert refused.status == REJECTED_WRONGLY and refused.text == "`not_prefix_preserving` †"
    per_turn = ref.per_turn
    bad = Built([(per_turn[0].ids, per_turn[0].weights), (per_turn[1].ids, per_turn[1].weights * 0)])
    assert classify(ref, bad, train).status == WRONG


def test_rejects_and_vanished_conversations():
    renders = Reference(None, Doc([1, 2, 3], np.array([0, 1, 1], np.float32)))
    raises = Reference("TemplateError: System role not supported")
    assert classify(raises, Rejected("template_error", "messages", "...")).status == REJECTED_CORRECTLY
    assert classify(raises, Rejected("template_error", "messages", "...")).text == "n/a"
    assert classify(renders, Rejected("template_error", "messages", "...")).status == REJECTED_WRONGLY
    assert classify(raises, Built([([1], np.zeros(1, np.float32))])).status == WRONG
    assert classify(renders, Built([])).status == WRONG
    assert classify(renders, "UsageError: boom").status == WRONG
    # a render in which no token has a weight (SOLAR's answer made of tool calls it does not render): the build
    # drops the document as unsupervised, which is what it should do; one with a weight must not vanish
    weightless = Reference(None, Doc([1, 2, 3], np.zeros(3, np.float32)))
    assert classify(weightless, Built([])).status == OK
    assert classify(Reference(None, Doc([1, 2], None, "rewritten")), Built([])).status == WRONG
    # a template that rewrites history (no whole reference) whose per-turn documents straddle: exact only with the
    # straddling token at the larger weight, the reference's; any refusal is wrong
    per_turn = Reference(None, Doc([1, 2], None, "rewritten"), [Doc([1, 2], np.array([0, 1], np.float32), "", True)])
    assert classify(per_turn, Rejected("token_straddle", "messages[1]", "...")).status == REJECTED_WRONGLY
    assert classify(per_turn, Rejected("not_prefix_preserving", "messages[1]", "...")).status == REJECTED_WRONGLY
    straddled = classify(per_turn, Built([([1, 2], np.array([0, 1], np.float32))]))
    assert (straddled.status, straddled.text) == (OK, "ok (per-turn, straddle)")
    assert classify(per_turn, Built([([1, 2], np.array([0, 0], np.float32))])).status == WRONG


def test_a_render_with_no_weight_is_dropped_by_the_build(work):
    """SOLAR's template renders an assistant's ``tool_calls`` as nothing and writes no end of turn: the answer's
    span is empty, so the document has no weighted token and the build drops it (counted as unsupervised)."""
    (row,) = run_coverage(["upstage-SOLAR-10.7B-Instruct-v1.0"], ["tool_calls"], work=work)
    assert row.cells["tool_calls"].status == OK and row.cells["tool_calls"].text == "ok (no weight: dropped)"


def test_documents_are_attributed_in_input_order():
    """A record that left no document (dropped) takes none; the next record still finds its own."""
    a, b, c = (Doc([k, k + 1], np.array([0, 1], np.float32)) for k in (10, 20, 30))
    docs = [(a.ids, a.weights), (c.ids, c.weights), ([99], np.zeros(1, np.float32))]
    cands = [[[a]], [[b]], [[c]], [[Doc([5], None)]], [[Doc([6], None)]]]
    out = attribute(cands, {4: Rejected("r", "f", "p")}, docs)
    assert out[0] == Built([docs[0]]) and out[1] == Built([]) and out[2] == Built([docs[1]])
    assert isinstance(out[3], Rejected) and out[4] == Built([docs[2]])  # ids wrong: still its document


def test_every_template_is_classified(tmp_path):
    """Every template TRL ships, under both flags (~35 s): every pair classified, none built wrong, none that
    apply_chat_template renders refused."""
    from chat_coverage_support import template_names

    names = template_names()
    assert len(names) > 60
    default = run_coverage(names, work=tmp_path)
    training = run_coverage(
        [n for n in names if not n.endswith("_training")], training_run=True, work=tmp_path
    )
    for rows in (default, training):
        cells = [(r.template, s, c) for r in rows for s, c in r.cells.items()]
        assert all(c.status in STATUSES for _, _, c in cells)
    wrong = {(r.template, s) for rows in (default, training) for r in rows for s, c in r.cells.items() if c.status == WRONG}
    assert wrong == KNOWN_WRONG, wrong
    assert all(len(r.cells) == len(SHAPES) for r in default)
    # every pair apply_chat_template renders is built exactly, by default and with TRL's training template
    refused = {(r.template, s, c.text) for rows in (default, training) for r in rows for s, c in r.cells.items()
               if c.status == REJECTED_WRONGLY}  # fmt: skip
    assert not refused, sorted(refused)
    for rows in (default, training):
        t = totals(rows)
        assert t.exact == t.renderable, t


def test_the_eos_a_template_writes_after_the_last_message_only_closes_the_last_turn(work):
    """Phi-4-mini-reasoning writes ``eos_token`` after the last message where no generation prompt follows
    (``{% else %}{{ eos_token }}``), and a message that follows drops it: each earlier answer's weight ends at its
    ``<|end|>``, the last answer's takes that EOS too (``closing_text``). Checked against a search for the answers
    in the render."""
    from chat_coverage_support import closing_text, trailer_text

    name = "microsoft-Phi-4-mini-reasoning"
    tok, text = _tok(work, name), template_text(name)
    assert closing_text(text, tok) == tok.eos_token == "<|endoftext|>" and trailer_text(text, tok) == ""
    command_r7b = template_text("CohereForAI-c4ai-command-r7b-12-2024-tool_use")
    assert closing_text(command_r7b, tok) == ""  # an opener after every render: a trailer, not a closing
    record = shape_record("multi_turn", text)
    ref = reference(tok, record, text)
    assert ref.whole is not None and ref.whole.weights is not None, ref.whole.why
    rendered = tok.apply_chat_template(plain_messages(record["messages"]), tokenize=False)
    char_w = np.zeros(len(rendered), np.float32)
    for m, end in zip(record["messages"][1::2], ("<|end|>", "<|end|><|endoftext|>"), strict=True):
        start = rendered.index("<|assistant|>" + m["content"] + end) + len("<|assistant|>")
        char_w[start : start + len(m["content"] + end)] = 1.0
    enc = tok.backend_tokenizer.encode(rendered, add_special_tokens=False)
    want, _ = reference_token_weights(enc, char_w)
    want[0] = 0.0
    np.testing.assert_array_equal(ref.whole.weights, want)
    weighted = tok.decode([t for t, w in zip(ref.whole.ids, ref.whole.weights, strict=True) if w])
    assert weighted.count("<|endoftext|>") == 1


def test_a_token_across_the_end_of_the_generation_prompt_carries_the_answers_weight(work):
    """ERNIE's generation prompt ends with a space (``Assistant: ``) and the render goes on with the answer: the
    answer's weight starts after the prompt's characters (as the reference's docstring says), so a token that
    holds that space and the answer's first letter (`` I`` of ``It is 18 ...`` in this vocabulary) crosses the
    change. It holds a character of the answer: weight 1 in the reference, as ``assistant_masks`` marks it, and
    the build gives exactly that (ok), where it used to refuse the pair (``token_straddle``)."""
    name = "baidu-ERNIE-4.5-21B-A3B-Base-PT"
    tok, text = _tok(work, name), template_text(name)
    record = shape_record("tool_message", text)
    ref = reference(tok, record, text)
    rendered = tok.apply_chat_template(plain_messages(record["messages"]), tokenize=False)
    enc = tok.backend_tokenizer.encode(rendered, add_special_tokens=False)
    change = rendered.index("Assistant: It") + len("Assistant: ")
    # the premise: one token holds " I"
    (across,) = [t for t, (s, e) in enumerate(enc.offsets) if s < change < e]
    assert ref.whole is not None and ref.whole.straddle
    assert ref.whole.weights[across] == 1.0 and ref.whole.weights[across - 1] == 0.0
    cell = classify(ref, Rejected("token_straddle", "messages[3]", "token 335 (' I') crosses ..."))
    assert cell.status == REJECTED_WRONGLY
    (row,) = run_coverage([name], ["tool_message"], work=work)
    assert (row.cells["tool_message"].status, row.cells["tool_message"].text) == (OK, "ok (straddle)")


def test_templates_on_a_real_size_vocabulary(tmp_path):
    """``base``: the templates' tokenizers take a given vocabulary (here the sample's 4,096-id byte-level BPE, whose
    merges hold `` The``) with the family's tokens added: Qwen2.5 is still exact, and ERNIE's prompt, which ends
    with a space (``Assistant: ``), meets the answer's first word in one token, which carries the answer's weight in
    the reference and in the build."""
    from conftest import REPO

    base = str(REPO / "sample_data" / "tokenizer" / "tokenizer.json")
    tok = coverage_tokenizer("qwen2_5", str(tmp_path / "tok"), base)
    assert len(tok) >= 4096 and len(tok.tokenize("<|im_start|>")) == 1
    rows = run_coverage(["qwen2_5", "baidu-ERNIE-4.5-21B-A3B-Base-PT"], ["one_turn"], work=tmp_path, base=base)
    assert [r.cells["one_turn"].text for r in rows] == ["ok", "ok (straddle)"]
