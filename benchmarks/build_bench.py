"""Build throughput, memory and output size: weightprep against the alternatives, side by side.

    python benchmarks/build_bench.py                       # 10k records, 3 rounds, ~7 min on 2 cores
    python benchmarks/build_bench.py --records 100000 --repeat 5
    python benchmarks/build_bench.py --scale 100000,1000000 --tools weightprep   # flat memory, linear time
    python benchmarks/build_bench.py --executor ray --records 100000 --part-bytes 33554432   # Ray vs local
    python benchmarks/build_bench.py --records 30000 --repeat 5 --tools weightprep,limit-fastokens,limit,trl \
        --rss-at 30000,300000                              # issue 35: the build against the limits, and its memory

Every tool runs as its own subprocess on the same generated JSONL with the same GPT-2-size tokenizer
(``benchmarks/generate.py``), rounds interleaved so machine noise spreads evenly. Reported per tool:
median seconds of the whole process (interpreter start, imports and tokenizer load included) and of
its work alone (reading to finished output, as each tool measures itself), input tokens per second of
the whole process (the pieces' tokens, the same count for every tool), peak RSS of the whole process
(``wait4``), output bytes per input token, and fill (real tokens / row slots). Ratios are weightprep's
whole-process throughput over each alternative's, with its target. ``--rss-at`` adds weightprep's peak RSS
at each of the given input sizes (one run each, after the comparison): flat means the same at 10x the input.
Every tool's Python code is byte-compiled first (``compile_code``: the package's modules and these scripts), as a
wheel install leaves it: a checkout installed in editable mode on a machine that sets ``PYTHONDONTWRITEBYTECODE``
(this project's) would otherwise compile weightprep's ~50 modules from source in every run, ~0.07 s of the build's
start that no installed copy pays.
weightprep's rounds are also given split by what ran just before them, its own run or another tool's
(``after_own``): on a virtual machine that hands freed memory back to its host, that decides much of a round
(docs/performance.md).
The load average before and after is printed: on a shared machine, compare ratios and medians of one run,
never seconds across runs. ``weightprep-hf`` (tokenizers backend) must write
the same shard bytes as ``weightprep`` (fastokens under ``auto``): the SHA-256 of their shards is compared.
Tools: see alternatives.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
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

#: weightprep's whole-process throughput / the tool's, at least
TARGETS = {"limit": 3.0, "limit-fastokens": 0.85, "seed": 3.5, "trl": 4.0}
RSS_TARGET_MIB = 600


def run_tool(tool: str, data: Path, tokenizer: Path, seq_len: int) -> dict:
    """One run in a fresh subprocess; returns its own report plus peak RSS and output size."""
    out = Path(tempfile.mkdtemp(prefix=f"bench-{tool}-", dir=WORK))
    cache = Path(tempfile.mkdtemp(prefix="hf-cache-", dir=WORK))
    shutil.rmtree(out)
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    cmd = [sys.executable, str(HERE / "alternatives.py"), tool, str(data), str(tokenizer), str(out), str(seq_len)]
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        stdout.seek(0)
        stderr.seek(0)
        text, err = stdout.read().decode(), stderr.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"{tool} failed ({proc.returncode}):\n{err[-3000:]}")
    report = json.loads(text.strip().splitlines()[-1])
    report["wall"] = wall
    report["peak_rss"] = report.get("peak_rss") or usage.ru_maxrss * 1024
    report["out_bytes"] = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) if out.exists() else 0
    shards = sorted(out.rglob("*.arrow")) if out.exists() else []
    report["shards_sha256"] = hashlib.sha256(b"".join(hashlib.sha256(f.read_bytes()).digest() for f in shards)).hexdigest()
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    return report


def compare(args: argparse.Namespace) -> dict:
    data, tokenizer = ensure_data(args.records), ensure_tokenizer()
    tools = args.tools
    runs: dict[str, list[dict]] = {t: [] for t in tools}
    before = None  # the tool that ran just before (``after_own``)
    for r in range(args.repeat):
        order = tools if r % 2 == 0 else list(reversed(tools))
        for tool in order:
            runs[tool].append({**run_tool(tool, data, tokenizer, args.seq_len), "after": before})
            before = tool
            rep = runs[tool][-1]
            print(f"  round {r + 1}/{args.repeat} {tool:16s} {rep['wall']:7.2f} s whole, {rep['seconds']:7.2f} s work",
                  file=sys.stderr)
    tokens = runs["weightprep"][0]["tokens"] if "weightprep" in runs else runs[tools[0]][0].get("tokens")
    rows = {}
    for tool, rs in runs.items():
        wall = statistics.median(r["wall"] for r in rs)
        rows[tool] = {
            "wall_seconds": wall,
            "seconds": statistics.median(r["seconds"] for r in rs),
            "tokens_per_s": tokens / wall,
            "peak_rss_mib": statistics.median(r["peak_rss"] for r in rs) / 2**20,
            "bytes_per_token": statistics.median(r["out_bytes"] for r in rs) / tokens,
            "fill": rs[0].get("fill"),
            "runs": [round(r["wall"], 3) for r in rs],
            "shards_sha256": rs[0]["shards_sha256"],
        }
    print(f"\n{args.records:,} records, {tokens:,} input tokens, seq-len {args.seq_len}, {args.repeat} rounds, "
          f"{os.cpu_count()} cores, load average {args.load_before:.1f} before, {os.getloadavg()[0]:.1f} after; "
          "medians\n")
    print("| tool | seconds (whole) | seconds (work) | tokens/s | peak RSS MiB | out bytes/token | fill "
          "| weightprep speed-up (target) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    wp = rows.get("weightprep")
    for tool, row in rows.items():
        ratio = f"{wp['tokens_per_s'] / row['tokens_per_s']:.2f}x" if wp and tool != "weightprep" else "-"
        met = wp and tool in TARGETS and wp["tokens_per_s"] / row["tokens_per_s"] >= TARGETS[tool]
        target = f" (>= {TARGETS[tool]}x{': met' if met else ': NOT met'})" if tool in TARGETS and wp else ""
        fill = f"{row['fill']:.4f}" if row["fill"] is not None else "-"
        out_b = f"{row['bytes_per_token']:.2f}" if row["bytes_per_token"] else "-"
        print(f"| {tool} | {row['wall_seconds']:.2f} | {row['seconds']:.2f} | {row['tokens_per_s']:,.0f} "
              f"| {row['peak_rss_mib']:,.0f} | {out_b} | {fill} | {ratio}{target} |")
    if wp:
        print(f"\nweightprep peak RSS {wp['peak_rss_mib']:,.0f} MiB (target <= {RSS_TARGET_MIB} MiB)")
        after_own(runs["weightprep"], rows.get("limit-fastokens"))
    if wp and "weightprep-ray" in rows:
        ray_row = rows["weightprep-ray"]
        same = ray_row["shards_sha256"] == wp["shards_sha256"]
        print(f"Ray / local executor wall time: {ray_row['wall_seconds'] / wp['wall_seconds']:.2f}x (goal <= 1.3x); "
              f"shards {'byte-identical' if same else 'DIFFERENT'}")
    if wp and "weightprep-hf" in rows:
        same = rows["weightprep-hf"]["shards_sha256"] == wp["shards_sha256"]
        print(f"shards of weightprep (auto) vs --tokenizer-backend hf: {'byte-identical' if same else 'DIFFERENT'}")
    result = {"records": args.records, "tokens": tokens, "seq_len": args.seq_len, "tools": rows}
    if args.rss_at:
        result["peak_rss_mib"] = rss_at([int(n) for n in args.rss_at.split(",")], args.seq_len)
    return result


def after_own(runs: list[dict], limit: dict | None) -> None:
    """weightprep's rounds split by what ran just before: its own run (whose shards the harness had just deleted:
    the pages it reuses are warm) or another tool's (on a virtual machine that hands freed memory back to its
    host, first writes to the pages taken back cost a host fault each: docs/performance.md)."""
    own = [r["wall"] for r in runs if r["after"] == "weightprep"]
    other = [r["wall"] for r in runs if r["after"] not in (None, "weightprep")]
    for what, walls in (("right after its own run", own), ("after another tool's", other)):
        if walls:
            median = statistics.median(walls)
            vs = f" ({limit['wall_seconds'] / median:.2f}x the fastokens limit)" if limit else ""
            print(f"weightprep's rounds {what}: {', '.join(f'{w:.2f}' for w in walls)} s, median {median:.2f} s{vs}")


def rss_at(sizes: list[int], seq_len: int) -> dict[int, float]:
    """weightprep's peak RSS (MiB) at each input size, one run each; printed as one line. Each input is one part
    (``read.part_bytes`` of 1 TiB): the build runs in its own process, one worker, whose VmHWM is the figure (with
    several parts the pool's workers would hold them, and the driver's figure would be the driver's alone)."""
    tokenizer = ensure_tokenizer()
    peaks = {}
    saved = os.environ.get("BENCH_PART_BYTES")
    os.environ["BENCH_PART_BYTES"] = str(1 << 40)
    try:
        reports = {n: run_tool("weightprep", ensure_data(n), tokenizer, seq_len) for n in sizes}
    finally:
        if saved is None:
            del os.environ["BENCH_PART_BYTES"]
        else:
            os.environ["BENCH_PART_BYTES"] = saved
    for n, rep in reports.items():
        peaks[n] = rep["peak_rss"] / 2**20
        print(f"  {n:>9,} records: {rep['wall']:7.1f} s, peak RSS {peaks[n]:,.0f} MiB", file=sys.stderr)
    line = ", ".join(f"{n:,} records {mib:,.0f} MiB" for n, mib in peaks.items())
    low, high = min(peaks.values()), max(peaks.values())
    print(f"weightprep peak RSS: {line}; largest / smallest {high / low:.2f}x (flat: within 1.2x), "
          f"largest {high:,.0f} MiB (target <= {RSS_TARGET_MIB} MiB{': met' if high <= RSS_TARGET_MIB else ': NOT met'})")
    return peaks


def scale(args: argparse.Namespace) -> dict:
    sizes = [int(s) for s in args.scale.split(",")]
    tokenizer = ensure_tokenizer()
    results = {}
    for n in sizes:
        rep = run_tool("weightprep", ensure_data(n), tokenizer, args.seq_len)
        results[n] = rep
        print(f"  {n:>9,} records: {rep['wall']:8.1f} s, {rep['tokens'] / rep['wall']:,.0f} tokens/s, "
              f"peak RSS {rep['peak_rss'] / 2**20:,.0f} MiB, fill {rep['fill']:.4f}", file=sys.stderr)
    a, b = sizes[0], sizes[-1]
    print("\n| records | seconds | tokens/s | peak RSS MiB | fill |\n|---:|---:|---:|---:|---:|")
    for n, rep in results.items():
        print(f"| {n:,} | {rep['wall']:.1f} | {rep['tokens'] / rep['wall']:,.0f} | {rep['peak_rss'] / 2**20:,.0f} | {rep['fill']:.4f} |")
    rss = results[b]["peak_rss"] / results[a]["peak_rss"]
    time_ratio = results[b]["wall"] / results[a]["wall"]
    print(f"\npeak RSS {b:,} / {a:,}: {rss:.2f}x (target within 1.2x); "
          f"time: {time_ratio:.2f}x for {b / a:.0f}x the records (target <= {1.2 * b / a:.0f}x)")
    return {str(n): r for n, r in results.items()}


def compile_code() -> None:
    """Byte-compile weightprep's modules and the benchmark's scripts into ``__pycache__`` (what ``pip install``
    does for a wheel; Python reads them even where ``PYTHONDONTWRITEBYTECODE`` stops it from writing them)."""
    import compileall

    import weightprep

    for directory in (Path(weightprep.__file__).parent, HERE):
        compileall.compile_dir(str(directory), quiet=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=10000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument(
        "--tools", default="weightprep,weightprep-hf,limit,limit-fastokens,seed,trl", type=lambda s: s.split(",")
    )
    ap.add_argument("--scale", help="comma-separated record counts: weightprep alone at each size")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument(
        "--rss-at", help="comma-separated record counts: weightprep's peak RSS at each (one part), after the comparison"
    )
    ap.add_argument("--executor", choices=["local", "ray"], help="ray: weightprep on Ray against the local executor")
    ap.add_argument("--part-bytes", type=int, help="read.part_bytes of the weightprep runs (default: the build's)")
    args = ap.parse_args()
    compile_code()
    args.load_before = os.getloadavg()[0]
    if args.part_bytes:
        os.environ["BENCH_PART_BYTES"] = str(args.part_bytes)
    if args.executor == "ray":
        args.tools = ["weightprep", "weightprep-ray"]
    result = scale(args) if args.scale else compare(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
