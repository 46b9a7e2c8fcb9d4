"""Which transformers class ``AutoTokenizer`` builds for a local tokenizer directory, remembered across builds.

``AutoTokenizer`` decides a directory's class from its files (``tokenizer_config.json``'s ``tokenizer_class``,
``config.json``'s model type and transformers' tables of known exceptions, whether ``tokenizer.json`` is byte-level,
Mistral's files) and then calls that class's ``from_pretrained`` on the directory. Importing the auto classes
imports torch (about 1.8 s of a build's start and 260 MB in each process; transformers' tokenizer classes alone
need neither), so the decision is made by ``AutoTokenizer`` once and remembered: the next build (and every worker
of a build) imports the class it named and calls its ``from_pretrained`` as ``AutoTokenizer`` would have.

The memory is keyed by the transformers version, the directory's path (``AutoTokenizer`` matches a model's name,
for a directory its path, against tables of known checkpoints) and the bytes of every file of the directory but
weights (the decision reads nothing else), so an edited configuration, another file, a copy elsewhere or another
transformers is a new key and ``AutoTokenizer`` decides again. Remote code (``auto_map``, ``--trust-remote-code``) and hub ids are never
remembered. A memory that cannot be read or written (a read-only home, a damaged file) is ignored: ``AutoTokenizer``
then runs as before. It lives in ``$WEIGHTPREP_CACHE``, else ``$XDG_CACHE_HOME/weightprep``, else
``~/.cache/weightprep`` (``tokenizer-classes.json``, at most ``KEEP`` directories, the oldest dropped first).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["KEEP", "cache_dir", "load", "transformers_folder", "transformers_major", "transformers_version"]

#: Directories remembered, at most.
KEEP = 256
_FILE = "tokenizer-classes.json"
#: Files that hold weights, never read by a tokenizer's loading (left out of the key: gigabytes to hash).
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx", ".ckpt", ".npz")


def cache_dir() -> Path:
    """Where weightprep keeps what it remembers between runs."""
    if os.environ.get("WEIGHTPREP_CACHE"):
        return Path(os.environ["WEIGHTPREP_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "weightprep"


def transformers_folder() -> Path | None:
    """The installed transformers package's folder (None: none), found without importing transformers."""
    spec = importlib.util.find_spec("transformers")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(folders[0]) if folders else None


@functools.cache
def transformers_version() -> str | None:
    """The installed transformers' version (None: none), read off its ``__init__.py``: neither transformers nor
    ``importlib.metadata`` (~35 ms) is imported, but where that file does not say it."""
    folder = transformers_folder()
    if folder is None:
        return None
    init = folder / "__init__.py"
    found = re.search(r'^__version__ = "([^"]+)"', init.read_text(encoding="utf-8"), re.M) if init.is_file() else None
    if found is not None:
        return found[1]
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        return None


def transformers_major() -> int:
    """The installed transformers' major version (0: none), without importing it."""
    found = re.match(r"\d+", transformers_version() or "")
    return int(found[0]) if found else 0


def _key(directory: Path) -> str | None:
    """The directory's key: transformers' version, its path, and each non-weight file's name and bytes (None: not a
    local directory, remote code, or no transformers)."""
    installed = transformers_version()
    if installed is None:
        return None
    try:
        files = sorted(p for p in directory.iterdir() if p.is_file() and not p.name.endswith(_WEIGHTS))
        config = directory / "tokenizer_config.json"
        if config.is_file() and "auto_map" in json.loads(config.read_text(encoding="utf-8")):
            return None
        # the path too: AutoTokenizer matches the model's name (for a directory, its path) against its tables
        digest = hashlib.sha256(installed.encode() + b"\0" + str(directory.resolve()).encode())
        for path in files:
            digest.update(b"\0" + path.name.encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    except (OSError, ValueError):  # not a readable directory, bad JSON
        return None
    return digest.hexdigest()


def _read() -> dict[str, str]:
    try:
        found = json.loads((cache_dir() / _FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in found.items() if isinstance(v, str)} if isinstance(found, dict) else {}


def _remember(key: str, cls: type) -> None:
    """Add ``key -> cls`` (a transformers class) to the memory, atomically; nothing if it cannot be written."""
    if not cls.__module__.startswith("transformers.") or "<" in cls.__qualname__:
        return
    known = {k: v for k, v in _read().items() if k != key}
    known[key] = f"{cls.__module__}:{cls.__qualname__}"
    kept = dict(list(known.items())[-KEEP:])
    with contextlib.suppress(OSError):
        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{_FILE}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(kept, f)
            os.replace(tmp, folder / _FILE)
        except OSError:
            Path(tmp).unlink(missing_ok=True)


def _remembered(key: str) -> Any | None:
    """The class remembered for ``key``, imported; None if there is none or it no longer imports."""
    name = _read().get(key)
    if name is None:
        return None
    module, _, qualname = name.partition(":")
    try:
        return getattr(importlib.import_module(module), qualname)
    except (ImportError, AttributeError):
        return None


def load(name_or_path: str, *, trust_remote_code: bool = False) -> Any:
    """``AutoTokenizer.from_pretrained(name_or_path, use_fast=True, trust_remote_code=...)``, through the class it
    chose before for the same directory where that is known (no torch imported)."""
    directory = Path(name_or_path)
    key = None if trust_remote_code or not directory.is_dir() else _key(directory)
    cls = None if key is None else _remembered(key)
    if cls is not None:
        with contextlib.suppress(Exception):  # anything wrong: AutoTokenizer decides, and raises what it raises
            return cls.from_pretrained(name_or_path, _from_auto=True)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(name_or_path, use_fast=True, trust_remote_code=trust_remote_code)
    if key is not None:
        _remember(key, type(tok))
    return tok
