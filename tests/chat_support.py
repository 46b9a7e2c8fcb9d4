"""Chat tokenizers for the tests: each family's template (TRL's installed ``chat_templates``, or written here) on a
small tokenizer built in-process with that family's control tokens (byte-level BPE unless asked otherwise), plus a
naive reference of the weights.

The reference finds each message's header and content by plain string search in the rendered text, using what
each family is known to write around a turn; it shares nothing with ``weightprep.stages.chat``, which aligns by
prefix renders.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import trl
from tokenizer_factory import _byte_level_bpe, _sentencepiece

TEMPLATES = Path(trl.__file__).parent / "chat_templates"

#: Written here (Mistral v1 has no template in TRL): BOS, ``[INST] user [/INST]`` then the answer and EOS.
MISTRAL_V1 = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] + ' [/INST]' }}"
    "{% elif m['role'] == 'assistant' %}{{ m['content'] + eos_token }}{% endif %}{% endfor %}"
)


@dataclass(frozen=True)
class Family:
    """A chat family: its template and tokens, and how a turn looks (for the naive reference)."""

    name: str
    template: str
    specials: tuple[str, ...]
    bos: str | None
    eos: str
    trims: bool  # the template trims content
    roles: tuple[str, ...] = ("user", "assistant")

    def header(self, role: str) -> str:
        if self.name == "chatml":
            return f"<|im_start|>{role}\n"
        if self.name.startswith("llama3"):
            return f"<|start_header_id|>{role}<|end_header_id|>\n\n"
        if self.name == "gemma":
            return f"<start_of_turn>{'model' if role == 'assistant' else role}\n"
        return "[INST] " if role == "user" else ""

    def end(self, role: str) -> str:
        if self.name == "chatml":
            return "<|im_end|>\n"
        if self.name.startswith("llama3"):
            return "<|eot_id|>"
        if self.name == "gemma":
            return "<end_of_turn>\n"
        return " [/INST]" if role == "user" else "</s>"


def _template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


FAMILIES = {
    "chatml": Family("chatml", _template("qwen2_5"), ("<|im_start|>", "<|im_end|>", "<|endoftext|>"), None, "<|im_end|>", False),
    "llama3": Family(
        "llama3", _template("llama3"), ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        "<|begin_of_text|>", "<|eot_id|>", True,
    ),
    "llama3_1": Family(
        "llama3_1", _template("llama3_1"), ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        "<|begin_of_text|>", "<|eot_id|>", True,
    ),
    "gemma": Family("gemma", _template("gemma"), ("<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"), "<bos>", "<eos>", True),
    "mistral_v1": Family("mistral_v1", MISTRAL_V1, ("<s>", "</s>"), "<s>", "</s>", False),
}  # fmt: skip


#: The tokenizer models a chat family can be built on: byte-level BPE (Llama-3, Qwen), SentencePiece with byte
#: fallback and no word-start marker (Gemma), and the legacy SentencePiece conversion that puts "▁" in front of
#: every text between special tokens (Llama-2, Mistral v1), whose tokens do not spell the text byte for byte.
MODELS = ("byte_level", "sentencepiece", "sentencepiece_legacy")


@functools.lru_cache
def chat_tokenizer(name: str, template: str | None = None, model: str = "byte_level") -> Any:
    """A fast tokenizer of family ``name`` with its chat template (or ``template``) on ``model`` (``MODELS``):
    treat as read-only."""
    fam = FAMILIES[name]
    return build_chat_tokenizer(fam.specials, fam.bos, fam.eos, template or fam.template, model)


def build_chat_tokenizer(
    specials: tuple[str, ...], bos: str | None, eos: str, template: str, model: str = "byte_level", plain: tuple[str, ...] = (),
    base: str | None = None,
) -> Any:  # fmt: skip
    """A fast tokenizer on ``model`` (``MODELS``) whose ``specials`` are special added tokens and ``plain`` added tokens
    that are not special (as Qwen's ``<think>`` / ``<tool_call>``), with ``bos``/``eos`` (pad = eos) and ``template``.
    ``base``: a ``tokenizer.json`` to start from instead of a 500-id model trained here (a real-size vocabulary,
    whose merges join what a tiny one keeps apart: `` The``, ``\n\n``)."""
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    if base is not None:
        backend = Tokenizer.from_file(base)
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    elif model == "byte_level":
        backend = _byte_level_bpe(list(specials), 500)
    else:
        backend = _sentencepiece(list(specials), 500, "gemma" if model == "sentencepiece" else "legacy")
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=bos, eos_token=eos, pad_token=eos, model_max_length=8192,
        clean_up_tokenization_spaces=False,
    )  # fmt: skip
    tok.add_special_tokens({"additional_special_tokens": [t for t in specials if t not in (bos, eos)]})
    tok.chat_template = template
    return tok


#: Its generation prompt ends in a letter ("A"), so the answer's first letter joins it in one pre-token (byte-level
#: BPE keeps a run of letters together) and BPE may merge across the change of weight.
LETTER_PROMPT = (
    "{% for m in messages %}{% if m['role'] == 'user' %}{{ 'Q: ' + m['content'] + '\\n' }}{% else %}"
    "{{ 'A' + m['content'] + eos_token }}{% endif %}{% endfor %}{% if add_generation_prompt %}A{% endif %}"
)


@functools.lru_cache
def merging_tokenizer(template: str = LETTER_PROMPT) -> Any:
    """Byte-level BPE whose only merge is ``A`` + ``æ`` (the first byte of ``東``, ``日``, ``本``, ...): ``"A東"``
    is ``[Aæ, Ŀ, ±]``, one token across a character boundary that a multi-byte character makes. BOS and EOS are
    added special tokens (Llama-3's). Treat as read-only."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    bos, eos = "<|begin_of_text|>", "<|eot_id|>"
    vocab = {t: i for i, t in enumerate([bos, eos, *sorted(pre_tokenizers.ByteLevel.alphabet()), "Aæ"])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[("A", "æ")]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(bos, special=True), AddedToken(eos, special=True)])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=eos, clean_up_tokenization_spaces=False)
    tok.chat_template = template
    return tok


