"""Chat records against the same conversations given as pre-rendered pieces: what rendering and alignment cost.

    python benchmarks/chat_bench.py                      # 4,000 conversations, 3 rounds
    python benchmarks/chat_bench.py --records 20000 --turns 4
    python benchmarks/chat_bench.py --family llama3_1     # another template (tests/chat_support.py FAMILIES)

Both inputs hold the same conversations: ``chat.jsonl`` as ``{"messages": [...]}`` records (weightprep renders each
with the ChatML template of TRL's qwen2_5.jinja, or ``--family``'s), ``pieces.jsonl`` as the rendered text already cut where the
weight changes. Each build runs as its own ``weightprep build`` subprocess, rounds interleaved; the figure is the
median wall time of the whole process, and beside it its CPU (user + system of the build and its worker processes),
which moves less with the memory the build before it left. Goal: chat within 1.5x of pieces.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

_TEXT = ("the model learns weighted answers from packed rows of tokens while prompts stay at weight zero and key "
         "phrases count twice as much as ordinary text in every conversation")  # fmt: skip
WORDS = _TEXT.split(" ")


def _sentence(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(lo, hi))).capitalize() + "."


def make_inputs(work: Path, n: int, turns: int, seed: int = 7, family: str = "chatml") -> tuple[Path, Path, Path]:
    """The tokenizer directory (of the tests' chat ``family``), chat.jsonl and pieces.jsonl (same conversations)."""
    from chat_support import chat_tokenizer

    from weightprep.batches import Chat
    from weightprep.stages.chat import ChatRenderer

    tok = chat_tokenizer(family)
    tok_dir = work / "tok"
    tok.save_pretrained(str(tok_dir))
    renderer = ChatRenderer(tok)
    rng = random.Random(seed)
    chat_lines, piece_lines = [], []
    for _ in range(n):
        messages = [{"role": "system", "content": _sentence(rng, 4, 12)}]
        for _ in range(turns):
            messages.append({"role": "user", "content": _sentence(rng, 5, 40)})
            messages.append({"role": "assistant", "content": _sentence(rng, 10, 120), "weight": rng.choice([0.5, 1.0, 2.0])})
        chat_lines.append(json.dumps({"messages": messages}))
        text, weights, _ = renderer.char_weights(Chat(messages, None, None, b""))
        cuts = [0, *(i for i in range(1, len(text)) if weights[i] != weights[i - 1]), len(text)]
        pieces = [{"text": text[a:b], "weight": float(weights[a])} for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
        piece_lines.append(json.dumps({"pieces": pieces}))
    (work / "chat.jsonl").write_text("\n".join(chat_lines) + "\n")
    (work / "pieces.jsonl").write_text("\n".join(piece_lines) + "\n")
    return tok_dir, work / "chat.jsonl", work / "pieces.jsonl"


def run(inp: Path, tok_dir: Path, out: Path, cpu: list[float] | None = None) -> float:
    """The build's wall time; its CPU seconds (user + system, its worker processes included) appended to ``cpu``."""
    cmd = [sys.executable, "-m", "weightprep", "build", str(inp), "--tokenizer", str(tok_dir), "--out", str(out),
           "--overwrite", "--seq-len", "4096"]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    if cpu is not None:
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=4000)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--family", default="chatml", help="the tests' chat family whose template renders the conversations "
                    "(tests/chat_support.py FAMILIES: chatml, llama3, llama3_1, gemma, mistral_v1)")  # fmt: skip
    args = ap.parse_args()
    from build_bench import compile_code

    compile_code()  # as build_bench: no round compiles weightprep's modules (PYTHONDONTWRITEBYTECODE)
    with tempfile.TemporaryDirectory(prefix="chat-bench-") as tmp:
        work = Path(tmp)
        os.environ["WEIGHTPREP_CACHE"] = str(work / "cache")  # this run's own memory of tokenizer classes
        tok_dir, chat, pieces = make_inputs(work, args.records, args.turns, family=args.family)
        times: dict[str, list[float]] = {"chat": [], "pieces": []}
        cpu: dict[str, list[float]] = {"chat": [], "pieces": []}
        # a directory that AutoTokenizer must load imports torch at its first build and the class it chose is
        # remembered (weightprep.tokenizer_class); the rounds measure the builds after a first one, as a user's second
        # build is. This one is read directly (TokenizerFiles): neither build imports transformers
        from weightprep.tokenizer import direct_load_obstacle

        obstacle = direct_load_obstacle(tok_dir)
        cold = {name: run(inp, tok_dir, work / f"out-{name}") for name, inp in (("chat", chat), ("pieces", pieces))}
        for _ in range(args.repeat):
            for name, inp in (("chat", chat), ("pieces", pieces)):
                times[name].append(run(inp, tok_dir, work / f"out-{name}", cpu[name]))
        manifest = json.loads((work / "out-chat" / "weightprep_manifest.json").read_text())
        tokens = manifest["counts"]["accounting"]["tokens"]["accepted"]
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.records:,} conversations x {args.turns} turns ({args.family}), {tokens:,} tokens; whole-process "
          f"medians of {args.repeat}")
    for name in ("chat", "pieces"):
        print(f"  {name:7s} {med[name]:7.2f} s  {tokens / med[name]:>10,.0f} tokens/s   runs {' '.join(f'{t:.2f}' for t in times[name])}"
              f"   CPU {statistics.median(cpu[name]):.2f} s (user + system, its processes together)")
    how = "read directly, no transformers imported" if obstacle is None else f"AutoTokenizer, torch imported: {obstacle}"
    print(f"  the first chat build (the tokenizer {how}): {cold['chat']:.2f} s")
    cpu_ratio = statistics.median(cpu["chat"]) / statistics.median(cpu["pieces"])
    print(f"  chat / pieces CPU: {cpu_ratio:.2f}x (steadier than wall time: the pieces build's wall time moves with the "
          "memory the chat build before it freed)")
    ratio = med["chat"] / med["pieces"]
    print(f"  chat / pieces wall time: {ratio:.2f}x (goal <= 1.5x: {'met' if ratio <= 1.5 else 'MISSED'})")


if __name__ == "__main__":
    main()
