"""Chat documents by turn: the build's turns file places every message of every conversation in the rows, through
packing and chunking, and `weightprep inspect` shows a conversation turn by turn with role and weight."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest
from chat_support import FAMILIES, chat_tokenizer
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from weightprep.cli import main
from weightprep.config import config_from_dict
from weightprep.constants import TURNS_NAME
from weightprep.pipeline import build
from weightprep.report.stats import document_turns


def _conversation(i: int) -> list[dict]:
    """Conversation ``i``: its own contents, 1-3 exchanges, sometimes a system prompt, a tool turn or a custom role."""
    messages = [{"role": "system", "content": f"System prompt {i}."}] if i % 3 == 0 else []
    for k in range(1 + i % 3):
        messages.append({"role": "user", "content": f"Question {i}.{k}?"})
        messages.append({"role": "assistant", "content": f"Answer {i}.{k}!", **({"weight": 2.0} if k == 1 else {})})
    if i % 4 == 1:
        messages.append({"role": "tool", "content": f"tool output {i}"})
        messages.append({"role": "assistant", "content": f"Done {i}."})
    return messages


def _expected_turn_texts(tok, messages: list[dict]) -> list[str]:
    """Each message's text in the rendered conversation, computed by rendering prefixes with transformers."""
    prefixes = [tok.apply_chat_template(messages[:k], tokenize=False) if k else "" for k in range(len(messages) + 1)]
    return [prefixes[k + 1][len(prefixes[k]) :] for k in range(len(messages))]


def _build(tmp_path, records, **cfg):
    tok = chat_tokenizer("chatml")
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in records))
    manifest = build([str(raw)], tmp_path / "out", config_from_dict({"pack": {"seq_len": 256}, **cfg}), tokenizer=tok)
    return tok, manifest


def _turn_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("part_bytes", [None, 3000], ids=["one-part", "input-parts"])
def test_every_turn_of_every_conversation_is_where_the_turns_file_says(tmp_path, part_bytes):
    """With input parts the turns files of the parts are merged: their row numbers must be shifted."""
    convos = [_conversation(i) for i in range(40)]
    records = [r for i, c in enumerate(convos) for r in ({"messages": c}, {"pieces": [{"text": f"plain {i}", "weight": 1}]})]
    tok, manifest = _build(tmp_path, records, **({"read": {"part_bytes": part_bytes}} if part_bytes else {}))
    if part_bytes:
        assert len(manifest["inputs"][0]["parts"]) > 3
    assert manifest["turns_file"] == TURNS_NAME
    rows = datasets.load_from_disk(str(tmp_path / "out"))
    entries = _turn_lines(tmp_path / "out" / TURNS_NAME)
    assert [e["row"] for e in entries] == sorted({e["row"] for e in entries})  # one line per row, in order
    expected = {json.dumps(tok.apply_chat_template(c, tokenize=True)["input_ids"]): c for c in convos}
    seen = 0
    for entry in entries:
        ids = np.asarray(rows[entry["row"]]["input_ids"])
        bounds = np.cumsum([0, *rows[entry["row"]]["seq_lengths"]])
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            convo = expected.get(json.dumps(ids[a:b].tolist()))
            if convo is None:
                continue  # a pieces document or the pad tail
            seen += 1
            turns = [t for t in entry["turns"] if a <= t[0] < b]
            assert [(t[2], t[3]) for t in turns] == [(m["role"], i) for i, m in enumerate(convo)]
            texts = [tok.decode(ids[s : s + n].tolist()) for s, n, _, _ in turns]
            assert texts == _expected_turn_texts(tok, convo)
            assert turns[0][0] == a and turns[-1][0] + turns[-1][1] == b  # chatml: the turns tile the document
    assert seen == len(convos)


