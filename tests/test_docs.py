"""The documentation holds: the README (a front door of at most 250 lines, keeping the two commands CI runs) and the
site under docs/ (built by mkdocs with --strict: no dead link, no page outside the nav).

- Every ``tests/FILE.py::name`` the README and the docs cite names an existing file that defines ``name`` (docs/
  promises.md maps each promise to the tests that hold it), so a renamed or deleted test breaks here, loudly.
- Every ``weightprep`` command in a code block of the README or the docs names a real subcommand and only flags that
  subcommand has, so a renamed flag breaks here instead of in a reader's terminal. (The commands that run on the
  sample data are run by the tests that cite them; the others need a GPU, a model or a bucket.)
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
REFERENCE = re.compile(r"\btests/([\w/]+\.py)::(\w+)")
README_MAX_LINES = 250


def _docs() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _defines(source: str, name: str) -> bool:
    return (
        re.search(rf"^\s*(?:async\s+def|def|class)\s+{re.escape(name)}\b", source, re.MULTILINE) is not None
    )


def test_every_test_the_docs_cite_exists():
    promises = (REPO / "docs" / "promises.md").read_text(encoding="utf-8")
    cited = {(doc.relative_to(REPO).as_posix(), *m.groups()) for doc in _docs()
             for m in REFERENCE.finditer(doc.read_text(encoding="utf-8"))}  # fmt: skip
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


_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
#: a command line that runs weightprep: at the start of the line (or after ``&&``/``;``), or as ``-m weightprep``
_COMMAND = re.compile(r"(?:^\s*(?:\$\s+)?|&&\s*|;\s*|-m\s+)weightprep\s+([a-z][\w-]*)(.*)")


def _commands(text: str) -> list[tuple[str, list[str]]]:
    """``(subcommand, its flags)`` of every ``weightprep`` command line in the code blocks of ``text``."""
    found = []
    for block in _FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0]
            m = _COMMAND.search(line)
            if m is None or line.lstrip().startswith(("{", '"', "note:", "error:", "interrupted", "wrote")):
                continue
            rest = re.split(r"\s(?:\||;|&&|>|2>)\s", m[2])[0]
            try:
                words = shlex.split(rest)
            except ValueError:
                words = rest.split()
            flags = [f.split("=", 1)[0] for w in words for f in w.strip("[]").split("/") if f.startswith("--")]
            found.append((m[1], flags))
    return found


def test_every_command_in_the_docs_uses_real_flags():
    import click

    from weightprep.cli import _COMMANDS, main

    options = {}
    for name in _COMMANDS:
        command = main.get_command(click.Context(main), name)
        options[name] = {o for p in command.params if isinstance(p, click.Option) for o in [*p.opts, *p.secondary_opts]}
        options[name] |= {"--help"}
    problems, checked = [], 0
    for doc in _docs():
        for sub, flags in _commands(doc.read_text(encoding="utf-8")):
            checked += 1
            if sub not in options:
                problems.append(f"{doc.relative_to(REPO)}: weightprep {sub}: no such command")
                continue
            problems += [f"{doc.relative_to(REPO)}: weightprep {sub} {f}: no such option"
                         for f in flags if f not in options[sub]]  # fmt: skip
    assert checked > 40  # the pattern still finds the commands
    assert not problems, "\n".join(problems)


def test_the_readme_is_a_front_door_that_keeps_the_two_commands():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_MAX_LINES
    assert "make demo" in readme and "make test" in readme  # what CI (.ci/run) and a newcomer run
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    assert "make test" in (REPO / ".ci" / "run").read_text(encoding="utf-8")
    for link in re.findall(r"\]\((docs/[\w.-]+\.md)(?:#[\w-]+)?\)", readme):
        assert (REPO / link).is_file(), link


def test_every_page_is_in_the_site_navigation():
    import yaml

    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8").replace("!!python", "python"))

    def pages(nav) -> set[str]:
        if isinstance(nav, str):
            return {nav}
        if isinstance(nav, dict):
            return set().union(*(pages(v) for v in nav.values()))
        return set().union(*(pages(v) for v in nav))

    assert pages(config["nav"]) == {p.name for p in (REPO / "docs").glob("*.md")}


def test_the_reference_is_generated_from_the_commands():
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "tools" / "docs_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cli, config, api = module.cli_markdown(), module.config_markdown(), module.api_markdown()
    for needle in ("## `weightprep.pipeline`", "### `build`", "### `WeightedSFTTrainer`", "### `load_shards`",
                   "### `weighted_lm_loss`", "### `read_manifest`"):  # fmt: skip
        assert needle in api, needle
    for needle in ("## `weightprep build`", "`--resume`", "## `weightprep train`", "`--lora-r`", "## `weightprep plan`"):
        assert needle in cli, needle
    assert "| `pack.seq_len` | int | `2048` |" in config and "| `filter.overlong` | `drop` \\| `truncate` \\| `chunk` |" in config


def test_the_site_builds_strictly(tmp_path):
    """``mkdocs build --strict`` (what ``make docs`` serves): a dead link, a missing page or a stale anchor fails."""
    pytest.importorskip("material", reason="mkdocs-material is in the dev extra: pip install -e '.[dev]'")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "site" / "cli" / "index.html").is_file()
