"""Shared fixtures: the sample tokenizer, a JSONL writer, and an in-process build."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/ helpers: reference, tokenizer_factory

REPO = Path(__file__).resolve().parent.parent
SAMPLE_RAW = REPO / "sample_data" / "raw.jsonl"


@pytest.fixture(scope="session")
def sample_tok():
    from tokenizer_factory import sample_tokenizer

    return sample_tokenizer()


@pytest.fixture
def write_jsonl(tmp_path):
    """write_jsonl(records | lines, name) -> path; str items are written verbatim as lines."""

    def write(items, name: str = "raw.jsonl") -> Path:
        path = tmp_path / name
        lines = [it if isinstance(it, str) else json.dumps(it, ensure_ascii=False) for it in items]
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        return path

    return write


def load_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
