"""A JSON-array input against the same records as JSON Lines: throughput and peak memory, read and whole build.

    python benchmarks/json_array_bench.py --mib 1024            # a 1 GiB array (about 600k records), read only
    python benchmarks/json_array_bench.py --mib 64 --build      # and the whole build of each (tokenizer included)
    python benchmarks/json_array_bench.py --mib 128 --build --workers 2 --part-bytes 33554432   # on 2 workers
    python benchmarks/json_array_bench.py --mib 1024 --sized jsonl --build --workers 2   # 1 GiB of JSON Lines

``--mib`` sizes the array (the issue's "1 GB JSON-array file and the same records as JSONL"); the JSON Lines file
of the same records is about 7% smaller. ``--sized jsonl``: the sizing of the earlier figures (docs/inputs.md), 1
GiB of JSON Lines and a 7% larger array. The records are the benchmark's generated data
(``benchmarks/generate.py``); the array is written as LLaMA-Factory
writes its files (``json.dump(records, f, indent=2, ensure_ascii=False)``: one record over many lines), so the
splitter (``weightprep.stages.json_array``) sees a pretty-printed file, its worst case. Each measurement runs in a
fresh subprocess, rounds interleaved; peak RSS is the subprocess's (``wait4``), and so are its CPU seconds (user +
system, its worker processes included): on a machine shared with other jobs they move far less than the wall
clock, and their ratio is the throughput ratio the two files would have on idle cores, serial steps aside.

``read``: ``read_blocks`` + ``parse_block`` over the whole file (stage 1 and 2, the part that differs between the
two files), records per second. ``build``: ``weightprep build`` of the file, whole process (``--workers N``: with
``--executor local --workers N``; ``--part-bytes``: the parts' size, for both files). ``plan``: the plan of the
array's parts at ``--part-bytes`` that the array's build makes (guessed from the file's layout:
``plan_array.guessed_cuts``), and the exact plan's threaded pass beside it. The ratio is the array's throughput over the JSON Lines file's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from generate import WORK, ensure_data, ensure_tokenizer  # noqa: E402

_READ = """
import sys, time
from weightprep.stages.read import InputFile, read_blocks
from weightprep.stages.validate import parse_block
t0 = time.perf_counter()
record, n = InputFile(sys.argv[1]), 0
for block in read_blocks(record, 8 << 20):
    n += len(parse_block(block))
