"""Loading the tokenizer, its special tokens, and a fingerprint that ties shards to it.

The build only ever uses the fast (Rust) backend; a slow tokenizer is refused with the fix.
Without ``--tokenizer`` the small byte-level BPE tokenizer in ``sample_data/tokenizer`` is used
(built by ``sample_data/make_tokenizer.py``), and the caller is told so.
The fingerprint is a SHA-256 over the backend's JSON (with run-time truncation and padding
switched off) and the special-token ids: two tokenizers with the same fingerprint map every text
to the same ids.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weightprep.errors import UsageError

__all__ = [
    "SAMPLE_TOKENIZER_DIR",
    "SpecialTokens",
    "load_tokenizer",
    "special_tokens",
    "tokenizer_fingerprint",
    "tokenizer_summary",
]

#: The small tokenizer bundled with the repository (see sample_data/make_tokenizer.py).
SAMPLE_TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "sample_data" / "tokenizer"


@dataclass(frozen=True)
class SpecialTokens:
    """Ids the assembler needs. ``bos`` is None when the tokenizer has no BOS token."""

    bos: int | None
    eos: int
    pad: int


def load_tokenizer(name_or_path: str | None, *, trust_remote_code: bool = False) -> Any:
    """Load a fast tokenizer from a local directory or a hub id (``None``: the bundled sample one)."""
    from transformers import AutoTokenizer

    if name_or_path is None:
        if not (SAMPLE_TOKENIZER_DIR / "tokenizer.json").is_file():
            raise UsageError(
                f"the bundled sample tokenizer is missing at {SAMPLE_TOKENIZER_DIR}; "
                "rebuild it with `python sample_data/make_tokenizer.py` or pass --tokenizer PATH_OR_HUB_ID"
            )
        name_or_path = str(SAMPLE_TOKENIZER_DIR)
    try:
        tok = AutoTokenizer.from_pretrained(name_or_path, use_fast=True, trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers raises OSError/ValueError/... with useful text
        raise UsageError(
            f"could not load tokenizer {name_or_path!r}: {exc}\n"
            "Pass --tokenizer a local directory with tokenizer.json or a hub id you can reach."
        ) from exc
    if not getattr(tok, "is_fast", False):
        raise UsageError(
            f"tokenizer {name_or_path!r} loaded as a slow Python tokenizer ({type(tok).__name__}); "
            "weightprep needs a fast (Rust) tokenizer. Use a directory with tokenizer.json, or convert once "
            "with `AutoTokenizer.from_pretrained(path, from_slow=True).save_pretrained(out)`."
        )
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
        "class": type(tok).__name__,
        "fingerprint": tokenizer_fingerprint(tok),
        "vocab_size": len(tok),
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }
