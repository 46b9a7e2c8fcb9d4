"""Parallelism never changes the output: byte-identical shards whatever the number of tokenizer threads."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from conftest import SAMPLE_RAW


def test_num_proc_does_not_change_the_output(tmp_path):
    data = tmp_path / "raw.jsonl"
    data.write_bytes(SAMPLE_RAW.read_bytes() * 3)
    pipeline = tmp_path / "p.yaml"
    # small blocks and windows, so threads overlap many blocks and several packing windows
    pipeline.write_text("read: {block_bytes: 65536}\npack: {window: 300}\ntokenizer: {batch_size: 97}\n")
    exe = shutil.which("weightprep", path=os.path.dirname(sys.executable)) or "weightprep"
    outs = []
    for n in (1, 2, 4):
        out = tmp_path / f"out{n}"
        proc = subprocess.run(
            [exe, "build", str(data), "--pipeline", str(pipeline), "--num-proc", str(n), "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        outs.append(out)
    names = sorted(p.name for p in outs[0].iterdir())
    assert any(n.endswith(".arrow") for n in names)
    for other in outs[1:]:
        assert sorted(p.name for p in other.iterdir()) == names
        for name in names:
            assert (other / name).read_bytes() == (outs[0] / name).read_bytes(), name