print(n, time.perf_counter() - t0)
"""


_PLAN = """
import sys, time
from weightprep.distribute.plan import plan_parts
t0 = time.perf_counter()
parts = plan_parts([sys.argv[1]], int(sys.argv[2]), exact=sys.argv[3] == "exact")
print(len(parts), time.perf_counter() - t0, sum(p.check is not None for p in parts))
"""


def files(mib: int, sized: str = "array") -> tuple[Path, Path]:
    """The JSON Lines file and the array of the same records (a prefix of the generated data): ``sized="array"``,
    the array of at most ``mib`` MiB (the issue's "1 GB JSON-array file and the same records as JSONL"; the JSON
    Lines file is then about 7% smaller); ``"jsonl"``, the JSON Lines file of about ``mib`` MiB (the array about 7%
    larger: the sizing of the earlier figures)."""
    WORK.mkdir(exist_ok=True)
    stem = f"array-bench-{mib}" if sized == "jsonl" else f"array-bench-array{mib}"
    jsonl, array = WORK / f"{stem}.jsonl", WORK / f"{stem}.json"
    if jsonl.exists() and array.exists():
        return jsonl, array
    source = ensure_data(max(1000, mib * 700))  # about 1.6 KB a record as JSON Lines
    limit, tail = mib << 20, "\n]\n"
    # json.dump(indent=2) record by record: the whole list never in this process's memory
    tmp_jsonl, tmp_array = jsonl.with_suffix(".jsonl.tmp"), array.with_suffix(".json.tmp")
    with open(source, encoding="utf-8") as f, open(tmp_jsonl, "w", encoding="utf-8") as out, \
            open(tmp_array, "w", encoding="utf-8") as arr:  # fmt: skip
        arr.write("[\n")
        size, array_size = 0, 2
        for i, line in enumerate(f):
            text = json.dumps(json.loads(line), indent=2, ensure_ascii=False)
            piece = ("" if i == 0 else ",\n") + "  " + text.replace("\n", "\n  ")
            piece_size = len(piece.encode())
            if sized == "array" and array_size + piece_size + len(tail) > limit:
                break
            out.write(line)
            arr.write(piece)
            size, array_size = size + len(line.encode()), array_size + piece_size
            if sized == "jsonl" and size >= limit:
                break
        arr.write(tail)
    os.replace(tmp_jsonl, jsonl)
    os.replace(tmp_array, array)
    return jsonl, array


def run(cmd: list[str]) -> tuple[float, float, str, float]:
    """Wall seconds, peak RSS (MiB), stdout and CPU seconds (the process and its workers) of ``cmd`` in a fresh
    process."""
    with tempfile.TemporaryFile() as stdout:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        err = proc.stderr.read().decode() if proc.stderr else ""
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{err[-3000:]}")
        stdout.seek(0)
        return wall, usage.ru_maxrss / 1024, stdout.read().decode(), usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="size of the array (--sized array, the default) or of the "
                    "JSON Lines file (--sized jsonl), in MiB")
    ap.add_argument("--sized", choices=("array", "jsonl"), default="array",
                    help="which file --mib sizes: the array (the JSON Lines file of the same records is about 7%% "
                    "smaller) or the JSON Lines file (the array about 7%% larger)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--build", action="store_true", help="also time the whole build of each file")
    ap.add_argument("--workers", type=int, help="build with --executor local --workers N")
    ap.add_argument("--part-bytes", type=int, default=256 << 20, help="the parts' size (read.part_bytes)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--out-dir", type=Path, default=WORK,
                    help="where the builds write their output (default benchmarks/_work; /dev/shm: a build's 3 GB of "
                    "shards in memory, the same for both files, off the disk)")  # fmt: skip
    args = ap.parse_args()
    jsonl, array = files(args.mib, args.sized)
    results: dict[str, dict[str, list[float]]] = {}
    plan: dict[str, list[float]] = {"seconds": [], "parts": [], "exact": [], "guessed": []}
    for _ in range(args.repeat):
        for how in ("exact", "guessed"):
            _, _, out, _ = run([sys.executable, "-c", _PLAN, str(array), str(args.part_bytes), how])
            plan["seconds" if how == "guessed" else "exact"].append(float(out.split()[1]))
        plan["parts"].append(int(out.split()[0]))
        plan["guessed"].append(int(out.split()[2]))
        for name, path in (("jsonl", jsonl), ("array", array)):
            wall, rss, out, cpu = run([sys.executable, "-c", _READ, str(path)])
            records, seconds = out.split()
            entry = results.setdefault(f"read {name}", {"seconds": [], "rss": [], "records": [], "cpu": []})
            entry["cpu"].append(cpu)
            entry["seconds"].append(float(seconds))
            entry["rss"].append(rss)
            entry["records"].append(int(records))
            if args.build:
                os.sync()  # the disk's backlog from an earlier step: not this build's
                with tempfile.TemporaryDirectory(dir=args.out_dir) as out_dir:
                    cmd = [sys.executable, "-m", "weightprep", "build", str(path), "--out", f"{out_dir}/o",
                           "--tokenizer", str(ensure_tokenizer()), "--part-bytes", str(args.part_bytes)]  # fmt: skip
                    if args.workers:
                        cmd += ["--executor", "local", "--workers", str(args.workers)]
                    wall, rss, _, cpu = run(cmd)
                entry = results.setdefault(f"build {name}", {"seconds": [], "rss": [], "records": [], "cpu": []})
                entry["cpu"].append(cpu)
                entry["seconds"].append(wall)
                entry["rss"].append(rss)
                entry["records"].append(results["read " + name]["records"][-1])
    table = {}
    for key, entry in results.items():
        seconds = statistics.median(entry["seconds"])
        table[key] = {"seconds": seconds, "records_per_s": entry["records"][0] / seconds, "peak_rss_mib": max(entry["rss"]),
                      "cpu_seconds": statistics.median(entry["cpu"]), "all_seconds": entry["seconds"]}  # fmt: skip
    sizes = {"jsonl": jsonl.stat().st_size, "array": array.stat().st_size}
    print(f"JSON Lines {sizes['jsonl'] / 2**20:,.0f} MiB, array {sizes['array'] / 2**20:,.0f} MiB, "
          f"{results['read jsonl']['records'][0]:,} records; median of {args.repeat}")  # fmt: skip
    table["plan array"] = {"seconds": statistics.median(plan["seconds"]), "parts": plan["parts"][0],
                           "guessed": bool(plan["guessed"][0]), "exact_seconds": statistics.median(plan["exact"])}  # fmt: skip
    how = "guessed from its layout" if plan["guessed"][0] else "no layout to guess from"
    print(f"  plan array   {table['plan array']['seconds']:8.2f} s  {plan['parts'][0]} parts of "
          f"{args.part_bytes / 2**20:g} MiB, {how} (the exact plan's pass: "
          f"{table['plan array']['exact_seconds']:.2f} s)")  # fmt: skip
    for key, row in table.items():
        if key == "plan array":
            continue
        print(f"  {key:12s} {row['seconds']:8.2f} s  {row['records_per_s']:>10,.0f} records/s  "
              f"peak RSS {row['peak_rss_mib']:7.0f} MiB  CPU {row['cpu_seconds']:7.1f} s")  # fmt: skip
    for stage in ("read", "build"):
        if f"{stage} array" in table:
            ratio = table[f"{stage} array"]["records_per_s"] / table[f"{stage} jsonl"]["records_per_s"]
            cpu = table[f"{stage} jsonl"]["cpu_seconds"] / table[f"{stage} array"]["cpu_seconds"]
            print(f"  {stage}: array / JSON Lines throughput = {ratio:.2f}x (CPU seconds: {cpu:.2f}x)")
            table[f"{stage} ratio"] = {"array_over_jsonl": ratio, "cpu_jsonl_over_array": cpu}
    if args.json:
        args.json.write_text(json.dumps({"sizes": sizes, **table}, indent=2))


if __name__ == "__main__":
    main()
