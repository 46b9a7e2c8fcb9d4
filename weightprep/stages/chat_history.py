"""Stage 2a — history modes (``chat.history``): which documents a conversation becomes.

``full``: one document per conversation, the whole render (steps 1-5 of ``stages/chat.py``); where the template's
generation prompt is not how it renders an answer, or it rewrites a message of weight 0, the weighted spans come
from its own renders (``chat_spans``). ``per-turn``: one document per message ``i`` with a weight > 0, the
conversation as inference renders it at that turn (``messages[:i + 1]``, only message ``i`` weighted); where the
template does not start the turn with its own generation prompt (DeepSeek-R1 distills prefill ``<think>\\n``),
the turn as TRL's training template renders it, spliced after the original prompt (``_spliced``). ``auto`` (the
build's default): ``full`` where steps 2-3 hold; where the template cannot render a weighted turn after its own
generation prompt and TRL has a training template for it, the whole conversation as that template renders it
(what SFTTrainer trains on with ``assistant_only_loss``: ``_trained``); else the spans from the template's own
renders; else (a template that rewrites a *weighted* turn: Qwen3, gpt-oss) ``per-turn``.

``HistoryModes`` is a part of ``ChatRenderer``: it calls the renderer's ``runs``, ``render``,
``prepare`` and its attributes (``history``, ``original``, ``tok``, ...).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from weightprep.batches import Chat, ChatTokens
from weightprep.stages.chat_align import Runs, char_runs
from weightprep.stages.chat_common import ChatError, template_messages
from weightprep.stages.chat_templates import TrlMissing, training_template

__all__ = ["HISTORY_MODES", "Document", "HistoryModes", "joined"]

#: ``chat.history``: whole conversations, per-turn documents, or whole where that is exact, else per-turn.
HISTORY_MODES = ("auto", "full", "per-turn")
#: What ``auto`` answers with per-turn documents: a template that rewrites earlier turns, or whose generation
#: prompt is not where the turn it renders starts.
_REWRITTEN = ("not_prefix_preserving", "generation_prompt_mismatch")


class Document(NamedTuple):
    """A document's rendered text, its characters' weights and turn codes as runs, the conversation it was
    rendered from (truncated after its turn for a per-turn document; named in errors), and how many of its weighted
    turns TRL's training template rendered (the template itself could not)."""

    chat: Chat
    text: str
    runs: Runs
    training: int = 0


def joined(chat: Chat, parts: list[ChatTokens], per_turn: bool, training: int, sanitized: int = 0) -> ChatTokens:
    """A conversation's documents as one ``ChatTokens`` (``offsets`` between them for per-turn documents), its
    source ``chat`` (whatever the parts name)."""
    source = Chat(chat.messages, chat.tools, chat.template_kwargs, b"", chat.offset)  # (as ``_replace``, faster)
    if not per_turn:
        part = parts[0]
        return ChatTokens(
            part.ids, part.weights, source, part.turns, None, training, sanitized, part.straddling, part.batch,
            part.start,
        )  # fmt: skip
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p.ids) for p in parts], out=offsets[1:])
    return ChatTokens(
        np.concatenate([p.ids for p in parts]), np.concatenate([p.weights for p in parts]), source,
        np.concatenate([p.turns for p in parts]), offsets, training, sanitized, sum(p.straddling for p in parts),
    )  # fmt: skip


