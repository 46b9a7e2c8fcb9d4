"""The build's counts, and the identity they must satisfy before anything is published.

Every record read is accepted or rejected (by reason); every accepted record becomes one
document; every document is written, dropped (by reason) or cut into chunks; and the tokens
and weight written are what was accepted minus what each step removed::

    records             = accepted + sum(rejected)
    documents           = accepted - chat_history_conversations + chat_history_documents
    documents_written   = documents - sum(dropped) - chunked + chunks (+ documents_repeated)
    tokens written      = tokens accepted - tokens dropped (by reason) - tokens cut by truncation (+ repeated)
    weight written      = weight accepted - weight unlabeled (first tokens, chunks' first tokens)
                          - weight dropped (by reason) - weight cut by truncation (+ repeated)

The terms in parentheses are those of a build with sources (``weightprep.sources``): a source's epochs write
a document more than once (or, below one epoch, not at all), and the copies beyond one per document are counted
as repeated documents, tokens and weight, net (negative where records are left out; the records as ``repeats``
and ``omitted``). Such a build checks the identity for each source too (``source_counts``: no rows, which
hold several sources).

A conversation built as per-turn documents (``chat.history``) is ``chat_history_documents`` documents, not
one; their tokens beyond the conversation's last document are ``chat_history_extra_tokens`` (a cost, already
among the accepted tokens).

"Accepted" tokens and weight are computed from the tokenizer's output and the pieces' weights,
not from the assembled documents, so the identity checks assemble, mask, filter, pack and write
together. ``check_accounting`` runs on every build, just before the output is published; a
failure is an internal error (``AccountingError``) and nothing is written.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from weightprep.errors import AccountingError

__all__ = ["final_counts", "source_counts", "check_accounting", "dropped_warnings", "DROP_REASONS", "WARN_SHARE"]

DROP_REASONS = ("overlong", "unsupervised")
#: The terms of the token and weight identities that are not removed from the accepted ones (repeated: added).
_ADDED = ("accepted", "written", "repeated")
#: The share of documents or of weight that a build may lose before it warns (``dropped_warnings``).
WARN_SHARE = 0.05
#: Relative tolerance of the weight identity: float32 weights summed in float64, in different orders.
_WEIGHT_RTOL = 1e-9


def final_counts(counts: Counter[str], rejected: Counter[str], seq_len: int, *, repeats: bool = False) -> dict[str, Any]:
    """The manifest's ``counts`` from the build's raw counters (``repeats``: with the terms of epochs)."""
    rows = counts["rows"]
    accepted = counts["accepted"]
    tokens_removed = {f"dropped_{r}": counts[f"tokens_dropped_{r}"] for r in DROP_REASONS}
    weight_removed = {f"dropped_{r}": counts[f"weight_dropped_{r}"] for r in DROP_REASONS}
    final: dict[str, Any] = {
        "records": accepted + sum(rejected.values()),
        "accepted": accepted,
        "rejected": dict(sorted(rejected.items())),
        "pieces": counts["pieces"],
        "piece_tokens": counts["piece_tokens"],
        "documents": counts["documents"],
        "chat_documents": counts["chat_documents"],
        "chat_history_conversations": counts["chat_history_conversations"],
        "chat_history_documents": counts["chat_history_documents"],
        "chat_history_extra_tokens": counts["chat_history_extra_tokens"],
        "chat_training_template_turns": counts["chat_training_template_turns"],
        "chat_sanitized_control_tokens": counts["chat_sanitized_control_tokens"],
        "chat_straddling_tokens": counts["chat_straddling_tokens"],
        "empty_documents": counts["empty_documents"],
        "documents_written": counts["documents_written"],
        "dropped": {r: counts[f"dropped_{r}"] for r in DROP_REASONS},
        "truncated": counts["truncated"],
        "chunked": counts["chunked"],
        "chunks": counts["chunks"],
        "rows": rows,
        "tokens": counts["tokens"],
        "pad_tokens": rows * seq_len - counts["tokens"],
        "supervised_tokens": counts["supervised_tokens"],
        "total_weight": round(counts["total_weight"], 6),
        "fill_ratio": round(counts["tokens"] / (rows * seq_len), 6) if rows else 0.0,
        "accounting": {
            "tokens": {
                "accepted": counts["tokens_accepted"],
                **tokens_removed,
                "cut_truncated": counts["tokens_truncated"],
                "written": counts["tokens"],
            },
            "weight": {
                "accepted": counts["weight_accepted"],
                "unlabeled_first": counts["weight_unlabeled_first"],
                "unlabeled_chunks": counts["weight_chunked"],
                **weight_removed,
                "cut_truncated": counts["weight_truncated"],
                "written": counts["total_weight"],
            },
        },
    }
    if repeats:
        final["repeats"] = counts["repeats"]
        final["omitted"] = counts["omitted"]
        final["documents_repeated"] = counts["documents_repeated"]
        final["accounting"]["tokens"]["repeated"] = counts["tokens_repeated"]
        final["accounting"]["weight"]["repeated"] = counts["weight_repeated"]
    return final


def source_counts(counts: Counter[str], rejected: Counter[str]) -> dict[str, Any]:
    """One source's counts (``final_counts`` with its repeats, without rows: a row holds several sources)."""
    final = final_counts(counts, rejected, 1, repeats=True)
    for key in ("rows", "pad_tokens", "fill_ratio"):
        del final[key]
    return final


