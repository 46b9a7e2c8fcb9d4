"""The alternatives weightprep is measured against, each runnable alone (the driver runs them as
subprocesses so each one's wall time and peak RSS are its own):

- ``limit``: tokenize-only. Reads the whole file, pushes every piece text through the same fast
  tokenizer (``tokenizers.Tokenizer.from_file``, no transformers) in large batches on all cores, and does nothing else.
- ``limit-fastokens``: the same with fastokens' ``encode_batch_flat``: the limit of a build on fastokens.
- ``weightprep-hf``: weightprep with ``--tokenizer-backend hf`` (tokenizers), for the backends' ratio; its
  shards must be byte-identical to ``weightprep``'s.
- ``weightprep-ray``: weightprep on Ray actors (``--executor ray``, a local Ray cluster started for the build),
  against ``weightprep`` on its default local executor; the same part plan, so the same shard bytes.
- ``seed``: the recipe weightprep replaces (the write-up the project started from): ``datasets.map``
  tokenizing each piece to build the weights, then the joined text again, padded to max length,
  labels masked by pad id; ``save_to_disk``.
- ``trl``: TRL's own path for the same texts: ``datasets.map`` tokenizing the joined text, then
  ``trl.pack_dataset(..., strategy="bfd")``, ``save_to_disk``. No weights at all.

Each prints one JSON line with ``seconds``: the time from the start of reading to the finished output,
tokenizer loading included, interpreter start-up and imports excluded (weightprep: from its command's start,
which imports the build while the tokenizer loads).

Usage: python benchmarks/alternatives.py {weightprep,weightprep-hf,weightprep-ray,limit,limit-fastokens,seed,trl} INPUT TOKENIZER OUT SEQ_LEN
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

__all__ = ["weightprep_build", "limit", "limit_fastokens", "seed_recipe", "trl_path"]


def peak_rss() -> int | None:
    """This process's peak resident memory in bytes (VmHWM: its own address space only; the driver's
    ``wait4`` figure also counts the parent's memory at fork time on Linux)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None


def _report(start: float, **extra) -> None:
    print(json.dumps({"seconds": time.perf_counter() - start, **extra, "peak_rss": peak_rss()}))


def weightprep_build(
    path: str, tokenizer: str, out: str, seq_len: int, backend: str = "auto", executor: str = "local"
) -> None:
    """``weightprep build`` as a user runs it: its command line, in this process (its summary on stdout dropped), the
    process then ended as the command line's is (``weightprep.cli.run``: without the interpreter's teardown);
    ``BENCH_PART_BYTES`` sets ``--part-bytes``. Its ``seconds`` start where the command starts, so they include the
    build's own imports, which the command overlaps with loading the tokenizer."""
    import contextlib
    import io

    from weightprep.cli import main
    from weightprep.constants import MANIFEST_NAME

    start = time.perf_counter()
    args = ["build", path, "--tokenizer", tokenizer, "--tokenizer-backend", backend, "--seq-len", str(seq_len),
            "--out", out, "--overwrite", "--executor", executor]  # fmt: skip
    if os.environ.get("BENCH_PART_BYTES"):
        args += ["--part-bytes", os.environ["BENCH_PART_BYTES"]]
    with contextlib.redirect_stdout(io.StringIO()):
        main(args, standalone_mode=False)
    c = json.loads((Path(out) / MANIFEST_NAME).read_text())["counts"]
    _report(start, tokens=c["piece_tokens"], rows=c["rows"], fill=c["fill_ratio"])
    from weightprep.commands import _ending

    _ending.end(0)  # as the command line's process (weightprep.cli.run) ends after its build


def limit(path: str, tokenizer: str, out: str, seq_len: int) -> None:
    from tokenizers import Tokenizer

    start = time.perf_counter()
    backend = Tokenizer.from_file(f"{tokenizer}/tokenizer.json")
    with open(path, encoding="utf-8") as f:
        texts = [p["text"] for line in f for p in json.loads(line)["pieces"]]
    n = 0
    batch = 16384
    for i in range(0, len(texts), batch):
        n += sum(len(e.ids) for e in backend.encode_batch_fast(texts[i : i + batch], add_special_tokens=False))
    _report(start, tokens=n)


