"""``--dataset-info FILE:NAME``: a LLaMA-Factory ``dataset_info.json`` entry read as the ``--columns`` mapping it
stands for; records named as an entry names them build as the same records in weightprep's own names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from weightprep.cli import main
from weightprep.config import config_from_dict
from weightprep.constants import MANIFEST_NAME
from weightprep.errors import UsageError
from weightprep.pipeline import build
from weightprep.stages.dataset_info import dataset_info_columns

#: written by hand in LLaMA-Factory's layout (data/README.md)
INFO = {
    "alpaca_demo": {"file_name": "alpaca.json"},
    "alpaca_renamed": {
        "file_name": "a.json",
        "columns": {"prompt": "instr", "query": "inp", "response": "out", "system": "sys", "history": "hist"},
    },
    "glaive_demo": {"file_name": "g.json", "formatting": "sharegpt", "columns": {"messages": "conversations", "tools": "tools"}},
    "sharegpt_tags": {
        "file_name": "s.json", "formatting": "sharegpt", "columns": {"messages": "dialog"},
        "tags": {"user_tag": "USER", "assistant_tag": "BOT", "observation_tag": "OBS", "function_tag": "CALL"},
    },
    "openai_style": {
        "file_name": "o.json", "formatting": "sharegpt", "columns": {"messages": "msgs", "system": "sys"},
        "tags": {"role_tag": "speaker", "content_tag": "said", "user_tag": "user", "assistant_tag": "assistant",
                 "system_tag": "system"},
    },
    "role_content_defaults": {"file_name": "r.json", "formatting": "sharegpt", "tags": {"role_tag": "role", "content_tag": "content"}},
    "wiki_demo": {"file_name": "wiki_demo.txt", "columns": {"prompt": "text"}},
    "refinedweb": {"hf_hub_url": "tiiuae/falcon-refinedweb", "columns": {"prompt": "content"}},
    "dpo": {"file_name": "d.json", "ranking": True, "formatting": "sharegpt", "columns": {"chosen": "c", "rejected": "r"}},
    "mllm": {"file_name": "m.json", "formatting": "sharegpt", "columns": {"messages": "messages", "images": "images"}},
    "other": {"file_name": "x.json", "formatting": "openai"},
}  # fmt: skip


@pytest.fixture
def info(tmp_path: Path) -> Path:
    path = tmp_path / "dataset_info.json"
    path.write_text(json.dumps(INFO, indent=2))
    return path


@pytest.mark.parametrize(
    ("name", "columns"),
    [
        ("alpaca_demo", ""),
        ("alpaca_renamed", "instruction=instr,input=inp,output=out,system=sys,history=hist"),
        ("glaive_demo", ""),
        ("wiki_demo", ""),  # pre-training text: a prompt and no response
        ("refinedweb", "text=content"),
        ("sharegpt_tags", "conversations=dialog,role.user=USER,role.assistant=BOT,role.tool=OBS,role.function_call=CALL"),
        ("openai_style", "messages=msgs,message.role=speaker,message.content=said,role.tool=observation,system=sys"),
        # LLaMA-Factory's role defaults are ShareGPT's (human, gpt, observation) whatever the keys
        ("role_content_defaults", "messages=conversations,role.user=human,role.assistant=gpt,role.tool=observation"),
    ],
)
def test_an_entry_is_the_mapping_it_stands_for(info, name, columns):
    assert dataset_info_columns(f"{info}:{name}") == columns


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("dpo", "ranking, chosen, rejected: a preference dataset (weightprep builds supervised data) is not supported"),
        ("mllm", "images: media columns (a text tool) is not supported"),
        ("other", "formatting 'openai': expected 'alpaca' or 'sharegpt'"),
        ("missing", "has no entry 'missing'; its entries: alpaca_demo, alpaca_renamed, dpo, glaive_demo, mllm, openai_style, other, refinedweb"),
    ],
)
def test_an_entry_weightprep_cannot_read_is_refused_naming_why(info, name, problem):
    with pytest.raises(UsageError, match="--dataset-info") as err:
        dataset_info_columns(f"{info}:{name}")
    assert problem in str(err.value)


def test_a_spec_without_a_name_or_file_is_refused(tmp_path):
    with pytest.raises(UsageError, match="expected FILE:NAME"):
        dataset_info_columns("dataset_info.json")
    with pytest.raises(UsageError, match="cannot read"):
        dataset_info_columns(f"{tmp_path}/none.json:x")


def _arrow(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.arrow"))}


def _build(tmp_path: Path, records: list[dict], tok, name: str, columns: str = "") -> dict[str, bytes]:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(records))
    cfg = config_from_dict({"pack": {"seq_len": 256}, "read": {"columns": columns or None}})
    manifest = build([str(path)], tmp_path / f"out-{name}", cfg, tokenizer=tok)
    assert manifest["counts"]["records"] == len(records) and not manifest["counts"].get("rejected")
    return _arrow(tmp_path / f"out-{name}")


@pytest.fixture(scope="module")
def chatml():
    from chat_support import chat_tokenizer

    return chat_tokenizer("chatml")  # Qwen2.5's template


def test_records_named_as_their_entry_says_build_as_the_canonical_records(tmp_path, info, chatml):
    sample_tok = chatml
    canonical_alpaca = [{"instruction": "Add", "input": "2 and 2", "output": "4", "system": "Be brief.",
                         "history": [["Hi", "Hello!"]]}]  # fmt: skip
    renamed_alpaca = [{"instr": "Add", "inp": "2 and 2", "out": "4", "sys": "Be brief.", "hist": [["Hi", "Hello!"]]}]
    want = _build(tmp_path, canonical_alpaca, sample_tok, "alpaca")
    assert _build(tmp_path, renamed_alpaca, sample_tok, "alpaca-r", dataset_info_columns(f"{info}:alpaca_renamed")) == want

    canonical = [{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]}]
    tagged = [{"dialog": [{"from": "USER", "value": "Hi"}, {"from": "BOT", "value": "Hello!"}]}]
    want = _build(tmp_path, canonical, sample_tok, "sharegpt")
    assert _build(tmp_path, tagged, sample_tok, "sharegpt-r", dataset_info_columns(f"{info}:sharegpt_tags")) == want

    messages = [{"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"},
                              {"role": "assistant", "content": "Hello!"}]}]  # fmt: skip
    openai = [{"msgs": [{"speaker": "system", "said": "S"}, {"speaker": "user", "said": "Hi"},
                        {"speaker": "assistant", "said": "Hello!"}]}]  # fmt: skip
    want = _build(tmp_path, messages, sample_tok, "messages")
    assert _build(tmp_path, openai, sample_tok, "openai-r", dataset_info_columns(f"{info}:openai_style")) == want

    want = _build(tmp_path, [{"text": "Plain words to pre-train on."}], sample_tok, "text")
    got = _build(tmp_path, [{"content": "Plain words to pre-train on."}], sample_tok, "text-r", dataset_info_columns(f"{info}:refinedweb"))
    assert got == want


def test_the_flag_adds_the_entry_to_columns(tmp_path, info, chatml):
    tok_dir = tmp_path / "tok"
    chatml.save_pretrained(str(tok_dir))
    data = tmp_path / "a.json"
    data.write_text(json.dumps([{"instr": "Add", "inp": "2 and 2", "out": "4", "note": "x"}]))
    out = tmp_path / "out"
    tok = ["--tokenizer", str(tok_dir), "--seq-len", "64"]
    result = CliRunner().invoke(main, ["build", str(data), "--out", str(out), *tok, "--dataset-info", f"{info}:alpaca_renamed"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["config"]["read"]["columns"] == "instruction=instr,input=inp,output=out,system=sys,history=hist"
    assert manifest["counts"]["records"] == 1
    both = CliRunner().invoke(main, ["build", str(data), "--out", str(tmp_path / "o2"), *tok, "--dataset-info",
                                     f"{info}:alpaca_demo", "--columns", "instruction=instr,input=inp,output=out"])  # fmt: skip
    assert both.exit_code == 0, both.output
    bad = CliRunner().invoke(main, ["build", str(data), "--out", str(tmp_path / "o3"), *tok, "--dataset-info", f"{info}:nope"])
    assert bad.exit_code != 0 and "has no entry 'nope'" in bad.output
