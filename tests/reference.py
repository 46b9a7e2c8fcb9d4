"""An independent, deliberately naive reference for what the build must produce, and the invariant checks.

Nothing here imports weightprep's stages: documents are assembled record by record with plain
Python lists and the tokenizer's ordinary ``__call__``, so the vectorized pipeline is checked
against a second implementation rather than against itself.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np

IGNORE = -100
TOKEN_COLUMNS = ("input_ids", "labels", "weights", "position_ids")


def continuation_ids(tok: Any, text: str) -> list[int]:
    """``text`` tokenized as the continuation of a sequence: no word-start marker in front of it.

    Computed by hand for each marker-adding family, from the model alone (``model.tokenize`` on a pre-token):
    the legacy SentencePiece normalizer and ``Metaspace(split=False)`` both make one pre-token of the text
    with spaces as "▁"; ``ByteLevel`` splits by its regex and maps bytes to characters. Other tokenizers add
    nothing at the start of a call and are called as they are."""
    backend = tok.backend_tokenizer
    spec = json.loads(backend.to_str())
    normalizer, pre = spec["normalizer"] or {}, spec["pre_tokenizer"] or {}
    prepends = any(n.get("type") == "Prepend" for n in normalizer.get("normalizers", [normalizer]))
    if prepends or (pre.get("type") == "Metaspace" and not pre["split"]):
        pre_tokens = [text.replace(" ", "▁")] if text else []
    elif pre.get("type") == "ByteLevel" and pre["add_prefix_space"]:
        from tokenizers import pre_tokenizers

        pre_tokens = [w for w, _ in pre_tokenizers.ByteLevel(add_prefix_space=False).pre_tokenize_str(text)]
    else:
        return tok(text, add_special_tokens=False)["input_ids"]
    return [t.id for w in pre_tokens for t in backend.model.tokenize(w)]


def reference_document(tok: Any, pieces: list[dict], *, add_bos: bool = True, eos_weight: float = 1.0):
    """(ids, weights) of one record: BOS? + its pieces + EOS; first token weight 0. The first non-empty piece is
    tokenized as the start of a sequence, every later one as a continuation (``continuation_ids``)."""
    ids: list[int] = []
    weights: list[float] = []
    if add_bos and tok.bos_token_id is not None:
        ids.append(tok.bos_token_id)
        weights.append(0.0)
    started = False
    for piece in pieces:
        text = piece["text"]
        piece_ids = continuation_ids(tok, text) if started else tok(text, add_special_tokens=False)["input_ids"]
        started = started or bool(text)
        ids.extend(piece_ids)
        weights.extend([float(np.float32(piece["weight"]))] * len(piece_ids))
    ids.append(tok.eos_token_id)
    weights.append(float(np.float32(eos_weight)))
    weights[0] = 0.0
    return ids, weights


def reference_documents(tok: Any, records: list[dict], *, max_length: int, eos_weight: float = 1.0):
    """The documents a drop-policy build keeps, with the counts of what it drops."""
    kept, dropped = [], Counter()
    for rec in records:
        ids, weights = reference_document(tok, rec["pieces"], eos_weight=eos_weight)
        if len(ids) > max_length:
            dropped["overlong"] += 1
        elif not any(w > 0 for w in weights):
            dropped["unsupervised"] += 1
        else:
            kept.append((ids, weights))
    return kept, dropped


def rows_as_numpy(ds: Any) -> dict[str, Any]:
    """A datasets.Dataset (or dict of lists) as {column: ndarray[n, L]}, seq_lengths as a list of lists."""
    cols = {c: np.asarray(ds[c]) for c in TOKEN_COLUMNS if c in ds.column_names} if hasattr(ds, "column_names") else {
        c: np.asarray(v) for c, v in ds.items() if c != "seq_lengths"
    }
    if hasattr(ds, "column_names") and "attention_mask" in ds.column_names:
        cols["attention_mask"] = np.asarray(ds["attention_mask"])
    cols["seq_lengths"] = [list(map(int, s)) for s in ds["seq_lengths"]]
    return cols


def check_rows(rows: dict[str, Any], seq_len: int, pad_id: int, *, packed: bool) -> list[tuple[list[int], list[float]]]:
    """Assert every row invariant of the output contract; return the documents found in the rows."""
    n = len(rows["seq_lengths"])
    for c in TOKEN_COLUMNS:
        assert rows[c].shape == (n, seq_len), (c, rows[c].shape)
    if not packed:
        assert rows["attention_mask"].shape == (n, seq_len)
    ids, labels, weights, pos = (rows[c] for c in TOKEN_COLUMNS)
    assert ((labels == IGNORE) == (weights == 0)).all(), "labels must be -100 exactly where weight is 0"
    sup = labels != IGNORE
    assert (labels[sup] == ids[sup]).all(), "supervised labels must equal input_ids"
    assert (weights >= 0).all()
    docs = []
    for r in range(n):
        segs = rows["seq_lengths"][r]
        assert sum(segs) == seq_len, f"row {r}: seq_lengths {segs} do not sum to {seq_len}"
        assert all(s > 0 for s in segs)
        start = 0
        for k, length in enumerate(segs):
            sl = slice(start, start + length)
            assert pos[r, sl].tolist() == list(range(length)), f"row {r}: position_ids must restart per segment"
            is_pad_tail = k == len(segs) - 1 and not (weights[r, sl] > 0).any()
            if is_pad_tail:
                assert (ids[r, sl] == pad_id).all() and (labels[r, sl] == IGNORE).all()
                if not packed:
                    assert (rows["attention_mask"][r, sl] == 0).all()
            else:
                assert weights[r, start] == 0 and labels[r, start] == IGNORE, "first token of a document is unlabeled"
                docs.append((ids[r, sl].tolist(), weights[r, sl].tolist()))
                if not packed:
                    assert (rows["attention_mask"][r, sl] == 1).all()
            start += length
        if not packed:
            assert len(segs) in (1, 2), "unpacked rows hold one document"
    return docs


def same_documents(found, expected) -> None:
    """The two lists hold the same documents (tokens and weights), each as often: nothing lost or duplicated."""
    key = lambda d: (tuple(d[0]), tuple(np.float32(d[1]).tolist()))  # noqa: E731
    assert Counter(map(key, found)) == Counter(map(key, expected))


def reference_policy(doc, max_length: int, policy: str):
    """The documents that ``policy`` makes of one (ids, weights) document, before dropping unsupervised ones."""
    ids, weights = doc
    if len(ids) <= max_length:
        return [doc]
    if policy == "drop":
        return []
    if policy == "truncate":
        return [(ids[:max_length], weights[:max_length])]
    chunks = []
    for start in range(0, len(ids), max_length):
        w = list(weights[start : start + max_length])
        w[0] = 0.0
        chunks.append((ids[start : start + max_length], w))
    return chunks


def supervised(docs):
    return [d for d in docs if any(w > 0 for w in d[1])]