def check_accounting(counts: dict[str, Any]) -> None:
    """Raise ``AccountingError`` unless ``counts`` (a manifest's) satisfy the identity above."""
    c = counts
    problems = []
    rejected = sum(c["rejected"].values())
    if c["records"] != c["accepted"] + rejected:
        problems.append(f"records read {c['records']} != accepted {c['accepted']} + rejected {rejected}")
    conversations, per_turn = c["chat_history_conversations"], c["chat_history_documents"]
    if c["documents"] != c["accepted"] - conversations + per_turn:
        problems.append(
            f"documents {c['documents']} != accepted records {c['accepted']} - conversations built per turn "
            f"{conversations} + their documents {per_turn}"
        )
    repeated = c.get("documents_repeated", 0)
    expected_docs = c["documents"] - sum(c["dropped"].values()) - c["chunked"] + c["chunks"] + repeated
    if c["documents_written"] != expected_docs:
        problems.append(
            f"documents written {c['documents_written']} != documents {c['documents']} - dropped "
            f"{sum(c['dropped'].values())} - chunked {c['chunked']} + chunks {c['chunks']} + repeated {repeated} "
            f"= {expected_docs}"
        )
    t = c["accounting"]["tokens"]
    expected_tokens = t["accepted"] - sum(v for k, v in t.items() if k not in _ADDED) + t.get("repeated", 0)
    if t["written"] != expected_tokens or c["tokens"] != t["written"]:
        problems.append(f"tokens written {t['written']} != accepted {t['accepted']} - removed = {expected_tokens} ({t})")
    w = c["accounting"]["weight"]
    expected_weight = w["accepted"] - sum(v for k, v in w.items() if k not in _ADDED) + w.get("repeated", 0)
    if not math.isclose(w["written"], expected_weight, rel_tol=_WEIGHT_RTOL, abs_tol=1e-6):
        problems.append(f"weight written {w['written']!r} != accepted {w['accepted']!r} - removed = {expected_weight!r} ({w})")
    if c.get("pad_tokens", 0) < 0:
        problems.append(f"pad tokens {c['pad_tokens']} < 0")
    if problems:
        raise AccountingError(problems)


def dropped_warnings(counts: dict[str, Any], max_length: int) -> list[str]:
    """The build's losses worth a warning (a manifest's ``counts``; ``max_length``: the longest document kept
    whole): more than ``WARN_SHARE`` of the documents or of the accepted weight dropped as overlong, more than that
    of the weight cut by truncation, more than that of the documents dropped as unsupervised. Each names its fix.

    >>> c = {"documents": 100, "dropped": {"overlong": 24, "unsupervised": 0},
    ...      "accounting": {"weight": {"accepted": 1000.0, "dropped_overlong": 300.0, "cut_truncated": 0.0}}}
    >>> dropped_warnings(c, 512)[0].split(":")[0]
    '24.0% of the documents (24 of 100) and 30.0% of the weight were dropped as longer than 512 tokens'
    """
    documents = counts["documents"]
    weight = counts["accounting"]["weight"]
    accepted = weight["accepted"]
    share = lambda part, whole: part / whole if whole else 0.0  # noqa: E731
    warnings = []
    overlong = counts["dropped"].get("overlong", 0)
    overlong_weight = weight.get("dropped_overlong", 0.0)
    if share(overlong, documents) > WARN_SHARE or share(overlong_weight, accepted) > WARN_SHARE:
        warnings.append(
            f"{100 * share(overlong, documents):.1f}% of the documents ({overlong:,} of {documents:,}) and "
            f"{100 * share(overlong_weight, accepted):.1f}% of the weight were dropped as longer than {max_length:,} "
            "tokens: --overlong chunk keeps them as chunks, --overlong truncate keeps their start, a larger "
            "--seq-len (or --max-length) keeps them whole"
        )
    truncated = weight.get("cut_truncated", 0.0)
    if share(truncated, accepted) > WARN_SHARE:
        warnings.append(
            f"{100 * share(truncated, accepted):.1f}% of the weight was cut off by truncation ({counts['truncated']:,} "
            f"document(s) longer than {max_length:,} tokens): --overlong chunk keeps it, or a larger --seq-len"
        )
    unsupervised = counts["dropped"].get("unsupervised", 0)
    if share(unsupervised, documents) > WARN_SHARE:
        warnings.append(
            f"{100 * share(unsupervised, documents):.1f}% of the documents ({unsupervised:,} of {documents:,}) were "
            "dropped as unsupervised (no token of weight > 0): check the pieces' weights, or --role-weights for chats"
        )
    return warnings
