"""Where a build's time goes, stage by stage, and where the fastokens limit's goes: the table of docs/performance.md.

    python benchmarks/profile_build.py                 # 30k generated records, GPT-2-size BPE (benchmarks/generate.py)
    python benchmarks/profile_build.py --records 300000 --repeat 3

Runs the stages of one part in this process, one after the other on one thread (no overlap, so each stage's
time is its own), block by block exactly as a build runs them, and times each with wall clocks
(``perf_counter``), not CPU seconds: the tokenizer's calls use every core, and CPU seconds would count its threads
too. Rows: reading (``read_blocks``: bytes, line cuts, SHA-256), JSON parsing + validation (``parse_block``),
the fastokens calls (``encode_batch_flat``), the guard's re-encoding with tokenizers, the rest of the tokenize
stage (the Python glue), assemble, mask, filter, pack, write (Arrow IPC). Then the limit script
(``alternatives.limit_fastokens``) split the same way: loading the tokenizer, reading + ``json.loads``, encoding.
Loading the tokenizers and the imports are timed apart. The medians of ``--repeat`` runs are printed as a
Markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from generate import ensure_data, ensure_tokenizer  # noqa: E402

__all__ = ["profile_build", "profile_limit"]


class _Clock:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t


def _timed(clock: _Clock, name: str, fn):
    def wrapper(*args, **kwargs):
        with clock(name):
            return fn(*args, **kwargs)

    return wrapper


def _pack_and_write(clock: _Clock, chunks, writer, row_counts: Counter) -> None:
    """Each chunk of rows made (timed as pack) and written (as write) before the next, as a build's writer does (its
    packer reuses the chunk's arrays)."""
    from weightprep.blocks import count_rows

    while True:
        with clock("pack"):
            rows = next(chunks, None)
        if rows is None:
            return
        count_rows(rows, row_counts)
        with clock("write (Arrow IPC)"):
            writer.write(rows)


def profile_build(data: Path, tokenizer: Path, seq_len: int = 2048) -> dict[str, float]:
    """Seconds per stage of one build of ``data`` (see the module docstring)."""
    clock = _Clock()
    t0 = time.perf_counter()

    import weightprep.blocks as blocks_mod
    from weightprep.config import config_from_dict
    from weightprep.heap import bound_heap
    from weightprep.stages import assemble as assemble_mod
    from weightprep.stages import filter as filter_mod
    from weightprep.stages import mask as mask_mod
    from weightprep.stages import tokenize as tokenize_mod
    from weightprep.stages.pack import Packer
    from weightprep.stages.read import InputFile, read_blocks
    from weightprep.stages.validate import parse_block
    from weightprep.stages.write import ShardWriter
    from weightprep.tokenizer import load_tokenizer, special_tokens

    clock.seconds["imports"] = time.perf_counter() - t0
    bound_heap()  # as a build's worker does
    cfg = config_from_dict({"tokenizer": {"name": str(tokenizer)}, "pack": {"seq_len": seq_len}})
    with clock("load tokenizers (tokenizers + fastokens)"):
        tok = load_tokenizer(str(tokenizer), direct=True)
        specials = special_tokens(tok)
        pieces = tokenize_mod.PieceTokenizer(tok, cfg.tokenizer.batch_size, "auto")
        assert pieces.backend == "fastokens", pieces.note
    # the fastokens calls, the guard's tokenizers calls: timed inside the tokenize stage's own time
    fast = pieces.encoders[0]
    fast._flat = _timed(clock, "tokenize: fastokens calls", fast._flat)
    for ref in pieces.reference:
        if ref is not None:
            ref._encode = _timed(clock, "tokenize: guard (tokenizers)", ref._encode)
    stages = {
        "assemble": (blocks_mod, "assemble", assemble_mod.assemble),
        "mask": (blocks_mod, "mask", mask_mod.mask),
        "filter": (blocks_mod, "filter_documents", filter_mod.filter_documents),
    }
    for label, (module, name, fn) in stages.items():
        setattr(module, name, _timed(clock, label, fn))
    try:
        out = Path(tempfile.mkdtemp(prefix="profile-build-"))
        packer = Packer(seq_len, specials.pad, window=cfg.pack.window, reuse=1)  # each chunk written before the next
        writer = ShardWriter(out, seq_len, packed=True, max_shard_bytes=cfg.write.max_shard_bytes)
        counts: dict = defaultdict(int)
        record = InputFile(str(data))
        blocks = iter(read_blocks(record, cfg.read.block_bytes, cfg.read.max_line_bytes))
        row_counts: Counter = Counter()
        while True:
            with clock("read (bytes, lines, SHA-256)"):
                block = next(blocks, None)
            if block is None:
                break
            with clock("JSON parsing + validation"):
                records = parse_block(block, None)
            with clock("tokenize + assemble + mask + filter (document_batch)"):
                docs, batch_counts = blocks_mod.document_batch(records, pieces, specials, cfg, labels=False)
            for k, v in batch_counts.items():
                counts[k] += v
            _pack_and_write(clock, packer.add(docs), writer, row_counts)
        _pack_and_write(clock, packer.flush(), writer, row_counts)
        with clock("write (Arrow IPC)"):
            writer.close()
    finally:
        for module, name, fn in stages.values():
            setattr(module, name, fn)
    s = dict(clock.seconds)
    batch = s.pop("tokenize + assemble + mask + filter (document_batch)")
    inner = sum(s[k] for k in ("tokenize: fastokens calls", "tokenize: guard (tokenizers)", "assemble", "mask", "filter"))
    s["tokenize: Python glue (+ counts)"] = batch - inner
    s["total (measured stages)"] = sum(v for k, v in s.items())
    s["_tokens"] = counts["piece_tokens"]
    s["_rows"] = row_counts["rows"]
    return s


