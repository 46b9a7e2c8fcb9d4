"""docs/promises.md maps each README promise to the tests that hold it: every ``tests/FILE.py::name`` it (and the
README) cites must name an existing file that defines ``name``, so a renamed or deleted test breaks here, loudly,
instead of leaving the table pointing at nothing. Text only: no test module is imported."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REFERENCE = re.compile(r"\btests/([\w/]+\.py)::(\w+)")


def _defines(source: str, name: str) -> bool:
    return (
        re.search(rf"^\s*(?:async\s+def|def|class)\s+{re.escape(name)}\b", source, re.MULTILINE) is not None
    )


def test_every_test_the_docs_cite_exists():
    promises = (REPO / "docs" / "promises.md").read_text(encoding="utf-8")
    cited = {(doc, *m.groups()) for doc in ("docs/promises.md", "README.md")
             for m in REFERENCE.finditer((REPO / doc).read_text(encoding="utf-8"))}  # fmt: skip
    assert len(REFERENCE.findall(promises)) > 50  # the pattern still matches the table's form
    sources: dict[str, str | None] = {}
    missing = []
    for doc, file, name in sorted(cited):
        if file not in sources:
            path = REPO / "tests" / file
            sources[file] = path.read_text(encoding="utf-8") if path.is_file() else None
        if sources[file] is None:
            missing.append(f"{doc}: tests/{file}::{name}: no such file")
        elif not _defines(sources[file], name):
            missing.append(f"{doc}: tests/{file}::{name}: no def or class {name} in tests/{file}")
    assert not missing, "fix these references (a test was renamed or removed):\n" + "\n".join(missing)
