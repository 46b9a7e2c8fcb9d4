"""TRL's dataset formats as input: each gives the same documents, byte for byte, as the pieces form it stands for."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weightprep.batches import Block
from weightprep.config import config_from_dict
from weightprep.errors import InputError
from weightprep.pipeline import build
from weightprep.stages.validate import _parse_exact, _parse_fast, check_line, parse_block


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def _arrow(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.arrow"))}


def _same_shards(tmp_path: Path, tok, a: list[dict], b: list[dict], **cfg) -> dict:
    config = config_from_dict({"pack": {"seq_len": 128}, **cfg})
    ma = build([str(_write(tmp_path / "a.jsonl", a))], tmp_path / "out-a", config, tokenizer=tok)
    mb = build([str(_write(tmp_path / "b.jsonl", b))], tmp_path / "out-b", config, tokenizer=tok)
    assert _arrow(tmp_path / "out-a") == _arrow(tmp_path / "out-b") and _arrow(tmp_path / "out-a")
    assert ma["counts"] == mb["counts"]
    return ma


def test_text_and_prompt_completion_equal_their_pieces(tmp_path, sample_tok):
    forms = [
        {"text": "Plain language-modeling text, all of it learned."},
        {"prompt": "Q: 2+2?\nA:", "completion": " 4"},
        {"prompt": "Translate: chat", "completion": " cat", "prompt_weight": 0.25, "completion_weight": 2.5},
        {"text": "second text", "id": 7},
    ]
    pieces = [
        {"pieces": [{"text": "Plain language-modeling text, all of it learned.", "weight": 1}]},
        {"pieces": [{"text": "Q: 2+2?\nA:", "weight": 0}, {"text": " 4", "weight": 1}]},
        {"pieces": [{"text": "Translate: chat", "weight": 0.25}, {"text": " cat", "weight": 2.5}]},
        {"pieces": [{"text": "second text", "weight": 1}]},
    ]
    m = _same_shards(tmp_path, sample_tok, forms, pieces)
    assert m["counts"]["documents_written"] == 4


def test_conversational_prompt_completion_equals_messages(tmp_path):
    from chat_support import chat_tokenizer

    tok = chat_tokenizer("chatml")
    prompt = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"}]
    completion = [{"role": "assistant", "content": "Hello!"}]
    trl_form = [{"prompt": prompt, "completion": completion}, {"prompt": prompt, "completion": completion, "completion_weight": 3}]
    messages = [
        {"messages": [{**prompt[0], "weight": 0}, {**prompt[1], "weight": 0}, completion[0]]},
        {"messages": [{**prompt[0], "weight": 0}, {**prompt[1], "weight": 0}, {**completion[0], "weight": 3}]},
    ]
    # prompt messages stay 0 even where the role default would weight them
    m = _same_shards(tmp_path, tok, trl_form, messages, chat={"role_weights": "assistant=1,user=0.5"})
    assert m["counts"]["chat_documents"] == 2


@pytest.mark.parametrize(
    ("line", "field", "reason"),
    [
        ('{"text": "a", "pieces": [{"text": "b", "weight": 1}]}', "<record>", "ambiguous_shape"),
        ('{"text": "a", "prompt": "b", "completion": "c"}', "<record>", "ambiguous_shape"),
        ('{"text": "a", "messages": [{"role": "user", "content": "b"}]}', "<record>", "ambiguous_shape"),
        ('{"prompt": "only a prompt"}', "completion", "missing_field"),
        ('{"completion": "only"}', "prompt", "missing_field"),
        ('{"prompt": "a", "completion": "b", "completion_weight": -1}', "completion_weight", "bad_weight"),
        ('{"prompt": "a", "completion": "b", "prompt_weight": "1"}', "prompt_weight", "wrong_type"),
        ('{"prompt": "a", "completion": [{"role": "assistant", "content": "b"}]}', "completion", "wrong_type"),
        ('{"prompt": [], "completion": [{"role": "assistant"}]}', "completion[0].content", "missing_field"),
        ('{"text": 5}', "text", "wrong_type"),
        # a message's content is checked as a text: its type, then its Unicode
        ('{"messages": [{"role": "user", "content": 42}, {"role": "assistant", "content": "b"}]}', "messages[0].content",
         "wrong_type"),
        ('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b\\ud800"}]}',
         "messages[1].content", "invalid_utf8"),
        # a message's other keys reach the template: checked for Unicode, and a good one ends no check early
        ('{"messages": [{"role": "user", "content": "a", "name": "n\\udfff"}, {"role": "assistant", "content": "b"}]}',
         "messages[0].name", "invalid_utf8"),
        ('{"messages": [{"role": "user", "content": "a", "name": "n"}, {"role": "assistant", "content": 7}]}',
         "messages[1].content", "wrong_type"),
        # what the template is given beside the messages: its type, then its Unicode (the tools', then the kwargs')
        ('{"messages": [{"role": "user", "content": "a"}], "chat_template_kwargs": "x"}', "chat_template_kwargs",
         "wrong_type"),
        ('{"messages": [{"role": "user", "content": "a"}], "tools": [{"name": "t\\udfff"}]}', "tools[0].name",
         "invalid_utf8"),
        ('{"messages": [{"role": "user", "content": "a"}], "tools": [], "chat_template_kwargs": {"k": "t\\udfff"}}',
         "chat_template_kwargs.k", "invalid_utf8"),
        ('{"prompt": "a", "prompt": "b", "completion": "c"}', "prompt", "duplicate_key"),
        ('{"text": "a", "text": "b"}', "text", "duplicate_key"),
        ('{"messages": [{"role": "user", "content": "a"}], "tools": [], "tools": []}', "tools", "duplicate_key"),
        ('{"messages": "hi"}', "messages", "wrong_type"),
        ('{"messages": [{"role": 5, "content": "a"}]}', "messages[0].role", "wrong_type"),
        ('{"messages": [{"role": "", "content": "a"}]}', "messages[0].role", "wrong_type"),
        # beside text records (the columnar path of mixed shapes): half a pair with a text, pieces that are no pieces
        ('{"text": "a", "prompt": "b"}', "<record>", "ambiguous_shape"),
        ('{"pieces": []}', "pieces", "empty_pieces"),
        ('{"pieces": [null]}', "pieces[0]", "wrong_type"),
        ('{"pieces": [{"text": null, "weight": 1}]}', "pieces[0].text", "wrong_type"),
        ('{"pieces": [{"text": "a", "weight": null}]}', "pieces[0].weight", "wrong_type"),
        # another tool's shape refused while it is converted (stages/shapes.py)
        ('{"conversations": [{"from": "martian", "value": "x"}]}', "conversations[0].from", "wrong_type"),
        ('{"prompt": "a\\udfff", "completion": "b"}', "prompt", "invalid_utf8"),
        ('{"prompt": "a", "completion": "b\\udfff"}', "completion", "invalid_utf8"),
    ],
)
def test_ambiguous_and_bad_records_are_rejected_by_both_paths(tmp_path, line, field, reason):
    _, problem = check_line(line.encode())
    assert problem is not None and (problem.field, problem.reason) == (field, reason)
    good = '{"text": "fine"}'
    block = Block("raw.jsonl", 1, 3, f"{good}\n{line}\n{good}\n".encode())
    assert _parse_fast(block) is None  # the columnar path never accepts it
    with pytest.raises(InputError) as err:
        parse_block(block)
    assert (err.value.line, err.value.field, err.value.reason) == (2, field, reason)


def test_a_pair_of_a_text_and_a_conversation_is_named_as_such():
    _, problem = check_line(b'{"prompt": "p", "completion": [{"role": "assistant", "content": "c"}]}')
    assert problem.field == "completion" and problem.problem == (
        "prompt and completion must both be strings or both message lists; found string 'p' and list"
    )


def test_a_missing_half_of_a_pair_names_the_half_that_is_there():
    _, problem = check_line(b'{"completion": "c"}')
    assert (problem.field, problem.problem) == ("prompt", "missing; a record with 'completion' needs both prompt and completion")
    _, problem = check_line(b'{"prompt": "p"}')
    assert (problem.field, problem.problem) == ("completion", "missing; a record with 'prompt' needs both prompt and completion")


def test_a_null_value_is_no_shape_beside_another():
    """``"pieces": null`` beside a text is a text record; alone it is a pieces record (rejected as one)."""
    content, problem = check_line(b'{"pieces": null, "text": "a"}')
    assert problem is None and content == [("a", 1.0)]
    _, problem = check_line(b'{"pieces": null}')
    assert problem is not None and problem.field == "pieces"


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
_w = st.floats(0, 10, allow_nan=False)
_record = st.one_of(
    st.builds(lambda t: {"text": t}, _text),
    st.builds(lambda p, c: {"prompt": p, "completion": c}, _text, _text),
    st.builds(lambda p, c, pw, cw: {"prompt": p, "completion": c, "prompt_weight": pw, "completion_weight": cw}, _text, _text, _w, _w),
    st.builds(lambda ps: {"pieces": [{"text": t, "weight": w} for t, w in ps]}, st.lists(st.tuples(_text, _w), min_size=1, max_size=3)),
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(records=st.lists(_record, min_size=1, max_size=12))
def test_columnar_path_equals_the_exact_path(records):
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    block = Block("raw.jsonl", 1, len(records), data)
    fast = _parse_fast(block)
    exact, rejects = _parse_exact(block)
    assert not rejects and fast is not None
    assert fast.texts == exact.texts
    assert fast.piece_weights.tolist() == exact.piece_weights.tolist()
    assert fast.piece_offsets.tolist() == exact.piece_offsets.tolist()
    assert fast.lines.tolist() == exact.lines.tolist()


_blank = st.sampled_from(["", " ", "\t", "\r", " \t\r", "   "])


@settings(max_examples=100, deadline=None)
@given(lines=st.lists(st.one_of(_blank, st.integers(0, 9)), min_size=1, max_size=12).filter(
    lambda xs: any(isinstance(x, int) for x in xs)), first=st.integers(1, 10**6))  # fmt: skip
def test_the_columnar_path_numbers_records_by_their_lines_past_blank_ones(lines, first):
    """Blank lines (spaces, tabs, carriage returns) give no record: each record keeps its own line's number."""
    text = "".join((f'{{"pieces": [{{"text": "r{x}", "weight": {x}}}]}}' if isinstance(x, int) else x) + "\n" for x in lines)
    records = _parse_fast(Block("raw.jsonl", first, len(lines), text.encode()))
    expected = [first + i for i, x in enumerate(lines) if isinstance(x, int)]
    assert records is not None and records.lines.tolist() == expected
    assert records.texts == [f"r{x}" for x in lines if isinstance(x, int)]


