"""Other tools' record shapes, recognized by their keys: each gives the same shards, byte for byte, as the canonical
record written by hand that it stands for (weightprep.stages.shapes; docs/inputs.md)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from weightprep.config import config_from_dict
from weightprep.pipeline import build
from weightprep.stages.validate import check_line

TOOL = {"name": "get_time", "description": "The time in a city", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}}, "required": ["city"]}}  # fmt: skip


@pytest.fixture(scope="module")
def chatml():
    from chat_support import chat_tokenizer

    return chat_tokenizer("chatml")  # Qwen2.5's template: system default, tools, tool calls


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def _same_shards(
    tmp_path: Path, tok, theirs: list[dict], ours: list[dict], name: str = "theirs.json", columns: str | None = None
) -> Path:
    """Build ``theirs`` (as a JSON array, with ``columns``) and ``ours`` (JSON Lines): the same shards and counts."""
    config = config_from_dict({"pack": {"seq_len": 2048}})
    if name.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(theirs), tmp_path / name)
    else:
        (tmp_path / name).write_text(json.dumps(theirs, indent=2), encoding="utf-8")
    theirs_config = config_from_dict({"pack": {"seq_len": 2048}, "read": {"columns": columns}})
    ma = build([str(tmp_path / name)], tmp_path / "out-a", theirs_config, tokenizer=tok)
    mb = build([str(_write(tmp_path / "ours.jsonl", ours))], tmp_path / "out-b", config, tokenizer=tok)
    a = {p.name: p.read_bytes() for p in sorted((tmp_path / "out-a").glob("*.arrow"))}
    assert a and a == {p.name: p.read_bytes() for p in sorted((tmp_path / "out-b").glob("*.arrow"))}
    assert ma["counts"] == mb["counts"] and ma["counts"]["records"] == ma["counts"]["documents_written"] == len(theirs)
    return tmp_path / "out-a"


def _weighted_text(out: Path, tok, holding: str) -> list[tuple[float, str]]:
    """The document of the build whose text holds ``holding``, as runs of (weight, decoded text)."""
    import datasets

    for row in datasets.load_from_disk(str(out)):
        ends = np.cumsum(row["seq_lengths"])
        for start, end in zip([0, *ends[:-1]], ends, strict=True):
            ids, weights = np.array(row["input_ids"][start:end]), np.array(row["weights"][start:end])
            if holding in tok.decode(ids.tolist()):
                cuts = np.flatnonzero(np.diff(weights)) + 1
                return [(float(w[0]), tok.decode(i.tolist()))
                        for i, w in zip(np.split(ids, cuts), np.split(weights, cuts), strict=True)]  # fmt: skip
    raise AssertionError(f"no document holds {holding!r}")


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def _assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def test_alpaca_is_its_conversation(tmp_path, chatml):
    alpaca = [
        {"instruction": "Add the numbers.", "input": "2 + 2", "output": "4"},
        {"instruction": "Say hello.", "input": "", "output": "Hello!"},
        {"instruction": "", "input": "Only an input.", "output": "Fine."},
        {"instruction": "And now?", "input": "", "output": "Now this.", "system": "Be brief.",
         "history": [["First question", "First answer"], ["Second", "Second answer"]]},
    ]  # fmt: skip
    canonical = [
        {"messages": [_user("Add the numbers.\n2 + 2"), _assistant("4")]},
        {"messages": [_user("Say hello."), _assistant("Hello!")]},
        {"messages": [_user("Only an input."), _assistant("Fine.")]},
        {"messages": [{"role": "system", "content": "Be brief."}, _user("First question"), _assistant("First answer"),
                      _user("Second"), _assistant("Second answer"), _user("And now?"), _assistant("Now this.")]},
    ]  # fmt: skip
    out = _same_shards(tmp_path, chatml, alpaca, canonical)
    runs = _weighted_text(out, chatml, "Add the numbers")  # the user's turn at 0, the answer (and its end of turn) at 1
    assert [w for w, _ in runs] == [0.0, 1.0] and runs[1][1] == "4<|im_end|>\n"
    assert runs[0][1].endswith("<|im_start|>user\nAdd the numbers.\n2 + 2<|im_end|>\n<|im_start|>assistant\n")


def test_sharegpt_with_tool_calls_is_its_conversation(tmp_path, chatml):
    call = {"name": "get_time", "arguments": {"city": "Paris"}}
    sharegpt = [
        {"conversations": [
            {"from": "human", "value": "What time is it in Paris?"},
            {"from": "function_call", "value": json.dumps(call)},
            {"from": "observation", "value": '{"time": "10:00"}'},
            {"from": "gpt", "value": "It is 10:00 in Paris."},
        ], "tools": json.dumps([TOOL])},
        {"conversations": [{"from": "system", "value": "Be kind."}, {"from": "user", "value": "Hi"},
                           {"from": "chatgpt", "value": "Hello", "weight": None}], "system": "ignored: the first wins"},
        {"messages": [{"from": "human", "value": "Hi"}, {"from": "model", "value": "Hey"}], "system": "Be brief.",
         "tools": [{"type": "function", "function": TOOL}]},
    ]  # fmt: skip
    canonical = [
        {"messages": [
            _user("What time is it in Paris?"),
            {"role": "assistant", "tool_calls": [{"type": "function", "function": call}]},
            {"role": "tool", "content": '{"time": "10:00"}'},
            _assistant("It is 10:00 in Paris."),
        ], "tools": [{"type": "function", "function": TOOL}]},
        {"messages": [{"role": "system", "content": "Be kind."}, _user("Hi"), _assistant("Hello")]},
        {"messages": [{"role": "system", "content": "Be brief."}, _user("Hi"), _assistant("Hey")],
         "tools": [{"type": "function", "function": TOOL}]},
    ]  # fmt: skip
    out = _same_shards(tmp_path, chatml, sharegpt, canonical)
    runs = _weighted_text(out, chatml, "Paris")  # the call weighted inside its markup, the tool's result not
    assert [w for w, _ in runs] == [0.0, 1.0, 0.0, 1.0]
    assert runs[1][1] == '<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
    assert '{"time": "10:00"}' in runs[2][1] and runs[3][1] == "It is 10:00 in Paris.<|im_end|>\n"


def test_content_parts_and_other_tools_weights_are_ours(tmp_path, chatml):
    theirs = [
        {"messages": [{"role": "user", "content": [{"type": "text", "value": "hi"}], "loss_weight": 0.0},
                      {"role": "assistant", "content": [{"type": "text", "value": "Hello"}], "loss_weight": 1.0}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Two "}, {"type": "text", "text": "parts"}]},
                      {"role": "assistant", "content": "half", "loss_weight": 0.5}]},
        {"messages": [_user("q"), {**_assistant("skipped"), "train": False}, {**_user("q2"), "train": True},
                      {**_assistant("kept"), "loss": True}, {**_assistant("not this"), "loss": False}]},
    ]  # fmt: skip
    canonical = [
        {"messages": [{**_user("hi"), "weight": 0.0}, {**_assistant("Hello"), "weight": 1.0}]},
        {"messages": [_user("Two parts"), {**_assistant("half"), "weight": 0.5}]},
        {"messages": [_user("q"), {**_assistant("skipped"), "weight": 0}, {**_user("q2"), "weight": 1},
                      {**_assistant("kept"), "weight": 1}, {**_assistant("not this"), "weight": 0}]},
    ]  # fmt: skip
    _same_shards(tmp_path, chatml, theirs, canonical, name="theirs.jsonl.json")


#: ChatML that writes an answer's reasoning and tool calls (as Qwen3's does), so that both reach the shards
_REASONING_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.reasoning_content %}<think>{{ m.reasoning_content }}"
    "</think>{% endif %}{{ m.content or '' }}{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}"
    "</tool_call>{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_llamafactory_v1_reasoning_and_tool_call_parts_are_the_messages_fields(tmp_path):
    """LLaMA-Factory v1's ``reasoning`` parts are ``reasoning_content`` and its ``tool_call`` parts ``tool_calls``
    (its ``_to_hf_messages``), as its ``reason_tool_use_demo_50.jsonl`` writes them."""
    from chat_support import chat_tokenizer

    tok = chat_tokenizer("chatml", template=_REASONING_CHATML)
    call = {"name": "get_time", "arguments": {"city": "Paris"}}
    theirs = [{"messages": [
        {"role": "user", "content": [{"type": "text", "value": "Time in Paris?"}]},
        {"role": "assistant", "content": [{"type": "reasoning", "value": "Ask the "}, {"type": "reasoning", "value": "tool."},
                                          {"type": "tool_call", "value": json.dumps(call)}]},
        {"role": "tool", "content": [{"type": "text", "value": "10:00"}]},
        {"role": "assistant", "content": [{"type": "reasoning", "value": "Say it."}, {"type": "text", "value": "10:00."}],
         "loss_weight": 2.0},
    ], "tools": json.dumps([TOOL])}]  # fmt: skip
    canonical = [{"messages": [
        _user("Time in Paris?"),
        {"role": "assistant", "content": "", "reasoning_content": "Ask the tool.", "tool_calls": [{"type": "function", "function": call}]},
        {"role": "tool", "content": "10:00"},
        {**_assistant("10:00."), "reasoning_content": "Say it.", "weight": 2.0},
    ], "tools": [{"type": "function", "function": TOOL}]}]  # fmt: skip
    out = _same_shards(tmp_path, tok, theirs, canonical)
    runs = _weighted_text(out, tok, "Paris")
    assert [w for w, _ in runs] == [0.0, 1.0, 0.0, 2.0]
    assert runs[1][1] == '<think>Ask the tool.</think><tool_call>{"name": "get_time", "arguments": {"city": "Paris"}}</tool_call><|im_end|>\n'
    assert runs[3][1] == "<think>Say it.</think>10:00.<|im_end|>\n"


def test_the_hubs_prompt_beside_messages_builds_from_messages(tmp_path, chatml):
    conversation = [_user("Write a haiku."), _assistant("Quiet pond, a frog.")]
    theirs = [{"prompt": "Write a haiku.", "prompt_id": "a1b2", "messages": conversation, "category": "Generation"}]
    _same_shards(tmp_path, chatml, theirs, [{"messages": conversation}])


@pytest.mark.parametrize(
    ("record", "field", "reason"),
    [
        ({"messages": [_user("a"), {**_assistant("b"), "weight": 1, "loss_weight": 0.5}]}, "messages[1]",
         "ambiguous_weight"),
        ({"messages": [_user("a"), {**_assistant("b"), "train": False, "loss": True}]}, "messages[1]",
         "ambiguous_weight"),
        ({"messages": [_user("a"), {**_assistant("b"), "training": False}]}, "messages[1].training", "unknown_weight"),
        ({"messages": [_user("a"), {**_assistant("b"), "Weight": 0}]}, "messages[1].Weight", "unknown_weight"),
        ({"messages": [_user("a"), {**_assistant("b"), "train_detail": []}]}, "messages[1].train_detail",
         "unknown_weight"),
        ({"messages": [_user("a"), {**_assistant("b"), "train": "no"}]}, "messages[1].train", "wrong_type"),
        ({"messages": [_user("a"), {**_assistant("b"), "loss_weight": -1}]}, "messages[1].loss_weight", "bad_weight"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url",
          "image_url": {"url": "x.png"}}]}, _assistant("b")]}, "messages[0].content[1].type", "non_text_content"),
        ({"messages": [{"role": "user", "content": [{"text": "no type"}]}]}, "messages[0].content[0]", "wrong_type"),
        ({"messages": [{"role": "assistant", "content": [{"type": "tool_call", "value": "{not json"}]}]},
         "messages[0].content[0].value", "wrong_type"),
        ({"messages": [{"role": "assistant", "content": [{"type": "tool_call", "value": '{"arguments": {}}'}]}]},
         "messages[0].content[0].value", "wrong_type"),
        ({"messages": [{"role": "assistant", "content": [{"type": "reasoning", "value": "r"}], "reasoning_content": "r"}]},
         "messages[0].reasoning_content", "ambiguous_shape"),
        ({"messages": [{"role": "assistant", "content": [{"type": "reasoning", "value": 3}]}]},
         "messages[0].content[0].value", "wrong_type"),
        ({"conversations": [{"from": "human", "value": "a"}, {"from": "robot", "value": "b"}]}, "conversations[1].from",
         "wrong_type"),
        ({"conversations": [{"from": ["human"], "value": "a"}]}, "conversations[0].from", "wrong_type"),  # unhashable
        ({"conversations": "hi"}, "conversations", "wrong_type"),
        ({"conversations": ["hi"]}, "conversations[0]", "wrong_type"),
        ({"conversations": [{"from": "human", "role": "user", "value": "a"}]}, "conversations[0]", "ambiguous_shape"),
        ({"conversations": [{"value": "a"}]}, "conversations[0].from", "missing_field"),  # neither from nor role
        ({"conversations": [{"from": "human", "value": [{"type": "text", "text": "a"}]}]}, "conversations[0].value",
         "wrong_type"),  # parts under role/content only
        ({"conversations": [{"from": "human", "value": "a"}], "system": 3}, "system", "wrong_type"),
        ({"conversations": [{"from": "human", "value": "a", "loss_weight": -1}, {"from": "gpt", "value": "b"}],
          "system": "S"}, "conversations[0].loss_weight", "bad_weight"),
        ({"messages": [{"from": {"a": 1}, "content": "a"}]}, "messages[0].from", "wrong_type"),
        ({"conversations": [{"from": "human", "value": "a"}, {"from": "function_call", "value": "not json"}]},
         "conversations[1].value", "wrong_type"),
        ({"conversations": [{"from": "human", "value": "a"}, {"from": "gpt"}]}, "conversations[1].value",
         "missing_field"),
        ({"conversations": [{"from": "human", "value": "a"}], "tools": "{not json"}, "tools", "wrong_type"),
        ({"conversations": [{"from": "human", "value": "a"}], "text": "b"}, "<record>", "ambiguous_shape"),
        ({"instruction": "a", "output": "b", "text": "c"}, "<record>", "ambiguous_shape"),
        ({"instruction": "a", "output": 3}, "output", "wrong_type"),
        ({"instruction": "a", "output": "b", "history": [["only one"]]}, "history[0]", "wrong_type"),
        # problems found in the converted record are named as the record has them
        ({"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b", "loss_weight": -1}],
          "system": "S"}, "conversations[1].loss_weight", "bad_weight"),
        ({"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b", "weight": "1"}],
          "system": "S"}, "conversations[1].weight", "wrong_type"),
        ({"instruction": "a", "output": "b\ud800"}, "output", "invalid_utf8"),
        ({"instruction": "a", "output": "b", "history": [["q", "\udc80"]]}, "history[0][1]", "invalid_utf8"),
    ],
)  # fmt: skip
def test_a_shape_that_cannot_be_read_as_meant_is_refused(record, field, reason):
    content, problem = check_line(json.dumps(record).encode())
    assert content is None and problem is not None
    assert (problem.field, problem.reason) == (field, reason), problem


def test_a_record_of_no_shape_names_the_shapes_it_came_closest_to():
    _, problem = check_line(json.dumps({"instructions": "Add.", "output": "4", "id": 3}).encode())
    assert problem is not None and problem.reason == "missing_field"
    assert problem.problem.endswith(
        "closest: Alpaca (has output; 'instructions' for 'instruction'?); the record's keys: 'instructions', 'output', 'id'"
    )
    _, problem = check_line(json.dumps({"conversation": []}).encode())
    assert "ShareGPT ('conversation' for 'conversations'?)" in problem.problem
    _, problem = check_line(json.dumps({"id": 1}).encode())
    assert problem.problem.endswith("; the record's keys: 'id'")


def test_columns_name_fields_message_keys_and_roles_as_llamafactory_and_axolotl_map_them(tmp_path, chatml):
    """LLaMA-Factory's dataset_info.json ``columns`` + ``tags``, axolotl's ``field_messages``,
    ``message_property_mappings`` and ``roles``: one --columns mapping."""
    theirs = [
        {"dialog": [{"speaker": "USER", "said": "Hi"}, {"speaker": "BOT", "said": "Hello"},
                    {"speaker": "person", "said": "Bye"}, {"speaker": "BOT", "said": "Bye!", "loss": False}]},
    ]  # fmt: skip
    ours = [{"messages": [_user("Hi"), _assistant("Hello"), _user("Bye"), {**_assistant("Bye!"), "weight": 0}]}]
    columns = "messages=dialog,message.role=speaker,message.content=said,role.user=USER,role.user=person,role.assistant=BOT"
    _same_shards(tmp_path, chatml, theirs, ours, columns=columns)


def test_columns_reach_sharegpt_tags_and_parquet_messages(tmp_path, chatml):
    theirs = [{"chat": [{"from": "HUMAN", "value": "Hi"}, {"from": "AI", "value": "Hello"}], "system": "Be kind."}]
    ours = [{"messages": [{"role": "system", "content": "Be kind."}, _user("Hi"), _assistant("Hello")]}]
    _same_shards(tmp_path, chatml, theirs, ours, columns="conversations=chat,role.human=HUMAN,role.gpt=AI")
    (tmp_path / "ours.jsonl").unlink()
    for out in ("out-a", "out-b"):
        import shutil

        shutil.rmtree(tmp_path / out)
    _same_shards(tmp_path, chatml, theirs, ours, name="theirs.parquet", columns="conversations=chat,role.human=HUMAN,role.gpt=AI")


def test_json_fields_renamed_as_parquet_columns_are(tmp_path, sample_tok):
    theirs = [{"question": "Q: 2+2?", "answer": " 4"}]
    ours = [{"prompt": "Q: 2+2?", "completion": " 4"}]
    _same_shards(tmp_path, sample_tok, theirs, ours, columns="prompt=question,completion=answer")


@pytest.mark.parametrize(
    ("record", "columns", "field"),
    [
        ({"text": "a", "body": "b"}, "text=body", "text"),
        ({"messages": [{"role": "user", "content": "a", "said": "b"}]}, "message.content=said", "messages[0].content"),
    ],
)
def test_a_rename_onto_a_name_the_record_holds_is_refused(record, columns, field):
    from weightprep.stages.columns import parse_columns

    _, problem = check_line(json.dumps(record).encode(), parse_columns(columns))
    assert problem is not None and (problem.field, problem.reason) == (field, "duplicate_key")
    assert "one would silently replace the other" in problem.problem


def test_a_source_maps_its_own_json_names(tmp_path, chatml):
    """``columns`` of a source (a pipeline file's sources: entry) reaches inside its JSON records' messages, and
    only its own: the other source's records keep their names."""
    from weightprep.sources import Source

    dialog = tmp_path / "dialog.json"
    dialog.write_text(json.dumps([{"dialog": [{"speaker": "USER", "said": "Hi"}, {"speaker": "BOT", "said": "Hello"}]}]))
    plain = _write(tmp_path / "plain.jsonl", [{"messages": [_user("Hi"), _assistant("Hello")]}])
    columns = "messages=dialog,message.role=speaker,message.content=said,role.user=USER,role.assistant=BOT"
    sources = [Source("a", (str(dialog),), columns=columns), Source("b", (str(plain),))]
    config = config_from_dict({"pack": {"seq_len": 2048}})
    manifest = build([], tmp_path / "out", config, tokenizer=chatml, sources=sources)
    assert [s["records"] for s in manifest["sources"]] == [1, 1] and manifest["counts"]["chat_documents"] == 2
    ours = _write(tmp_path / "ours.jsonl", [{"messages": [_user("Hi"), _assistant("Hello")]}] * 2)
    reference = build([str(ours)], tmp_path / "ref", config, tokenizer=chatml)
    assert manifest["counts"]["tokens"] == reference["counts"]["tokens"]
    assert manifest["counts"]["total_weight"] == reference["counts"]["total_weight"]


def test_role_content_under_conversations_and_tools_as_a_string_beside_messages(tmp_path, chatml):
    call = [{"type": "function", "function": {"name": "get_time", "arguments": {"city": "Paris"}}}]
    theirs = [
        {"conversations": [_user("Hi"), {"role": "assistant", "content": [{"type": "text", "text": "Hey"}]}]},
        {"messages": [_user("Time in Paris?"), _assistant("Let me check.")], "tools": json.dumps([TOOL])},
        # OpenAI tool-call messages: content null (or text beside the calls), the calls kept
        {"conversations": [_user("Time?"), {"role": "assistant", "content": None, "tool_calls": call},
                           {"from": "gpt", "value": "Checking.", "tool_calls": call}], "tools": [TOOL]},
    ]
    ours = [
        {"messages": [_user("Hi"), _assistant("Hey")]},
        {"messages": [_user("Time in Paris?"), _assistant("Let me check.")],
         "tools": [{"type": "function", "function": TOOL}]},
        {"messages": [_user("Time?"), {"role": "assistant", "tool_calls": call},
                      {"role": "assistant", "content": "Checking.", "tool_calls": call}],
         "tools": [{"type": "function", "function": TOOL}]},
    ]  # fmt: skip
    _same_shards(tmp_path, chatml, theirs, ours)


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        ({"conversations": [{"value": "a"}]}, "missing; expected one of"),
        ({"conversations": [{"from": "robot", "value": "a"}]}, "unknown role string 'robot'; expected one of"),
        ({"conversations": [{"from": "human"}]}, "expected a string; missing"),
        ({"conversations": [{"from": "human", "value": 3}]}, "expected a string; found number 3"),
        ({"messages": [{"role": "user", "content": "a", "train_detail": []}]}, "weight by character spans"),
        ({"messages": [{"role": "user", "content": "a", "loss_mask": 1}]}, "use one of weight, loss_weight"),
    ],
)  # fmt: skip
def test_a_refused_shape_says_what_it_found(record, problem):
    _, found = check_line(json.dumps(record).encode())
    assert found is not None and problem in found.problem, found


