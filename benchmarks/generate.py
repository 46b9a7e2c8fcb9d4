"""Benchmark inputs: realistic token-weighted JSONL of any size, and a GPT-2-size byte-level BPE.

Records come from the sample-data builders (``sample_data/make_raw.py``): instruction rows with a
weight-0 prompt and a weight-1 answer, multi-span weighted answers (0.5 / 1 / 2), multi-turn chats,
prose and multilingual text, in the sample's proportions, without the tiny and overlong extremes;
each record gets its own seeded RNG so any size is a prefix of a larger one. With the 50k tokenizer
the mean document is ~400 tokens.

The tokenizer is a byte-level BPE of 50,257 ids (GPT-2's size) trained with ``tokenizers`` on the
first records of the data plus the Python standard library's sources (the data's word banks alone
saturate at ~10k ids); both are cached under ``benchmarks/_work/``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import sysconfig
from pathlib import Path

__all__ = ["WORK", "ensure_data", "ensure_tokenizer"]

REPO = Path(__file__).resolve().parent.parent
WORK = Path(__file__).resolve().parent / "_work"


def _make_raw():
    spec = importlib.util.spec_from_file_location("make_raw", REPO / "sample_data" / "make_raw.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def ensure_data(n_records: int, seed: int = 1234) -> Path:
    """``benchmarks/_work/raw-{n}.jsonl``, generated once."""
    WORK.mkdir(exist_ok=True)
    path = WORK / f"raw-{n_records}.jsonl"
    if path.exists():
        return path
    make_raw = _make_raw()
    kinds = list(make_raw.PLAN)
    weights = [make_raw.PLAN[k] for k in kinds]
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for i in range(n_records):
            rng = random.Random(seed * 1_000_003 + i)
            kind = rng.choices(kinds, weights)[0]
            _, source, pieces = make_raw.BUILDERS[kind](rng)
            record = {"pieces": [p for p in pieces if p["text"]], "source": source, "id": f"{kind}-{i}"}
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path


def ensure_tokenizer(vocab_size: int = 50257, train_records: int = 20000) -> Path:
    """A GPT-2-size byte-level BPE saved as a transformers tokenizer directory, trained once."""
    out = WORK / f"bpe-{vocab_size}"
    if (out / "tokenizer.json").exists():
        return out
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    data = ensure_data(train_records)

    def texts():
        with open(data, encoding="utf-8") as f:
            for line in f:
                yield "".join(p["text"] for p in json.loads(line)["pieces"])
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        for path in sorted(stdlib.rglob("*.py")):
            if "site-packages" not in path.parts and "test" not in path.parts:
                yield path.read_text(encoding="utf-8", errors="replace")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts(), trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    wrapped.save_pretrained(str(out))
    return out