def test_a_record_nested_too_deep_for_python_is_decided_by_the_columnar_parser():
    deep = b"[" * 5000 + b"]" * 5000
    assert check_line(b'{"pieces": [{"text": "a", "weight": 2}, {"text": "b", "weight": 0}], "meta": ' + deep + b"}") == (
        [("a", 2.0), ("b", 0.0)], None)  # fmt: skip
    _, problem = check_line(b'{"pieces": ' + deep + b"}")
    assert (problem.field, problem.reason) == ("<json>", "too_deep")


def test_a_crlf_conversation_keeps_its_line_without_the_carriage_return():
    """A conversation keeps its raw line (for its reject, should rendering refuse it) as the file has it, less
    the line's end: ``\r\n`` and ``\n`` alike."""
    line = b'{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}'
    records, rejects = _parse_exact(Block("raw.jsonl", 1, 2, line + b"\r\n" + line + b"\n"))
    assert rejects == [] and [c.raw for c in records.chats] == [line, line]
    assert [c.offset for c in records.chats] == [0, len(line) + 2]
    pieces = b'{"pieces": [{"text": "x", "weight": 1}]}'
    records, _ = _parse_exact(Block("raw.jsonl", 1, 3, pieces + b"\n" + line + b"\n" + pieces + b"\n"))
    assert records.lines.tolist() == [1, 2, 3] and [c is None for c in records.chats] == [True, False, True]


