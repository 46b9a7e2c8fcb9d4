"""Loading the tokenizer, its special tokens, and a fingerprint that ties shards to it.

The build only ever uses the fast (Rust) backend; a slow tokenizer is refused with the fix.
Without ``--tokenizer`` the small byte-level BPE tokenizer in ``sample_data/tokenizer`` is used
(built by ``sample_data/make_tokenizer.py``), and the caller is told so.

The build reads a local tokenizer directory itself (``TokenizerFiles``: ``tokenizer.json`` +
``tokenizer_config.json`` / ``special_tokens_map.json``) wherever that gives exactly what
``AutoTokenizer`` would: importing transformers' auto classes imports torch (about 3 s and 260 MB).
That is the case for the generic class (``tokenizer_class`` ``PreTrainedTokenizerFast``, e.g. Llama-3)
when the configuration asks transformers for no change to the backend (``direct_load_obstacle`` lists
what would); anything else (model-specific classes, which transformers 5 rebuilds from the vocabulary,
hub ids, remote code) goes through ``AutoTokenizer`` as before, or through the class it chose for the same
directory before (``weightprep.tokenizer_class``), which imports no torch either; and once transformers has built
a directory's tokenizer, the build reads its snapshot (``weightprep.tokenizer_snapshot``) directly too.
The fingerprint is a SHA-256 over the backend's JSON (with run-time truncation and padding
switched off) and the special-token ids: two tokenizers with the same fingerprint map every text
to the same ids.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weightprep.errors import UsageError

__all__ = [
    "GENERIC_CLASSES",
    "chat_tokenizer",
    "local_path_problem",
    "SAMPLE_TOKENIZER_DIR",
    "SpecialTokens",
    "TokenizerFiles",
    "direct_load_obstacle",
    "transformers_tokenizer",
    "load_tokenizer",
    "special_tokens",
    "tokenizer_location",
    "tokenizer_fingerprint",
    "tokenizer_summary",
    "set_tokenizer_threads",
]

#: The small tokenizer bundled with the repository (see sample_data/make_tokenizer.py).
SAMPLE_TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "sample_data" / "tokenizer"


@dataclass(frozen=True)
class SpecialTokens:
    """Ids the assembler needs. ``bos`` is None when the tokenizer has no BOS token."""

    bos: int | None
    eos: int
    pad: int


#: The classes that transformers 5 builds from ``tokenizer.json`` as it is (``TokenizersBackend``).
GENERIC_CLASSES = frozenset({"PreTrainedTokenizerFast", "TokenizersBackend"})
#: tokenizer_config.json keys with which transformers changes the backend at load time.
_CHANGING_KEYS = (
    "add_bos_token", "add_eos_token", "add_prefix_space", "split_special_tokens", "fix_mistral_regex",
    "auto_map", "tokenizer_file", "fast_tokenizer_files", "legacy", "from_slow",
)
#: tokenizer_config.json keys listing special tokens beyond the named ones (transformers 5 writes
#: ``extra_special_tokens``, 4 ``additional_special_tokens``): no change where each is a special added token already
_EXTRA_KEYS = ("extra_special_tokens", "additional_special_tokens")
_NAMED_SPECIALS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _content(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    return value.get("content") if isinstance(value, dict) else value


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"could not read {path}: {exc}") from exc


def direct_load_obstacle(directory: Path, backend: Any = None) -> str | None:
    """Why reading ``directory`` directly might differ from ``AutoTokenizer`` (None: it cannot).

    ``backend``: its ``tokenizer.json`` already loaded by tokenizers (else it is loaded here)."""
    if not (directory / "tokenizer.json").is_file() or not (directory / "tokenizer_config.json").is_file():
        return "no tokenizer.json + tokenizer_config.json"
    config = _read_json(directory / "tokenizer_config.json")
    if config.get("tokenizer_class") not in GENERIC_CLASSES:
        return f"tokenizer_class {config.get('tokenizer_class')!r} is built by its own transformers class"
    if changing := [k for k in _CHANGING_KEYS if config.get(k)]:
        return f"tokenizer_config.json sets {', '.join(changing)}"
    backend = backend if backend is not None else _load_backend(directory)
    if backend.post_processor is None:
        return "tokenizer.json has no post-processor (transformers writes one)"
    added = {t.content: (i, t) for i, t in backend.get_added_tokens_decoder().items()}
    for key in _EXTRA_KEYS:
        extra = config.get(key) or []
        if not isinstance(extra, list) or any(_content(t) not in added or not added[_content(t)][1].special for t in extra):
            return f"tokenizer_config.json sets {key} that are not special added tokens of tokenizer.json"
    for index, token in (config.get("added_tokens_decoder") or {}).items():
        mine = added.get(_content(token))
        if mine is None or mine[0] != int(index) or (isinstance(token, dict) and any(
            getattr(mine[1], k) != v for k, v in token.items() if k in ("lstrip", "rstrip", "normalized", "single_word", "special")
        )):
            return f"added token {_content(token)!r} of tokenizer_config.json differs from tokenizer.json"
    for key, value in _special_config(directory, config).items():
        if value is not None and _content(value) not in added:
            return f"{key} {_content(value)!r} is not an added token of tokenizer.json (transformers would add it)"
    return None


def _load_backend(directory: Path) -> Any:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(directory / "tokenizer.json"))
    except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
        raise UsageError(f"could not load {directory / 'tokenizer.json'}: {exc}") from exc


def _special_config(directory: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The named special tokens as transformers resolves them: tokenizer_config.json, and special_tokens_map.json
    where the config predates ``added_tokens_decoder`` (transformers' legacy path)."""
    specials = {k: config.get(k) for k in _NAMED_SPECIALS}
    legacy_map = directory / "special_tokens_map.json"
    if "added_tokens_decoder" not in config and legacy_map.is_file():
        specials.update({k: v for k, v in _read_json(legacy_map).items() if k in _NAMED_SPECIALS})
    return specials