def test_a_conversation_chunked_by_the_overlong_policy_keeps_its_turns(tmp_path):
    """Chunks of 16 tokens: each surviving chunk's turns name the messages its tokens came from."""
    convo = _conversation(2)  # 3 exchanges
    tok, manifest = _build(tmp_path, [{"messages": convo}], filter={"overlong": "chunk", "max_length": 16}, pack={"seq_len": 16})
    assert manifest["counts"]["chunked"] == 1
    full = tok.apply_chat_template(convo, tokenize=True)["input_ids"]
    # message k's tokens are full[bounds[k]:bounds[k + 1]] (chatml turns end on special tokens: aligned)
    bounds = [len(tok.apply_chat_template(convo[:k], tokenize=True)["input_ids"]) if k else 0 for k in range(len(convo) + 1)]
    rows = datasets.load_from_disk(str(tmp_path / "out"))
    entries = {e["row"]: e["turns"] for e in _turn_lines(tmp_path / "out" / TURNS_NAME)}
    checked = 0
    for r in range(len(rows)):
        ids, n_real = rows[r]["input_ids"], rows[r]["seq_lengths"][0]
        at = next(i for i in range(0, len(full), 16) if full[i : i + n_real] == ids[:n_real])  # the chunk's place
        for s, n, role, message in entries[r]:
            assert convo[message]["role"] == role
            assert bounds[message] <= at + s and at + s + n <= bounds[message + 1]
            checked += n
        assert sum(n for _, n, _, _ in entries[r]) == n_real  # every token of the chunk is in a turn
    assert checked == sum(rows[r]["seq_lengths"][0] for r in range(len(rows))) > 0


def test_a_pieces_build_writes_no_turns_file(tmp_path):
    _, manifest = _build(tmp_path, [{"pieces": [{"text": "just text", "weight": 1}]}])
    assert manifest["turns_file"] is None and not (tmp_path / "out" / TURNS_NAME).exists()


def test_inspect_shows_a_conversation_turn_by_turn(tmp_path):
    convo = _conversation(5)  # three exchanges (the second answer weighted 2), then a tool turn and an answer
    _cli_build(tmp_path, [{"messages": convo}, {"pieces": [{"text": "tail piece", "weight": 1}]}])
    out = CliRunner().invoke(main, ["inspect", str(tmp_path / "out"), "--no-color"]).output
    headers = [line for line in out.splitlines() if line.startswith("▸")]
    want = [f"▸ {m['role']} (messages[{i}]), weight {m.get('weight', 1.0 if m['role'] == 'assistant' else 0):g}:"
            for i, m in enumerate(convo)]
    assert [h.split(": ")[0] + ":" for h in headers] == want
    assert [m["role"] for m in convo] == ["user", "assistant"] * 3 + ["tool", "assistant"]
    turn_texts = out.split("▸")[1:]
    assert "[w=2]Answer 5.1!" in turn_texts[3] and "tool output 5" in turn_texts[6]
    assert "ail piece<|im_end|>" in out.split("document 2")[1] and "▸" not in out.split("document 2")[1]  # no turns


def _cli_build(tmp_path, records, *flags):
    """A build through the CLI from a saved tokenizer directory (inspect then finds the tokenizer by its path)."""
    chat_tokenizer("chatml").save_pretrained(tmp_path / "tok")
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in records))
    args = ["build", str(raw), "--tokenizer", str(tmp_path / "tok"), "--out", str(tmp_path / "out"), *flags]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output


def test_validation_split_has_its_own_turns_file(tmp_path):
    records = [{"messages": _conversation(i)} for i in range(30)]
    _cli_build(tmp_path, records, "--validation-records", "5", "--seq-len", "256")
    for split in ("train", "validation"):
        entries = _turn_lines(tmp_path / "out" / split / TURNS_NAME)
        assert entries
        out = CliRunner().invoke(main, ["inspect", str(tmp_path / "out"), "--split", split, "--row", "0", "--no-color"]).output
        assert "▸ user (messages[" in out
    assert sum(len(e["turns"]) for split in ("train", "validation")
               for e in _turn_lines(tmp_path / "out" / split / TURNS_NAME)) == sum(len(r["messages"]) for r in records)


