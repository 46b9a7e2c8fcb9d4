"""Names and numbers shared by the build pipeline, the shards and the trainer.

One place for the ignore index, the column names and the shard format version, so that
no module spells ``-100`` or ``"weights"`` on its own.
"""

from __future__ import annotations

__all__ = [
    "IGNORE_INDEX",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "READABLE_VERSIONS",
    "INPUT_IDS",
    "LABELS",
    "WEIGHTS",
    "POSITION_IDS",
    "SEQ_LENGTHS",
    "ATTENTION_MASK",
    "PACKED_COLUMNS",
    "UNPACKED_COLUMNS",
    "EVAL_SOURCE",
    "MANIFEST_NAME",
    "TURNS_NAME",
]

#: Label value that PyTorch's cross-entropy (and every HF model) ignores.
IGNORE_INDEX = -100

#: Written into the manifest; the trainer refuses shards of another format. Version 3: a build with sources
#: holds ``validation_<name>`` splits (a version-2 reader would train without evaluating them) and the default chat
#: build of DeepSeek-R1-style templates is TRL's training render. Version 2 shards hold nothing version 3 reads
#: differently, so they are still read; version 1 is refused.
FORMAT_NAME = "weightprep-shards"
FORMAT_VERSION = 3
READABLE_VERSIONS = (2, 3)

INPUT_IDS = "input_ids"
LABELS = "labels"
WEIGHTS = "weights"
POSITION_IDS = "position_ids"
SEQ_LENGTHS = "seq_lengths"
ATTENTION_MASK = "attention_mask"

#: Columns of a packed row, in the order they are written.
PACKED_COLUMNS = (INPUT_IDS, LABELS, WEIGHTS, POSITION_IDS, SEQ_LENGTHS)
#: Unpacked rows carry the same columns plus a 0/1 attention mask.
UNPACKED_COLUMNS = (*PACKED_COLUMNS, ATTENTION_MASK)

#: Not in any shard: the trainer's tag of an evaluation row with the index of its source (``validation_NAME``
#: split), so one pass and one all-reduce give the loss of every source and of their union.
EVAL_SOURCE = "eval_source"

#: File beside the shards that records what the build did.
MANIFEST_NAME = "weightprep_manifest.json"

#: Beside the shards of a build with chat records (each split's directory): one JSON line per row holding
#: conversation tokens, ``{"row": i, "turns": [[start, length, role, message index], ...]}``.
TURNS_NAME = "chat_turns.jsonl"
