"""A tokenizer that transformers built for a directory, kept as a directory the build reads without transformers.

A directory that only transformers may load as it is (a model's own class, e.g. ``Qwen2Tokenizer``, which
transformers 5 rebuilds from the vocabulary; keys of ``tokenizer_config.json`` that change the backend) costs every
build process ~1 s before its first record even once its class is remembered (``weightprep.tokenizer_class``):
``import transformers`` (~0.55 s) and the class's own load. What the build uses of that tokenizer is its backend
(``tokenizers.Tokenizer``, which serializes exactly: ``to_str``), its named special tokens, its added tokens, its
chat templates and control tokens, and its decode. So after transformers has built it once, ``remember`` writes it
as a tokenizer directory of the plainest kind (``tokenizer.json`` from the backend, ``tokenizer_config.json`` with
those tokens and templates, class ``TokenizersBackend``) and ``recall`` reads it back as a ``TokenizerFiles``
under the directory's own name and class: no transformers, no torch.

A snapshot is written only where the ``TokenizerFiles`` read back from it equals the tokenizer transformers built
in all of that (``differences``: fingerprint, vocabulary size, class, special and added tokens, chat templates,
control tokens per template, decode of every id); anything else is left to transformers, as before. Snapshots are
keyed as the remembered classes are (transformers' version, the directory's path, the bytes of every file but
weights: any change is a new key) and by the tokenizers version, live in ``cache_dir()/tokenizers/KEY-VERSION/``
and are at most ``KEEP`` (the least recently used dropped first: a ``tokenizer.json`` is megabytes). A snapshot
that cannot be read is ignored, and replaced by the next; the processes of a first build, each writing its own,
keep the first that reads back (``_put``), so none of them ever finds the name missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from weightprep import tokenizer_class

__all__ = ["KEEP", "differences", "recall", "remember"]

#: Snapshots kept, at most.
KEEP = 8
#: seconds after which a folder still being written is one whose writer stopped
_STALE = 3600
_FOLDER = "tokenizers"
_CLASS = "weightprep_class"  # the key of tokenizer_config.json that names the class transformers built
_NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _home() -> Path:
    return tokenizer_class.cache_dir() / _FOLDER


def _name(directory: Path) -> str | None:
    """The snapshot's folder name: the directory's key (``tokenizer_class``) and the tokenizers version that wrote
    and reads its ``tokenizer.json`` (None: no key)."""
    import tokenizers

    key = tokenizer_class._key(directory)
    return None if key is None else f"{key}-{tokenizers.__version__}"


def recall(directory: Path) -> Any | None:
    """The snapshot of ``directory`` as a ``TokenizerFiles`` (None: none, or it cannot be read)."""
    from weightprep.tokenizer import TokenizerFiles

    name = _name(directory)
    folder = None if name is None else _home() / name
    if folder is None or not (folder / "tokenizer.json").is_file():
        return None
    try:
        files = TokenizerFiles(folder, name_or_path=str(directory))
    except Exception:  # noqa: BLE001 - a damaged snapshot: transformers loads the directory, and it is written anew
        return None
    with contextlib.suppress(OSError):
        os.utime(folder)  # recently used: kept longest
    return files


def _config(tok: Any) -> dict[str, Any]:
    template = getattr(tok, "chat_template", None)
    if isinstance(template, dict):
        template = [{"name": k, "template": v} for k, v in template.items()]
    return {
        "tokenizer_class": "TokenizersBackend", _CLASS: type(tok).__name__,
        **{k: str(getattr(tok, k)) for k in _NAMED if getattr(tok, k, None) is not None},
        "chat_template": template, "chat_control_tokens": getattr(tok, "chat_control_tokens", None),  # (transformers 5)
        "clean_up_tokenization_spaces": bool(tok.clean_up_tokenization_spaces),
    }  # fmt: skip


def differences(files: Any, tok: Any) -> list[str]:
    """What the ``TokenizerFiles`` ``files`` answers otherwise than the transformers tokenizer ``tok`` (none: the
    build runs the same with either)."""
    from weightprep.stages.chat_control import control_token_list
    from weightprep.tokenizer import tokenizer_summary

    found = []
    checks = {
        "summary": (tokenizer_summary(files), tokenizer_summary(tok)),
        "special_tokens_map": (files.special_tokens_map, tok.special_tokens_map),
        "added tokens": (
            {i: (t.content, t.special, t.lstrip, t.rstrip, t.normalized, t.single_word) for i, t in files.added_tokens_decoder.items()},
            {i: (t.content, t.special, t.lstrip, t.rstrip, t.normalized, t.single_word) for i, t in tok.added_tokens_decoder.items()},
        ),  # fmt: skip
        "chat_template": (files.chat_template, getattr(tok, "chat_template", None)),
        "named tokens": ({k: getattr(files, k, None) for k in _NAMED}, {k: getattr(tok, k, None) for k in _NAMED}),
        "decode": (files.decode(range(len(tok))), tok.decode(list(range(len(tok))))),
    }
    template = tok.chat_template
    for text in (template.values() if isinstance(template, dict) else [template] if template else []):
        checks[f"control tokens of a template ({len(text)} characters)"] = (
            control_token_list(files, text), control_token_list(tok, text)
        )  # fmt: skip
    for what, (mine, theirs) in checks.items():
        if mine != theirs:
            found.append(what)
    return found


def remember(directory: Path, tok: Any) -> bool:
    """Keep what transformers built for ``directory`` (``tok``, a fast tokenizer) as a snapshot, where it reads back
    the same (``differences``); whether it was kept. Nothing is kept where it cannot be written."""
    from weightprep.tokenizer import TokenizerFiles

    name = _name(directory)
    if name is None:
        return False
    home = _home()
    try:
        home.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=home, prefix=".new-"))
    except OSError:
        return False
    try:
        (tmp / "tokenizer.json").write_text(tok.backend_tokenizer.to_str(), encoding="utf-8")
        (tmp / "tokenizer_config.json").write_text(json.dumps(_config(tok)), encoding="utf-8")
        if differences(TokenizerFiles(tmp, name_or_path=str(directory)), tok):
            return False
        _put(tmp, home / name, directory)
    except Exception:  # noqa: BLE001 - a snapshot only saves time: one that cannot be made (no backend, a decode
        # that fails, a full disk) is not kept
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _drop_oldest(home)
    return True


def _put(new: Path, target: Path, directory: Path) -> None:
    """``new`` renamed to ``target``, atomically. A snapshot there already (another process's, made meanwhile) is
    kept where it reads back, so that no reader finds the name missing; one that does not is moved aside first."""
    try:
        os.replace(new, target)  # (fails where ``target`` is a folder that holds files)
        return
    except OSError:
        if recall(directory) is not None:
            return
    aside = Path(tempfile.mkdtemp(dir=target.parent, prefix=".old-"))
    os.replace(target, aside / "snapshot")
    os.replace(new, target)
    shutil.rmtree(aside, ignore_errors=True)


def _drop_oldest(home: Path) -> None:
    """Keep the ``KEEP`` snapshots used last; drop what writers that stopped half-way left (a ``.new-`` or ``.old-``
    folder an hour old)."""
    with contextlib.suppress(OSError):
        folders = [(p, p.stat().st_mtime) for p in home.iterdir() if p.is_dir()]
        kept = sorted((t, p) for p, t in folders if not p.name.startswith("."))
        stale = [p for p, t in folders if p.name.startswith((".new-", ".old-")) and t < time.time() - _STALE]
        for old in [p for _, p in kept[:-KEEP]] + stale:
            shutil.rmtree(old, ignore_errors=True)  # (another process's drop of it)
