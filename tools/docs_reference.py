"""The documentation's reference pages, generated from the code so they cannot go stale.

``cli_markdown()`` renders every ``weightprep`` command from its click definition (arguments, options, choices,
defaults, help); ``config_markdown()`` every key a pipeline file may hold, from the configuration dataclasses
(``weightprep.config``: their defaults and ``help``); ``api_markdown()`` the public Python API (``API_MODULES``:
each name of a module's ``__all__`` that the module defines, with its signature and docstring), read from the source
with ``ast``, so that nothing (torch above all) is imported. As an mkdocs hook (``mkdocs.yml``: ``hooks:``) it
replaces the markers ``<!-- cli-reference -->``, ``<!-- config-reference -->`` and ``<!-- api-reference -->`` in a
page; ``tests/test_docs.py`` calls the functions directly. Importing the commands imports neither torch nor
transformers (the CLI loads them lazily).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import typing
from pathlib import Path
from typing import Any

__all__ = ["cli_markdown", "config_markdown", "api_markdown", "on_page_markdown", "API_MODULES"]

CLI_MARKER = "<!-- cli-reference -->"
CONFIG_MARKER = "<!-- config-reference -->"
API_MARKER = "<!-- api-reference -->"
PACKAGE = Path(__file__).resolve().parent.parent / "weightprep"
#: The modules whose ``__all__`` is the public Python API, in the order the page shows them.
API_MODULES = ("pipeline", "config", "train/trainer", "train/data", "train/collator", "train/loss", "manifest",
               "storage", "plan/estimate", "plan/advice", "progress")


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _option_row(param: Any) -> str:
    import click

    names = ", ".join(f"`{n}`" for n in [*param.opts, *param.secondary_opts])
    if isinstance(param.type, click.Choice):
        kind = " \\| ".join(f"`{c}`" for c in param.type.choices)
    elif getattr(param, "is_flag", False):
        kind = "flag"
    else:
        kind = _cell(param.type.name)
    default = param.default
    unset = default is None or default is False or default == () or callable(default) or type(default).__name__ == "Sentinel"
    shown = "" if unset or getattr(param, "is_flag", False) else f"`{default}`"
    return f"| {names} | {kind} | {shown} | {_cell(param.help or '')} |"


def cli_markdown() -> str:
    """Every command of the ``weightprep`` CLI as Markdown: usage, description, options."""
    import click

    from weightprep.cli import _COMMANDS

    out = []
    for name, (module, attr, short) in _COMMANDS.items():
        command = getattr(importlib.import_module(module), attr)
        ctx = click.Context(command, info_name=f"weightprep {name}")
        out += [f"## `weightprep {name}`", "", short, "", "```", command.get_usage(ctx), "```", ""]
        out += [inspect.cleandoc(command.help or "").replace("\b\n", ""), ""]
        arguments = [p for p in command.params if isinstance(p, click.Argument)]
        if arguments:
            out += ["Arguments: " + ", ".join(f"`{p.human_readable_name}`" for p in arguments), ""]
        options = [p for p in command.params if isinstance(p, click.Option) and not p.hidden]
        out += ["| option | type | default | what |", "|---|---|---|---|", *map(_option_row, options), ""]
    return "\n".join(out)


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(tp))
    return _cell(getattr(tp, "__name__", str(tp)).replace("typing.", ""))


def config_markdown() -> str:
    """Every key of a pipeline file (``pipelines/*.yaml``), section by section, with its default and meaning."""
    from weightprep.config import BuildConfig

    hints = typing.get_type_hints(BuildConfig)
    out = ["| key | type | default | what |", "|---|---|---|---|"]
    for section in dataclasses.fields(BuildConfig):
        cls = hints[section.name]
        sub_hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None  # type: ignore[misc]
            )  # fmt: skip
            out.append(f"| `{section.name}.{f.name}` | {_type_name(sub_hints[f.name])} | `{default}` | "
                       f"{_cell(f.metadata.get('help', ''))} |")  # fmt: skip
    return "\n".join(out)


def _public(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return [e.value for e in node.value.elts if isinstance(e, ast.Constant)]  # type: ignore[attr-defined]
    return []


def api_markdown() -> str:
    """The public functions and classes of ``API_MODULES``: signature and docstring, from the source text."""
    out = []
    for rel in API_MODULES:
        path = PACKAGE / f"{rel}.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module = "weightprep." + rel.replace("/", ".")
        out += [f"## `{module}`", "", (ast.get_docstring(tree) or "").split("\n\n")[0], ""]
        defined = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        for name in _public(tree):
            node = defined.get(name)
            if node is None:
                continue  # a constant or a re-export: documented where it is defined
            if isinstance(node, ast.FunctionDef):
                signature = f"{name}({ast.unparse(node.args)})"
            else:
                bases = ", ".join(ast.unparse(b) for b in node.bases)
                signature = f"class {name}" + (f"({bases})" if bases else "")
            out += [f"### `{name}`", "", "```python", signature, "```", "", inspect.cleandoc(ast.get_docstring(node) or ""), ""]
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """mkdocs hook: fill the reference markers of a page."""
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_markdown())
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_markdown())
    if API_MARKER in markdown:
        markdown = markdown.replace(API_MARKER, api_markdown())
    return markdown
