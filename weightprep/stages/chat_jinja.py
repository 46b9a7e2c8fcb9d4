"""transformers' chat-template code (``transformers/utils/chat_template_utils.py``), without importing transformers.

The chat stage renders with transformers' own Jinja environment, inputs and ``{% generation %}`` tracker (what
``apply_chat_template`` renders with). ``import transformers`` costs ~0.55 s of CPU in every process that renders
(its lazy import table is built from its source tree, and ``transformers.utils`` imports the hub client), while
that module needs only jinja2, numpy, packaging and two helpers of its own package: a logger and
``is_jinja_available``. ``template_utils()`` therefore runs the installed file itself, as its own module, with
those two relative imports answered here, wherever:

- transformers is not imported yet in this process (once it is, its own module is returned: one environment);
- the file imports from its package exactly ``logging`` and ``import_utils``'s ``is_jinja_available``,
  ``is_torch_available`` and ``is_vision_available`` (read from its syntax tree: a transformers whose file imports
  anything else is imported as it is).

``is_torch_available`` and ``is_vision_available`` answer False: in that file they only decide the JSON schema of
Python functions given as tools (``get_json_schema``), and the build's tools are JSON. The same template renders
the same text either way: ``tests/test_chat_jinja.py`` renders every template of the tests with both modules.
Anything that goes wrong loading the file imports transformers' module instead.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib.util
import logging
import sys
import types
from pathlib import Path
from typing import Any

__all__ = ["module_file", "template_utils"]

#: what the file may import from its own package, and the stand-ins that answer those imports
_PACKAGE_IMPORTS = {
    (1, None): {"logging"},
    (1, "import_utils"): {"is_jinja_available", "is_torch_available", "is_vision_available"},
}


class _Logger:
    """transformers' logger as that file uses it: ``warning_once`` (transformers' logging adds it)."""

    def __init__(self, name: str) -> None:
        self._logger = logging.getLogger(name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)

    @functools.cache  # noqa: B019 - one logger per module, kept for the process, as transformers' is
    def warning_once(self, *args: Any) -> None:
        self._logger.warning(*args)


def _stand_ins() -> dict[str | None, types.ModuleType]:
    log = types.ModuleType("logging")
    log.get_logger = _Logger  # type: ignore[attr-defined]
    utils = types.ModuleType("import_utils")
    utils.is_jinja_available = lambda: importlib.util.find_spec("jinja2") is not None  # type: ignore[attr-defined]
    utils.is_torch_available = lambda: False  # type: ignore[attr-defined]
    utils.is_vision_available = lambda: False  # type: ignore[attr-defined]
    package = types.ModuleType("transformers.utils")
    package.logging = log  # type: ignore[attr-defined]
    return {None: package, "import_utils": utils}


def module_file() -> Path | None:
    """The installed ``transformers/utils/chat_template_utils.py`` (None: no transformers), found without
    importing transformers."""
    from weightprep.tokenizer_class import transformers_folder

    folder = transformers_folder()
    path = folder / "utils" / "chat_template_utils.py" if folder is not None else None
    return path if path is not None and path.is_file() else None


def _package_imports(tree: ast.Module) -> dict[tuple[int, str | None], set[str]]:
    found: dict[tuple[int, str | None], set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            found.setdefault((node.level, node.module), set()).update(a.name for a in node.names)
    return found


def _standalone(path: Path) -> types.ModuleType | None:
    """The file run as its own module, or None where its imports from its package are not the known ones."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, str(path))
    wanted = _package_imports(tree)
    if any(k not in _PACKAGE_IMPORTS or not names <= _PACKAGE_IMPORTS[k] for k, names in wanted.items()):
        return None
    answers = _stand_ins()

    def import_(name: str, globals_: Any = None, locals_: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if level == 0:
            return builtins.__import__(name, globals_, locals_, fromlist, level)
        return answers[name or None]

    module = types.ModuleType("weightprep.stages._transformers_chat_template_utils")
    module.__file__ = str(path)
    module.__dict__["__builtins__"] = {**vars(builtins), "__import__": import_}
    exec(compile(tree, str(path), "exec"), module.__dict__)  # noqa: S102 - the installed transformers' own file
    return module


@functools.cache
def _loaded() -> types.ModuleType | None:
    path = module_file()
    if path is None:
        return None
    try:
        return _standalone(path)
    except Exception:  # noqa: BLE001 - anything unexpected: transformers' own import decides
        return None


def template_utils() -> Any:
    """transformers' ``chat_template_utils``: its own module where transformers is imported (or the file cannot be
    run alone), else the installed file run without importing transformers."""
    if "transformers" not in sys.modules:
        module = _loaded()
        if module is not None:
            return module
    from transformers.utils import chat_template_utils

    return chat_template_utils