class TokenizerFiles:
    """A local tokenizer directory read without transformers: what the build needs of a tokenizer.

    ``backend_tokenizer`` is ``tokenizer.json`` loaded by tokenizers; special tokens, added tokens and chat
    templates are resolved as transformers does (what the chat stage renders with); ``transformers_tokenizer(self)``
    loads the full one where a stage needs it (``sanitize_control_tokens``, TRL's training templates)."""

    is_fast = True
    class_name = "TokenizersBackend"  # what AutoTokenizer returns for these directories

    def __init__(self, directory: Path, backend: Any = None, *, name_or_path: str | None = None) -> None:
        self.name_or_path = str(directory) if name_or_path is None else name_or_path
        self.file = directory / "tokenizer.json"  # what the backend was read from
        self.backend_tokenizer = backend if backend is not None else _load_backend(directory)
        config = _read_json(directory / "tokenizer_config.json")
        # a snapshot (weightprep.tokenizer_snapshot) names the class transformers built it with
        self.class_name = config.get("weightprep_class", TokenizerFiles.class_name)
        self.chat_template = _chat_templates(directory, config)
        self.chat_control_tokens = config.get("chat_control_tokens")
        self._clean_up = config.get("clean_up_tokenization_spaces", False)  # transformers 5's default
        self.special_tokens_map: dict[str, str] = {}  # as transformers 5's: the named special tokens that are set
        for key, value in _special_config(directory, config).items():
            token = _content(value)
            setattr(self, key, token)
            setattr(self, f"{key}_id", None if token is None else self.backend_tokenizer.token_to_id(token))
            if token is not None:
                self.special_tokens_map[key] = token
        self._full: Any = None

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def decode(self, ids: Any, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool | None = None) -> str:
        """``decode`` as transformers 5's tokenizer decodes: the backend's own decode, where no clean-up of
        tokenization spaces is asked for or set in tokenizer_config.json; else (or under transformers 4) transformers'
        tokenizer decodes."""
        from weightprep.tokenizer_class import transformers_major

        clean = self._clean_up if clean_up_tokenization_spaces is None else clean_up_tokenization_spaces
        if clean or transformers_major() < 5:
            return transformers_tokenizer(self).decode(  # type: ignore[no-any-return]
                ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=clean_up_tokenization_spaces
            )
        return self.backend_tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)  # type: ignore[no-any-return]

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        return self.backend_tokenizer.get_added_tokens_decoder()  # type: ignore[no-any-return]

    @property
    def added_tokens_encoder(self) -> dict[str, int]:
        return {t.content: i for i, t in sorted(self.added_tokens_decoder.items())}