@pytest.mark.parametrize("name", ["llama3", "gemma"])
def test_bos_lies_in_the_first_turn_where_the_template_renders_it_with_it(name, tmp_path):
    """messages[0] spans render(messages[:1]) less render([]). Llama-3's template prepends BOS to the first
    message's content, and Gemma's cannot render no message (it reads messages[0]): BOS is in messages[0]'s span."""
    tok = chat_tokenizer(name)
    convo = _conversation(2)  # user/assistant only: Gemma's template refuses other roles
    raw = tmp_path / "raw.jsonl"
    raw.write_text(json.dumps({"messages": convo}) + "\n")
    build([str(raw)], tmp_path / "out", config_from_dict({"pack": {"seq_len": 256}}), tokenizer=tok)
    row = datasets.load_from_disk(str(tmp_path / "out"))[0]
    turns = _turn_lines(tmp_path / "out" / TURNS_NAME)[0]["turns"]
    assert row["input_ids"][0] == tok.convert_tokens_to_ids(FAMILIES[name].bos)
    assert turns[0][0] == 0
    assert [t[2] for t in turns] == [m["role"] for m in convo]
    first = tok.decode(row["input_ids"][turns[0][0] : turns[0][0] + turns[0][1]])
    assert first.startswith(FAMILIES[name].bos) and "Question 2.0?" in first and "Answer" not in first


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(0, 60), min_size=0, max_size=8, unique=True), start=st.integers(0, 30),
       length=st.integers(1, 30))  # fmt: skip
def test_document_turns_partition_the_document(cuts, start, length):
    cuts = sorted(cuts)
    turns = [[a, b - a, "user", i] for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)) if b > a]
    parts = document_turns(turns, start, length)
    assert [p[0] for p in parts] == list(np.cumsum([0, *(p[1] for p in parts)])[:-1])  # contiguous from 0
    assert sum(p[1] for p in parts) == length and all(p[1] > 0 for p in parts)
    for offset, _n, role, message in parts:
        inside = [t for t in turns if t[0] <= start + offset < t[0] + t[1]]
        assert (role is None) == (not inside) and (not inside or (inside[0][3] == message))


def test_the_html_report_heads_each_turn_with_its_role(tmp_path):
    import re
    from html import unescape

    convo = _conversation(3)  # a system prompt, then user/assistant exchanges
    _cli_build(tmp_path, [{"messages": convo}, {"pieces": [{"text": "tail piece", "weight": 1}]}])
    report = tmp_path / "report.html"
    assert CliRunner().invoke(main, ["inspect", str(tmp_path / "out"), "--html", str(report)]).exit_code == 0
    page = report.read_text()
    row = page.split('data-row="0"')[1].split("<h3>")[0]
    heads = re.findall(r'<span class="turn" data-role="([^"]+)" data-message="(\d+)">', row)
    assert heads == [(m["role"], str(i)) for i, m in enumerate(convo)]
    # the tokens after each head are that message's rendering (the last chunk runs on into the pieces document)
    chunks = re.split(r'<span class="turn"[^>]*>[^<]*</span>', row)[1:]
    texts = [unescape(re.sub(r"<[^>]+>", "", c)).replace("↵", "").replace("\n", "") for c in chunks]
    for text, want in zip(texts, _expected_turn_texts(chat_tokenizer("chatml"), convo), strict=True):
        assert text.startswith(want.replace("\n", ""))


