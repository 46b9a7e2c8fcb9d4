"""Stage 3 — tokenize: every piece text exactly once, in large batches, through the Rust tokenizer.

This is the only module that calls a tokenizer on piece texts (and on rendered conversations: ``documents``). It talks to the fast tokenizer's Rust
backend directly (``encode_batch_fast``, no offsets), which spreads a batch over all cores and skips the
Python-side bookkeeping of ``tokenizer(texts)``; special tokens are never added here (the assemble
stage places BOS/EOS itself), and truncation/padding are switched off on a private copy so a
tokenizer saved with them cannot cut or pad pieces.

A document is its pieces back to back, so only its first non-empty piece is tokenized as the start of a
sequence; every later piece is tokenized as a *continuation*. The difference matters for tokenizers that
put a word-start marker at the beginning of every call: SentencePiece conversions (normalizer
``Prepend("▁")``, or pre-tokenizer ``Metaspace(prepend_scheme="first"|"always")``: Llama-2, Mistral,
TinyLlama, CodeLlama) and ``ByteLevel(add_prefix_space=True)`` (RoBERTa-style). Tokenized alone, each
later piece would get a space in front of it. The continuation tokenizer is a copy of the backend with
that marker switched off in its configuration (``continuation_spec``); the text is never edited.
Byte-level tokenizers without a prefix space (GPT-2, Llama-3, Qwen) have no marker: one tokenizer does both.

Two backends run the same ``tokenizer.json`` (start and continuation alike): ``tokenizers`` (``hf``) and
fastokens (Rust, several times faster, flat ids with no per-token Python objects), which reads most but not all
tokenizers. ``auto`` takes fastokens where it loads the tokenizer and agrees with tokenizers on a fixed set of
probe texts, else tokenizers (with a note saying why). Whatever runs, every block re-encodes a deterministic
sample of its pieces with tokenizers; a difference stops the build, naming the piece's file:line and both id
sequences.

Example: texts ``["Q: 2+2?\n", "A: 4"]`` -> ids ``[48, 27, 17, ...]`` with offsets ``[0, 6, 9]``:
piece ``p`` is ``ids[offsets[p]:offsets[p + 1]]``.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np

from weightprep.batches import Records
from weightprep.errors import BackendMismatch, UsageError
from weightprep.prefetch import FastokensPrefetch

__all__ = [
    "AGREEMENT_PROBES", "BACKENDS", "GUARD_DOCUMENTS", "GUARD_PIECES", "PieceTokenizer", "continuation_spec",
    "document_starts",
]

#: Components known to add nothing at the start of a call (beyond what ``continuation_spec`` switches off).
_NORMALIZERS = {
    "BertNormalizer", "ByteLevel", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "Nmt", "Precompiled", "Prepend",
    "Replace", "Sequence", "Strip", "StripAccents",
}
_PRE_TOKENIZERS = {
    "BertPreTokenizer", "ByteLevel", "CharDelimiterSplit", "Digits", "FixedLength", "Metaspace", "Punctuation",
    "Sequence", "Split", "UnicodeScripts", "Whitespace", "WhitespaceSplit",
}
#: A text that no continuation may change: no marker before it, nothing stripped from it.
_PROBE = "x"


def _refuse(what: str) -> UsageError:
    return UsageError(
        f"cannot tokenize later pieces of a document as continuations: the tokenizer's {what}. Its pieces "
        "would not join to the document's text. Use a tokenizer.json whose normalizer and pre-tokenizer are "
        "among tokenizers' built-in ones, or join the pieces of each record into one before building."
    )


def _continue_component(node: dict | None, kind: str) -> dict | None:
    """The component with its per-call prefix switched off (``None`` where it is only that prefix)."""
    if node is None:
        return None
    known, children = (_NORMALIZERS, "normalizers") if kind == "normalizer" else (_PRE_TOKENIZERS, "pretokenizers")
    kind_name = kind.replace("_", "-")
    t = node.get("type")
    if t not in known:
        raise _refuse(f"{kind_name} {t!r} is not one whose start-of-call behaviour is known")
    if t == "Sequence":
        parts = [_continue_component(c, kind) for c in node[children]]
        return {**node, children: [p for p in parts if p is not None]}
    if kind == "normalizer" and t == "Prepend":  # the legacy SentencePiece conversion's "▁" before every call
        return None
    if kind == "normalizer" and t == "Strip" and node.get("strip_left"):
        raise _refuse("normalizer Strip removes the leading whitespace of every call")
    if kind == "pre_tokenizer" and t == "Metaspace":
        node = {**node, "prepend_scheme": "never"}
        if "add_prefix_space" in node:  # the form written by tokenizers < 0.14
            node["add_prefix_space"] = False
        return node
    if kind == "pre_tokenizer" and t == "ByteLevel":
        return {**node, "add_prefix_space": False}
    return node


def continuation_spec(spec: dict) -> dict | None:
    """A ``tokenizer.json`` (as a dict) that tokenizes text as the continuation of a sequence, or ``None`` when
    the tokenizer already does (it adds nothing at the start of a call). Raises ``UsageError`` for a tokenizer
    whose start-of-call behaviour cannot be established."""
    cont = {
        **spec,  # a whole tokenizer.json, or just its "normalizer" and "pre_tokenizer"
        "normalizer": _continue_component(spec.get("normalizer"), "normalizer"),
        "pre_tokenizer": _continue_component(spec.get("pre_tokenizer"), "pre_tokenizer"),
    }
    if cont == spec:
        return None
    return cont


def _probe_adds_nothing(backend: Any) -> bool:
    """Whether the backend keeps ``_PROBE`` as it is through its normalizer and pre-tokenizer."""
    text = backend.normalizer.normalize_str(_PROBE) if backend.normalizer is not None else _PROBE
    if backend.pre_tokenizer is not None:
        text = "".join(s for s, _ in backend.pre_tokenizer.pre_tokenize_str(text))
    return text == _PROBE


def document_starts(texts: list[str], piece_offsets: np.ndarray) -> np.ndarray:
    """Indices of the pieces that start a document: each record's first non-empty piece (an empty piece has no
    tokens, so the piece after it is still the start of the sequence)."""
    nonempty = np.flatnonzero(np.fromiter(map(bool, texts), dtype=bool, count=len(texts)))
    candidates = np.append(nonempty, len(texts))[np.searchsorted(nonempty, piece_offsets[:-1])]
    return candidates[candidates < piece_offsets[1:]]


#: Texts on which fastokens must give tokenizers' ids before ``auto`` uses it: scripts, emoji with joiners,
#: whitespace runs, control characters, code, special-token look-alikes.
AGREEMENT_PROBES: tuple[str, ...] = (
    "Hello, wörld! The quick brown fox jumps over the lazy dog.",
    " leading space", "trailing space ", "  two  spaces\n\n\tand a tab\r\n",
    "東京は日本の首都です。北京是中国的首都。", "مرحبا بالعالم. שלום עולם.", "😀🚀 👨‍👩‍👧 👍🏽 🇯🇵",
    "def add(a, b):\n    return a + b  # 3.14159, 1e-9, 0x1F\n", "<s></s><|endoftext|><pad>[UNK]", "\u00a0\u200b\x00\x7f",
    "Ünïcödé ﬁ ｆｕｌｌｗｉｄｔｈ ℌ", "a" * 300, "",
)
#: Pieces per block that the guard re-encodes with tokenizers when fastokens runs.
GUARD_PIECES = 64
#: Documents (rendered conversations, hundreds of tokens each) per ``documents`` call that the guard re-encodes:
#: the chat stage's calls are batches of ~8 MiB of input (``chat.RENDER_BYTES``), so 64 a call is the pieces' 64
#: per 8 MiB block.
GUARD_DOCUMENTS = 64
BACKENDS = ("auto", "fastokens", "hf")


class _HFEncoder:
    """tokenizers' backend: ``encode_batch_fast`` in batches, then flat arrays."""

    name = "hf"

    def __init__(self, backend: Any, batch_size: int) -> None:
        self.backend, self.batch_size = backend, batch_size
        self._encode = getattr(backend, "encode_batch_fast", backend.encode_batch)

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        encodings: list[Any] = []
        for start in range(0, len(texts), self.batch_size):
            encodings.extend(self._encode(texts[start : start + self.batch_size], add_special_tokens=False))
        lengths = np.fromiter(map(len, encodings), dtype=np.int64, count=len(encodings))
        offsets = np.zeros(len(encodings) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.fromiter(
            chain.from_iterable(map(attrgetter("ids"), encodings)), dtype=np.int32, count=int(offsets[-1])
        )
        return flat, offsets


class _FastokensEncoder:
    """fastokens' ``encode_batch_flat``: little-endian uint32 ids and uint64 offsets, read as numpy arrays."""

    name = "fastokens"

    def __init__(self, spec_json: str | Any, batch_size: int) -> None:
        """From a tokenizer.json text, or a ``fastokens.Tokenizer`` already loaded (``FastokensPrefetch``)."""
        import fastokens

        loaded = spec_json if not isinstance(spec_json, str) else fastokens.Tokenizer.from_json_str(spec_json)
        self.tokenizer, self.batch_size = loaded, batch_size

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        parts = [self._flat(texts[s : s + self.batch_size]) for s in range(0, len(texts), self.batch_size)]
        return _concat(parts) if parts else (np.zeros(0, np.int32), np.zeros(1, np.int64))

    def _flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The two buffers as read-only int32 and int64 views, no copy: ids are below 2**31 and offsets below
        2**63, so reinterpreting their bits as signed leaves every value as it is."""
        ids, offsets = self.tokenizer.encode_batch_flat(texts, add_special_tokens=False)
        return np.frombuffer(ids, dtype="<u4").view("<i4"), np.frombuffer(offsets, dtype="<u8").view("<i8")


def _concat(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Flat (ids, offsets) pairs one after the other, as one pair."""
    if len(parts) == 1:
        return parts[0]
    ids = np.concatenate([p[0] for p in parts])
    shifts = np.cumsum([0] + [len(p[0]) for p in parts[:-1]])
    offsets = np.concatenate([[0]] + [p[1][1:] + shift for p, shift in zip(parts, shifts, strict=True)])
    return ids, offsets.astype(np.int64)


def _interleave(parts: list[tuple[np.ndarray, np.ndarray]], order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pieces encoded in ``order`` (the concatenation of ``parts``) put back in their own order."""
    ids, offsets = _concat(parts)
    position = np.empty_like(order)
    position[order] = np.arange(len(order))  # where each piece sits in the concatenation
    lengths = np.diff(offsets)[position]
    out_offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out_offsets[1:])
    gather = np.repeat(offsets[:-1][position] - out_offsets[:-1], lengths) + np.arange(out_offsets[-1])
    return ids[gather], out_offsets


class PieceTokenizer:
    """Callable turning a batch of records' piece texts into flat int32 ids plus int64 offsets.

    ``backend`` is ``auto``, ``fastokens`` or ``hf`` (see the module docstring); ``self.backend`` is the one that
    runs and ``self.note`` says why ``auto`` did not take fastokens (None when it did, or was not asked)."""

    def __init__(
        self,
        tokenizer: Any,
        batch_size: int = 4096,
        backend: str = "hf",
        notify: Callable[[str], None] | None = None,
        prefetched: FastokensPrefetch | None = None,
    ) -> None:
        from tokenizers import Tokenizer

        if backend not in BACKENDS:
            raise UsageError(f"tokenizer backend {backend!r}: choose one of {', '.join(BACKENDS)}")
        hf = tokenizer.backend_tokenizer
        if hf.truncation is not None or hf.padding is not None:
            hf = copy.deepcopy(hf)  # never change the caller's tokenizer
            hf.no_truncation()
            hf.no_padding()
        # only the two components decide the continuation: no parse of the whole tokenizer.json
        parts = {k: None if c is None else json.loads(c.__getstate__()) for k, c in
                 (("normalizer", hf.normalizer), ("pre_tokenizer", hf.pre_tokenizer))}
        cont = continuation_spec(parts)
        cont_json = None if cont is None else json.dumps({**json.loads(hf.to_str()), **cont})
        hf_cont = None if cont_json is None else Tokenizer.from_str(cont_json)
        if not _probe_adds_nothing(hf_cont or hf):
            raise _refuse(f"normalizer and pre-tokenizer still change {_PROBE!r} with their start marker off")
        #: tokenizers' encoders (start, continuation or None): the reference the guard compares with
        self.reference = (_HFEncoder(hf, batch_size), None if hf_cont is None else _HFEncoder(hf_cont, batch_size))
        self._encoders: tuple[Any, Any] | None = self.reference if backend == "hf" else None
        self._requested, self._notify, self._prefetched = backend, notify, prefetched
        self.note: str | None = None
        self._loading: threading.Thread | None = None
        self._load_error: BaseException | None = None
        if self._encoders is None:  # fastokens loads (~0.5 s for 50k ids, GIL released) while the reader starts
            self._loading = threading.Thread(
                target=self._load_fastokens, args=(hf, cont_json, batch_size), name="weightprep-fastokens", daemon=True
            )
            self._loading.start()

    def _load_fastokens(self, hf: Any, cont_json: str | None, batch_size: int) -> None:
        try:
            self._encoders = self._fastokens(hf, cont_json, batch_size)
        except (ImportError, ValueError, RuntimeError) as exc:
            if self._requested == "fastokens":
                self._load_error = UsageError(f"--tokenizer-backend fastokens: {exc}; use --tokenizer-backend hf")
            self.note = f"tokenizing with tokenizers, not fastokens: {exc}"
            self._encoders = self.reference
        except BaseException as exc:  # re-raised in the caller's thread
            self._load_error = exc

    @property
    def encoders(self) -> tuple[Any, Any]:
        """(start, continuation or None) encoders of the backend that runs; waits for fastokens to load."""
        if self._loading is not None:
            self._loading.join()
            self._loading = None
            if self._load_error is not None:
                raise self._load_error
            if self.note is not None and self._notify is not None:
                self._notify(self.note)
        assert self._encoders is not None
        return self._encoders

    def close(self) -> None:
        """Wait for a fastokens load still running (a build that fails before its first block)."""
        if self._loading is not None:
            self._loading.join()
        if self._prefetched is not None:
            self._prefetched.close()

    @property
    def backend(self) -> str:
        """The backend that runs: "fastokens" or "hf"."""
        return self.encoders[0].name

    @property
    def continuation(self) -> Any | None:
        """The continuation encoder, None when the tokenizer has no start marker (one encoder does both)."""
        return self.encoders[1]

    def _fastokens(self, hf: Any, cont_json: str | None, batch_size: int) -> tuple[Any, Any]:
        """fastokens encoders for start (the prefetched file, else ``hf``'s JSON) and continuation, once they give
        tokenizers' ids on every probe."""
        try:
            import fastokens  # noqa: F401
        except ImportError as exc:
            raise ImportError("fastokens is not installed (pip install 'fastokens>=0.3.5,<0.4')") from exc
        try:
            fast = (
                _FastokensEncoder(hf.to_str() if self._prefetched is None else self._prefetched.result(), batch_size),
                None if cont_json is None else _FastokensEncoder(cont_json, batch_size),
            )
        except Exception as exc:  # fastokens raises ValueError for a component it does not support
            raise ValueError(f"fastokens cannot load this tokenizer ({exc})") from exc
        probes = list(AGREEMENT_PROBES)
        for mine, ref in zip(fast, self.reference, strict=True):
            if mine is not None and not all(
                np.array_equal(a, b) for a, b in zip(_split(*mine(probes)), _split(*ref(probes)), strict=True)
            ):
                raise ValueError("fastokens and tokenizers give different ids for this tokenizer's probe texts")
        return fast

    def __call__(self, records: Records) -> tuple[np.ndarray, np.ndarray]:
        """Ids and offsets of the pieces of ``records``: piece ``p`` is ``ids[offsets[p]:offsets[p + 1]]``."""
        texts = records.texts
        start, cont = self.encoders
        if cont is None:
            ids, offsets = start(texts)
            is_start = None
        else:
            is_start = np.zeros(len(texts), dtype=bool)
            is_start[document_starts(texts, records.piece_offsets)] = True
            first, later = np.flatnonzero(is_start), np.flatnonzero(~is_start)
            ids, offsets = _interleave(
                [start([texts[i] for i in first.tolist()]), cont([texts[i] for i in later.tolist()])],
                np.concatenate([first, later]),
            )
        if self.encoders is not self.reference:
            self._guard(records, ids, offsets, is_start)
        return ids, offsets

    @property
    def backend_tokenizer(self) -> Any:
        """tokenizers' backend that the guard compares with (truncation and padding off)."""
        return self.reference[0].backend

    def encodings(self, texts: list[str]) -> list[Any]:
        """tokenizers' own encodings of whole documents, with their offsets (``Encoding.ids``, ``.offsets``)."""
        return self.backend_tokenizer.encode_batch(texts, add_special_tokens=False) if texts else []

    def documents(self, texts: list[str], where: Callable[[int], tuple[str, int, str]]) -> tuple[np.ndarray, np.ndarray]:
        """Ids of whole documents (a rendered conversation), each tokenized as the start of a sequence: document
        ``d`` is ``ids[offsets[d]:offsets[d + 1]]``. The guard re-encodes a sample as for pieces; ``where(d)`` is the
        (file, line, field) it names."""
        start = self.encoders[0]
        ids, offsets = start(texts)
        if self.encoders is not self.reference:
            self._compare(texts, _sample(len(texts), GUARD_DOCUMENTS), self.reference[0], ids, offsets, where)
        return ids, offsets

    def _guard(self, records: Records, ids: np.ndarray, offsets: np.ndarray, is_start: np.ndarray | None) -> None:
        """Re-encode a deterministic sample of the pieces with tokenizers; stop at the first difference."""
        sample = _sample(len(records.texts))
        groups = [sample] if is_start is None else [sample[is_start[sample]], sample[~is_start[sample]]]

        def where(i: int) -> tuple[str, int, str]:
            record = int(np.searchsorted(records.piece_offsets, i, side="right")) - 1
            return records.path, int(records.lines[record]), f"pieces[{i - int(records.piece_offsets[record])}].text"

        for index, ref in zip(groups, self.reference, strict=False):  # start pieces, then continuations
            self._compare(records.texts, index, ref, ids, offsets, where)

    @staticmethod
    def _compare(
        texts: list[str], index: np.ndarray, ref: Any, ids: np.ndarray, offsets: np.ndarray,
        where: Callable[[int], tuple[str, int, str]],
    ) -> None:  # fmt: skip
        """Texts ``index`` encoded by ``ref`` (tokenizers) must give ``ids[offsets[i]:offsets[i + 1]]``."""
        if not len(index):
            return
        expected = _split(*ref([texts[i] for i in index.tolist()]))
        for i, want in zip(index.tolist(), expected, strict=True):
            got = ids[offsets[i] : offsets[i + 1]]
            if not np.array_equal(got, want):
                path, line, field = where(i)
                raise BackendMismatch(
                    path, line, field,
                    f"fastokens and tokenizers tokenize this text differently: fastokens {got.tolist()}, "
                    f"tokenizers {want.tolist()}. Rerun with --tokenizer-backend hf (and report the text to fastokens).",
                )  # fmt: skip


def _sample(n: int, k: int = GUARD_PIECES) -> np.ndarray:
    """The guard's deterministic sample of ``n`` texts: ``k`` evenly spaced (all of them if fewer)."""
    return np.unique(np.linspace(0, n - 1, num=min(n, k)).astype(np.int64)) if n else np.zeros(0, np.int64)


def _split(ids: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    return [ids[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]
