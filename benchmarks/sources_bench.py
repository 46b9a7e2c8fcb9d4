"""The cost of several sources: a 3-source build against a one-source build of the same records.

    python benchmarks/sources_bench.py                     # 20k records, 5 pairs
    python benchmarks/sources_bench.py --records 50000 --repeat 7 --executor local

The generated JSONL (``benchmarks/generate.py``, GPT-2-size tokenizer) is cut into three files of 1/2, 1/3 and
1/6 of its records. Each pair runs, in alternating order, ``weightprep build ALL.jsonl`` and ``weightprep build
--source a=...,weight=2 --source b=...,weight=0.5 --source c=...`` (one epoch each: the same records, tokens and
rows) as whole subprocesses, interpreter start and tokenizer load included. Reported for each: the median wall
seconds and the median CPU seconds (user + system of the whole process tree, ``wait4``: what the build costs,
nearly unaffected by other load on a shared machine), and the medians of the per-pair ratios (3 sources / 1
source) of both. Goal: at most 1.1 (CPU; wall where the machine is otherwise idle). The user-CPU and peak-memory
ratios are printed too: system time is mostly page faults, which grow with the memory a build touches and cost
more while other processes press on memory (the CPU ratio is steadiest on a quiet machine). ``--epochs`` gives source ``b``
1.5 epochs instead (more rows, and the epoch pass), to show that cost apart.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from generate import WORK, ensure_data, ensure_tokenizer  # noqa: E402

GOAL = 1.1


def _split(data: Path) -> list[Path]:
    """``data`` cut into three files of 1/2, 1/3 and 1/6 of its lines (made once)."""
    lines = data.read_text(encoding="utf-8").splitlines(keepends=True)
    cuts = [0, len(lines) // 2, len(lines) * 5 // 6, len(lines)]
    paths = []
    for name, a, b in zip("abc", cuts, cuts[1:], strict=False):
        path = WORK / f"{data.stem}-{name}.jsonl"
        if not path.exists():
            path.write_text("".join(lines[a:b]), encoding="utf-8")
        paths.append(path)
    return paths


def _run(args: list[str]) -> tuple[float, float, float, float]:
    """(wall seconds, CPU seconds, user CPU seconds, peak resident MiB) of one build in a fresh subprocess."""
    out = Path(tempfile.mkdtemp(prefix="sources-bench-", dir=WORK))
    shutil.rmtree(out)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "weightprep", "build", *args, "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"weightprep build {' '.join(args)} failed")
    shutil.rmtree(out)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_utime, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--executor", default="serial", choices=["serial", "local"])
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--epochs", action="store_true", help="source b: 1.5 epochs (not the same records then)")
    opts = parser.parse_args()
    data, tokenizer = ensure_data(opts.records), ensure_tokenizer()
    a, b, c = _split(data)
    common = ["--tokenizer", str(tokenizer), "--seq-len", str(opts.seq_len), "--executor", opts.executor]
    one = [str(data), *common]
    b_opts = ",epochs=1.5" if opts.epochs else ""
    three = ["--source", f"a={a},weight=2", "--source", f"b={b},weight=0.5{b_opts}", "--source", f"c={c}", *common]
    _run(one)  # warm the page cache and the tokenizer files
    runs: dict[str, list[tuple[float, float, float, float]]] = {"one": [], "three": []}
    ratios: dict[str, list[float]] = {"wall": [], "cpu": [], "user": [], "memory": []}
    for i in range(opts.repeat):
        order = ["one", "three"] if i % 2 == 0 else ["three", "one"]
        pair = {name: _run(one if name == "one" else three) for name in order}
        for name, measured in pair.items():
            runs[name].append(measured)
        ratios["wall"].append(pair["three"][0] / pair["one"][0])
        ratios["cpu"].append(pair["three"][1] / pair["one"][1])
        ratios["user"].append(pair["three"][2] / pair["one"][2])
        ratios["memory"].append(pair["three"][3] / pair["one"][3])
        print(f"pair {i + 1}: one source {pair['one'][0]:.2f} s ({pair['one'][1]:.2f} s CPU), three sources "
              f"{pair['three'][0]:.2f} s ({pair['three'][1]:.2f} s CPU)", flush=True)  # fmt: skip

    def median(name: str, k: int) -> float:
        return statistics.median(m[k] for m in runs[name])

    wall, cpu = statistics.median(ratios["wall"]), statistics.median(ratios["cpu"])
    print(f"{opts.records:,} records, {opts.repeat} pairs, --executor {opts.executor}: one source {median('one', 0):.2f} s "
          f"wall / {median('one', 1):.2f} s CPU, three sources {median('three', 0):.2f} s / {median('three', 1):.2f} s; "
          f"median ratio wall {wall:.3f}, CPU {cpu:.3f} (goal <= {GOAL}); user CPU {statistics.median(ratios['user']):.3f}, "
          f"peak memory {statistics.median(ratios['memory']):.3f} ({median('one', 3):.0f} MiB / {median('three', 3):.0f} MiB)")  # fmt: skip
    if cpu > GOAL and not opts.epochs:
        sys.exit(1)


if __name__ == "__main__":
    main()
