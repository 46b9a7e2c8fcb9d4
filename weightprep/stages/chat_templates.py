"""The chat template that renders a build's conversations: the tokenizer's own, a file, or TRL's training one.

``chat.template`` (``--chat-template``) is ``null`` (the tokenizer's ``chat_template``), a ``.jinja`` file, or
``training``: the training template that ``trl.chat_template_utils.get_training_chat_template`` maps the
tokenizer's template to (prefix-preserving, every turn's reasoning kept, ``{% generation %}`` tags), which
TRL's ``SFTTrainer`` swaps in with ``assistant_only_loss=True``. TRL is the ``train`` extra: imported here
only, and only when a training template is needed (the import takes seconds). The manifest records the
templates used by their SHA-256 (``manifest_chat``).
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any, NamedTuple

from weightprep.errors import UsageError
from weightprep.tokenizer import transformers_tokenizer

__all__ = [
    "TRAINING", "Templates", "TrlMissing", "manifest_chat", "resolve_templates", "template_sha256",
    "training_template",
]  # fmt: skip

#: The ``chat.template`` value that asks for TRL's training template.
TRAINING = "training"
PIP_TRL = "pip install 'weightprep[train]'"


class TrlMissing(UsageError):
    """A training template was needed and TRL is not installed."""


class Templates(NamedTuple):
    """``template`` renders the documents (whole conversations, and the turns of per-turn documents);
    ``original``: the template inference uses, for the context of per-turn documents, where it differs
    (``training``); ``source``: where ``template`` comes from; ``path``: the file it was read from (for
    errors); ``training``: ``template`` is TRL's training template."""

    template: str | None
    original: str | None
    source: str
    path: str | None = None
    training: bool = False


def tokenizer_template(tok: Any) -> str | None:
    """The tokenizer's chat template (the ``default`` one of named templates)."""
    template = getattr(tok, "chat_template", None)
    return template.get("default") if isinstance(template, dict) else template


def _trl() -> Any:
    try:
        from trl import chat_template_utils
    except ImportError as exc:
        raise TrlMissing(f"TRL is not installed ({exc}); install it with {PIP_TRL}") from None
    return chat_template_utils


#: ``training_template``'s answers, by template text (TRL maps a template by comparing its text with its own)
_FOUND: dict[str, str | None] = {}
#: why TRL has no training template for a template, where that is not TRL's own "not supported"
_WHY: dict[str, str] = {}


def training_template(tok: Any, template: str) -> str | None:
    """The training template TRL maps ``template`` to: ``template`` itself where TRL trains on it as it is
    (already prefix-preserving with ``{% generation %}`` tags), None where TRL has none. ``TrlMissing``
    without TRL. ``tok``: the build's tokenizer (TRL renders probe conversations with the transformers one)."""
    if template not in _FOUND:
        utils = _trl()
        holder = tok = transformers_tokenizer(tok)
        if tokenizer_template(tok) != template:  # TRL reads the template off the tokenizer
            holder = copy.copy(tok)
            holder.chat_template = template
        try:
            found = utils.get_training_chat_template(holder)
        except ValueError:  # "patching is not supported for this template"
            found = False
        except Exception as exc:  # noqa: BLE001 - TRL's own probe renders fail on the template (Hermes 3's
            # tool_use template iterates ``tools`` without a guard: TypeError): TRL has no training template for it
            found = False
            _WHY[template] = f" (TRL's check of the template fails: {type(exc).__name__}: {exc})"
        _FOUND[template] = None if found is False else template if found is None else found
    return _FOUND[template]


def _trl_source(text: str) -> str:
    """``training: trl VERSION chat_templates/NAME.jinja``, TRL's file holding ``text`` (for the manifest)."""
    import trl

    folder = Path(_trl().__file__).parent / "chat_templates"
    files = sorted(folder.glob("*.jinja"))
    name = next((p.name for p in files if p.read_text(encoding="utf-8") == text), "?")
    return f"training: trl {trl.__version__} chat_templates/{name}"


def resolve_templates(tok: Any, setting: str | None) -> Templates:
    """The templates that ``chat.template`` = ``setting`` means for ``tok`` (the build's tokenizer)."""
    own = tokenizer_template(tok)
    if setting is None:
        return Templates(own, None, "tokenizer")
    if setting != TRAINING:
        return Templates(Path(setting).read_text(encoding="utf-8"), None, setting, setting)
    if not own:
        raise UsageError(
            "--chat-template training maps the tokenizer's chat_template to TRL's training template, but the "
            "tokenizer has none; pass --chat-template FILE.jinja or use the model's own tokenizer"
        )
    try:
        found = training_template(tok, own)
    except TrlMissing as exc:
        raise TrlMissing(f"--chat-template training needs TRL's training templates: {exc}") from None
    if found is None:
        raise UsageError(
            "--chat-template training: TRL has no training template for this tokenizer's chat_template (it "
            f"knows its own copies of about 30 model templates, compared character for character){_WHY.get(own, '')}; "
            "build with "
            "the tokenizer's own template (no --chat-template: whole conversations, or per-turn documents "
            "where it rewrites history) or pass a prefix-preserving template with --chat-template FILE.jinja"
        )
    if found == own:
        return Templates(own, None, "training: the tokenizer's own (TRL trains on it as is)", training=True)
    return Templates(found, own, _trl_source(found), training=True)


def template_sha256(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def manifest_chat(
    tok: Any, setting: str | None, history: str, training_turns: int, per_turn: int = 0
) -> dict[str, Any]:
    """The manifest's ``chat`` block: the template that rendered the documents (SHA-256 and origin), the
    history mode, the template of per-turn documents' context (the original under ``training``), the
    training template that rendered the turns the template itself cannot (``training_turns`` documents; null
    when none) and, where ``per_turn`` conversations were built as per-turn documents with the template itself,
    ``training_alternative``: the training template ``--chat-template training`` would render each of them
    with once (null: TRL has none for it, or is not installed)."""
    chosen = resolve_templates(tok, setting)
    block: dict[str, Any] = {
        "template_source": chosen.source,
        "template_sha256": template_sha256(chosen.template),
        "history": history,
        "context_template_sha256": template_sha256(chosen.original or chosen.template),
        "turn_template_source": None,
        "turn_template_sha256": None,
    }
    if training_turns and chosen.original is None and chosen.template:
        found = training_template(tok, chosen.template)
        if found is not None:
            block.update(turn_template_source=_trl_source(found), turn_template_sha256=template_sha256(found))
    if per_turn and not chosen.training and chosen.template:
        try:
            found = training_template(tok, chosen.template)
        except TrlMissing:
            found = None
        block["training_alternative"] = None if found is None else (
            "training: the template itself, as TRL trains on it" if found == chosen.template else _trl_source(found)
        )  # fmt: skip
    return block