# what a message's values may be: the plain ones (strings, numbers that are weights) and those that are not
_VALUES = st.one_of(
    st.text(max_size=6), st.sampled_from(["", "user", "é", "\ud800", "a\udcff", 'a": ', '"role":', "a\\"]), st.none(),
    st.booleans(),
    st.integers(-3, 3), st.sampled_from([10**400, 1e39, 3.5e38, -0.0, 0.5, 2.0]), st.lists(st.integers(), max_size=2),
)
_PLAIN = {"role": st.one_of(st.sampled_from(["user", "assistant", ""]), _VALUES), "content": st.one_of(st.text(max_size=5), _VALUES)}
_MESSAGE_KEYS = st.sampled_from(["role", "content", "weight", "name", "train", "loss_weight", "from", "value"])


@st.composite
def _chat_lines(draw) -> bytes:
    """A JSON line near the plain chat record: its messages' keys drawn from role/content/weight and others, each
    key possibly twice, written plainly, with space before the colon or escaped (``"r\\u006fle"``), values of every
    kind (strings that hold a quote before a colon among them); the record's keys ``messages`` and sometimes
    another."""
    def key(k):
        how = draw(st.integers(0, 7))
        if how == 0:  # every character escaped: the same key to json
            return '"' + "".join(f"\\u{ord(c):04x}" for c in k) + '"'
        return json.dumps(k) + (" " if how == 1 else "\t" if how == 2 else "")

    def obj(pairs):  # JSON text of an object whose keys may repeat
        return "{" + ", ".join(f"{key(k)}: {v}" for k, v in pairs) + "}"

    def value(v):
        return json.dumps(v) if not isinstance(v, int) or abs(v) < 10**300 else str(v)

    messages = []
    for _ in range(draw(st.integers(0, 3))):
        plain = draw(st.booleans())
        keys = ["role", "content"] + (["weight"] if draw(st.booleans()) else []) if plain else draw(st.lists(_MESSAGE_KEYS, max_size=4))
        pairs = [(k, value(draw(_PLAIN.get(k, _VALUES) if plain else _VALUES))) for k in keys]
        if draw(st.integers(0, 9)) == 0 and pairs:
            pairs.append(pairs[0])  # a key twice
        messages.append(obj(pairs))
    record = [("messages", "[" + ", ".join(messages) + "]")]
    extra = draw(st.sampled_from([None, "tools", "id", "pieces", "messages"]))
    if extra is not None:
        record.append((extra, value(draw(_VALUES))))
    return obj(record).encode()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(line=_chat_lines())
