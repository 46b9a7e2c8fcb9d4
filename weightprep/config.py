"""Build configuration: frozen dataclasses, one per stage, loaded from YAML and CLI overrides.

A pipeline file mirrors the dataclasses (``pipelines/packed.yaml``)::

    tokenizer: {name: null, add_bos: auto}
    read:      {block_bytes: 8388608, max_line_bytes: 67108864, part_bytes: 268435456, text_sample_by: line}
    validate:  {on_invalid: error}
    assemble:  {eos_weight: 1.0}
    filter:    {overlong: drop, max_length: null}
    pack:      {enabled: true, seq_len: 2048, window: 20000}
    write:     {max_shard_bytes: 268435456}
    split:     {validation_fraction: null, validation_records: null, seed: 0}
    chat:      {template: null, role_weights: "assistant=1", sanitize_control_tokens: false, history: auto}

Unknown keys and wrong types are errors; every problem is collected and reported together,
each naming its dotted path (``pack.seq_len: expected int, got str '2k'``). CLI flags are
applied on top as dotted overrides (``{"pack.seq_len": 4096}``) and validated the same way.

Renamed keys and values (``RENAMED_KEYS``, ``RENAMED_VALUES``) are still accepted under their old spelling, in
files and overrides alike, with a deprecation note (a ``FutureWarning``, shown once per key or value).
"""

from __future__ import annotations

import dataclasses
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from weightprep.errors import ConfigError

__all__ = [
    "TokenizerConfig",
    "ReadConfig",
    "ValidateConfig",
    "AssembleConfig",
    "FilterConfig",
    "PackConfig",
    "WriteConfig",
    "SplitConfig",
    "ChatConfig",
    "BuildConfig",
    "load_config",
    "load_sources",
    "config_from_dict",
    "config_to_dict",
]


@dataclass(frozen=True)
class TokenizerConfig:
    name: str | None = field(default=None, metadata={"help": "Local directory or hub id; null: the bundled sample tokenizer."})
    add_bos: Literal["auto", "always", "never"] = field(
        default="auto", metadata={"help": "auto: prepend BOS when the tokenizer has one."}
    )
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow custom tokenizer code from the hub."})
    batch_size: int = field(default=16384, metadata={"help": "Piece texts per call of the fast tokenizer."})
    backend: Literal["auto", "fastokens", "hf"] = field(
        default="auto",
        metadata={"help": "auto: fastokens where it loads the tokenizer and agrees with tokenizers, else tokenizers (hf)."},
    )


@dataclass(frozen=True)
class ReadConfig:
    block_bytes: int = field(default=8 << 20, metadata={"help": "Bytes of JSONL parsed per block (bounds memory)."})
    max_line_bytes: int = field(
        default=64 << 20, metadata={"help": "Longest line read; a longer one is rejected without being held in memory."}
    )
    columns: str | None = field(
        default=None,
        metadata={"help": "Other names of record fields, message keys and roles: TARGET=SOURCE,... (prompt=question,"
                          "message.role=from,role.user=human)."},
    )
    part_bytes: int = field(
        default=256 << 20,
        metadata={"help": "Plain JSONL files are cut into parts of about this many bytes, the unit of parallel work "
                          "(files of conversations 16 times finer, never under 8 MiB)."},
    )
    text_sample_by: Literal["line", "paragraph", "document"] = field(
        default="line",
        metadata={"help": "Plain-text inputs (.txt, .md): a record per line, paragraph or whole file (datasets' sample_by)."},
    )


@dataclass(frozen=True)
class ValidateConfig:
    on_invalid: Literal["error", "skip"] = field(
        default="error",
        metadata={"help": "error: the first invalid record stops the build; skip: quarantine it in rejects.jsonl."},
    )


@dataclass(frozen=True)
class AssembleConfig:
    eos_weight: float = field(default=1.0, metadata={"help": "Weight of the EOS token that ends each document."})


@dataclass(frozen=True)
class FilterConfig:
    overlong: Literal["drop", "truncate", "chunk"] = field(
        default="drop", metadata={"help": "What to do with documents longer than max_length."}
    )
    max_length: int | None = field(default=None, metadata={"help": "Longest document kept; null: pack.seq_len."})


@dataclass(frozen=True)
class PackConfig:
    enabled: bool = field(default=True, metadata={"help": "Pack many documents per row; false: one padded document per row."})
    seq_len: int = field(default=2048, metadata={"help": "Length of every output row, in tokens."})
    window: int = field(default=20000, metadata={"help": "Documents per best-fit-decreasing window."})


@dataclass(frozen=True)
class WriteConfig:
    max_shard_bytes: int = field(default=256 << 20, metadata={"help": "Upper bound on one Arrow shard's size."})


@dataclass(frozen=True)
class SplitConfig:
    validation_fraction: float | None = field(
        default=None, metadata={"help": "Share of records held out as the validation split (0 < F < 1)."}
    )
    validation_records: int | None = field(default=None, metadata={"help": "Number of records held out instead."})
    seed: int = field(default=0, metadata={"help": "Seed of the record hash that assigns the splits."})

    @property
    def enabled(self) -> bool:
        return self.validation_fraction is not None or self.validation_records is not None


