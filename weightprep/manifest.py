"""Reading the manifest that ``weightprep build`` writes beside its shards: the one reader of the package.

``weightprep train``, ``weightprep inspect`` and ``weightprep plan --shards`` all open a shard directory through
:func:`read_manifest`, which refuses, with the fix, a directory that is not a finished build of this format.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from weightprep.constants import FORMAT_NAME, FORMAT_VERSION, MANIFEST_NAME
from weightprep.errors import UsageError

__all__ = ["REBUILD", "build_setting", "read_manifest"]

#: The fix for shards this version cannot use.
REBUILD = "rebuild them with `weightprep build` from this version"


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest beside the shards, checked for this format and version."""
    path = Path(path)
    if not path.is_dir():
        raise UsageError(f"shard directory {str(path)!r} does not exist; create it with `weightprep build`")
    manifest_path = path / MANIFEST_NAME
    if not manifest_path.is_file():
        raise UsageError(
            f"{path} has no {MANIFEST_NAME}: it is not a weightprep shard directory (or the build did not finish); "
            "create it with `weightprep build INPUT.jsonl --out DIR`"
        )
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{manifest_path}: unreadable manifest ({exc}); {REBUILD}") from exc
    if not isinstance(manifest, dict):
        raise UsageError(f"{manifest_path}: manifest is not a JSON object; {REBUILD}")
    fmt, version = manifest.get("format"), manifest.get("format_version")
    if fmt != FORMAT_NAME or version != FORMAT_VERSION:
        raise UsageError(
            f"{manifest_path}: shards of format {fmt!r} version {version!r}, expected {FORMAT_NAME!r} version "
            f"{FORMAT_VERSION} (written by weightprep {manifest.get('weightprep_version', '?')}); {REBUILD}"
        )
    return manifest


def build_setting(config: dict[str, Any], flat: str, nested: tuple[str, str]) -> Any:
    """A build setting from the manifest's resolved configuration: ``config[flat]`` or ``config[a][b]``."""
    if flat in config:
        return config[flat]
    section = config.get(nested[0])
    return section.get(nested[1]) if isinstance(section, dict) else None