class HistoryModes:
    """The history modes of ``ChatRenderer`` (module docstring)."""

    # what ChatRenderer gives these methods (declared for the type checker)
    history: str
    original: str | None
    template: str | None
    tok: Any
    role_weights: dict[str, float]
    roles: list[str]
    scale: float
    sanitize: bool
    _tokenize: Any
    _context: Any
    _training: Any
    _trl_missing: TrlMissing | None
    runs: Any
    render: Any
    prepare: Any
    _empty: Any
    _weight: Any
    _scaled_weight: Any
    _char_turns: Any

    def documents(self, chat: Chat) -> tuple[list[Document], bool]:
        """The conversation's documents by ``history`` (module docstring, "History"), and whether they are
        per-turn ones: ``full`` one, ``per-turn`` one per weighted message, ``auto`` one where the template
        renders the conversation prefix-preserving with each turn after its generation prompt, else
        per-turn."""
        if self.history != "per-turn":
            try:
                return [Document(chat, *self.runs(chat))], False
            except ChatError as exc:
                if exc.reason not in _REWRITTEN:
                    raise
                if self.history == "auto" and exc.reason == "generation_prompt_mismatch" and self._has_training():
                    return [self._trained(chat, exc)], False  # where TRL has a training template: SFTTrainer's
                try:  # the weighted spans from the template's own renders (``chat_spans``)
                    return [Document(chat, *self.runs(chat, derive=True))], False
                except ChatError as derived:
                    if self.history == "full" and derived.reason == "not_prefix_preserving":
                        raise ChatError(derived.field, f"{derived.problem}; --chat-history full asks one document "
                                        "per conversation, which this template cannot give: --chat-history per-turn "
                                        "builds one per weighted message as inference renders it, --chat-history auto "
                                        "(the default) does so only where needed", derived.reason) from None  # fmt: skip
                    if self.history == "full" or derived.reason != "not_prefix_preserving":
                        raise
                    # auto: a template that rewrites a weighted turn: per-turn documents
        weights = [self._weight(i, m) for i, m in enumerate(chat.messages)]
        docs = []
        for i, w in enumerate(weights):
            if w > 0:  # the conversation up to message i, the only one weighted
                only = [{**m, "weight": w if j == i else 0.0} for j, m in enumerate(chat.messages[: i + 1])]
                try:
                    docs.append(self._turn(chat._replace(messages=only), i))
                except ChatError as exc:  # auto: a later turn the template cannot render after its prompt
                    if self.history != "auto" or exc.reason != "generation_prompt_mismatch" or self.original:
                        raise
                    return [self._trained(chat, exc)], False
        if not docs:  # nothing weighted: one document, which the filter drops (and counts) as unsupervised
            return [Document(chat, *self.runs(chat))], False
        return docs, True

    def _turn(self, turn: Chat, i: int) -> Document:
        """The per-turn document of message ``i``, the last of ``turn`` and its only weighted message: the
        context as inference renders it, then the turn. Where the template does not start the turn with its
        own generation prompt (DeepSeek-R1 distills: the prompt prefills ``<think>\\n``, the turn is
        re-rendered without its reasoning), the turn as the training template TRL maps the template to renders
        it."""
        assistant = turn.messages[i]["role"] == "assistant"
        if self.original is not None:  # --chat-template training: the context by the template inference uses
            context = self._context_renderer()
            if not assistant:
                return Document(turn, *context.runs(turn))
            return self._spliced(turn, i, context, self)
        try:
            return Document(turn, *self.runs(turn))
        except ChatError as exc:
            if exc.reason in _REWRITTEN and self.history == "auto":  # TRL's training template where it has one
                if exc.reason == "generation_prompt_mismatch" and self._has_training():  # (``documents``), else
                    raise  # the spans from the template's own renders
                try:
                    return Document(turn, *self.runs(turn, derive=True))
                except ChatError:
                    raise exc from None
            if exc.reason != "generation_prompt_mismatch" or not assistant:
                raise
            training = self._training_for(exc)
            if training is None:
                raise
            return self._spliced(turn, i, self, training)

    def _has_training(self) -> bool:
        """Whether TRL is installed and has a training template for this one (``--chat-template training`` not
        in effect): then ``auto`` builds a conversation the template cannot render after its own generation
        prompt as that template renders it (``_trained``)."""
        if self.original is not None:
            return False
        try:
            return self._training_renderer() is not None
        except TrlMissing:
            return False

    def _training_for(self, exc: ChatError) -> Any | None:
        """The training renderer that may render what ``exc`` refused (None: TRL has no training template for this
        one); without TRL, ``exc`` saying that TRL's template was not tried."""
        try:
            return self._training_renderer()
        except TrlMissing as missing:
            raise ChatError(
                exc.field, f"{exc.problem}. TRL's training template was not tried: {missing}", exc.reason,
            ) from None  # fmt: skip

    def _trained(self, chat: Chat, exc: ChatError) -> Document:
        """``auto`` for a conversation with a turn the template cannot render after its own generation prompt
        (``exc``; DeepSeek-R1 distills prefill ``<think>\\n`` and drop the reasoning, Nemotron 3 prefills
        ``<think>\\n`` and renders ``<think></think>``): the whole conversation as the training template TRL maps
        the template to renders it, weighted on its ``{% generation %}`` blocks, each with its turn's weight: what
        SFTTrainer trains on with ``assistant_only_loss``. Refused (``exc``, saying why) where TRL has none."""
        training = self._training_for(exc)
        if training is None:
            raise ChatError(
                exc.field,
                f"{exc.problem}; TRL has no training template for this chat template either (one that renders the "
                "turn as SFTTrainer trains on it). Pass --chat-template FILE.jinja with a template whose generation "
                "prompt begins each assistant turn as it renders it",
                exc.reason,
            ) from None
        text, runs = training.runs(chat)
        weighted = sum(self._weight(i, m) > 0 for i, m in enumerate(chat.messages) if m["role"] == "assistant")
        return Document(chat, text, runs, weighted)

    def _spliced(self, turn: Chat, i: int, context: Any, turns: Any) -> Document:
        """``G_i`` of ``context`` (the conversation before message ``i`` and the generation prompt, as
        inference renders it), then what ``turns`` renders after that same generation prompt when message
        ``i`` is the last. Only those characters are weighted: the generation prompt, prefilled ``<think>\\n``
        included, stays 0."""
        full = turns.runs(turn)[0]  # also checks the contents and kwargs as for any document
        messages = template_messages(turn)
        ours, theirs = context.prepare(turn, messages), turns.prepare(turn, messages)
        before, prompt = context.render(ours, i)[0], context.render(ours, i, generation=True)[0]
        turn_before, turn_prompt = turns.render(theirs, i)[0], turns.render(theirs, i, generation=True)[0]
        if not (
            prompt.startswith(before) and turn_prompt.startswith(turn_before) and full.startswith(turn_prompt)
            and turn_prompt[len(turn_before):] == prompt[len(before):]
        ):  # fmt: skip
            which = "the training template" if turns is self else (
                "neither in the template nor in the training template TRL maps it to, which"
            )  # fmt: skip
            at = len(turn_before)
            raise ChatError(
                f"messages[{i}]",
                f"the generation prompt {prompt[len(before):]!r} is not where this turn starts: {which} "
                f"renders the turn as {full[at : at + 40]!r}. After a prompt that prefills reasoning markup, "
                "the turn's content must start with it (such templates may not read reasoning_content)",
                "generation_prompt_mismatch",
            )
        text = prompt + full[len(turn_prompt) :]
        weights = np.zeros(len(text), dtype=np.float32)
        weights[len(prompt) :] = self._scaled_weight(i, turn.messages[i])

        def prefix(k: int) -> str:
            """``P_k`` of ``context``: the characters of the earlier messages, for their turn codes."""
            if k > i:
                return text
            if k == i:
                here = before
            else:
                here = context._empty(turn, ours, text) if k == 0 else context.render(ours, k)[0]
            if not text.startswith(here):  # no turn code for that message (_char_turns)
                raise ChatError(f"messages[{k - 1}]", "not a prefix of the document", "not_prefix_preserving")
            return here

        char_turns = context._char_turns(messages, text, prefix)
        return Document(turn, text, char_runs(weights, char_turns), 1 if turns is not self else 0)

    def _context_renderer(self) -> Any:
        """Renders ``original``, the template inference uses (``--chat-template training``)."""
        if self._context is None:
            tokens = self._tokenize
            self._context = type(self)(
                self.tok, self.original, self.role_weights, self.roles, tokens, scale=self.scale
            )
        return self._context

    def _training_renderer(self) -> Any | None:
        """Renders the training template TRL maps ``template`` to (None: TRL has none, or trains on
        ``template`` as it is). ``TrlMissing`` without TRL."""
        if self._training is False:
            if self._trl_missing is not None:
                raise self._trl_missing
            try:
                found = training_template(self.tok, self.template)
            except TrlMissing as exc:
                self._trl_missing = exc
                raise
            self._training = None
            if found is not None and found != self.template:  # weighted as SFTTrainer's mask (``training``)
                self._training = type(self)(
                    self.tok, found, self.role_weights, self.roles, self._tokenize, training=True,
                    sanitize_control_tokens=self.sanitize, scale=self.scale,
                )  # fmt: skip
        return self._training  # type: ignore[return-value]