def test_plain_chat_records_take_the_general_paths_answer(line, monkeypatch):
    """``validate._plain_chat`` answers for the plain chat record only, and as the general path does
    (``to_canonical``, ``validate_record``, ``record_content``): conversation, problem, or neither."""
    from weightprep.stages import validate

    fast = check_line(line)
    with monkeypatch.context() as m:  # (undone after each example)
        m.setattr(validate, "_plain_chat", lambda obj, raw, text=None: None)
        general = check_line(line)
    assert fast == general


_DUPLICATED = [
    '{"messages": [{"role": "user", "content": "a", "role": "user"}]}',
    '{"messages": [{"role": "user", "content": "a", "role" : "assistant"}]}',
    '{"messages": [{"role": "user", "content": "a", "content"\t:"b"}]}',
    '{"messages": [{"role": "user", "content": "a", "\\u0072ole": "user"}]}',
    '{"messages": [{"role": "user", "content": "a"}], "messages": [{"role": "user", "content": "a"}]}',
    '{"messages": [{"role": "user", "content": "a\\": x", "weight": 1, "weight": 2}]}',
]
_NOT_DUPLICATED = [
    '{"messages": [{"role": "user", "content": "say \\"role\\": no"}, {"role": "assistant", "content": "b"}]}',
    '{"messages": [{"role" : "user", "content":"a"}, {"\\u0072ole": "assistant", "content": "a\\\\"}]}',
]


