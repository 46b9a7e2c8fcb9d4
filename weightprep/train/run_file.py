"""One YAML file for a whole run: ``weightprep train --config run.yaml`` with a ``build:`` section builds the shards
first when they are missing or were built from another configuration, then trains.

::

    # weightprep train --config run.yaml
    model: Qwen/Qwen3-0.6B
    output_dir: runs/qwen3
    shards: shards/qwen3            # where the build: section writes (and train reads)
    lora_r: 16
    build:
      inputs: [data/chat.jsonl]     # or sources: [{name, path, weight, epochs}, ...]
      tokenizer: {name: Qwen/Qwen3-0.6B}
      pack: {seq_len: 4096}
      split: {validation_fraction: 0.05}

The ``build:`` section holds what a pipeline file holds (``weightprep.config``: ``tokenizer``, ``pack``,
``filter``, ``chat``, ``split``, ..., and ``sources``), plus ``inputs`` (a path, glob or URL, or a list of them).
The shards at ``shards`` are up to date when their manifest records the same resolved configuration, the same
inputs (paths and sizes) and, with sources, the same names, weights and epochs; anything else is built again
(replacing the earlier build, which must be a weightprep output). A change inside the tokenizer's files under the
same name is not seen: remove the shards to build them again. Under torchrun (several processes) stale shards are
an error: one process builds, so build them first in a single process.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from weightprep import storage
from weightprep.config import config_from_dict, config_to_dict
from weightprep.constants import MANIFEST_NAME
from weightprep.errors import ConfigError

__all__ = ["BUILD_KEY", "BuildSection", "build_section", "stale_reason", "ensure_built"]

#: The key of a train config file that holds the build of the run.
BUILD_KEY = "build"


class BuildSection:
    """A parsed ``build:`` section: its configuration, inputs or sources, checked before any work."""

    def __init__(self, data: Any, origin: str) -> None:
        from weightprep.sources import sources_from_data

        if not isinstance(data, dict):
            raise ConfigError([f"{BUILD_KEY}: expected a mapping (inputs, tokenizer, pack, ...), got {data!r}"], origin)
        data = dict(data)
        inputs = data.pop("inputs", None)
        if isinstance(inputs, str):
            inputs = [inputs]
        has_sources = "sources" in data
        if (inputs is None) == (not has_sources):
            raise ConfigError([f"{BUILD_KEY}: give inputs (a path or a list of paths) or sources, exactly one"], origin)
        if inputs is not None and (not isinstance(inputs, list) or not all(isinstance(p, str) for p in inputs)):
            raise ConfigError([f"{BUILD_KEY}.inputs: expected a path or a list of paths, got {inputs!r}"], origin)
        self.inputs: list[str] = inputs or []
        self.sources = sources_from_data(data["sources"], origin) if has_sources else None
        try:
            self.cfg = config_from_dict(data, source=origin)
        except ConfigError as exc:  # name the section in every problem
            raise ConfigError([f"{BUILD_KEY}.{p}" for p in exc.problems], origin) from None


def build_section(data: dict[str, Any], origin: str) -> BuildSection | None:
    """The ``build:`` section of a train config file's mapping (removed from it), None if it has none."""
    if BUILD_KEY not in data:
        return None
    return BuildSection(data.pop(BUILD_KEY), origin)


def _input_files(section: BuildSection) -> list[tuple[str, int]]:
    from weightprep.pipeline import source_files
    from weightprep.stages.read import expand_inputs

    if section.sources is not None:
        files = [p for group in source_files(section.sources, section.cfg) for p in group]
    else:
        files = expand_inputs(section.inputs)
    return sorted((p, storage.size(p)) for p in files)


def stale_reason(section: BuildSection, shards: str | Path) -> str | None:
    """Why the shards at ``shards`` are not what ``section`` builds (missing, another configuration, other inputs
    or sources), or None when they are."""
    manifest_path = storage.join(shards, MANIFEST_NAME)
    if not storage.isfile(manifest_path):
        return f"{shards} holds no build yet"
    manifest = json.loads(storage.read_text(manifest_path))
    wanted = json.loads(json.dumps(config_to_dict(section.cfg)))
    if manifest.get("config") != wanted:
        changed = sorted(
            f"{name}.{key}" for name, part in wanted.items() for key, value in part.items()
            if (manifest.get("config") or {}).get(name, {}).get(key) != value
        )  # fmt: skip
        return f"{shards} was built with another configuration ({', '.join(changed) or 'its layout'} differ)"
    built = sorted((i["path"], i["bytes"]) for i in manifest.get("inputs", []))
    if built != _input_files(section):
        return f"{shards} was built from other inputs (or they changed since)"
    if section.sources is not None:
        recorded = [(s["name"], s["weight"], s["epochs"]) for s in manifest.get("sources") or []]
        if recorded != [(s.name, s.weight, s.epochs) for s in section.sources]:
            return f"{shards} was built from other sources (names, weights or epochs differ)"
    return None


def ensure_built(
    section: BuildSection, shards: str | Path, notify: Callable[[str], None], *, build: Callable[..., Any] | None = None
) -> bool:
    """Build ``section`` into ``shards`` unless they are up to date (``stale_reason``); whether it built. ``build``:
    the build's entry point (default ``weightprep.pipeline.build``)."""
    reason = stale_reason(section, shards)
    if reason is None:
        notify(f"{shards} is up to date with the config's {BUILD_KEY}: section (same configuration and inputs): not rebuilt")
        return False
    notify(f"building {shards}: {reason}")
    if build is None:
        from weightprep.pipeline import build
    build(section.inputs if section.sources is None else [], shards, section.cfg, overwrite=True,
          sources=section.sources, notify=notify)  # fmt: skip
    return True
