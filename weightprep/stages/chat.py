"""Stage 2a — chat: render each conversation with the model's chat template, tokenize it once, weight its tokens.

A record ``{"messages": [{"role", "content", "weight"?, ...}], "tools"?, "chat_template_kwargs"?}`` becomes one
document holding exactly the tokens the model sees at inference. Render once, tokenize once, align by characters,
fail loudly:

1. ``S = render(messages)`` with the tokenizer's ``chat_template`` (or ``--chat-template FILE``) through
   transformers' own ``render_jinja_template``, with the special tokens and keyword arguments that
   ``apply_chat_template`` passes, so the sandbox, filters and inputs are exactly its (its installed file, run
   without importing transformers where nothing else needs it: ``chat_jinja``).
2. Message ``i`` spans the characters ``[|P_i|, |P_{i+1}|)`` of ``S``, ``P_i = render(messages[:i])``; each ``P_i``
   must be a prefix of ``S`` (else ``not_prefix_preserving``: templates that rewrite earlier turns, like Qwen3's
   reasoning stripping or Mistral v3's moved system prompt, are refused, never misaligned). Only the boundaries of
   messages with a weight > 0 are rendered and checked: a rewrite elsewhere moves no weighted character.
3. An assistant message: ``G_i = render(messages[:i], add_generation_prompt=True)``; where ``P_i ⊑ G_i ⊑ P_{i+1}``,
   ``[|P_i|, |G_i|)`` is the generation prompt and gets weight 0, ``[|G_i|, |P_{i+1}|)`` (content, end-of-turn
   token, trailing newline) the message's weight. Where not (a prompt that prefills what the answer is not rendered
   with, an earlier message of weight 0 rendered otherwise once the answer follows), the weight starts where the
   renders part (``chat_spans.answer_start``: ``derive``; ``generation_prompt_mismatch`` where they cannot be
   aligned). A reasoning or tool-call marker the content starts with carries the message's weight.
   With ``{% generation %}`` tags the tagged blocks are weighted instead, as transformers' ``assistant_masks``
   marks them: each block with the weight of the assistant turn ``[|P_i|, |P_{i+1}|)`` that holds its last
   character (a turn may have several: Gemma's thinking channel, content and ``<turn|>``; DeepSeek's
   ``<｜tool▁outputs▁end｜>`` opens the answer's block before the answer's message starts); with every assistant
   weighted, a block outside all their turns is ``generation_tag_mismatch``. A template that ends every render
   with EOS after the last message (Phi-3) has ``P_k`` end before that EOS.
4. Any other message with a weight > 0: the weight starts where two probe renders with different placeholder
   contents first differ, so headers and template-injected preambles keep weight 0.
5. ``S`` is tokenized once (``add_special_tokens=False``: the template owns BOS/EOS) by the build's tokenizer
   (fastokens where it runs, guarded as for pieces); each token's characters come from its bytes
   (``stages/spans.py``), or from tokenizers' offsets where the tokens do not spell the text byte for byte. Each
   token takes the weight of its characters; a token across a change of weight (a ``\n\n`` holding the end of
   Qwen3.5's ``<think>\n`` prompt and the start of an answer's ``\n</think>``) takes the largest, as transformers'
   ``assistant_masks`` marks every token holding a character of a generation block (counted:
   ``ChatTokens.straddling``). Offsets that go backwards or leave weighted characters uncovered are
   ``bad_offsets``; two leading BOS are ``double_bos``.
6. Control tokens (``chat_control``): the turn tokens, what the template writes at a turn's boundary in probe
   renders, in a string of the record are ``control_token_in_content``, or with ``sanitize_control_tokens`` are
   encoded as text as ``apply_chat_template(..., sanitize_control_tokens=True)`` encodes them (counted:
   ``ChatTokens.sanitized``); every other control token (a marker in a turn, a preamble or a default system prompt:
   ``<tool_call>``, ``<think>``, ``[THINK]``) is a token in any content, with its message's weight. A template that
   raises is ``template_error``; ``chat_template_kwargs`` that set what the renderer sets itself
   (``add_generation_prompt``, ``messages``, ``tools``, the tokenizer's special tokens, ...: ``RESERVED_KWARGS``) are
   ``reserved_template_kwarg``, field ``chat_template_kwargs.KEY``: with ``add_generation_prompt`` a trailing
   generation prompt would enter the document with the last turn's weight.
   A template that does not parse is a usage error naming its file and line, raised by ``check`` before any record.

Default weights: ``assistant`` 1, every other role 0 (``--role-weights``); a message's ``weight`` overrides them.
A rejected conversation names ``messages[i]`` and the reason, in strict mode as an error, with ``--skip-invalid``
in rejects.jsonl.

History (``chat.history``: ``full``, ``per-turn``, ``auto``): which documents a conversation becomes, in
``chat_history``. The modules of this stage, by step: ``chat_common`` (reasons, ``ChatError``), this one (steps
1-5: rendering, character weights, tokenizing; a block's conversations in batches of ``RENDER_BYTES``),
``chat_align`` (step 5's weights on tokens, a batch's documents at once), ``chat_prefixes`` (prefixes cut from one
render),
``chat_spans`` (step 3 where the renders part), ``chat_control`` (step 6), ``chat_history`` (history modes),
``chat_templates`` (which template: the tokenizer's, a file, TRL's training one), ``chat_jinja`` (transformers'
chat-template code), ``chat_skeleton`` (renders filled in from a shape's skeleton).

Cost, for a 5-message conversation of ~670 tokens on one core: ~55-60 µs, of which ~20 µs render it and weigh its
characters as runs (``chat_align.Runs``) and the rest tokenize it, find its tokens' spans and align them, a block's
conversations at once. The prefixes and generation prompts are cut from one render of the whole
conversation where ``chat_prefixes`` proves that is what the template writes (Qwen2.5's ChatML, Gemma: 8 of TRL's
72); elsewhere each is rendered (seven renders for five messages, O(turns²)). A render of a conversation whose
shape (roles, keys, empty strings) was rendered before is that shape's skeleton with its strings put in, where the
render proved that the template only writes them, strips them or tests them against literals (``chat_skeleton``:
108 of the 143 templates of the tests without ``{% generation %}``): ~4 µs instead of ~15-20 µs. The conversation
is converted for the template once (``_Template``).
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from weightprep.batches import Chat, ChatTokens, Records, Reject, TokenBatch, turn_code
from weightprep.errors import UsageError
from weightprep.stages import chat_prefixes
from weightprep.stages.chat_align import Runs, align_runs, char_runs, run_chars
from weightprep.stages.chat_common import CHAT_REASONS, ChatError, diverge, snippet, template_messages
from weightprep.stages.chat_control import (
    PROBE_TOOLS,
    SEPARATOR,
    control_token_list,
    first_turn_token,
    record_strings,
    template_literal_text,
    token_pattern,
    turn_structure,
)
from weightprep.stages.chat_history import HISTORY_MODES, Document, HistoryModes, joined
from weightprep.stages.chat_jinja import template_utils
from weightprep.stages.chat_skeleton import (
    MAX_SHAPES,
    Skeletons,
    compile_skeleton,
    compiled_fill,
    plain_shape,
    scan_messages,
    shape_keys,
)
from weightprep.stages.chat_spans import answer_start, plain_answer, trailer
from weightprep.stages.chat_templates import TrlMissing
from weightprep.stages.spans import TokenSpans
from weightprep.stages.tokenize import PieceTokenizer
from weightprep.weights import is_valid_weight, parse_role_weights

__all__ = [
    "CHAT_REASONS", "HISTORY_MODES", "RESERVED_KWARGS", "ChatError", "ChatRenderer", "parse_role_weights",
    "render_chats",
]  # fmt: skip


#: What every render sets itself, besides the tokenizer's special tokens: the template's inputs, and the parameters
#: of ``render_jinja_template`` (which it reads rather than passes on, so a record must not set them either).
RESERVED_KWARGS = (
    "messages", "tools", "documents", "add_generation_prompt", "conversations", "chat_template",
    "return_assistant_tokens_mask", "continue_final_message",
)  # fmt: skip
#: The marks ``apply_chat_template(..., sanitize_control_tokens=True)`` puts around a control token in the inputs
#: (transformers' ``_CONTROL_TOKEN_START`` / ``_CONTROL_TOKEN_END``), and so does ``prepare`` with ``sanitize``.
_MARKS = re.compile("[\U000f0000\U000f0001]")
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
#: input bytes of the conversations that ``render_chats`` renders in one ``tokens_batch`` call: a block of the
#: default ``read.block_bytes``. A rendered conversation holds its text and a few runs until its tokens are
#: aligned, and a block's documents are then views of its batch's arrays (``blocks._chat_documents``): no copy
RENDER_BYTES = 8 << 20
_PROBES = ("\ue000weightprep-probe-a\ue000", "\ue001weightprep-probe-b\ue001")


class _Template:
    """One chat template compiled in transformers' own Jinja environment, rendering the prefixes of a conversation.

    ``render_jinja_template`` (what ``apply_chat_template`` calls) converts the messages, tools and keyword arguments
    to plain data (``_plain_template_data``, reasoning fields aliased) at every call, which is half the cost of a
    render of a short conversation, and the chat stage renders each conversation's prefixes several times. Here a
    conversation is converted once (``prepare``) and each prefix is rendered by the same compiled template, called
    with the same arguments as ``render_jinja_template`` calls it (``_render_with_assistant_indices`` for
    ``{% generation %}`` spans). The template is sandboxed and immutable, so the converted messages are shared by the
    renders; a render's context is the one ``Template.render`` builds, from a copy of the globals made once. With a
    transformers that lacks those functions, every render goes through ``render_jinja_template``.
    """

    def __init__(self, template: str, tagged: bool) -> None:
        ctu = template_utils()
        self.template, self.tagged = template, tagged
        self._ctu = ctu
        self.direct = all(
            hasattr(ctu, f) for f in
            ("_compile_jinja_template", "_plain_template_data", "_alias_reasoning_fields", "_render_with_assistant_indices")
        )  # fmt: skip
        # compiled whatever the path, so that a template that does not parse fails here, once (TemplateSyntaxError)
        compile_ = getattr(ctu, "_compile_jinja_template", None)
        self._compiled = compile_(template) if compile_ is not None else None
        # what Template.render merges into every context (a ChainMap over the environment's globals, slow to copy)
        self._globals = dict(self._compiled.globals) if self._compiled is not None else {}
        self._kwargs: tuple[Any, Any] = (None, None)  # the last keyword arguments prepared, and as plain data
        #: the message fields ``_alias_reasoning_fields`` reads (None: not known, every conversation is aliased)
        self.reasoning: frozenset[str] | None = (
            frozenset(ctu._REASONING_FIELDS) if self.direct and hasattr(ctu, "_REASONING_FIELDS") else None
        )  # fmt: skip
        # the renders without {% generation %} spans: the same template in an overlay of that environment whose
        # getattr reads a plain dict's key directly (_dict_getattr)
        # and whose loops note where each message starts (chat_prefixes: prefixes cut from the whole render)
        self._fast = self._compiled
        self._shape: chat_prefixes.PrefixShape | None = None
        # a conversation's whole render filled in from its shape's, where the template only writes its strings
        self._skeletons: Skeletons | None = None
        # the keyword arguments, and a render's arguments without and with the generation prompt
        self._skeleton_args: tuple[Any, tuple[dict[str, Any], dict[str, Any]]] = (None, ({}, {}))
        if self._compiled is not None and not tagged:
            overlay = self._compiled.environment.overlay()
            overlay.getattr, overlay.getitem = _lookups(overlay)
            self._fast, self._shape = chat_prefixes.compile_tracked(overlay, template)
            skeleton = compile_skeleton(self._compiled.environment, template, _lookups)
            if skeleton is not None:
                skeleton_globals = dict(skeleton.globals)
                self._skeletons = Skeletons(lambda args, tracker: self._render(args, tracker, skeleton, skeleton_globals))

    def prepare(
        self, messages: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any], *, shared: bool = False,
        scanned: list[tuple[Any, ...]] | None = None,
    ) -> _Prepared:  # fmt: skip
        """The conversation as the template sees it. ``shared``: ``kwargs`` are the renderer's own, the same for
        every conversation without ``chat_template_kwargs`` (its whole render may then come from its shape's).
        ``scanned``: the messages are ``chat_skeleton.scan_messages``' (``template``, with the reasoning fields
        refused), these their shape keys: plain data already, nothing to alias."""
        if not self.direct or (tools is not None and not all(isinstance(t, dict) for t in tools)):
            return _Prepared(messages, tools, kwargs, False)  # render_jinja_template converts (or refuses) them
        plain = self._ctu._plain_template_data
        if kwargs is not self._kwargs[0]:  # the same arguments for every conversation without chat_template_kwargs
            self._kwargs = (kwargs, plain(kwargs))
        shaped = shared and tools is None and self._skeletons is not None
        if scanned is not None:
            return _Prepared(messages, plain(tools), self._kwargs[1], True, {}, scanned if shaped else None)
        messages = self._ctu._alias_reasoning_fields(_plain_messages(plain, messages))
        return _Prepared(messages, plain(tools), self._kwargs[1], True, {}, shape_keys(messages) if shaped else None)

    def render(self, prepared: _Prepared, k: int, generation: bool) -> tuple[str, list]:
        """The first ``k`` messages rendered, and their ``{% generation %}`` spans (tagged templates only)."""
        messages, tools, kwargs, direct, whole, keys = prepared
        if not direct:
            rendered, spans = self._ctu.render_jinja_template(
                conversations=[messages[:k]], tools=tools, chat_template=self.template, add_generation_prompt=generation,
                return_assistant_tokens_mask=self.tagged, **kwargs,
            )  # fmt: skip
            return rendered[0], (spans[0] if spans else [])
        if self._shape is not None and k >= 1 and whole is not None:
            cut = self._cut(prepared, k, generation)
            if cut is not None:
                return cut, []
        if keys is not None:
            filled = self._filled(prepared, k, generation, tracked=False)
            if filled is not None:
                return filled[0], []
        args = {"messages": messages[:k], "tools": tools, "documents": None, "add_generation_prompt": generation, **kwargs}
        if self.tagged:
            return self._ctu._render_with_assistant_indices(compiled_template=self._compiled, **args)  # type: ignore[no-any-return]
        return self._render(args), []

    def _filled(self, prepared: _Prepared, k: int, generation: bool, *, tracked: bool) -> tuple[str, Any] | None:
        """The render of the first ``k`` messages from its shape's skeleton (``chat_skeleton``), and with
        ``tracked`` its prefix cuts; None where the shape has none."""
        assert self._skeletons is not None and prepared.keys is not None
        if self._skeleton_args[0] is not prepared.kwargs:
            base = {"tools": None, "documents": None, **prepared.kwargs}
            self._skeleton_args = (prepared.kwargs, ({**base, "add_generation_prompt": False},
                                                     {**base, "add_generation_prompt": True}))  # fmt: skip
        args = self._skeleton_args[1][generation]
        return self._skeletons.fill(prepared.messages[:k], prepared.keys[:k], args, tracked=tracked)

    def _cut(self, prepared: _Prepared, k: int, generation: bool) -> str | None:
        """The render of the first ``k`` messages cut from the whole conversation's (``chat_prefixes``), rendered
        once, tracked; None where that is not proven for this conversation (then it is rendered)."""
        whole = prepared.whole
        if "cuts" not in whole and prepared.keys is not None:
            filled = self._filled(prepared, len(prepared.messages), False, tracked=True)
            if filled is not None:
                whole["text"], whole["cuts"] = filled
        if "cuts" not in whole:
            listed = prepared.messages[:]
            tracker = chat_prefixes.Tracker(listed)
            args = {"messages": listed, "tools": prepared.tools, "documents": None, "add_generation_prompt": False,
                    **prepared.kwargs}  # fmt: skip
            try:
                whole["text"] = self._render(args, tracker)
                whole["cuts"] = tracker.cuts(whole["text"])
            except Exception:  # the renders that are asked for raise it, or not, as they are made
                whole["cuts"] = None
        cuts = whole["cuts"]
        assert self._shape is not None
        if cuts is None or k > len(cuts) or (generation and self._shape.generation is None):
            return None
        text: str = whole["text"][: cuts[k - 1]]
        return text + self._shape.generation if generation else text  # type: ignore[operator]

    def cuts(self, prepared: _Prepared, k: int) -> tuple[list[int], str] | None:
        """Where ``render`` cut the renders of the first ``1..k`` messages from the whole conversation's
        (``_cut``): their ends in it, and the text the generation prompt appends to each; None where it renders
        them (``render`` of all ``k`` first: the cuts are made there)."""
        shape = self._shape
        cuts = prepared.whole.get("cuts") if prepared.whole is not None else None  # (a direct conversation's)
        if shape is None or shape.generation is None or cuts is None or k > len(cuts):
            return None
        return cuts, shape.generation

    def _render(
        self, args: dict[str, Any], tracker: chat_prefixes.Tracker | None = None, compiled: Any = None,
        globals_: dict[str, Any] | None = None,
    ) -> str:  # fmt: skip
        """``Template.render(**args)``: the same context (the template's globals, then ``args``), built from a copy
        of the globals made once (``tracker``: the loop over the messages tracked). ``compiled`` and its globals:
        another compilation of the template (``chat_skeleton``'s)."""
        compiled = self._fast if compiled is None else compiled
        env = compiled.environment
        if env.is_async:
            return compiled.render(**args)
        context = compiled.new_context({**(self._globals if globals_ is None else globals_), **args}, shared=True)
        try:
            chunks = compiled.root_render_func(context)
            return env.concat(chunks) if tracker is None else tracker.render(chunks)
        except Exception:
            env.handle_exception()  # raises the template's error with its own traceback, as render does
            raise


_JSON_SCALARS = (str, int, float, bool, type(None))


def _plain_messages(plain: Callable[[Any], Any], messages: Any) -> Any:
    """``plain(messages)`` (transformers' ``_plain_template_data``), with a message that is a dict of exact JSON
    scalars copied as it is: what ``plain`` returns for those (exact scalars as they are), without a call per
    value."""
    if type(messages) is not list:
        return plain(messages)
    return [
        dict(m) if type(m) is dict and all(type(k) is str and type(v) in _JSON_SCALARS for k, v in m.items()) else plain(m)
        for m in messages
    ]


#: what ``getattr`` finds on a dict: the attributes of its type (a dict instance has no ``__dict__``)
_DICT_ATTRIBUTES = frozenset(name for cls in dict.__mro__ for name in vars(cls))


def _lookups(overlay: Any) -> tuple[Callable[[Any, str], Any], Callable[[Any, Any], Any]]:
    """The ``getattr`` and ``getitem`` of the renders without ``{% generation %}`` spans, for an overlay of the
    template's environment: a plain dict's keys read directly (``_dict_getattr``), the loops tracked
    (``chat_prefixes``)."""
    cls = type(overlay)
    return (
        _dict_getattr(overlay, chat_prefixes.tracked_getattr(functools.partial(cls.getattr, overlay))),
        chat_prefixes.tracked_getitem(functools.partial(cls.getitem, overlay)),
    )


def _dict_getattr(env: Any, sandboxed: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    """``sandboxed`` (``env``'s getattr: an attribute, else the item, else undefined) with the answer for a plain
    dict and a name that is not a dict attribute found first: ``message.role`` in a template is the item ``role``,
    as the sandbox answers it after ``getattr`` raised AttributeError, which cost more than the rest of a
    render's lookups."""

    def getattr_(obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                return env.undefined(obj=obj, name=attribute)
        return sandboxed(obj, attribute)

    return getattr_


class _Prepared(NamedTuple):
    """A conversation's inputs to the template; ``direct``: already converted to plain data."""

    messages: list[dict[str, Any]]
    tools: Any
    kwargs: dict[str, Any]
    direct: bool
    #: the whole conversation's render and its cuts (``_Template._cut``), once made; None: not for this one
    whole: dict[str, Any] | None = None
    #: its messages' parts of its shape (``chat_skeleton.shape_keys``), where its renders may come from its shape's
    #: skeleton (no tools, the renderer's own keyword arguments); else None
    keys: list[tuple[Any, ...]] | None = None


class ChatRenderer(HistoryModes):
    """Renders and aligns conversations for one tokenizer and template text (default: the tokenizer's own).

    ``tokenize`` is the build's ``PieceTokenizer`` (fastokens where it runs); without one, tokenizers'. ``source``
    is the file ``template`` was read from, named in errors. ``sanitize_control_tokens``: a turn's control tokens in
    the inputs are encoded as text, as ``apply_chat_template(..., sanitize_control_tokens=True)`` does, instead of
    being refused (``control_token_in_content``)."""

    def __init__(
        self,
        tokenizer: Any,
        template: str | None = None,
        role_weights: dict[str, float] | None = None,
        roles: list[str] | None = None,
        tokenize: PieceTokenizer | None = None,
        source: str | None = None,
        *,
        history: str = "full",
        original: str | None = None,
        training: bool = False,
        sanitize_control_tokens: bool = False,
        scale: float = 1.0,
    ) -> None:
        if history not in HISTORY_MODES:
            raise ValueError(f"history must be one of {HISTORY_MODES}, got {history!r}")
        self.tok = tokenizer
        #: encode the control tokens that content may not hold as text (``control_tokens``), instead of refusing
        self.sanitize = sanitize_control_tokens
        #: ``HISTORY_MODES``: one document per conversation, one per weighted message, or the first where it
        #: is exact
        self.history = history
        #: the template inference uses, for the context of per-turn documents, where ``template`` is not it
        #: (TRL's training template); None: ``template``
        self.original = original
        #: ``template`` is TRL's training template (``chat.template: training``): a whole conversation is
        #: weighted on its ``{% generation %}`` spans as SFTTrainer's assistant mask is, even where the
        #: template rewrites earlier turns (gpt-oss's drops their analysis channel)
        self.training = training
        #: the file of ``template`` (for errors); None: the tokenizer's own template
        self.source = source
        #: role names by code - 1, in order of first appearance (shared with the writer, which names turns)
        self.roles: list[str] = roles if roles is not None else []
        self.template = template if template is not None else getattr(tokenizer, "chat_template", None)
        if isinstance(self.template, dict):  # several named templates: the default one
            self.template = self.template.get("default")
        self.role_weights = {"assistant": 1.0} if role_weights is None else role_weights
        #: the source's weight (``weightprep.sources``): a message of weight w weighs ``float32(scale * w)``
        self.scale = scale
        self.tagged = bool(self.template and _GENERATION_TAG.search(self.template))
        self._control: re.Pattern[str] | None = None
        self._control_split: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self._joinable: bool | None = None  # see _check_control_tokens
        self._specials: dict[str, Any] | None = None  # the tokenizer's special tokens, template arguments of each render
        self._tokenize = tokenize
        self._spans: TokenSpans | None = None
        self._template: _Template | None = None
        self._bos = getattr(tokenizer, "bos_token_id", None)
        self._eos = getattr(tokenizer, "eos_token", None)
        self._empty_renders: dict[tuple[str, str], str] = {}
        self._eos_trailer: bool | None = None  # ``_trails_eos``, read once
        self._opener: str | None = None  # ``_trailer``, read once
        self._context: ChatRenderer | None = None  # renders ``original``
        self._training: ChatRenderer | None | bool = False  # TRL's training template (False: not looked up)
        self._trl_missing: TrlMissing | None = None
        self._added: re.Pattern[str] | None = None  # ``_markers``
        self._turn_codes: dict[tuple[str, int], int] = {}  # ``turn_code`` of (role, message index), as found
        #: by ``plain_shape`` key: its compiled fill, ``P_0``, the generation prompt and its skeletons, or False
        #: (``_plain_runs``)
        self._plain: dict[tuple[Any, ...], Any] = {}

    def check(self) -> None:
        """Refuse, before any work, a tokenizer that cannot render conversations."""
        if not self.template:
            raise UsageError(
                "the input holds chat records (\"messages\") but the tokenizer has no chat_template; pass "
                "--chat-template FILE.jinja or use the model's own tokenizer"
            )
        if getattr(self.tok, "backend_tokenizer", None) is None:
            raise UsageError("chat records need a fast (Rust) tokenizer with offsets; this one is slow-only")
        import tokenizers

        version = tuple(int(p) for p in re.findall(r"\d+", tokenizers.__version__)[:3])
        if version < (0, 20, 1):  # earlier offsets are wrong for Llama-3-style ignore_merges tokenizers
            raise UsageError(f"chat records need tokenizers >= 0.20.1 (correct offsets); found {tokenizers.__version__}")
        if self.sanitize and not all(hasattr(template_utils(), f) for f in ("mark_control_tokens", "encode_marked_chat")):
            import transformers

            raise UsageError(
                "--sanitize-control-tokens encodes control tokens as apply_chat_template(..., "
                f"sanitize_control_tokens=True) does, which transformers {transformers.__version__} lacks; upgrade "
                "transformers or drop the flag"
            )
        self._compiled()

    def _compiled(self) -> _Template:
        """The template, compiled once. One that does not parse fails every conversation alike: the user's to fix
        (``UsageError`` naming the file and the line), not a reject per record."""
        if self._template is None:
            from jinja2 import TemplateSyntaxError

            try:
                self._template = _Template(self.template, self.tagged)
            except TemplateSyntaxError as exc:
                lines = self.template.splitlines()
                n = exc.lineno if 0 < exc.lineno <= len(lines) else len(lines)
                where = f"{self.source}:{n}" if self.source else f"the tokenizer's chat_template, line {n}"
                fix = "fix the file" if self.source else "pass a working template with --chat-template FILE.jinja"
                line = lines[n - 1].strip() if lines else ""
                problem = str(exc.message or exc).rstrip(".")
                raise UsageError(
                    f"{where}: the chat template is not valid Jinja: {problem} (the line reads "
                    f"{line[:80] + ('...' if len(line) > 80 else '')!r}); {fix}"
                ) from None
        return self._template

    def control_tokens(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The template's control tokens split in two: ``(turn, in_turn)``.

        Control tokens are transformers' (``_get_control_tokens``: the special added tokens, and the added tokens
        the template's literal text holds). ``in_turn``: those the template's literal text holds that it does not
        write at a turn's boundary (``chat_control.turn_structure``: found by rendering probe conversations) and
        none of the tokenizer's BOS, EOS, pad or unknown tokens: the markers the template writes inside a turn, a
        preamble or a default system prompt (``<tool_call>``, ``<think>``, ``[THINK]``, gpt-oss' ``<|channel|>``),
        which any message's content may hold as ``apply_chat_template`` tokenizes them. ``turn``: every other
        control token (role headers, ends of turns, BOS/EOS, and special tokens the template never writes), refused
        in content or, with ``sanitize_control_tokens``, encoded as text. A template that renders no probe shape
        as lists of parts) keeps every control token in ``turn``."""
        if self._control_split is None:
            self._compiled()  # a template that does not parse fails here, as a usage error naming its line
            control = control_token_list(self.tok, self.template)
            written = template_literal_text(self.template)
            fixed = {getattr(self.tok, f"{k}_token", None) for k in ("bos", "eos", "pad", "unk")}
            structure = self._turn_structure(control, fixed)
            in_turn = tuple(t for t in control if t in written and t not in fixed and t not in structure)
            self._control_split = (tuple(t for t in control if t not in in_turn), in_turn)
        return self._control_split

    def _control_tokens(self) -> re.Pattern[str]:
        """The control tokens that content may not hold (``control_tokens()[0]``), longest first."""
        if self._control is None:
            self._control = token_pattern(self.control_tokens()[0])
        return self._control

    def _turn_structure(self, control: tuple[str, ...], fixed: set[str | None]) -> set[str]:
        """The control tokens the template writes at a turn's boundary in probe renders (``chat_control``)."""
        specials = dict(self.tok.special_tokens_map)

        def render(messages: list[dict[str, Any]], k: int, generation: bool, tools: Any) -> str:
            return self.render(self._compiled().prepare(messages, tools, specials), k, generation=generation)[0]

        return turn_structure(render, control, fixed)

    @property
    def tokenize(self) -> PieceTokenizer:
        if self._tokenize is None:
            self._tokenize = PieceTokenizer(self.tok, backend="hf")
        return self._tokenize

    def prepare(
        self, chat: Chat, messages: list[dict[str, Any]], scanned: list[tuple[Any, ...]] | None = None
    ) -> _Prepared:
        """The conversation's inputs to the template: messages, tools, and ``apply_chat_template``'s keyword
        arguments (the special tokens, then the record's ``chat_template_kwargs``). With ``sanitize``, the control
        tokens that content may not hold are marked in the record's strings, as ``apply_chat_template(...,
        sanitize_control_tokens=True)`` marks them (again: marking drops the marks already there). ``scanned``:
        the shape keys of messages from ``chat_skeleton.scan_messages`` (never with ``sanitize``)."""
        tools, kwargs = chat.tools, chat.template_kwargs or {}
        if self.sanitize:
            mark_control_tokens = template_utils().mark_control_tokens
            control = self._control_tokens()
            messages, tools, kwargs = (mark_control_tokens(v, control) for v in (messages, tools, kwargs))
        if self._specials is None:
            self._specials = dict(self.tok.special_tokens_map)
        if kwargs:
            return self._compiled().prepare(messages, tools, {**self._specials, **kwargs}, scanned=scanned)
        return self._compiled().prepare(messages, tools, self._specials, shared=True, scanned=scanned)

    def render(self, prepared: _Prepared, k: int, *, generation: bool = False) -> tuple[str, list]:
        """The first ``k`` messages of a prepared conversation rendered (``template_error`` if the template fails)."""
        assert self._template is not None
        try:
            return self._template.render(prepared, k, generation)
        except Exception as exc:  # jinja2 errors and raise_exception() from the template
            raise ChatError("messages", f"the chat template failed: {type(exc).__name__}: {exc}", "template_error") from None

    def _empty(self, chat: Chat, prepared: _Prepared, text: str) -> str:
        """``P_0``: what the template writes for no message (a preamble), or "" where it cannot render that."""
        key = ("", "") if chat.tools is None and chat.template_kwargs is None else (
            json.dumps(chat.tools, sort_keys=True), json.dumps(chat.template_kwargs, sort_keys=True)
        )  # fmt: skip
        if key not in self._empty_renders:
            try:
                self._empty_renders[key] = self._cut(self.render(prepared, 0)[0])
            except ChatError:
                self._empty_renders[key] = ""
        empty = self._empty_renders[key]
        return empty if text.startswith(empty) else ""

    def _weight(self, i: int, message: dict[str, Any]) -> float:
        if "weight" in message:
            return float(message["weight"])
        return self.role_weights.get(message["role"], 0.0)

    def _scaled_weight(self, i: int, message: dict[str, Any]) -> float:
        """A message's weight times its source's (``scale``); refused where float32 cannot hold it, before the
        character weights would be inf (the alignment would then blame the template for inf - inf)."""
        w = self.scale * self._weight(i, message)
        if not is_valid_weight(w):
            raise ChatError(
                f"messages[{i}].weight",
                f"{self._weight(i, message):g} times the source's weight {self.scale:g} is beyond float32's largest "
                "(the shards store weights as float32): lower the source's weight",
                "bad_weight",
            )
        return w

    def char_weights(self, chat: Chat, *, derive: bool = False) -> tuple[str, np.ndarray, np.ndarray]:
        """``runs``, a weight and a turn code per character."""
        text, runs = self.runs(chat, derive=derive)
        return (text, *run_chars(runs, len(text)))

    def runs(self, chat: Chat, *, derive: bool = False) -> tuple[str, Runs]:
        """The rendered text and its characters' weights (steps 1-4 of the module docstring) and turn codes
        (``turn_code``: the message whose span holds a character; 0 for template text outside every message), as
        runs (``chat_align.Runs``). ``derive``: an assistant turn's weight may start where the renders say it does
        where its generation prompt is not a prefix of it (``chat_spans.answer_start``), and a message of weight 0
        may be rewritten."""
        if not derive and self._plain:
            found = self._plain_runs(chat)
            if found is not None:
                return found
        self._check_kwargs(chat)
        reasoning = self._compiled().reasoning
        # the messages, their strings and shape in one pass where they are plain (``_Template.prepare(scanned=...)``)
        scan = (
            scan_messages(chat.messages, template=True, reasoning=reasoning)
            if reasoning is not None and not self.sanitize else None
        )  # fmt: skip
        messages, strings, scanned = scan if scan is not None else (template_messages(chat), None, None)
        if not self.sanitize:
            self._check_control_tokens(chat, messages, strings)
        prepared = self.prepare(chat, messages, scanned)
        text, tagged_spans = self.render(prepared, len(messages))
        if not derive and not self.tagged:
            cut = self._cut_runs(chat, messages, prepared, text)
            if cut is not None:
                if scanned is not None and prepared.keys is not None:
                    self._learn_plain(chat, scanned)
                return text, cut
        weights = np.zeros(len(text), dtype=np.float32)
        assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        # SFTTrainer's mask, whatever the template rewrites: block k to assistant k, or every block where all
        # assistants weigh the same. Else, where a turn has several blocks (Phi-3's EOS, Gemma's thinking channel,
        # content and <turn|>) or none, each block is the turn's that holds its last character
        in_order = self.training and self.tagged and (
            len(tagged_spans) == len(assistants) or len({self._weight(i, chat.messages[i]) for i in assistants}) == 1
        )  # fmt: skip
        if in_order:
            owners = assistants if len(tagged_spans) == len(assistants) else [assistants[-1]] * len(tagged_spans)
            for (a, b), i in zip(tagged_spans, owners, strict=True):
                weights[a:b] = self._scaled_weight(i, chat.messages[i])
        claimed = np.zeros(len(tagged_spans), dtype=bool)
        prefixes: dict[int, str] = {len(messages): self._cut(text)}
        eos = self._eos  # (the tokenizer's attributes are slow to read: once per renderer)

        def prefix(k: int) -> str:
            """``P_k``, checked to be a prefix of ``S`` (only the turns that carry weight are rendered)."""
            if k not in prefixes:
                if k == 0:
                    prefixes[0] = self._empty(chat, prepared, text)
                    return prefixes[0]
                here = self._cut(self.render(prepared, k)[0])
                if not text.startswith(here) and self._trails_eos() and text.startswith(here[: -len(eos)]):
                    here = here[: -len(eos)]  # the EOS written after the last message only: turns end before it
                if not text.startswith(here):
                    at = diverge(here, text)
                    raise ChatError(
                        f"messages[{k - 1}]",
                        f"the template is not prefix-preserving: rendering messages[:{k}] gives text that is not a "
                        f"prefix of the whole conversation (they differ at character {at}: {snippet(here, at)} vs "
                        f"{snippet(text, at)}), so turns cannot be aligned; use a template that renders earlier "
                        "turns unchanged (--chat-template)",
                        "not_prefix_preserving",
                    )
                prefixes[k] = here
            return prefixes[k]

        for i, m in enumerate(messages):
            # scaled here, once: per-turn documents carry their message's unscaled weight (``documents``)
            w = self._scaled_weight(i, chat.messages[i])
            if w == 0:
                continue
            if in_order and m["role"] == "assistant":  # SFTTrainer's mask, as it is (above)
                continue
            if derive and m["role"] == "assistant" and not self.tagged:  # the turn before may be rewritten
                here = prefix(i + 1)
                try:
                    before: str | None = self._cut(self.render(prepared, i)[0]) if i else self._empty(chat, prepared, text)
                except ChatError:
                    before = None
                prompt = self._prompt(prepared, i)
                at = answer_start(before, prompt, here, m.get("content"), self._markers(), self._first_difference)
                if at is None:
                    d = diverge(prompt, here)
                    raise ChatError(
                        f"messages[{i}]",
                        f"the generation prompt (render with add_generation_prompt=True) is not where this turn "
                        f"starts, and the renders cannot be aligned (chat_spans): they differ at character {d}: "
                        f"{snippet(prompt, d)} vs {snippet(here, d)}. No flag builds it exactly; pass "
                        "--chat-template FILE.jinja with a template that writes the generation prompt only when "
                        "asked and renders each answer after it",
                        "generation_prompt_mismatch",
                    )
                weights[at : len(here)] = w
                continue
            start, end = len(prefix(i)), len(prefix(i + 1))
            if end < start:
                raise ChatError(
                    f"messages[{i}]", f"the template renders messages[:{i + 1}] shorter than messages[:{i}]",
                    "not_prefix_preserving",
                )  # fmt: skip
            if m["role"] == "assistant":
                if self.tagged:
                    for k, (a, b) in enumerate(tagged_spans):
                        if start < b <= end:  # its last character is in this turn (an empty block has none)
                            weights[a:b] = w
                            claimed[k] = a < b
                else:
                    prompt = self._prompt(prepared, i)
                    here = prefix(i + 1)
                    if not (prompt.startswith(prefix(i)) and here.startswith(prompt)):
                        at = diverge(prompt, here)
                        raise ChatError(
                            f"messages[{i}]",
                            f"the generation prompt (render with add_generation_prompt=True) is not where this turn "
                            f"starts: they differ at character {at}: {snippet(prompt, at)} vs {snippet(here, at)}",
                            "generation_prompt_mismatch",
                        )
                    at = answer_start(prefix(i), prompt, here, m.get("content"), self._markers())
                    weights[len(prompt) if at is None else at : end] = w
            else:
                probes = [self.render(self.prepare(chat, [*messages[:i], {**m, "content": p}]), i + 1)[0] for p in _PROBES]
                weights[max(start, diverge(*probes)) : end] = w
        stray = [(a, b) for k, (a, b) in enumerate(tagged_spans) if a < b and not claimed[k]] if not in_order else []
        if stray and all(self._weight(i, chat.messages[i]) > 0 for i in assistants):  # then a block outside every
            a, b = stray[0]  # assistant turn is none's: SFTTrainer trains on it, weightprep cannot tell its weight
            raise ChatError(
                "messages", f"the template's {{% generation %}} block {text[a:b][:40]!r} (characters {a}-{b}) ends "
                "outside every assistant turn", "generation_tag_mismatch",
            )  # fmt: skip
        return text, char_runs(weights, self._char_turns(messages, text, prefix))

    def _cut_runs(self, chat: Chat, messages: list[dict[str, Any]], prepared: _Prepared, text: str) -> Runs | None:
        """``runs`` where the template's renders are cuts of the whole conversation's (``_Template.cuts``, no
        trailer) and every weighted message is an answer after its generation prompt: the same steps on the renders'
        lengths, without making the renders, each message two runs (its prompt, weight 0; its answer). None where
        another step is needed (a weighted message that is no answer, an answer not after its prompt, a start that
        is not within its message): ``runs`` takes the renders."""
        assert self._template is not None
        found = self._template.cuts(prepared, len(messages))
        if found is None or self._trailer():
            return None
        cuts, generation = found
        return self._runs_of_cuts(chat.messages, messages, cuts, generation, len(self._empty(chat, prepared, text)), text)

    def _learn_plain(self, chat: Chat, scanned: list[tuple[Any, ...]]) -> None:
        """After ``_cut_runs`` answered a conversation that ``runs`` scanned and filled from its shape's skeleton (so
        no tools, no ``chat_template_kwargs``, no sanitizing, no ``{% generation %}``): where its messages are plain
        (``plain_shape``), the plan ``_plain_runs`` follows for every conversation of that shape (once per shape;
        False where the skeleton has no compiled fill)."""
        shape = plain_shape(chat.messages)
        if shape is None or shape[0] in self._plain or len(self._plain) >= MAX_SHAPES:
            return
        skeletons = self._compiled()._skeletons
        assert skeletons is not None  # (``prepared.keys`` are made only where the template has skeletons)
        skeleton = skeletons.made(scanned, tracked=True)
        fill = compiled_fill(skeleton) if skeleton is not None else None
        generation = self._compiled()._shape.generation  # type: ignore[union-attr]  (``_cut_runs`` answered: not None)
        self._plain[shape[0]] = False if fill is None else (fill, self._empty_renders[("", "")], generation, skeletons)

    def _plain_runs(self, chat: Chat) -> tuple[str, Runs] | None:
        """``runs`` of a conversation of a shape ``_learn_plain`` has a plan for: the steps ``runs`` takes for it
        (the control tokens searched, the render filled from its skeleton and cut, ``_cut_runs``), each known to
        come out as it did for that shape but where it depends on the strings, which are checked here; None where
        it has no plan, or a step would not come out so (``runs`` then takes them all)."""
        if chat.tools is not None or chat.template_kwargs is not None:
            return None
        shape = plain_shape(chat.messages)
        plan = self._plain.get(shape[0]) if shape is not None else None
        if not plan:
            return None
        fill, empty, generation, skeletons = plan
        if self._control_tokens().search(SEPARATOR.join(shape[1])):  # type: ignore[index]
            return None  # ``_check_control_tokens`` names it (or, where a token holds the separator, finds none)
        # a cut per message, the last where the text ends: a template whose prefixes are cut writes nothing after
        # its loop over the messages but the generation prompt (``chat_prefixes``)
        text, cuts = fill(chat.messages)
        runs = self._runs_of_cuts(chat.messages, chat.messages, cuts, generation, len(empty) if text.startswith(empty) else 0, text)
        if runs is None:
            return None
        skeletons.served()
        return text, runs

    def _runs_of_cuts(
        self, originals: list[dict[str, Any]], messages: list[dict[str, Any]], cuts: list[int], generation: str,
        a: int, text: str,
    ) -> Runs | None:  # fmt: skip
        """``_cut_runs`` from the cuts of ``text`` (the messages' ends), the generation prompt and ``a``, where the
        first message starts (the end of ``P_0``); ``originals``: the record's messages (their weights),
        ``messages`` the template's."""
        starts, weights, turns = [0], [0.0], [0]  # the text before the first message: no turn's
        codes = self._turn_codes
        unknown: list[tuple[int, str, int]] = []  # (index into turns, role, message): codes given once all is known
        markers, scaled, prompted = self._markers(), self._scaled_weight, len(generation)
        for i, m in enumerate(messages):
            end = cuts[i]
            w = scaled(i, originals[i])
            if end < a:
                return None
            start = end
            if w != 0:
                start = a + prompted  # where the generation prompt ``P_i + generation`` ends
                if m["role"] != "assistant" or not i or start > end or not text.startswith(generation, a):
                    return None
                content = m.get("content")
                if not plain_answer(content, start, markers):  # rule 3 may move the start (``chat_spans``)
                    prompt = text[:a] + generation
                    at = answer_start(text[:a], prompt, text[:end], content, markers)
                    start = len(prompt) if at is None else at
                    if start < a:
                        return None
            if end > a:  # the message's prompt (weight 0), then its answer
                role = str(m["role"])
                code = codes.get((role, i))
                if code is None:  # a role's code never changes once given (``roles`` only grows)
                    unknown.append((len(turns), role, i))
                starts.extend((a, start))
                weights.extend((0.0, w))
                turns.extend((code, code))
            a = end
        for at_, role, i in unknown:  # in message order, as the renders' steps give them (``_turns``)
            code = codes.get((role, i))
            if code is None:
                code = codes[role, i] = turn_code(self.roles, role, i)
            turns[at_] = turns[at_ + 1] = code
        starts.append(a)  # the text after the last message: no turn's
        weights.append(0.0)
        turns.append(0)
        return Runs(starts, weights, turns)

    def _markers(self) -> re.Pattern[str]:
        """The tokenizer's added tokens (whitespace ones aside), longest first: where a render's boundary may fall
        inside one, and what an answer's content may open with (``chat_spans``)."""
        if self._added is None:
            added = getattr(self.tok, "added_tokens_encoder", {})
            self._added = token_pattern(tuple(t for t in added if t.strip()))
        return self._added

    def _first_difference(self, prompt: str, upto: str) -> int:
        """The first character of the first token of ``upto`` that is not ``prompt``'s token at the same place
        (both tokenized by tokenizers, as the build's tokenizer is guarded to): where the renders part
        (``chat_spans``)."""
        encode = self.tok.backend_tokenizer.encode
        a, b = encode(prompt, add_special_tokens=False), encode(upto, add_special_tokens=False)
        t = next((k for k, (x, y) in enumerate(zip(a.ids, b.ids, strict=False)) if x != y), min(len(a.ids), len(b.ids)))
        return b.offsets[t][0] if t < len(b.ids) else len(upto)

    def _prompt(self, prepared: _Prepared, i: int) -> str:
        """``G_i``; where it does not end with the trailer but writes its prompt after it (Command R+ tool_use ends
        every render with an instruction turn, its generation prompt follows it), without the trailer."""
        prompt = self.render(prepared, i, generation=True)[0]
        opener = self._trailer()
        if not opener or prompt.endswith(opener) or not i:
            return prompt
        before = self.render(prepared, i)[0]
        if before.endswith(opener) and prompt.startswith(before):
            return before[: len(before) - len(opener)] + prompt[len(before) :]
        return prompt

    def _cut(self, render: str) -> str:
        """A render less the text the template writes after every render (``_trailer``)."""
        opener = self._trailer()
        return render[: len(render) - len(opener)] if opener and render.endswith(opener) else render

    def _trailer(self) -> str:
        """The text the template writes after every render, ``add_generation_prompt`` or not, and drops once another
        message follows (Command R7B tool_use's next-answer opener; ``chat_spans.trailer``), from the renders of a
        probe conversation (user, assistant, user): every ``P_k`` ends before it, and the whole render's trailer is
        no turn's (weight 0)."""
        if self._opener is None:
            self._opener = ""
            contents = [f"\ue000weightprep-trailer-probe-{k}\ue000" for k in range(3)]
            messages = [{"role": r, "content": c} for r, c in zip(("user", "assistant", "user"), contents, strict=True)]
            for tools in (None, PROBE_TOOLS):  # with a probe tool where the template needs one (Command R+ tool_use)
                prepared = self._compiled().prepare(messages, tools, dict(self.tok.special_tokens_map))
                try:
                    renders = [self.render(prepared, k)[0] for k in (1, 2, 3)]
                    prompt = self.render(prepared, 1, generation=True)[0]
                    break
                except ChatError:
                    continue
            else:
                return self._opener
            at = renders[0].find(contents[0])
            if at >= 0:  # the user's turn ends after a control token that follows its content
                after = at + len(contents[0])
                cuts = [hit.end() for hit in self._markers().finditer(renders[0], after)]
                self._opener = trailer(renders, prompt, cuts)
        return self._opener

    def _trails_eos(self) -> bool:
        """Whether the template ends every render with EOS after the last message, whatever its role (Phi-3's
        ``{% else %}{{ eos_token }}``), read from probe renders: the EOS that ends ``messages[:k]`` is then no
        turn's, and the turns of a longer conversation end before it. Not so for a template that ends only an
        assistant's last turn otherwise (gpt-oss' ``<|return|>`` for ``<|end|>``): that rewrites the turn."""
        if self._eos_trailer is None:
            eos = self.tok.eos_token
            messages = [{"role": r, "content": f"\ue000weightprep-eos-probe-{k}\ue000"} for k, r in enumerate(("user", "assistant"))]
            prepared = self._compiled().prepare(messages, None, dict(self.tok.special_tokens_map))
            try:
                one, two = (self.render(prepared, k)[0] for k in (1, 2))
            except ChatError:
                one = two = ""
            self._eos_trailer = bool(eos) and one.endswith(eos) and two.endswith(eos) and two.startswith(one[: -len(eos)])
        return self._eos_trailer

    def _joins(self) -> bool:
        """Whether no control token holds ``SEPARATOR``: then no match spans two strings joined by it."""
        if self._joinable is None:
            self._joinable = not any(SEPARATOR in t for t in self.control_tokens()[0])
        return self._joinable

    def _check_control_tokens(self, chat: Chat, messages: list[dict[str, Any]], strings: list[str] | None = None) -> None:
        """A string of the record (what ``apply_chat_template(..., sanitize_control_tokens=True)`` would mark: every
        string of the messages, tools and ``chat_template_kwargs``) that holds a control token that opens or closes a
        turn is ``control_token_in_content``; in-turn markers (``control_tokens``) are tokens there, as
        ``apply_chat_template`` makes them."""
        found = first_turn_token(self._control_tokens(), chat, messages, self._joins(), strings)
        if found is not None:
            field, hit = found
            raise ChatError(
                field,
                f"holds the template's control token {hit.group()!r} at character {hit.start()}; it opens or "
                "closes a turn, so as a token it would end or forge one. Remove it, or pass "
                "--sanitize-control-tokens to encode it as plain text",
                "control_token_in_content",
            )

    def _check_kwargs(self, chat: Chat) -> None:
        """``chat_template_kwargs`` come after the renderer's own arguments (``prepare``): one that names an argument
        the renderer sets would override it (``reserved_template_kwarg``)."""
        if not chat.template_kwargs:
            return
        reserved = {*RESERVED_KWARGS, *self.tok.special_tokens_map}
        for key in chat.template_kwargs:
            if key in reserved:
                raise ChatError(
                    f"chat_template_kwargs.{key}",
                    "weightprep sets this argument of the template itself for every render (the generation prompt, "
                    "the messages and tools, the tokenizer's special tokens); a record cannot override it. Remove it",
                    "reserved_template_kwarg",
                )

    def _char_turns(self, messages: list[dict[str, Any]], text: str, prefix: Any) -> np.ndarray:
        """Each character's turn code, from every message's boundaries ``[|P_i|, |P_{i+1}|)``. A boundary that
        cannot be rendered as a prefix (a message with weight 0 under a template that rewrites it) leaves its
        characters at 0: they carry no weight, and the display then shows them as template text."""
        bounds: list[int | None] = []
        for k in range(len(messages) + 1):
            try:
                bounds.append(len(prefix(k)))
            except ChatError:
                bounds.append(None)
        return self._turns(messages, len(text), bounds)

    def _turns(self, messages: list[dict[str, Any]], length: int, bounds: list[int | None]) -> np.ndarray:
        """``length`` characters' turn codes: message ``i``'s on ``[bounds[i], bounds[i + 1])`` where both are
        known and it is not empty, 0 elsewhere."""
        turns = np.zeros(length, dtype=np.int32)
        codes = self._turn_codes
        for i, m in enumerate(messages):
            a, b = bounds[i], bounds[i + 1]
            if a is not None and b is not None and b > a:
                key = (str(m["role"]), i)
                code = codes.get(key)
                if code is None:  # a role's code never changes once given (``roles`` only grows)
                    code = codes[key] = turn_code(self.roles, key[0], i)
                turns[a:b] = code
        return turns

    def tokens(self, chat: Chat) -> ChatTokens:
        """Steps 1-6 for one conversation: its token ids and weights."""
        result = self.tokens_batch([chat])[0]
        if isinstance(result, ChatError):
            raise result
        return result

    def tokens_batch(
        self, chats: list[Chat], where: Callable[[int], tuple[str, int]] | None = None
    ) -> list[ChatTokens | ChatError]:
        """``tokens`` for many conversations, tokenized in one call; a failure is returned in its place.
        ``where(c)`` is the (file, line) of conversation ``c``, for the tokenizer guard's error."""
        rendered: list[tuple[list[Document], bool] | ChatError] = []
        for chat in chats:
            try:
                rendered.append(self.documents(chat))
            except ChatError as exc:
                rendered.append(exc)
        docs = [(c, doc) for c, r in enumerate(rendered) if not isinstance(r, ChatError) for doc in r[0]]
        tokenized: dict[int, tuple] = {}  # by index into docs
        sanitized: dict[int, int] = {}  # by conversation: its control tokens encoded as text
        if self.sanitize:  # a text with marked control tokens is tokenized as apply_chat_template's sanitize does
            for d, (c, doc) in enumerate(docs):
                if not isinstance(rendered[c], ChatError) and _MARKS.search(doc.text):
                    sanitized[c] = sanitized.get(c, 0) + len(_MARKS.findall(doc.text)) // 2
                    try:
                        tokenized[d] = self._sanitized(doc.chat, doc.text, doc.runs)
                    except ChatError as exc:
                        rendered[c] = exc
        plain = [d for d, (c, _) in enumerate(docs) if d not in tokenized and not isinstance(rendered[c], ChatError)]
        located = where or (lambda c: ("<conversations>", c + 1))
        spans = self._token_spans(
            [docs[d][1].text for d in plain], [docs[d][1].runs for d in plain],
            lambda i: (*located(docs[plain[i]][0]), "messages"),
        )  # fmt: skip
        for d, found in zip(plain, spans, strict=True):
            doc = docs[d][1]
            tokenized[d] = found if isinstance(found, ChatTokens) else (doc.text, doc.runs, *found)
        out: list[ChatTokens | ChatError] = list(rendered)  # type: ignore[arg-type]
        aligned: dict[int, list[ChatTokens]] = {}
        for d, (c, doc) in enumerate(docs):
            if isinstance(out[c], ChatError):
                continue
            done = tokenized[d]  # (``joined`` names the conversation as the source of its documents)
            try:
                if not isinstance(done, ChatTokens):
                    *args, exact = done
                    done = self.align(doc.chat, *args, exact=exact)
                aligned.setdefault(c, []).append(done)
            except ChatError as exc:
                out[c] = exc
        for c, parts in aligned.items():
            if not isinstance(out[c], ChatError):
                documents, per_turn = rendered[c]  # type: ignore[misc]
                out[c] = joined(chats[c], parts, per_turn, sum(d.training for d in documents), sanitized.get(c, 0))
        return out

    def _align_exact(
        self, texts: list[str], runs: list[Runs], ids: np.ndarray, tok_base: np.ndarray, starts: np.ndarray,
        ends: np.ndarray,
    ) -> Any:  # fmt: skip
        """Step 5 for documents end to end whose spans come from their ids' bytes (``TokenSpans.runs``: ``starts``,
        ``ends`` among their characters end to end; ``tok_base`` cuts ``ids``): ``align_runs`` over their runs
        put end to end, a few per document, gathered without an array per document."""
        lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        char_base = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum(lengths, out=char_base[1:])
        counts = np.fromiter((len(r.starts) for r in runs), dtype=np.int64, count=len(runs))
        total = int(counts.sum())
        run_starts = np.fromiter(itertools.chain.from_iterable(r.starts for r in runs), dtype=np.int64, count=total)
        run_starts += np.repeat(char_base[:-1], counts)
        joined_runs = Runs(
            run_starts,
            np.fromiter(itertools.chain.from_iterable(r.weights for r in runs), dtype=np.float32, count=total),
            np.fromiter(itertools.chain.from_iterable(r.turns for r in runs), dtype=np.int32, count=total),
        )  # fmt: skip
        return align_runs(char_base, joined_runs, tok_base, ids, starts, ends, self._bos, within=True)

    def _sanitized(
        self, chat: Chat, text: str, runs: Runs
    ) -> tuple[str, Runs, np.ndarray, np.ndarray, np.ndarray, bool]:
        """A conversation rendered from marked inputs (``prepare``), tokenized as ``apply_chat_template(...,
        sanitize_control_tokens=True)`` tokenizes it (transformers' ``encode_marked_chat``: a marked token as plain
        text, the text between marks encoded apart): the text without its marks, their characters' weights and
        turns, the ids, their characters' (start, end) and whether those came from the ids' bytes."""
        ctu = template_utils()
        backend = self.tok.backend_tokenizer
        split = backend.encode_special_tokens  # left set by its last piece: the build's own encodes read it
        try:
            ids = np.asarray(ctu.encode_marked_chat(self.tok, text), dtype=np.int32)
        except ValueError as exc:  # a control token that the tokenizer makes from plain text too
            token = re.search(r"Can't sanitize '(.*)'", str(exc))
            holders = (f for f, v in record_strings(chat, template_messages(chat)) if token and token[1] in v)
            field = next(holders, "messages")
            raise ChatError(
                field, f"cannot be encoded as plain text ({exc}); remove the control token", "control_token_in_content"
            ) from None
        finally:
            backend.encode_special_tokens = split
        keep = np.ones(len(text), dtype=bool)
        keep[[m.start() for m in _MARKS.finditer(text)]] = False
        clean = _MARKS.sub("", text)
        char_w, char_turns = run_chars(runs, len(text))
        kept = char_runs(char_w[keep], char_turns[keep])
        if self._spans is None:
            self._spans = TokenSpans(self.tokenize.backend_tokenizer)
        found = self._spans.spans([clean], ids, np.array([0, len(ids)])) if self._spans.supported else [None]
        if found[0] is not None:
            return clean, kept, ids, *found[0], True
        return clean, kept, ids, *self._marked_offsets(text, ids), False

    def _marked_offsets(self, text: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """tokenizers' offsets of ``encode_marked_chat(text)``'s tokens in ``text`` without its marks, its pieces
        encoded as it encodes them (``_encode_chat_piece``: after a newline, dropped again); ids that differ from
        ``ids`` are ``bad_offsets``."""
        _, marks = template_utils()._get_control_token_patterns(tuple(self.tok.added_tokens_encoder))
        backend = self.tok.backend_tokenizer
        newline = backend.encode("\n", add_special_tokens=False).ids
        got: list[int] = []
        starts: list[int] = []
        ends: list[int] = []
        at = 0
        for i, piece in enumerate(marks.split(text)):
            if not piece:
                continue
            split = backend.encode_special_tokens
            backend.encode_special_tokens = i % 2 == 1  # odd pieces are marked tokens, encoded as text
            try:
                enc, shift = (backend.encode("\n" + piece, add_special_tokens=False), 1) if i else (None, 0)
                if enc is None or enc.ids[: len(newline)] != newline:
                    enc, shift = backend.encode(piece, add_special_tokens=False), 0
                drop = len(newline) if shift else 0
            finally:
                backend.encode_special_tokens = split
            got += enc.ids[drop:]
            starts += [at + max(s - shift, 0) for s, _ in enc.offsets[drop:]]
            ends += [at + max(e - shift, 0) for _, e in enc.offsets[drop:]]
            at += len(piece)
        if got != ids.tolist():
            raise ChatError(
                "messages", "tokenizers' pieces do not give apply_chat_template's ids; cannot align weights", "bad_offsets"
            )
        return np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)

    def _token_spans(
        self, texts: list[str], runs: list[Runs], where: Callable[[int], tuple[str, int, str]]
    ) -> list[ChatTokens | tuple[np.ndarray, np.ndarray, np.ndarray, bool]]:
        """Each text's tokens: the build's tokenizer gives the ids, their bytes the spans (``TokenSpans``), and
        where those spell the text its ``ChatTokens``, aligned here with the others of its run (without a source:
        the caller's); elsewhere its ids, their characters' (start, end) and whether those came from the ids' bytes,
        for ``align`` (tokenizers' ids and offsets where the bytes do not spell the text; two leading BOS, which
        ``align`` refuses)."""
        if not texts:
            return []
        tokenize = self.tokenize
        if self._spans is None:
            self._spans = TokenSpans(tokenize.backend_tokenizer)
        found: list[Any] = [None] * len(texts)
        if self._spans.supported:
            ids, offsets = tokenize.documents(texts, where)
            ids = np.asarray(ids, dtype=np.int32)
            offsets = np.asarray(offsets, dtype=np.int64)
            # the batch's weights and turns, each run's written in place: its documents' arrays are views of them
            weights, turns = np.zeros(len(ids), dtype=np.float32), np.zeros(len(ids), dtype=np.int32)
            batch = TokenBatch(ids, weights, turns)
            none = Chat([], None, None, b"")
            for d, e, starts, ends, ok in self._spans.runs(texts, ids, offsets):
                a, b = int(offsets[d]), int(offsets[e])
                tok_base = offsets[d : e + 1] - a
                good = np.flatnonzero(ok)
                if not len(good):
                    continue
                if len(good) == e - d:  # every document's spans (the usual case): the run as it is
                    take: Any = slice(None)
                    base = tok_base
                else:  # those documents alone, their spans moved back over the characters of the others
                    counts = np.diff(tok_base)
                    take = np.repeat(ok, counts)
                    base = np.zeros(len(good) + 1, dtype=np.int64)
                    np.cumsum(counts[good], out=base[1:])
                    lengths = np.fromiter(map(len, texts[d:e]), dtype=np.int64, count=e - d)
                    dropped = np.cumsum(np.where(ok, 0, lengths)) - np.where(ok, 0, lengths)  # characters before each
                    starts, ends = (x[take] - np.repeat(dropped[good], counts[good]) for x in (starts, ends))
                got = self._align_exact(
                    [texts[d + k] for k in good], [runs[d + k] for k in good], ids[a:b][take], base, starts, ends
                )  # fmt: skip
                weights[a:b][take], turns[a:b][take] = got.weights, got.turns
                cuts = tok_base.tolist()
                for k, two, straddling in zip(good.tolist(), got.double_bos.tolist(), got.straddling.tolist(), strict=True):
                    x, y = a + cuts[k], a + cuts[k + 1]
                    if two:  # ``align`` says why (its spans from its first character)
                        found[d + k] = (ids[x:y], *self._spans.spans([texts[d + k]], ids[x:y], np.array([0, y - x]))[0], True)
                    else:
                        found[d + k] = ChatTokens(ids[x:y], weights[x:y], none, turns[x:y], None, 0, 0, straddling,
                                                  batch, x)  # fmt: skip
        missing = [d for d, got in enumerate(found) if got is None]
        for d, enc in zip(missing, tokenize.encodings([texts[d] for d in missing]), strict=True):
            pairs = np.fromiter(itertools.chain.from_iterable(enc.offsets), dtype=np.int64, count=2 * len(enc.ids))
            found[d] = (np.asarray(enc.ids, dtype=np.int32), pairs[0::2], pairs[1::2], False)
        return found

    @staticmethod
    def _check_offsets(text: str, runs: Runs, ids: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        """Offsets must go forwards and cover every weighted character (``bad_offsets``)."""
        if len(ids) and ((np.diff(starts) < 0).any() or (np.diff(ends) < 0).any() or (ends < starts).any()):
            raise ChatError("messages", "the tokenizer's offsets go backwards; cannot align weights", "bad_offsets")
        covered = np.bincount(starts, minlength=len(text) + 1) - np.bincount(ends, minlength=len(text) + 1)
        uncovered = (np.cumsum(covered)[: len(text)] == 0) & (run_chars(runs, len(text))[0] > 0)
        if uncovered.any():
            at = int(np.argmax(uncovered))
            raise ChatError("messages", f"weighted character {at} ({snippet(text, at)}) is in no token", "bad_offsets")

    def align(
        self, chat: Chat, text: str, runs: Runs, ids: np.ndarray, starts: np.ndarray, ends: np.ndarray, *,
        exact: bool = False,
    ) -> ChatTokens:  # fmt: skip
        """Step 5: the weights (and turn codes) of the characters (``runs``) put on the tokens ``ids`` of ``text``,
        whose characters are ``[starts[t], ends[t])``: a token takes the largest weight of its characters and the
        turn of the first character of that weight (``chat_align``)."""
        ids = np.asarray(ids, dtype=np.int32)
        if not exact:  # tokenizers' offsets; spans from the ids' bytes are in order and cover the text by construction
            self._check_offsets(text, runs, ids, starts, ends)
        found = align_runs(
            np.array([0, len(text)]), runs, np.array([0, len(ids)]), ids, starts, ends, self._bos
        )  # fmt: skip
        if found.double_bos[0]:
            raise ChatError("messages", "the rendered conversation starts with two BOS tokens", "double_bos")
        return ChatTokens(ids, found.weights, chat._replace(raw=b""), found.turns, straddling=int(found.straddling[0]))


def render_chats(records: Records, render: ChatRenderer, rejects: list[Reject]) -> Records:
    """Replace each ``Chat`` of ``records`` by its ``ChatTokens``; a conversation that fails goes to ``rejects``
    and leaves the batch."""
    if records.chats is None:
        return records
    todo = [r for r, chat in enumerate(records.chats) if isinstance(chat, Chat)]
    results: dict[int, ChatTokens | ChatError] = {}
    a = 0
    while a < len(todo):  # in batches of about RENDER_BYTES of input, each aligned before the next is rendered
        b, held = a, 0
        while b < len(todo) and (b == a or held < RENDER_BYTES):
            held += len(records.chats[todo[b]].raw) or 1  # type: ignore[union-attr]
            b += 1
        batch = todo[a:b]
        located = render.tokens_batch(
            [records.chats[r] for r in batch],  # type: ignore[misc]
            lambda c, batch=batch: (records.path, int(records.lines[batch[c]])),  # type: ignore[misc]
        )
        results.update(zip(batch, located, strict=True))
        a = b
    chats: list[Any] = []
    keep = np.ones(len(records), dtype=bool)
    for r, chat in enumerate(records.chats):
        result = results.get(r, chat)
        if isinstance(result, ChatError):
            keep[r] = False
            chats.append(None)
            assert isinstance(chat, Chat)
            rejects.append(
                Reject(records.path, int(records.lines[r]), chat.offset, result.reason, result.field, result.problem,
                       chat.raw, len(chat.raw))
            )  # fmt: skip
        else:
            chats.append(result)
    out = Records(records.path, records.lines, records.texts, records.piece_weights, records.piece_offsets, chats)
    return out if keep.all() else out.where(keep)