def reference_char_weights(fam: Family, text: str, messages: list[dict], role_weights: dict[str, float]) -> np.ndarray:
    """Per-character weights found by searching each turn's header and content in ``text``, left to right."""
    w = np.zeros(len(text), dtype=np.float32)
    cursor = 0
    for m in messages:
        role = m["role"]
        content = m["content"].strip() if fam.trims else m["content"]
        head = text.index(fam.header(role), cursor)
        start = head + len(fam.header(role))
        assert text.startswith(content, start), (text[start:], content)
        end = text.index(fam.end(role), start + len(content)) + len(fam.end(role))
        weight = m.get("weight", role_weights.get(role, 0.0))
        w[start:end] = weight
        cursor = end
    return w


def reference_token_weights(enc: Any, char_w: np.ndarray) -> tuple[np.ndarray, bool]:
    """Each token's weight, the largest of its characters' (transformers' ``assistant_masks`` marks every token
    holding a character of a generation block), and whether some token covers characters of two weights."""
    out = np.zeros(len(enc.ids), dtype=np.float32)
    straddle = False
    for k, (s, e) in enumerate(enc.offsets):
        if e > s:
            values = set(char_w[s:e].tolist())
            straddle |= len(values) > 1
            out[k] = max(values)
    return out, straddle


def chat_record(messages: list[dict], tools: Any = None, kwargs: Any = None) -> Any:
    """A conversation as the chat stage gets it from a record (its raw line: the messages' JSON)."""
    from weightprep.batches import Chat

    return Chat(messages, tools, kwargs, json.dumps({"messages": messages}).encode())


def plain_messages(messages: list[dict]) -> list[dict]:
    """The messages as ``apply_chat_template`` gets them: without weightprep's ``weight``."""
    return [{k: v for k, v in m.items() if k != "weight"} for m in messages]


def fastokens_wrong_on(monkeypatch, word: str = "weird") -> None:
    """The build's fastokens encoder made to disagree with tokenizers (first id + 1) on every text holding ``word``:
    what the tokenizer guard must catch."""
    from weightprep.stages import tokenize as stage

    real = stage._FastokensEncoder.__call__

    def wrong(self, texts):
        ids, offsets = real(self, texts)
        ids = ids.copy()
        for i, t in enumerate(texts):
            if word in t:
                ids[offsets[i]] += 1
        return ids, offsets

    monkeypatch.setattr(stage._FastokensEncoder, "__call__", wrong)