def profile_limit(data: Path, tokenizer: Path) -> dict[str, float]:
    """The limit script (``alternatives.limit_fastokens``) cut into its three steps."""
    s: dict[str, float] = {}
    t = time.perf_counter()
    import fastokens
    import numpy as np

    s["imports"] = time.perf_counter() - t
    t = time.perf_counter()
    tok = fastokens.Tokenizer.from_file(f"{tokenizer}/tokenizer.json")
    s["load tokenizers (fastokens)"] = time.perf_counter() - t
    t = time.perf_counter()
    with open(data, encoding="utf-8") as f:
        texts = [p["text"] for line in f for p in json.loads(line)["pieces"]]
    s["read + json.loads"] = time.perf_counter() - t
    t = time.perf_counter()
    n = 0
    for i in range(0, len(texts), 16384):
        ids, _ = tok.encode_batch_flat(texts[i : i + 16384], add_special_tokens=False)
        n += len(np.frombuffer(ids, dtype="<u4"))
    s["tokenize: fastokens calls"] = time.perf_counter() - t
    s["total (measured stages)"] = sum(s.values())
    s["_tokens"] = n
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=30000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--what", choices=["build", "limit", "both"], default="both")
    ap.add_argument("--one", choices=["build", "limit"], help=argparse.SUPPRESS)  # a child run: one JSON line
    args = ap.parse_args()
    data, tokenizer = ensure_data(args.records), ensure_tokenizer()
    if args.one:
        fn = profile_build if args.one == "build" else profile_limit
        print(json.dumps(fn(data, tokenizer) if args.one == "limit" else fn(data, tokenizer, args.seq_len)))
        return
    import subprocess

    whats = ["build", "limit"] if args.what == "both" else [args.what]
    runs: dict[str, list[dict]] = {w: [] for w in whats}
    for r in range(args.repeat):
        for w in whats if r % 2 == 0 else list(reversed(whats)):
            cmd = [sys.executable, __file__, "--one", w, "--records", str(args.records), "--seq-len", str(args.seq_len)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            runs[w].append(json.loads(out.strip().splitlines()[-1]))
    import os

    print(f"\n{args.records:,} records, {runs[whats[0]][0]['_tokens']:,} piece tokens, {args.repeat} runs each "
          f"(medians, seconds, one thread of Python, the tokenizers' calls on all {os.cpu_count()} cores); "
          f"load average {os.getloadavg()[0]:.1f}\n")
    for w in whats:
        keys = [k for k in runs[w][0] if not k.startswith("_")]
        med = {k: statistics.median(r[k] for r in runs[w]) for k in keys}
        total = med["total (measured stages)"]
        print(f"| {w}: stage | seconds | share |\n|---|---:|---:|")
        for k in keys:
            print(f"| {k} | {med[k]:.3f} | {100 * med[k] / total:.0f}% |")
        print()


if __name__ == "__main__":
    main()
