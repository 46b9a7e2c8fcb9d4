"""``--columns`` (``read.columns``, a source's ``columns``): other names for the fields of a record, of its messages
and of their roles, one mapping for every kind of file.

``TARGET=SOURCE,...`` where TARGET is

- a record's field (``prompt=question``, ``messages=conversation``): the key (a JSON record's) or column (a
  Parquet/Arrow file's) ``SOURCE`` is read as ``TARGET``;
- ``message.KEY`` (``message.role=speaker``, ``message.content=text``): inside every message of the record's
  ``messages`` (or ``conversations``, ``prompt``, ``completion``) list, the key ``SOURCE`` is read as ``KEY``;
- ``role.ROLE`` (``role.user=USER``, ``role.assistant=bot``): a message whose role (or ShareGPT ``from``) is
  ``SOURCE`` has the role ``ROLE``; a role may have several sources (``role.user=human,role.user=person``).

That covers LLaMA-Factory's ``dataset_info.json`` (``columns``: record fields; ``tags``: ``role_tag`` and
``content_tag`` -> ``message.role``/``message.content``, ``user_tag``, ``assistant_tag``, ``system_tag``,
``observation_tag`` -> ``role.user``, ``role.assistant``, ``role.system``, ``role.tool``, ``function_tag`` ->
``role.function_call``) and axolotl's ``field_messages`` (``messages=...``), ``message_property_mappings``
(``message.role=...``, ``message.content=...``) and ``roles`` (``role.ROLE=...`` for each). docs/inputs.md has
examples. A source mapped twice, or an empty side, is an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from weightprep.errors import UsageError

__all__ = ["Columns", "parse_columns"]


@dataclass(frozen=True)
class Columns:
    """A parsed mapping, each part source -> target: ``records`` (fields or columns), ``message`` (keys inside a
    message), ``roles`` (role values)."""

    records: dict[str, str] = field(default_factory=dict)
    message: dict[str, str] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.records or self.message or self.roles)

    def inside(self) -> Columns:
        """The mapping without its record fields (a columnar file's columns are renamed by its reader)."""
        return Columns({}, self.message, self.roles)


def parse_columns(spec: str | None) -> Columns:
    """``"prompt=question,message.role=from,role.user=human"`` -> ``Columns({"question": "prompt"}, {"from":
    "role"}, {"human": "user"})``."""
    parts: dict[str, dict[str, str]] = {"records": {}, "message": {}, "roles": {}}
    for part in filter(None, (p.strip() for p in (spec or "").split(","))):
        target, sep, source = (s.strip() for s in part.partition("="))
        if not sep or not target or not source:
            raise UsageError(f"--columns: expected TARGET=SOURCE[,TARGET=SOURCE...], got {part!r}")
        kind, dot, name = target.partition(".")
        if dot and kind in ("message", "role"):
            if not name:
                raise UsageError(f"--columns: {part!r} names no {'key' if kind == 'message' else 'role'} after {kind}.")
            mapping, target = parts["message" if kind == "message" else "roles"], name
        else:
            mapping = parts["records"]
        if source in mapping:  # a source cannot become two names: the last mapping would win silently
            what = "column" if mapping is parts["records"] else "key" if mapping is parts["message"] else "role"
            shown = {"records": "", "message": "message.", "roles": "role."}[next(k for k, v in parts.items() if v is mapping)]
            raise UsageError(
                f"--columns: {what} {source!r} is mapped twice ({shown}{mapping[source]}={source}, {part}); map each "
                f"{what} once"
            )
        mapping[source] = target
    return Columns(parts["records"], parts["message"], parts["roles"])