@dataclass(frozen=True)
class ChatConfig:
    template: str | None = field(
        default=None,
        metadata={
            "help": "Jinja chat template file for chat records; training: the training template TRL maps the "
            "tokenizer's template to (needs trl); null: the tokenizer's own."
        },
    )
    role_weights: str = field(
        default="assistant=1",
        metadata={"help": "Default weight per role of chat messages (ROLE=W,...); roles not named get 0."},
    )
    sanitize_control_tokens: bool = field(
        default=False,
        metadata={
            "help": "Encode the control tokens that open or close a turn (<|im_end|>, <|im_start|>, BOS/EOS, ...) "
            "found in a conversation's strings as plain text, as apply_chat_template(..., "
            "sanitize_control_tokens=True) does, instead of rejecting it (control_token_in_content). In-turn "
            "markers (<tool_call>, <think>) are tokens either way."
        },
    )
    history: Literal["auto", "full", "per-turn"] = field(
        default="auto",
        metadata={
            "help": "full: one document per conversation; per-turn: one per weighted message, as inference "
            "renders the conversation up to it; auto: full where the template renders the conversation "
            "prefix-preserving; where it cannot render a turn after its own generation prompt (DeepSeek-R1), "
            "the whole conversation as TRL's training template renders it (what SFTTrainer trains on); else "
            "per-turn."
        },
    )