def _chat_templates(directory: Path, config: dict[str, Any]) -> str | dict[str, str] | None:
    """The chat template as transformers 5 loads it: ``chat_template.jinja`` (``default``) and the files of
    ``additional_chat_templates/`` (by name) over tokenizer_config.json's; one ``default`` alone is a string,
    named templates a dict."""
    files = {"default": directory / "chat_template.jinja"} if (directory / "chat_template.jinja").is_file() else {}
    extra = directory / "additional_chat_templates"
    if extra.is_dir():
        files.update({p.name.removesuffix(".jinja"): p for p in extra.glob("*.jinja")})
    if files:
        found = {name: path.read_text(encoding="utf-8") for name, path in files.items()}
        return found["default"] if list(found) == ["default"] else found
    value = config.get("chat_template")
    return {t["name"]: t["template"] for t in value} if isinstance(value, (list, tuple)) else value


def transformers_tokenizer(tok: Any) -> Any:
    """The transformers tokenizer behind ``tok`` (loaded once for a ``TokenizerFiles``)."""
    if not isinstance(tok, TokenizerFiles):
        return tok
    if tok._full is None:
        tok._full = load_tokenizer(tok.name_or_path, direct=False)
    return tok._full


def chat_tokenizer(tok: Any, *, full: bool = False) -> Any:
    """The tokenizer the chat stage renders with: ``tok`` itself where it is a ``TokenizerFiles`` and transformers is
    5 or later (whose ``special_tokens_map``, the template's token arguments, holds the named tokens only, as
    ``TokenizerFiles``' does), else the transformers one; ``full``: always the transformers one (what
    ``sanitize_control_tokens`` encodes with)."""
    if full or not isinstance(tok, TokenizerFiles):
        return transformers_tokenizer(tok)
    from weightprep.tokenizer_class import transformers_major

    return tok if transformers_major() >= 5 else transformers_tokenizer(tok)


def tokenizer_location(name_or_path: str | None) -> str:
    """What ``--tokenizer`` names: a local directory or a hub id as given, the bundled sample one for ``None``."""
    if name_or_path is not None:
        return name_or_path
    if not (SAMPLE_TOKENIZER_DIR / "tokenizer.json").is_file():
        raise UsageError(
            f"the bundled sample tokenizer is missing at {SAMPLE_TOKENIZER_DIR}; "
            "rebuild it with `python sample_data/make_tokenizer.py` or pass --tokenizer PATH_OR_HUB_ID"
        )
    return str(SAMPLE_TOKENIZER_DIR)


def local_path_problem(name: str, what: str) -> str | None:
    """Why ``name`` (a ``--tokenizer`` or ``--model``) cannot be loaded if it is meant as a local path, else None.

    A hub id is ``name`` or ``org/name``; anything else (absolute, ``./``, ``~``, two slashes or more) is a path,
    and a missing one must be reported as a missing directory, not as a malformed repo id (what the hub client
    says of it)."""
    path = Path(name).expanduser()
    if path.is_file():
        return f"{what} {name} is a file: give the directory that holds it (with tokenizer.json / config.json)"
    if path.exists():
        return None
    looks_local = name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name or name.endswith("/")
    if looks_local:
        return (f"{what} {name}: no such directory (a local path; a hub id reads ORG/NAME, e.g. "
                "meta-llama/Llama-3.2-1B)")  # fmt: skip
    return None