def test_inspect_names_the_turn_of_each_per_turn_document(tmp_path):
    """A Qwen3 conversation built per turn: each document says which message it was made for, and the earlier
    turns the template re-renders before it (no single message's) are labelled as such; the summary does not
    pretend inspect wrote anything."""
    from test_chat_history import family_tokenizer

    family_tokenizer("qwen3").save_pretrained(tmp_path / "tok")
    messages = [{"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "<think>\nTwo plus two.\n</think>\n\n4"},
                {"role": "user", "content": "And 3+3?"},
                {"role": "assistant", "content": "<think>\nSix.\n</think>\n\n6", "weight": 2.0}]  # fmt: skip
    (tmp_path / "raw.jsonl").write_text(json.dumps({"messages": messages}) + "\n")
    args = ["build", str(tmp_path / "raw.jsonl"), "--tokenizer", str(tmp_path / "tok"), "--out", str(tmp_path / "out"),
            "--seq-len", "256"]  # fmt: skip
    assert CliRunner().invoke(main, args).exit_code == 0
    out = CliRunner().invoke(main, ["inspect", str(tmp_path / "out"), "--no-color"]).output
    assert out.startswith(f"{tmp_path / 'out'}/: 1 shard(s)")
    docs = {d.split(" ──")[0].split(", the per-turn document of ")[-1]: d for d in out.split("── document ")[1:]}
    assert sorted(docs) == ["messages[1]", "messages[3]"]
    assert "▸ earlier turns as rendered before messages[3], weight 0: [w=0]<|im_start|>assistant\n4<|im_end|>" in docs["messages[3]"]
    assert "▸ assistant (messages[3]), weight 2:" in docs["messages[3]"]
    assert "earlier turns" not in docs["messages[1]"] and "▸ assistant (messages[1]), weight 1:" in docs["messages[1]"]


def _reference_lines(turns: np.ndarray, first_row: int, roles: list[str]) -> list[str]:
    """The turns file's lines, row by row: each run of one non-zero code is a [start, length, role, message] span."""
    from weightprep.batches import split_turn_code

    lines = []
    for r, row in enumerate(turns.tolist()):
        spans, start = [], 0
        for j in range(1, len(row) + 1):
            if j == len(row) or row[j] != row[start]:
                if row[start]:
                    role, message = split_turn_code(row[start])  # the codes' own decoder (batches)
                    spans.append([start, j - start, roles[role], message])
                start = j
        if spans:
            lines.append(json.dumps({"row": first_row + r, "turns": spans}, ensure_ascii=False) + "\n")
    return lines


@settings(max_examples=200, deadline=None)
@given(
    runs=st.lists(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(1, 5)), max_size=6), max_size=5),
    first_row=st.integers(0, 10**6),
)
def test_the_turn_lines_of_a_chunk_are_its_rows_runs(runs, first_row):
    """``write.turn_lines`` finds every row's runs at once; the reference walks each row (and json.dumps each line)."""
    from weightprep.batches import turn_code
    from weightprep.stages.write import turn_lines

    roles = ["user", "assistant", 'tö"ol\\']  # escaped as JSON, non-ASCII kept
    seq_len = max([sum(n for *_, n in row) for row in runs] + [1])
    turns = np.zeros((len(runs), seq_len), dtype=np.int32)
    for r, row in enumerate(runs):
        at = 0
        for role, message, n in row:  # role 0: template text (code 0), else roles[role - 1]
            turns[r, at : at + n] = turn_code(list(roles), roles[role - 1], message) if role else 0
            at += n
    assert turn_lines(turns, first_row, roles) == _reference_lines(turns, first_row, roles)
    assert turn_lines(turns[:, :0], first_row, roles) == []


def test_a_turn_code_holds_65534_messages_and_16382_roles_and_anything_beyond_is_template_text():
    """``turn_code`` packs a role's index and a message's into an int32; past what it holds (a message index of
    65,535 or more, a new role once 16,383 are known) the code is 0, the template text's, and no role is added."""
    from weightprep.batches import split_turn_code, turn_code

    roles: list[str] = []
    last = (1 << 16) - 2  # the largest message index a code holds
    code = turn_code(roles, "assistant", last)
    assert code > 0 and split_turn_code(code) == (0, last) and roles == ["assistant"]
    assert turn_code(roles, "assistant", last + 1) == 0 and roles == ["assistant"]
    roles = [f"role{i}" for i in range((1 << 14) - 2)]
    code = turn_code(roles, "new", 3)  # the last role a code holds
    assert split_turn_code(code) == ((1 << 14) - 2, 3) and len(roles) == (1 << 14) - 1
    assert np.int32(code) == code  # an int32 holds it (the turns column's type)
    assert turn_code(roles, "another", 0) == 0 and len(roles) == (1 << 14) - 1 and "another" not in roles
    assert split_turn_code(turn_code(roles, "role0", 5)) == (0, 5)  # a role already known keeps its code