@dataclass(frozen=True)
class BuildConfig:
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    read: ReadConfig = field(default_factory=ReadConfig)
    validate: ValidateConfig = field(default_factory=ValidateConfig)
    assemble: AssembleConfig = field(default_factory=AssembleConfig)
    filter: FilterConfig = field(default_factory=FilterConfig)
    pack: PackConfig = field(default_factory=PackConfig)
    write: WriteConfig = field(default_factory=WriteConfig)
    split: SplitConfig = field(default_factory=SplitConfig)
    chat: ChatConfig = field(default_factory=ChatConfig)

    @property
    def max_length(self) -> int:
        """The longest document kept whole: ``filter.max_length`` or the row length."""
        return self.filter.max_length if self.filter.max_length is not None else self.pack.seq_len


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def _check_value(path: str, tp: Any, value: Any, problems: list[str]) -> Any:
    """Return ``value`` converted to ``tp`` or append a problem naming ``path``."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _check_value(path, inner, value, problems)
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            problems.append(f"{path}: expected one of {', '.join(map(repr, choices))}, got {_describe(value)}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            problems.append(f"{path}: expected a mapping of {', '.join(f.name for f in dataclasses.fields(tp))}, got {_describe(value)}")
            return tp()
        return _build(tp, value, problems, path + ".")
    if tp is bool:
        if not isinstance(value, bool):
            problems.append(f"{path}: expected true or false, got {_describe(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{path}: expected an integer, got {_describe(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{path}: expected a number, got {_describe(value)}")
            return value
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            problems.append(f"{path}: expected a string, got {_describe(value)}")
        return value
    raise TypeError(f"unsupported config type {tp!r} at {path}")  # a bug in this module, not user input


def _build(cls: type, data: dict[str, Any], problems: list[str], prefix: str = "") -> Any:
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            problems.append(f"{prefix}{key}: unknown key; expected one of {', '.join(sorted(names))}")
    kwargs = {k: _check_value(prefix + k, hints[k], v, problems) for k, v in data.items() if k in names}
    return cls(**kwargs)


def _semantic_checks(cfg: BuildConfig, problems: list[str]) -> None:
    if isinstance(cfg.pack.seq_len, int) and cfg.pack.seq_len < 2:
        problems.append(f"pack.seq_len: must be at least 2, got {cfg.pack.seq_len}")
    ml = cfg.filter.max_length
    if isinstance(ml, int) and isinstance(cfg.pack.seq_len, int) and not 2 <= ml <= cfg.pack.seq_len:
        problems.append(f"filter.max_length: must be between 2 and pack.seq_len ({cfg.pack.seq_len}), got {ml}")
    from weightprep.weights import is_valid_weight, weight_overflow_note

    w = cfg.assemble.eos_weight
    if isinstance(w, float) and not is_valid_weight(w):
        problems.append(f"assemble.eos_weight: must be a finite number >= 0, got {w}{weight_overflow_note(w)}")
    if isinstance(cfg.read.columns, str):
        from weightprep.errors import UsageError
        from weightprep.stages.columns import parse_columns

        try:
            parse_columns(cfg.read.columns)
        except UsageError as exc:
            problems.append(f"read.columns: {exc}".replace("--columns: ", ""))
    if isinstance(cfg.chat.role_weights, str):
        from weightprep.weights import parse_role_weights

        try:
            parse_role_weights(cfg.chat.role_weights)
        except ConfigError as exc:
            problems.extend(exc.problems)
    template = cfg.chat.template
    if isinstance(template, str) and template != "training" and not Path(template).is_file():
        problems.append(f"chat.template: no such file {template!r} (or 'training': TRL's training template)")
    frac, n_val = cfg.split.validation_fraction, cfg.split.validation_records
    if frac is not None and n_val is not None:
        problems.append("split: give validation_fraction or validation_records, not both")
    if isinstance(frac, float) and not 0 < frac < 1:
        problems.append(f"split.validation_fraction: must be between 0 and 1 (exclusive), got {frac}")
    if isinstance(n_val, int) and not isinstance(n_val, bool) and n_val < 1:
        problems.append(f"split.validation_records: must be at least 1, got {n_val}")
    for path, value, low in (
        ("pack.window", cfg.pack.window, 1),
        ("read.block_bytes", cfg.read.block_bytes, 1024),
        ("read.max_line_bytes", cfg.read.max_line_bytes, 1024),
        ("read.part_bytes", cfg.read.part_bytes, 1),
        ("write.max_shard_bytes", cfg.write.max_shard_bytes, 1024),
        ("tokenizer.batch_size", cfg.tokenizer.batch_size, 1),
    ):
        if isinstance(value, int) and value < low:
            problems.append(f"{path}: must be at least {low}, got {value}")


#: Keys renamed since they were released (old dotted path -> new): "split" is train/validation only.
RENAMED_KEYS = {"read.split_bytes": "read.part_bytes"}
#: Values renamed since they were released ((dotted path, old value) -> new value).
RENAMED_VALUES = {("filter.overlong", "split"): "chunk"}


def _deprecated(note: str) -> None:
    # FutureWarning: shown to users by default, once per note (the default filter); the CLI prints it as a note
    warnings.warn(note, FutureWarning, stacklevel=4)


def _renamed(merged: dict[str, Any], overrides: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """``merged`` (a pipeline file's sections) and ``overrides`` (dotted) with old keys moved to their new names;
    returns the overrides so renamed. A key given under both names is a problem."""
    renamed = dict(overrides)
    for old, new in RENAMED_KEYS.items():
        section, _, key = old.partition(".")
        new_section, _, new_key = new.partition(".")
        node = merged.get(section)
        if isinstance(node, dict) and key in node:
            _deprecated(f"{old} is deprecated: use {new}")
            if isinstance(merged.get(new_section), dict) and new_key in merged[new_section]:
                problems.append(f"{old}: renamed {new}, which is also given; keep only {new}")
            else:
                merged.setdefault(new_section, {})[new_key] = node.pop(key)
        value = renamed.pop(old, None)
        if value is not None:
            _deprecated(f"{old} is deprecated: use {new}")
            if renamed.get(new) is None:
                renamed[new] = value
    return renamed


def _renamed_values(merged: dict[str, Any]) -> None:
    """Old values in ``merged`` replaced by their new names."""
    for (dotted, old), new in RENAMED_VALUES.items():
        section, _, key = dotted.partition(".")
        node = merged.get(section)
        if isinstance(node, dict) and node.get(key) == old:
            _deprecated(f"{dotted}: {old} is deprecated: use {new}")
            node[key] = new


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    section, _, key = dotted.partition(".")
    node = data.setdefault(section, {})
    if isinstance(node, dict):
        node[key] = value


def config_from_dict(
    data: dict[str, Any] | None, overrides: dict[str, Any] | None = None, *, source: str | None = None
) -> BuildConfig:
    """Validate ``data`` (a pipeline file's mapping) plus dotted ``overrides`` into a BuildConfig."""
    problems: list[str] = []
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"<top level>: expected a mapping of sections, got {_describe(data)}"], source)
    # the sources (``weightprep.sources``) are not a stage's configuration: ``load_sources`` reads them
    merged = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items() if k != "sources"}
    for dotted, value in _renamed(merged, overrides or {}, problems).items():
        if value is not None:
            _set_dotted(merged, dotted, value)
    _renamed_values(merged)
    cfg = _build(BuildConfig, merged, problems)
    if not problems:
        _semantic_checks(cfg, problems)
    if problems:
        raise ConfigError(problems, source)
    return cfg


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> BuildConfig:
    """Read a YAML pipeline file (or none: the defaults) and apply CLI overrides."""
    if path is None:
        return config_from_dict({}, overrides)
    import yaml  # only for a pipeline file: a build without one never loads it

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError([f"pipeline file not found: {path}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"not valid YAML: {exc}"], str(path)) from None
    return config_from_dict(data, overrides, source=str(path))


def load_sources(path: str | Path | None) -> list[Any] | None:
    """The ``sources:`` list of a pipeline file (``weightprep.sources``), None where it declares none."""
    if path is None:
        return None
    import yaml

    from weightprep.sources import sources_from_data

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (FileNotFoundError, yaml.YAMLError):
        return None  # load_config reports it
    if not isinstance(data, dict) or "sources" not in data:
        return None
    return sources_from_data(data["sources"], str(path))


def config_to_dict(cfg: BuildConfig) -> dict[str, Any]:
    """The resolved configuration as plain data (for the manifest)."""
    return dataclasses.asdict(cfg)
