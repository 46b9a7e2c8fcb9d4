"""``final_counts`` and ``check_accounting`` on hand-built counts: every manifest field computed by hand, and each
identity of weightprep/accounting.py broken by one unit reported by name (found by ``make mutate``: the build tests
only ever produce balanced counts)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from weightprep.accounting import check_accounting, final_counts
from weightprep.errors import AccountingError

SEQ_LEN = 64

#: A balanced build: 10 records accepted, 3 rejected; 2 documents dropped, 1 split into 3 parts, so 10 written;
#: 1000 tokens accepted, 200 removed, 800 written into 13 rows of 64 (832 slots: 32 pads); weight likewise.
RAW = Counter({
    "accepted": 10, "pieces": 25, "piece_tokens": 990, "documents": 10, "chat_documents": 4, "empty_documents": 1,
    "chat_straddling_tokens": 3,
    "documents_written": 10, "dropped_overlong": 1, "dropped_unsupervised": 1, "truncated": 2, "chunked": 1,
    "chunks": 3, "rows": 13, "tokens": 800, "supervised_tokens": 612, "total_weight": 440.12345674,
    "tokens_accepted": 1000, "tokens_dropped_overlong": 100, "tokens_dropped_unsupervised": 30,
    "tokens_truncated": 70, "weight_accepted": 500.37345674, "weight_unlabeled_first": 10.0, "weight_chunked": 2.5,
    "weight_dropped_overlong": 40.0, "weight_dropped_unsupervised": 0.0, "weight_truncated": 7.75,
})  # fmt: skip
REJECTED = Counter({"malformed_json": 2, "bad_weight": 1})


def test_final_counts_computes_every_field_by_hand():
    assert final_counts(RAW, REJECTED, SEQ_LEN) == {
        "records": 13,  # 10 accepted + 3 rejected
        "accepted": 10,
        "rejected": {"bad_weight": 1, "malformed_json": 2},
        "pieces": 25,
        "piece_tokens": 990,
        "documents": 10,
        "chat_documents": 4,
        "chat_history_conversations": 0,  # no conversation built as per-turn documents
        "chat_history_documents": 0,
        "chat_history_extra_tokens": 0,
        "chat_training_template_turns": 0,
        "chat_sanitized_control_tokens": 0,
        "chat_straddling_tokens": 3,  # passed through as counted
        "empty_documents": 1,
        "documents_written": 10,
        "dropped": {"overlong": 1, "unsupervised": 1},
        "truncated": 2,
        "chunked": 1,
        "chunks": 3,
        "rows": 13,
        "tokens": 800,
        "pad_tokens": 32,  # 13 rows * 64 - 800 tokens
        "supervised_tokens": 612,
        "total_weight": 440.123457,  # rounded to 6 places
        "fill_ratio": 0.961538,  # 800 / 832, rounded to 6 places
        "accounting": {
            "tokens": {
                "accepted": 1000, "dropped_overlong": 100, "dropped_unsupervised": 30, "cut_truncated": 70,
                "written": 800,
            },
            "weight": {
                "accepted": 500.37345674, "unlabeled_first": 10.0, "unlabeled_chunks": 2.5, "dropped_overlong": 40.0,
                "dropped_unsupervised": 0.0, "cut_truncated": 7.75, "written": 440.12345674,
            },
        },
    }  # fmt: skip


def test_final_counts_of_a_build_that_wrote_nothing():
    counts = final_counts(Counter({"accepted": 0}), Counter({"bad_weight": 2}), SEQ_LEN)
    assert counts["records"] == 2
    assert counts["rows"] == 0 and counts["pad_tokens"] == 0
    assert counts["fill_ratio"] == 0.0
    check_accounting(counts)


def test_balanced_counts_pass():
    check_accounting(final_counts(RAW, REJECTED, SEQ_LEN))


def test_full_rows_have_no_pad_and_pass():
    raw = RAW.copy()
    raw["rows"] = 12
    raw["tokens"] = raw["tokens_accepted"] = 12 * SEQ_LEN
    raw["tokens_accepted"] += 200  # what was removed, as above
    counts = final_counts(raw, REJECTED, SEQ_LEN)
    assert counts["pad_tokens"] == 0 and counts["fill_ratio"] == 1.0
    check_accounting(counts)


def _set(counts: dict[str, Any], path: str, delta: float) -> None:
    *keys, last = path.split(".")
    for key in keys:
        counts = counts[key]
    counts[last] += delta


#: (fields changed by one unit, the identity that must be reported: how its problem line starts)
BROKEN = [
    (["records"], "records read "),
    (["rejected.bad_weight"], "records read "),
    (["accepted", "records"], "documents 10 != accepted records 11"),
    (["documents_written"], "documents written "),
    (["dropped.overlong"], "documents written "),
    (["chunked"], "documents written "),
    (["chunks"], "documents written "),
    (["accounting.tokens.written", "tokens", "pad_tokens-"], "tokens written "),
    (["accounting.tokens.accepted"], "tokens written "),
    (["accounting.tokens.dropped_unsupervised"], "tokens written "),
    (["accounting.tokens.cut_truncated"], "tokens written "),
    (["tokens"], "tokens written "),  # the rows hold a token the accounting does not
    (["accounting.weight.written"], "weight written "),
    (["accounting.weight.accepted"], "weight written "),
    (["accounting.weight.unlabeled_first"], "weight written "),
    (["accounting.weight.unlabeled_chunks"], "weight written "),
    (["accounting.weight.cut_truncated"], "weight written "),
]


@pytest.mark.parametrize(("fields", "identity"), BROKEN, ids=[" ".join(f) for f, _ in BROKEN])
def test_each_identity_broken_by_one_unit_is_reported(fields, identity):
    counts = final_counts(RAW, REJECTED, SEQ_LEN)
    for field in fields:
        _set(counts, field.rstrip("-"), -1 if field.endswith("-") else +1)
    with pytest.raises(AccountingError) as raised:
        check_accounting(counts)
    assert len(raised.value.problems) == 1, raised.value.problems
    assert raised.value.problems[0].startswith(identity), raised.value.problems


def test_negative_pad_is_reported():
    counts = final_counts(RAW, REJECTED, SEQ_LEN)
    counts["pad_tokens"] = -1  # more tokens than the rows hold
    with pytest.raises(AccountingError) as raised:
        check_accounting(counts)
    assert raised.value.problems == ["pad tokens -1 < 0"]


def test_weight_within_float_rounding_passes_and_beyond_it_fails():
    counts = final_counts(RAW, REJECTED, SEQ_LEN)
    counts["accounting"]["weight"]["written"] *= 1 + 1e-12  # summed in another order
    check_accounting(counts)
    counts["accounting"]["weight"]["written"] += 1e-4
    with pytest.raises(AccountingError, match="weight written"):
        check_accounting(counts)


def test_every_broken_identity_is_reported_together():
    counts = final_counts(RAW, REJECTED, SEQ_LEN)
    for field in ("records", "documents_written", "tokens", "accounting.weight.written"):
        _set(counts, field, +1)
    counts["pad_tokens"] = -1
    with pytest.raises(AccountingError) as raised:
        check_accounting(counts)
    assert [p.split(" ")[0] + " " + p.split(" ")[1] for p in raised.value.problems] == [
        "records read", "documents written", "tokens written", "weight written", "pad tokens",
    ]  # fmt: skip