def limit_fastokens(path: str, tokenizer: str, out: str, seq_len: int) -> None:
    import fastokens
    import numpy as np

    start = time.perf_counter()
    tok = fastokens.Tokenizer.from_file(f"{tokenizer}/tokenizer.json")
    with open(path, encoding="utf-8") as f:
        texts = [p["text"] for line in f for p in json.loads(line)["pieces"]]
    n = 0
    batch = 16384
    for i in range(0, len(texts), batch):
        ids, _ = tok.encode_batch_flat(texts[i : i + batch], add_special_tokens=False)
        n += len(np.frombuffer(ids, dtype="<u4"))
    _report(start, tokens=n)


def _load(path: str):
    import datasets

    datasets.disable_progress_bars()
    return datasets.load_dataset("json", data_files=path, split="train")


def seed_recipe(path: str, tokenizer: str, out: str, seq_len: int) -> None:
    from transformers import AutoTokenizer

    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(tokenizer)
    tok.pad_token = tok.pad_token or tok.eos_token

    def fn(batch):
        result = {"input_ids": [], "attention_mask": [], "labels": [], "weights": []}
        for pieces in batch["pieces"]:
            weights = []
            for p in pieces:  # each piece to learn its token count...
                ids = tok(p["text"], add_special_tokens=False)["input_ids"]
                weights.extend([p["weight"]] * len(ids))
            text = "".join(p["text"] for p in pieces)  # ...then the joined text again
            enc = tok(text, padding="max_length", truncation=True, max_length=seq_len)
            weights = (weights + [0.0] * seq_len)[:seq_len]
            labels = [i if i != tok.pad_token_id else -100 for i in enc["input_ids"]]  # masked by pad id
            result["input_ids"].append(enc["input_ids"])
            result["attention_mask"].append(enc["attention_mask"])
            result["labels"].append(labels)
            result["weights"].append(weights)
        return result

    ds = _load(path)
    ds = ds.map(fn, batched=True, remove_columns=ds.column_names)
    ds.save_to_disk(out)
    _report(start, rows=len(ds), fill=sum(map(sum, ds["attention_mask"])) / (len(ds) * seq_len))


def trl_path(path: str, tokenizer: str, out: str, seq_len: int) -> None:
    from transformers import AutoTokenizer
    from trl import pack_dataset

    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(tokenizer)

    def fn(batch):
        texts = ["".join(p["text"] for p in pieces) for pieces in batch["pieces"]]
        return {"input_ids": tok(texts, add_special_tokens=False)["input_ids"]}

    ds = _load(path)
    ds = ds.map(fn, batched=True, remove_columns=ds.column_names)
    packed = pack_dataset(ds, seq_length=seq_len, strategy="bfd")
    packed.save_to_disk(out)
    seconds = time.perf_counter() - start
    real = sum(map(len, ds["input_ids"]))  # outside the timed region
    print(json.dumps({"seconds": seconds, "rows": len(packed), "fill": real / (len(packed) * seq_len), "peak_rss": peak_rss()}))


def _preimport(name: str) -> None:
    """Import what the tool needs, and only that, before its timer starts (the whole-process time includes it)."""
    if name in ("seed", "trl"):
        import datasets  # noqa: F401
        from transformers import AutoTokenizer  # noqa: F401
    if name == "trl":
        import trl  # noqa: F401
    if name.startswith("weightprep"):
        import weightprep.cli  # noqa: F401  (the command imports the build itself, as it runs for a user)
    if name == "weightprep-ray":
        import ray  # noqa: F401
    if name == "limit":
        import tokenizers  # noqa: F401
    if name == "limit-fastokens":
        import fastokens  # noqa: F401


if __name__ == "__main__":
    name, path, tokenizer, out, seq_len = sys.argv[1:6]
    _preimport(name)
    tools = {
        "weightprep": weightprep_build,
        "weightprep-hf": lambda *a: weightprep_build(*a, backend="hf"),
        "weightprep-ray": lambda *a: weightprep_build(*a, executor="ray"),
        "limit": limit,
        "limit-fastokens": limit_fastokens,
        "seed": seed_recipe,
        "trl": trl_path,
    }
    tools[name](path, tokenizer, out, int(seq_len))