def load_tokenizer(name_or_path: str | None, *, trust_remote_code: bool = False, direct: bool = False) -> Any:
    """Load a fast tokenizer from a local directory or a hub id (``None``: the bundled sample one).

    ``direct``: return a ``TokenizerFiles`` where that is exactly what AutoTokenizer would load (the build)."""
    name_or_path = tokenizer_location(name_or_path)
    if (problem := local_path_problem(name_or_path, "tokenizer")) is not None:
        raise UsageError(problem)
    directory = Path(name_or_path)
    trusted = direct and not trust_remote_code  # a build's load of code it trusts: read directly where that is exact
    if trusted and (directory / "tokenizer.json").is_file():
        backend = _load_backend(directory)
        if direct_load_obstacle(directory, backend) is None:
            return TokenizerFiles(directory, backend)
    from weightprep import tokenizer_class, tokenizer_snapshot

    snapshots = trusted and directory.is_dir()  # (a hub id has none)
    kept = tokenizer_snapshot.recall(directory) if snapshots else None
    if kept is not None:
        return kept

    try:
        tok = tokenizer_class.load(name_or_path, trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers raises OSError/ValueError/... with useful text
        local = "" if Path(name_or_path).exists() else f" (and there is no local directory {name_or_path})"
        raise UsageError(
            f"could not load tokenizer {name_or_path!r}{local}: {exc}\n"
            "Pass --tokenizer a local directory with tokenizer.json or a hub id you can reach."
        ) from exc
    if not tok.is_fast:  # (every transformers tokenizer says)
        raise UsageError(
            f"tokenizer {name_or_path!r} loaded as a slow Python tokenizer ({type(tok).__name__}); "
            "weightprep needs a fast (Rust) tokenizer. Use a directory with tokenizer.json, or convert once "
            "with `AutoTokenizer.from_pretrained(path, from_slow=True).save_pretrained(out)`."
        )
    if snapshots:
        tokenizer_snapshot.remember(directory, tok)  # the next builds read it without transformers
    return tok


def special_tokens(tok: Any, *, add_bos: bool | None = None) -> SpecialTokens:
    """BOS (if any and wanted), EOS (required) and the pad id (pad, else EOS)."""
    eos = tok.eos_token_id
    if eos is None:
        raise UsageError(
            f"tokenizer {tok.name_or_path!r} has no EOS token; documents must end with one. "
            "Set it with `tok.eos_token = ...; tok.save_pretrained(dir)` and pass that directory."
        )
    bos = tok.bos_token_id
    if add_bos is False:
        bos = None
    elif add_bos is True and bos is None:
        raise UsageError(f"add_bos is true but tokenizer {tok.name_or_path!r} has no BOS token")
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    return SpecialTokens(bos=bos, eos=int(eos), pad=int(pad))


def tokenizer_fingerprint(tok: Any) -> str:
    """SHA-256 of what decides the ids: the backend's model, normalizer, pre-tokenizer, added tokens.

    Hashes the backend's own JSON (serialized in a fixed order by ``tokenizers``) with run-time
    truncation and padding switched off, plus the special-token ids; no JSON round trip, which
    costs a second on a 150k vocabulary.
    """
    backend = tok.backend_tokenizer
    if backend.truncation is not None or backend.padding is not None:
        backend = copy.deepcopy(backend)
        backend.no_truncation()
        backend.no_padding()
    digest = hashlib.sha256(backend.to_str().encode())
    digest.update(json.dumps([tok.bos_token_id, tok.eos_token_id, tok.pad_token_id]).encode())
    return digest.hexdigest()


def tokenizer_summary(tok: Any) -> dict[str, Any]:
    """What the manifest records about the tokenizer."""
    return {
        "name_or_path": str(tok.name_or_path),
        "class": getattr(tok, "class_name", type(tok).__name__),
        "fingerprint": tokenizer_fingerprint(tok),
        "vocab_size": len(tok),
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }


def set_tokenizer_threads(num_proc: int | None) -> None:
    """Size the Rust tokenizer's thread pool (read once, at its first parallel call in this process)."""
    if num_proc is not None:
        os.environ["RAYON_NUM_THREADS"] = str(num_proc)
    # a parent that set TOKENIZERS_PARALLELISM=false (e.g. to fork safely) would leave us on one core
    if num_proc is None or num_proc > 1:
        os.environ["TOKENIZERS_PARALLELISM"] = "true"
