"""Write every hostile case of tests/test_hostile_inputs.py to a directory, one file each."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from test_hostile_inputs import ACCEPTED, REJECTED  # noqa: E402

if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "hostile-corpus")
    out.mkdir(parents=True, exist_ok=True)
    for name, case in {**ACCEPTED, **REJECTED}.items():
        (out / f"{name}.jsonl").write_bytes(case[0])
    print(f"wrote {len(ACCEPTED) + len(REJECTED)} files to {out}/")