@pytest.mark.parametrize("line", _DUPLICATED + _NOT_DUPLICATED)
def test_a_plain_chat_line_parsed_without_the_hook_repeats_no_key(line, monkeypatch):
    """The usual chat line is parsed without the per-object hook, its keys counted in its text (``_KEYS``); a key
    given twice, however written (space or tab before the colon, escaped), is refused as the hooked parse refuses
    it, and a line whose strings hold a quote before a colon, or whose keys are escaped, is answered as that parse
    answers it."""
    from weightprep.stages import validate

    fast = check_line(line.encode())
    with monkeypatch.context() as m:
        m.setattr(validate, "_KEYS", re.compile("(?!)"))  # no key found: never answered unhooked
        general = check_line(line.encode())
    assert fast == general
    assert (fast[1] is not None) == (line in _DUPLICATED)
    assert fast[1] is None or fast[1].reason == "duplicate_key"


@pytest.mark.parametrize("after", [" x", '{"messages": []}', "]", " \u3000"])
def test_a_chat_line_with_more_than_its_object_is_malformed_json(after):
    """What follows a plain conversation's object on its line, but whitespace, makes the line malformed JSON, as
    ``json.loads`` says: the unhooked parse reads only the object, and leaves the line to the hooked one."""
    line = '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}' + after
    chat, problem = check_line(line.encode())
    assert chat is None and problem.reason == "malformed_json" and "Extra data" in problem.problem
    with pytest.raises(json.JSONDecodeError, match="Extra data"):
        json.loads(line)


@pytest.mark.parametrize("line", [
    '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "weight": 2}]}',
    '{"messages":[{"content":"a","role":"user"},{"weight":0.5,"role":"assistant","content":"b"}]}',
    '{"messages" : [ {"role" : "user" , "content" : "x\\ny"} ]}',
    '{"messages": [{"role": "user", "content": "a"}]} \t\r',
])  # fmt: skip
def test_the_usual_chat_line_is_answered_by_the_parse_without_the_hook(line):
    """A plain conversation, keys in any order and spacing, escapes in its strings, whitespace after it, is answered
    by the unhooked parse
    (``_PLAIN_DECODER``: its messages are plain dicts, not the hooked parse's ``_Object``), as the hooked one would."""
    from weightprep.stages import validate

    chat, problem = check_line(line.encode())
    assert problem is None and chat.raw == line.encode()
    assert all(type(m) is dict for m in chat.messages) and chat.messages == json.loads(line)["messages"]
    hooked = validate._plain_chat(validate._DECODER.decode(line), line.encode())
    assert hooked == chat and all(type(m) is validate._Object for m in hooked.messages)


def test_the_plain_chat_record_is_answered_in_one_pass():
    from weightprep.stages.validate import _DECODER, _plain_chat

    line = '{"messages": [{"role": "user", "content": "é"}, {"role": "assistant", "content": "b", "weight": 2}]}'
    chat = _plain_chat(_DECODER.decode(line), line.encode())
    assert chat is not None and chat.messages == json.loads(line)["messages"] and chat.raw == line.encode()
    for other in ('{"messages": [{"role": "user", "content": "a", "weight": true}]}',
                  '{"messages": [{"role": "user", "content": "a", "weight": 1e39}]}',
                  '{"messages": [{"role": "user", "content": "a", "role": "user"}]}',
                  '{"messages": [{"role": "user", "content": "\\ud800"}]}',
                  '{"messages": [{"role": "user", "content": "a", "train": false}]}',
                  '{"messages": [{"role": "", "content": "a"}]}',
                  '{"messages": [{"role": "user", "content": "a"}], "id": 1}'):  # fmt: skip
        assert _plain_chat(_DECODER.decode(other), other.encode()) is None, other


def test_a_plain_looking_chat_record_still_takes_the_columns_names():
    """With ``--columns`` a record that looks canonical is renamed first: ``role.user=human`` makes its ``human``
    messages user ones (the one-pass check answers only where no columns are given)."""
    from weightprep.stages.columns import parse_columns

    line = b'{"messages": [{"role": "human", "content": "a"}, {"role": "assistant", "content": "b"}]}'
    chat, problem = check_line(line, parse_columns("role.user=human"))
    assert problem is None and [m["role"] for m in chat.messages] == ["user", "assistant"]
    chat, problem = check_line(line)
    assert problem is None and [m["role"] for m in chat.messages] == ["human", "assistant"]