def test_the_columns_mapping_parses_each_part_and_refuses_a_source_mapped_twice():
    from weightprep.errors import UsageError
    from weightprep.stages.columns import Columns, parse_columns

    spec = "messages=dialog, message.role=speaker,message.content=said,role.user=USER,role.user=person,role.tool=OBS"
    assert parse_columns(spec) == Columns(
        {"dialog": "messages"}, {"speaker": "role", "said": "content"}, {"USER": "user", "person": "user", "OBS": "tool"}
    )
    assert not parse_columns(None) and parse_columns("prompt=q").inside() == Columns()
    for bad, message in [
        ("role.user=a,role.assistant=a", "role 'a' is mapped twice (role.user=a, role.assistant=a)"),
        ("message.role=a,message.content=a", "key 'a' is mapped twice (message.role=a, message.content=a)"),
        ("message.=a", "names no key after message."),
        ("role.=a", "names no role after role."),
    ]:
        with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
            parse_columns(bad)


@pytest.mark.parametrize(
    ("record", "columns", "conversation"),
    [
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}, None, True),
        ({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}, None, True),  # ShareGPT
        ({"instruction": "say hi", "input": "", "output": "hi"}, None, True),  # Alpaca: rendered as messages
        ({"prompt": [{"role": "user", "content": "hi"}], "completion": [{"role": "assistant", "content": "yo"}]},
         None, True),  # TRL's conversational prompt-completion
        ({"dialog": [{"role": "user", "content": "hi"}]}, "messages=dialog", True),  # named by --columns
        ({"dialog": [{"role": "user", "content": "hi"}]}, None, False),  # no shape: the build names the record
        ({"messages": [{"role": "user", "content": [{"type": "image"}]}]}, None, False),  # refused: no conversation
        ({"prompt": "hi", "completion": "yo"}, None, False),
        ({"text": "plain"}, None, False),
        ({"pieces": [{"text": "a", "weight": 1}]}, None, False),
    ],
)  # fmt: skip
def test_a_conversation_is_a_record_built_through_the_chat_template(record, columns, conversation):
    """``shapes.is_conversation`` (what the plan asks of a file's first record): a message list after conversion."""
    from weightprep.stages.columns import parse_columns
    from weightprep.stages.shapes import is_conversation

    assert is_conversation(record, parse_columns(columns)) is conversation


@pytest.mark.parametrize(
    "message",
    [{"role": "user", "content": "hi", "name": "ann", "tool_call_id": "7"}, {"role": "user", "content": "hi", "weight": 1},
     "not a message", None],
)  # fmt: skip
def test_messages_with_nothing_to_convert_are_the_records_own(message):
    """A conversation whose messages hold no content parts and no other tool's weight key is the record's own list,
    not a copy (other keys such as ``name`` are no weights); a message that is not an object is left to validation
    to refuse."""
    from weightprep.stages.shapes import to_canonical

    messages = [message, {"role": "assistant", "content": "yes", "weight": 2.0}]
    record = to_canonical({"messages": messages})
    assert record["messages"] is messages
    if not isinstance(message, dict):
        _, problem = check_line(json.dumps({"messages": messages}).encode())
        assert (problem.field, problem.reason) == ("messages[0]", "wrong_type")
