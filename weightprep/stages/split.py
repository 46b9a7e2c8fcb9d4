"""Stage 2b — split: assign whole records to ``train`` or ``validation``, before anything is tokenized.

A record's split depends only on its content and ``split.seed``: the key of a record is an 8-byte BLAKE2b
digest of the seed and its pieces (each text's UTF-8 bytes and its weight, length-prefixed), read as an
unsigned integer (a conversation: of ``chat\\0`` and its canonical JSON, ``Chat.canonical``: keys sorted, no spaces,
characters as themselves in UTF-8). A record goes to ``validation`` when its key is below a cut:

- ``--validation-fraction F``: the cut is ``F * 2**64``, so each record lands there with probability F,
  independently of the others;
- ``--validation-records N``: the cut is just above the N-th smallest key of the input, found by a first pass
  over the records (read and validated, not tokenized; conversations are not rendered, their key needs none, so
  with ``--skip-invalid`` one that the chat stage then rejects keeps its place among the N smallest keys, and
  ``validation`` holds one record fewer). Identical records share a key and so a split; if copies of one record straddle the N-th key
  they all go to ``validation`` (N is then exceeded by those copies).

Nothing about the cut depends on block size, thread count or executor, and identical records (duplicates) are
never in both splits.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable

import numpy as np

from weightprep.batches import Records
from weightprep.errors import UsageError

__all__ = ["TRAIN", "VALIDATION", "record_keys", "fraction_cut", "smallest_keys", "cut_from_keys", "split_records"]

TRAIN = "train"
VALIDATION = "validation"
_FULL = 1 << 64


def record_keys(records: Records, seed: int) -> np.ndarray:
    """uint64[R]: the split key of each record (see the module docstring)."""
    keys = np.empty(len(records), dtype=np.uint64)
    prefix = struct.pack("<q", seed)
    offsets = records.piece_offsets.tolist()
    weights = records.piece_weights.tolist()
    texts = records.texts
    chats = records.chats
    for r in range(len(records)):
        h = hashlib.blake2b(prefix, digest_size=8)
        if chats is not None and chats[r] is not None:  # a conversation, rendered or not: its canonical JSON
            h.update(b"chat\0" + chats[r].canonical.encode("utf-8", "surrogatepass"))  # type: ignore[union-attr]
        for p in range(offsets[r], offsets[r + 1]):
            data = texts[p].encode("utf-8", "surrogatepass")
            h.update(struct.pack("<Qd", len(data), weights[p]))
            h.update(data)
        keys[r] = int.from_bytes(h.digest(), "little")
    return keys


def fraction_cut(fraction: float) -> int:
    """The cut of ``--validation-fraction``: keys below it go to validation."""
    return min(_FULL, int(fraction * _FULL))


def smallest_keys(blocks: Iterable[Records], n: int, seed: int) -> tuple[int, np.ndarray]:
    """The number of records in ``blocks`` and the ``n`` smallest of their keys (fewer if they hold fewer).
    Mergeable: the ``n`` smallest of several such key sets are the ``n`` smallest of their union."""
    smallest = np.zeros(0, dtype=np.uint64)
    total = 0
    for records in blocks:
        total += len(records)
        smallest = np.concatenate([smallest, record_keys(records, seed)])
        if len(smallest) > n:
            smallest = np.partition(smallest, n - 1)[:n]
    return total, smallest


def cut_from_keys(total: int, keys: Iterable[int], n: int) -> int:
    """The cut of ``--validation-records N``: one above the N-th smallest key of every record, from the record
    count and smallest keys of every part of the input (``smallest_keys``)."""
    if total <= n:
        raise UsageError(
            f"--validation-records {n} would leave no training records: the input holds {total} valid record(s); "
            "ask for fewer, or use --validation-fraction"
        )
    smallest = np.sort(np.fromiter(keys, dtype=np.uint64))[:n]
    return int(smallest.max()) + 1


def split_records(records: Records, cut: int, seed: int) -> dict[str, Records]:
    """``records`` as ``{"train": ..., "validation": ...}`` by their keys and the cut."""
    if cut >= _FULL:
        to_validation = np.ones(len(records), dtype=bool)
    else:
        to_validation = record_keys(records, seed) < np.uint64(cut)
    return {TRAIN: records.where(~to_validation), VALIDATION: records.where(to_validation)}

