"""Mutation check of the modules whose bugs lose or misplace data: does some test fail on each small change?

    python tools/mutate.py [--module stages/pack.py ...] [--jobs 2] [--out docs/mutations.md]

Each mutant is one small change to one function of one module (a comparison flipped, ``+`` for ``-``, a constant
off by one, ``and`` for ``or``, a condition negated, a call statement dropped, ``side="right"`` for ``"left"``).
The tests are imported once; each mutant runs in a forked child that swaps the mutated function's code object
into the live function (``func.__code__``), so every reference to it, ``from m import f`` ones included, runs the
mutant, then runs that module's tests (``MODULES``) with ``-x``. A failing run kills the mutant; a run past its
time limit (``--timeout-factor`` x the unmutated run) counts as killed too (an endless loop). A mutant that every
test survives is listed, unless ``EQUIVALENT`` explains why it cannot change behaviour.

What it does not see: code run in other processes (the spawn pools of ``--executor local``, Ray actors, the CLI
run as a subprocess) runs unmutated, so only in-process tests kill mutants; module-level code is not mutated.
Cost: one unmutated run of each module's tests, then one child per mutant (about a second each when a test
fails early, the whole test run when none does). Not part of CI; run it before stopping on a change to these
modules (``make mutate``) and keep the survivors at zero or explained in ``docs/mutations.md``.
"""

from __future__ import annotations

import argparse
import ast
import copy
import datetime
import importlib
import os
import signal
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: module (relative to weightprep/) -> the test files that exercise it in-process
MODULES: dict[str, list[str]] = {
    "stages/assemble.py": ["tests/test_properties.py", "tests/test_tokenize.py", "tests/test_build_output.py"],
    "stages/mask.py": ["tests/test_stages.py", "tests/test_properties.py", "tests/test_build_output.py"],
    "stages/pack.py": [
        "tests/test_stages.py", "tests/test_properties.py", "tests/test_build_output.py", "tests/test_chat_turns.py",
    ],
    "stages/filter.py": [
        "tests/test_stages.py", "tests/test_properties.py", "tests/test_build_output.py", "tests/test_bad_input.py",
    ],
    "stages/spans.py": ["tests/test_spans.py", "tests/test_chat.py"],
    # the per-block chain (assemble, mask, filter) and the columnar batches between stages: where, concat, merge
    "blocks.py": [
        "tests/test_stages.py", "tests/test_properties.py", "tests/test_build_output.py", "tests/test_bad_input.py",
        "tests/test_chat.py", "tests/test_chat_turns.py", "tests/test_chat_history.py", "tests/test_chat_align.py",
        "tests/test_chat_control.py",
    ],
    "batches.py": [
        "tests/test_stages.py", "tests/test_properties.py", "tests/test_build_output.py", "tests/test_chat_turns.py",
        "tests/test_interleave.py", "tests/test_sources.py", "tests/test_split.py",
    ],
    # which tokenizer a build runs: the class AutoTokenizer chose, remembered; fastokens' early load
    "tokenizer_class.py": ["tests/test_tokenizer_files.py"],
    # a directory read without transformers (special and added tokens, chat templates), and when chat may use it
    "tokenizer.py": ["tests/test_tokenizer_files.py", "tests/test_chat_jinja.py", "tests/test_tokenizer_snapshot.py"],
    # what transformers built for a directory, kept and read back without it
    "tokenizer_snapshot.py": ["tests/test_tokenizer_snapshot.py"],
    # transformers' chat-template file run alone, or transformers' own module
    "stages/chat_jinja.py": ["tests/test_chat_jinja.py"],
    "prefetch.py": ["tests/test_tokenize.py"],
    "stages/chat.py": [
        "tests/test_chat.py", "tests/test_chat_control.py", "tests/test_chat_turns.py", "tests/test_chat_history.py",
        "tests/test_chat_prefixes.py", "tests/test_chat_render.py", "tests/test_chat_align.py", "tests/test_chat_fallbacks.py",
        "tests/test_chat_skeleton.py",
    ],
    # prefix renders cut from one render of the whole conversation (split out of chat.py)
    "stages/chat_prefixes.py": ["tests/test_chat_prefixes.py", "tests/test_chat.py", "tests/test_chat_skeleton.py"],
    # a conversation's renders filled in from its shape's skeleton
    "stages/chat_skeleton.py": ["tests/test_chat_skeleton.py", "tests/test_chat.py", "tests/test_chat_prefixes.py"],
    "stages/chat_templates.py": ["tests/test_chat_history.py", "tests/test_chat_real_templates.py"],
    # split out of chat.py (issue 32): the turn-token rule, where a turn's weight starts, the history modes
    "stages/chat_control.py": [
        "tests/test_chat_control.py", "tests/test_chat_real_templates.py", "tests/test_tokenizer_files.py",
        "tests/test_tokenizer_snapshot.py", "tests/test_chat_render.py",
    ],
    "stages/chat_spans.py": ["tests/test_chat_spans.py", "tests/test_chat_real_templates.py", "tests/test_chat_align.py"],
    "stages/chat_history.py": ["tests/test_chat_history.py", "tests/test_chat_fallbacks.py", "tests/test_chat.py"],
    "stages/chat_common.py": ["tests/test_chat.py", "tests/test_chat_align.py"],
    # step 5 for a block of documents at once: the weight of a token, straddling ones included (issue 32)
    "stages/chat_align.py": ["tests/test_chat_align.py", "tests/test_chat.py"],
    # lines and their bytes: the block cutter, the decompressor and each block's bytes behind it
    "stages/read.py": [
        "tests/test_read.py", "tests/test_decompress.py", "tests/test_hostile_fuzz.py", "tests/test_hostile_inputs.py",
        "tests/test_interleave.py", "tests/test_storage.py", "tests/test_inputs.py",
    ],
    # the other kinds of file and the other tools' shapes (docs/inputs.md)
    "stages/json_array.py": [
        "tests/test_json_array_scan.py", "tests/test_inputs.py", "tests/test_build_memory.py", "tests/test_plan_array.py",
    ],
    # a JSON array's cuts at plan time: chunk summaries chained, then the splitter from each target
    "distribute/plan_array.py": ["tests/test_plan_array.py", "tests/test_json_array_scan.py", "tests/test_inputs.py"],
    # the plan's byte ranges: JSON Lines cut after newlines, arrays after separators (guessed or exact), mixed parts
    "distribute/plan.py": ["tests/test_plan_array.py", "tests/test_inputs.py", "tests/test_distribute.py",
                           "tests/test_interleave.py"],  # fmt: skip
    "stages/text.py": ["tests/test_inputs.py"],
    "stages/shapes.py": ["tests/test_shapes.py", "tests/test_formats.py"],
    "stages/columns.py": ["tests/test_shapes.py", "tests/test_parquet.py", "tests/test_source_checks.py"],
    # test_chat_turns: turn rows across parts; test_sources: mixed parts (several byte ranges a part)
    "distribute/merge.py": ["tests/test_distribute.py", "tests/test_chat_turns.py", "tests/test_sources.py"],
    # test_executors: the workers' own code (_run_local, the Ray actor's class) called in this process
    "distribute/executors.py": ["tests/test_executors.py", "tests/test_distribute.py"],
    # a part's stages in their threads: the rows written in their own thread while the next are made
    "distribute/job.py": [
        "tests/test_build_output.py", "tests/test_stages.py", "tests/test_bad_input.py", "tests/test_split.py",
        "tests/test_distribute.py", "tests/test_chat_turns.py", "tests/test_sources.py", "tests/test_interleave.py",
    ],
    # a source's weight and epochs, the interleave of mixed parts (Hypothesis over weights and epochs)
    "sources.py": ["tests/test_source_checks.py", "tests/test_sources.py"],
    "distribute/mixed.py": ["tests/test_interleave.py", "tests/test_sources.py"],
    "accounting.py": [
        "tests/test_accounting.py", "tests/test_hostile_inputs.py", "tests/test_split.py", "tests/test_build_output.py",
        "tests/test_chat_history.py",
    ],
    # the bytes to and from stores: literal names, ranged reads, retries, redaction, fresh reads for recovery.
    # The moto-server tests (test_storage_guarantees, test_storage_server) hold the same promises against a real
    # store, but take minutes: each survivor would cost that; the memory:// tests here run in seconds
    "storage.py": ["tests/test_storage.py", "tests/test_publish.py", "tests/test_publish_local.py", "tests/test_read.py"],
    # the one rule that masks URL secrets in every artifact and message
    "redact.py": ["tests/test_redact.py"],
    # the commit protocol, local (renames) and in a store (journal, non-colliding names, finish or undo)
    "stages/publish.py": ["tests/test_publish_local.py", "tests/test_publish.py", "tests/test_storage.py"],
    "stages/write.py": [
        "tests/test_publish_local.py", "tests/test_build_output.py", "tests/test_stages.py", "tests/test_chat_turns.py",
        "tests/test_publish.py",
    ],
    "stages/validate.py": [
        "tests/test_bad_input.py", "tests/test_hostile_fuzz.py", "tests/test_hostile_inputs.py", "tests/test_formats.py",
    ],
    "train/loss.py": [
        "tests/test_train_loss.py", "tests/test_train_attention.py", "tests/test_train_kernel.py",
        "tests/test_train_trainer.py",
    ],
}

_ONCE = "set at most once per call (one branch), into a Counter made by that call: = and += agree"
_JINJA_LINE = "Jinja numbers lines from 1 and splits them at \\r\\n, \\r and \\n, which splitlines splits too: "
_PAIRS = "a MixedPart has one source per segment (plan_mixed makes them in pairs): strict changes nothing"
_END_MARKER = "run_mixed never reads the end marker's segment (it goes on to the next read when records is None)"
_SOURCE_BITS = "2 << 40, 1 << 41 or 1 << 39 still keep the sources apart: a read number would need 2**39 documents in a part"
_ONE_READY = "one ready block is in order already (t, then read number, ascending): merging it is concatenating it"
_MARGIN = "the margin stays above six standard deviations: only how often the exact second pass runs changes, not the keys"
_TAKE_EDGE = "take = 0, 1 or len(every) in the other branch gives the same smallest keys"
_ZERO_GRAPH = "every term is x * 0.0: adding or subtracting one gives the same value and the same zero gradients"
_CACHE_KEY = "a cache key only: dicts equal but for their key order get their own entries, each rendered alike"
_NAMES_TEST = "_names_ok is read only as `not _names_ok(...)`: None refuses as False does"
_JOINED = ("the search of every string joined only decides whether to search string by string: a token in one string "
           "is in the join too, and a match across two sends it to the per-string search, which finds none")

_IGNORE_ERRORS = "differs only when a removal fails (a permission error on a leftover), which the tests, run as root, cannot make"
_FINALIZED = ("weakref.finalize removes the staging directory when the StoreOutput goes, at the end of the failed build "
              "(CPython frees it there): the explicit removal only makes it sooner")
_NOT_ALIVE = "callers read it as `not _alive(...)`: None says dead as False does"
_LOADABLE_NAMES = ("only loadable files' names reach it, each '/'-free or one split deep: the same order within a split "
                   "(dataset_info.json before state.json, also alphabetically), top-level files after every split's")
_UNBOUNDED = "an Arrow file's reads are unbounded by chunk: 2**61, 2**62 or 2**63 bytes all exceed any read pyarrow asks for"
_DEEP_BLOCK = "_check_deep keeps only the one record's texts and weights: the stand-in block's line and offset name nothing it returns"
_LINE_BASE = "a line that gives a row is a JSON object, two or more characters other than whitespace: moving a line's count by one character (its first, or the newline before it) keeps it above 0, and a blank line stays at or below 0"
_ONE_BLOCK = "pyarrow's block size only decides whether a block is read as one: at least the block's length it is, and below it a record across blocks is refused, so the exact path gives the same records (slower)"
_LAST_PART = "the last part of a '/'-split is the same however many splits are allowed"

#: reasons shared by several mutants
_COPY = "a copy of the same values (astype with copy=True): the same ids, weights and turns"
_FIRST_COUNT = ("the block's counts are a new Counter and its conversations are counted before its pieces: nothing "
                "to add to yet, = and += give the same")
_EMPTY_SLICE = "w and t are empty there (no characters): any slice of them is empty too"
_TO_STEPS = ("None hands the conversation to the renders' steps, which give the same runs (tested equal on every "
             "template of TRL and of the real corpus: test_weights_from_the_cuts_lengths_are_the_renders); only slower")
_SPAN_SOURCE = ("exact only says whether the spans came from the ids' bytes, so that align skips the check of "
                "tokenizers' offsets: both sources give these tokens the same spans, and the check passes on them")
_PART_COUNTS = ("a document's training and sanitized counts are never read: joined gives its conversation's "
                "ChatTokens the conversation's own")
_BINCOUNT = ("bincount's result is as long as its largest index + 1 whatever minlength asks beyond that, and only its "
             "first n counts are read")
_PRECHECK = ("a quick test for any token across a change: the exact selection under it (across) finds the same tokens, "
             "a looser test only runs it more often")
_AT_EDGE = ("a token that only begins or ends at a change holds characters of one weight: its heaviest character is its "
            "first, with the same weight and turn, and it is not counted as straddling")
_NO_SOLID = "the sentinel for no byte yet is only compared with ',' and '[' (44, 91): -1, -2 and 0 are neither"
_PARITY = "a parity: adding or taking away was_inside (0 or 1) leaves the same remainder of 2"
_PAST_CLOSE = "only whitespace follows the closing ']' (refused otherwise just above): no bracket or comma lies past it"
_SUSPECT = "a quick filter of the separators to walk back from: a looser one walks back from more, with the same outcome"
_ONE_REJECT = "a too_long block is one reject whatever its n_lines: validate.parse_block reads only its data and too_long"
_AFTER_CLOSE = ("after the closing ']' only whitespace follows (the scanner refuses anything else) and what is kept "
                "of it is never handed on: the reader's end reads scanner.closed, not what is pending")
_NO_GAP_AT_0 = "the head starts at the file's start, whitespace or a BOM then the '[': no gap (a ',') is at offset 0"
_READ_SIZE = "the size of the reads after the first only: the offset found does not depend on it (test_find_is_bytes_find_across_reads)"
_ODD_CASE = ("a chunk's summary after an odd run of backslashes differs from the even one only where its first quote "
             "follows a run from the chunk's start (carried=1 changes nothing elsewhere, and nothing without quotes): "
             "computing it in more cases gives the same summary")
_THREADS = "how many threads summarize the chunks: the cuts do not depend on it (tests/test_plan_array.py runs 1-3)"
_TARGET_1 = ("a target of 1 looks from byte 0 on: whitespace, a BOM or the '[' there, never a separator, so looking from "
             "byte 1 gives the same cut (and depth 0 there sends it to the sequential pass either way)")
_CLOSED = "once the array has closed before a separator, no later target finds one either: its cuts are the same"
_SKIPPED_AGAIN = ("the cut just made is past its target and every earlier one: the skip rule (cuts[-1] >= target) moves "
                  "the index past them again")
_STRICT = "the zipped sequences are made the same length just above: strict only guards that"
_PLACEHOLDER = "the index of a segment before numbering: replaced in order just below (dataclasses.replace)"
_STEP = ("the size of the reads only: the blocks do not depend on it (tests/test_json_array_scan.py and "
         "tests/test_inputs.py cut at every size), and read.block_bytes and read.max_line_bytes are at least 1024, "
         "so the guard against 0 never acts")
_SCRATCH = "a work array's size: grown when smaller than the chunk and used as its first len(data) items, so a larger one gives the same"
#: mutant id (``--list`` prints them) -> why no test can tell it from the original (an equivalent mutant)
_ROOM = ("how much room a window's arrays get when they grow (a guess from the batch's tokens per document, or half "
         "as much again): the same values go in whatever the room; only how often they grow changes")
_ROOM_FULL = "growing an array that is exactly full: the same values copied into a larger one"
_SAME_COPY = "a window's column already of its dtype, copied (astype copy=True) instead of viewed: the same values"
_VIEW_OR_COPY = ("a window of exactly the rest of the batch, taken as views or copied into the held window: the same "
                 "documents in the same order either way")

_DISTINCT = ("a plain shape's key needs its messages' content kinds and key orders told apart (one to one with "
             "scan_messages' keys, tests/test_chat_skeleton.py): any codes serve that stay distinct, as these do")
_EITHER_COPY = ("which way a chunk's rows are copied, by its documents' slices or through one token index: the same "
                "rows either way (tests/test_stages.py runs the rows' property tests both ways)")
_FIRST_CHARACTER = ("a turn's span one character later only where a render shares no first character with the whole "
                    "one (the empty render, or a refused one): a control token there is moved back to its start "
                    "(the boundary inside a token), and any other character is no header's or end's token")
_PROBE_LENGTHS = "the probes' contents all have one length (a one-digit number each): any message's length is the same"
_BACKWARDS = ("a bound that goes backwards leaves the turn before it empty, raised to the bound before or not: that "
              "turn's content is not found in it and the shape is skipped either way")
_SHAPES_END = ("every probe shape ends with a user message and an answer (PROBE_SHAPES): the message before the last "
               "is never an answer, so leaving it out of the count changes nothing")
_FALSY = "its only callers read it as a condition (``and``): None is as false as False"
_SAME_LENGTHS = "the three lists are made from arrays of one length: strict or not, zip pairs them all"
EQUIVALENT: dict[str, str] = {
    # twenty-first session: chat_control.py's first whole run
    "stages/chat_control.py:_lcp:int+1:i = 0": _FIRST_CHARACTER,
    "stages/chat_control.py:turn_structure:int+1:bounds = [0]": _FIRST_CHARACTER,
    "stages/chat_control.py:turn_structure:binop:bounds[k] = text.find(messages[k - 1]['content']) + len(messages[k - 1]['content'])#2": _PROBE_LENGTHS,
    "stages/chat_control.py:turn_structure:int+1:bounds[k] = text.find(messages[k - 1]['content']) + len(messages[k - 1]['content'])#1": _PROBE_LENGTHS,
    "stages/chat_control.py:turn_structure:int-1:bounds[k] = text.find(messages[k - 1]['content']) + len(messages[k - 1]['content'])#1": _PROBE_LENGTHS,
    "stages/chat_control.py:turn_structure:int+1:inner = any((m['role'] == 'assistant' for messages, *_ in read for m in messages[:-1]))": _SHAPES_END,
    "stages/chat_control.py:turn_structure:int+1:if k < len(messages) - 1 or not inner:": _SHAPES_END,
    "stages/chat_control.py:turn_structure:int+1:bounds.append(0)": (
        "a placeholder: every bound appended is set before it is read (the next message's, or the text's end)"),
    "stages/chat_control.py:turn_structure:compare0:if m.start() < b < m.end():": (
        "a bound at a token's start is moved to that same start: no change"),
    "stages/chat_control.py:turn_structure:int+1:for k in range(1, len(bounds)):": _BACKWARDS,
    "stages/chat_control.py:turn_structure:int-1:bounds[k] = max(bounds[k], bounds[k - 1])": _BACKWARDS,
    "stages/chat_control.py:turn_structure:bool:ats = [turn.find(m['content']) for turn, m in zip(turns, messages, strict=True)]": (
        "a turn per message, made from the messages: strict or not, zip pairs them all"),
    # twenty-first session: chat_history.py's first whole run
    "stages/chat_history.py:HistoryModes._has_training:return_none:return False": _FALSY,
    "stages/chat_history.py:HistoryModes._has_training:return_none:return False#1": _FALSY,
    "stages/chat_history.py:HistoryModes._has_training:bool:return False": (
        "with --chat-template training (original set) the renderer's template is TRL's training one, whose "
        "{% generation %} tags place every answer: runs never refuses it with generation_prompt_mismatch (the one "
        "caller in documents), and _turn returns through _spliced before its own call"),
    # twenty-first session: batches.py's first run
    "batches.py:Records.where:bool:pieces = [p for s, n in zip(starts, counts.tolist(), strict=True) for p in range(s, s + n)]": (
        "the records' starts and piece counts come from one index: strict or not, zip pairs them all"),
    "batches.py:Documents.concat:int-1:if len(parts) == 1:": (
        "one part concatenated alone is a copy equal to it in every column: only the shortcut is lost"),
    "batches.py:_ranges:int+1:prev_last = np.concatenate([[0], (starts + lengths - 1)[nonempty][:-1]])": (
        "the first range's step is overwritten by its start (step[0]) whatever prev_last's first value: the first "
        "non-empty range always starts at slot 0"),
    # twentieth session: a part's rows written in their own thread (job.PartJob._run)
    "distribute/job.py:PartJob._run:int+1:packers = {name: Packer(seq_len, state.specials.pad, packed=packed, window=cfg.pack.window, reuse...": (
        "four sets of rows' arrays in turn instead of three: a chunk's arrays are used again later still, as safely"),
    "distribute/job.py:PartJob._run:bool:docs, batch_counts = document_batch(subset, state.tokenize, state.specials, cfg, labels=False)": (
        "the documents' labels made for the queue as well: the rows make theirs from ids and weights (rows_from_bins) "
        "and never read the documents'; the same bytes, only slower"),
    "distribute/job.py:PartJob._run:boolop:if rejects is not None and block_rejects:": (
        "a strict build raises its block's first reject before the block reaches here: block_rejects is empty "
        "wherever rejects is None"),
    # twentieth session: a chunk's rows from its documents' slices (pack.rows_from_bins, pack._Segments)
    "stages/pack.py:rows_from_bins:compare0:if n_rows and len(order) and (int(used.sum()) >= _SLICE_TOKENS * len(order)):": _EITHER_COPY,
    "stages/pack.py:rows_from_bins:binop:if n_rows and len(order) and (int(used.sum()) >= _SLICE_TOKENS * len(order)):": _EITHER_COPY,
    "stages/pack.py:_Segments.__init__:bool:self.segments = list(zip(sources, lengths, is_pad, strict=True))": _SAME_LENGTHS,
    "stages/pack.py:Packer._next_buffers:binop:self._turn = (self._turn + 1) % len(self._buffers)#1": (
        "the sets of arrays taken in turn backwards: each is used again only after all the others, as forwards"),
    # twentieth session: the plain conversations' plans (chat_skeleton.plain_shape, ChatRenderer._learn_plain)
    "stages/chat.py:ChatRenderer._joins:return_none:return self._joinable": _JOINED,
    "stages/chat.py:ChatRenderer._learn_plain:compare0:if shape is None or shape[0] in self._plain or len(self._plain) >= MAX_SHAPES:#2": (
        "the most plans a renderer keeps, one more or not: a shape without a plan takes the steps, which give the same runs"),
    "stages/chat_skeleton.py:plain_shape:binop:key += (role, (0 if not content else 1 if content.isspace() else 2) + (3 if first == 'content' el...": _DISTINCT,
    "stages/chat_skeleton.py:plain_shape:compare0:key += (role, (0 if not content else 1 if content.isspace() else 2) + (3 if first == 'content' el...": _DISTINCT,
    "stages/chat_skeleton.py:plain_shape:int+1:key += (role, (0 if not content else 1 if content.isspace() else 2) + (3 if first == 'content' el...#3": _DISTINCT,
    # sixteenth session: a window's documents copied in as their batches arrive (pack._Window)
    'stages/pack.py:Packer.add:compare0:if not held.count and len(docs) - a >= self.window:': _VIEW_OR_COPY,
    'stages/pack.py:_Window._column:binop:grown = np.empty(max(guess, 0 if array is None else len(array) * 3 // 2, end), dtype=dtype)': _ROOM,
    'stages/pack.py:_Window._column:binop:grown = np.empty(max(guess, 0 if array is None else len(array) * 3 // 2, end), dtype=dtype)#1': _ROOM,
    'stages/pack.py:_Window._column:binop:guess = end + int((end - at) / max(docs, 1) * (self.size - self.count - docs) * 1.1)': _ROOM,
    'stages/pack.py:_Window._column:binop:guess = end + int((end - at) / max(docs, 1) * (self.size - self.count - docs) * 1.1)#1': _ROOM,
    'stages/pack.py:_Window._column:binop:guess = end + int((end - at) / max(docs, 1) * (self.size - self.count - docs) * 1.1)#4': _ROOM,
    'stages/pack.py:_Window._column:binop:guess = end + int((end - at) / max(docs, 1) * (self.size - self.count - docs) * 1.1)#5': _ROOM,
    'stages/pack.py:_Window._column:binop:guess = end + int((end - at) / max(docs, 1) * (self.size - self.count - docs) * 1.1)#6': _ROOM,
    "stages/pack.py:_Window._column:compare0:if array is None or len(array) < end or (not np.can_cast(dtype, array.dtype, 'safe')):#1": _ROOM_FULL,
    'stages/pack.py:_Window._column:int+1:grown = np.empty(max(guess, 0 if array is None else len(array) * 3 // 2, end), dtype=dtype)': _ROOM,
    'stages/pack.py:_Window._column:int+1:grown = np.empty(max(guess, 0 if array is None else len(array) * 3 // 2, end), dtype=dtype)#1': _ROOM,
    'stages/pack.py:_Window._column:int+1:grown = np.empty(max(guess, 0 if array is None else len(array) * 3 // 2, end), dtype=dtype)#2': _ROOM,
    'stages/pack.py:_Window._column:int+1:guess = end + int((end - at) / max(docs, 1) * (self.size - self.count - docs) * 1.1)': _ROOM,
    'stages/pack.py:_Window._column:int-1:grown = np.empty(max(guess, 0 if array is None else len(array) * 3 // 2, end), dtype=dtype)': _ROOM,
    'stages/pack.py:_Window._column:int-1:grown = np.empty(max(guess, 0 if array is None else len(array) * 3 // 2, end), dtype=dtype)#1': _ROOM,
    'stages/pack.py:_Window._column:int-1:guess = end + int((end - at) / max(docs, 1) * (self.size - self.count - docs) * 1.1)': _ROOM,
    'stages/pack.py:_Window.documents:bool:return self._arrays[name][:self.tokens].astype(self._dtypes[name], copy=False)': _SAME_COPY,
    "stages/pack.py:_Window.put:binop:self._column('turns', np.zeros(at, np.int32), 0, at, b - a)": _ROOM,
    'stages/pack.py:_Window.put:binop:self._column(name, values[t0:t1], at, end, b - a)': _ROOM,
    "stages/chat_skeleton.py:Sym.__add__:return_none:return str.__add__(self, other)": "the look is noted first: a render that joined a placeholder to a non-string keeps no skeleton, whatever the join returned",
    "stages/chat_skeleton.py:Sym.__radd__:return_none:return NotImplemented": "the look is noted first: the render keeps no skeleton, whatever the reflected join returned",
    "stages/chat_skeleton.py:Sym.__radd__:drop:_looked()": "reached only for a left operand that is no str and whose own + refused (a number, an undefined): NotImplemented then raises TypeError, and a render that raises keeps no skeleton (a str subclass on the left, Markup, joins it itself and is seen by the mark check)",
    "stages/chat_skeleton.py:scan_messages:int+1:key.append((k, v) if k == 'role' else (k, 0 if not v else 1 if v.isspace() else 2))#2": "a label of the shape key: 3 for 2 keeps the three kinds of string (empty, whitespace only, other) apart",
    # eleventh session: a file's first record (the plan cuts a file of conversations finer)
    "stages/read.py:first_record:int+1:want = min(4 * want, FIRST_RECORD_BYTES)":
        "reads growing x5 instead of x4 up to the same limit: fewer reads, the same record found or not",
    "stages/read.py:first_record:int-1:want = min(4 * want, FIRST_RECORD_BYTES)":
        "reads growing x3 instead of x4 up to the same limit: more reads, the same record found or not",
    # eleventh session: the plan's cut of a file of conversations
    "distribute/plan.py:_file_plan:compare0:if size <= chat_part_bytes(part_bytes) or is_whole(path, text_sample_by):":
        "a file of exactly chat_part_bytes has no target below its size either way (one part): the early return "
        "only spares the read of its first record",
    # eleventh session: the turns file's lines of a chunk at once
    "stages/write.py:turn_lines:bool:texts = [f'[{a}, {b}, {names[c]}, {m}]' for a, b, c, m in zip(starts.tolist(), lengths.tolist(), ...":
        "strict=False: the four lists are one array each of the same spans, equal lengths by construction",
    'stages/write.py:turn_lines:bool:return [f"""{{"row": {first_row + int(rows[a])}, "turns": [{\', \'.join(texts[a:b])}]}}\\n""" for a,...':
        "strict=False: cuts[:-1] and cuts[1:] are one list less its last and its first item, of equal lengths",
    "stages/spans.py:TokenSpans.__init__:int-1:size = max(vocab.values(), default=-1) + 1":
        "an empty vocabulary then has one id without bytes (length -1): every id is still unknown, so the same None",
    "distribute/merge.py:merge_results:bool:for (part, result) in zip(parts, results, strict=True):":
        "run_parts returns exactly one result per part: strict changes nothing on equal lengths",
    "distribute/merge.py:merge_results:bool:(out_dir / name).mkdir(parents=True, exist_ok=True)":
        "out_dir is the build's staging directory, which holds parts/ (made before any part ran): no parent to make",
    "distribute/merge.py:merge_results:drop:rejects.close()":
        "the file object's last reference goes when merge_results returns, and CPython closes (flushes) it then",
    "distribute/merge.py:merge_results:drop:f.close()":
        "the file object's last reference goes when merge_results returns, and CPython closes (flushes) it then",
    "stages/mask.py:labels_from_weights:bool:return np.where(weights > 0, input_ids, np.int32(IGNORE_INDEX)).astype(np.int32, copy=False)":
        "np.where made a new array: astype copies it or not, the values are the same",
    "stages/filter.py:filter_documents:augassign:counts[f'tokens_{reason}'] += len(before.input_ids) - len(after.input_ids)":
        "each reason is removed at most once per call, into a Counter made by that call: = and += agree",
    "stages/filter.py:filter_documents:augassign:counts[f'weight_{reason}'] += float(before.weights.sum(dtype=np.float64) - after.weights.sum(dtyp...":
        "each reason is removed at most once per call, into a Counter made by that call: = and += agree",
    "stages/filter.py:filter_documents:augassign:counts['dropped_overlong'] += n_long": _ONCE,
    "stages/filter.py:filter_documents:augassign:counts['truncated'] += n_long": _ONCE,
    "stages/filter.py:filter_documents:augassign:counts['chunked'] += n_long": _ONCE,
    "stages/filter.py:filter_documents:augassign:counts['chunks'] += int(parts[long].sum())": _ONCE,
    "stages/filter.py:filter_documents:augassign:counts['dropped_unsupervised'] += n_unsup": _ONCE,
    "stages/spans.py:_byte_level_alphabet:int+1:printable = [*range(ord('!'), ord('~') + 1), *range(ord('¡'), ord('¬') + 1), *range(ord('®'), ord...#2":
        'range to 0x100 adds 256 -> chr(256), but byte 0 is then given chr(256) too and the inverted dict keeps 0',
    'stages/spans.py:_byte_level_alphabet:int-1:for b in range(256):':
        'byte 255 (ÿ) is in the printable range: the loop never changes it',
    "train/loss.py:weighted_lm_loss:bool:inputs = {'input_ids': batch[INPUT_IDS], 'labels': batch[LABELS], 'token_weights': batch[WEIGHTS]...":
        "the patched forward always reaches _weighted_forward, which sets use_cache=False itself before the body runs",
    'train/loss.py:_weighted_forward:binop:log_probs = hidden.new_zeros(mask.shape, dtype=torch.float32) + zero':
        "zero is x * 0.0, a 0 connected to the graph: zeros - 0 and zeros + 0 are the same zeros, with zero gradients",
    "train/loss.py:_weighted_forward:binop:zero = hidden.sum() * 0.0 + weight.sum() * 0.0 + (bias.sum() * 0.0 if bias is not None else 0.0)":
        _ZERO_GRAPH,
    "train/loss.py:_weighted_forward:binop:zero = hidden.sum() * 0.0 + weight.sum() * 0.0 + (bias.sum() * 0.0 if bias is not None else 0.0)#1":
        _ZERO_GRAPH,
    'stages/spans.py:TokenSpans.__init__:int+1:size = max(vocab.values(), default=-1) + 1':
        'only an empty vocabulary reaches the default: [None] * -1 == [None] * 0',
    'stages/spans.py:TokenSpans.__init__:int+1:size = max(vocab.values(), default=-1) + 1#1':
        'one more id without bytes (length -1) at the end: that id is unknown either way',
    'stages/spans.py:TokenSpans.__init__:int+1:self._lengths = np.array([-1 if s is None else len(s) for s in surfaces], dtype=np.int64)':
        'every use of a length is `< 0` or np.maximum(., 0): -2 and -1 agree',
    "stages/spans.py:TokenSpans._run:int+1:lengths = np.full(len(ids), -1, dtype=np.int64)":
        'every use of a length is `< 0` or np.maximum(., 0): -2 and -1 agree',
    "stages/shapes.py:_needs_work:return_none:return False":
        "None is as false as False for every caller (`any`, `not`)",
    "stages/shapes.py:_needs_work:int+1:if isinstance(m.get('content'), list) or m.get('weight', 0) is None:":
        "the default only stands in for a missing weight: 0 and 1 are both not None",
    "stages/spans.py:TokenSpans._run:compare0:if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= len(self._lengths)):":
        "the masked lookup then runs for id 0 too: with every id in the vocabulary it gives the plain lookup's lengths",
    "stages/spans.py:TokenSpans._run:int+1:if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= len(self._lengths)):":
        "the masked lookup then runs for id 0 too: with every id in the vocabulary it gives the plain lookup's lengths",
    "stages/spans.py:TokenSpans._run:int+1:holes = len(lengths) > 0 and int(lengths.min()) < 0":
        "a single token without bytes: its document's byte sum is -1, never a text's size, so it is None either way; "
        "the others have no token",
    "stages/spans.py:TokenSpans._run:compare0:holes = len(lengths) > 0 and int(lengths.min()) < 0#1":
        "a zero-length token then counts as a possible hole: np.maximum(lengths, 0) is lengths, and no length is < 0",
    "stages/spans.py:TokenSpans._run:int+1:holes = len(lengths) > 0 and int(lengths.min()) < 0#1":
        "a zero-length token then counts as a possible hole: np.maximum(lengths, 0) is lengths, and no length is < 0",
    "stages/spans.py:TokenSpans._run:bool:ids = ids.astype(np.intp, copy=False)": _COPY,
    "stages/spans.py:TokenSpans.spans:int+1:cuts = (offsets[d:e + 1] - offsets[d]).tolist()": (
        "cuts is read at k and k + 1 for the run's documents only: an element past them is never read"
    ),
    "stages/spans.py:TokenSpans._misspelled:compare0:long = np.flatnonzero(lens > _WORD)": (
        "a token of exactly _WORD bytes has no bytes past its word: its byte-by-byte part compares nothing"
    ),
    "stages/spans.py:_first_words:int+1:return grid.view('<u8').reshape(-1)": (
        "numpy reads any negative size in reshape as the one to infer: -2 is -1"
    ),
    "stages/spans.py:TokenSpans._run:bool:text_bytes = np.frombuffer(b''.join((e for e, good in zip(encoded, ok, strict=True) if good)), dt...":
        'encoded and ok both have len(texts) entries: strict never raises',
    "distribute/merge.py:_ranges:bool:out.extend(zip(part.segments, result['inputs'], index, result['rejects_files'], strict=True))":
        "a mixed part's job returns one input record and one rejects entry per segment: strict changes nothing",
    "stages/chat.py:render_chats:bool:results.update(zip(batch, located, strict=True))":
        "tokens_batch returns one result per conversation it is given: strict never raises",
    "distribute/executors.py:_run_here:bool:threading.Thread(target=run, name=f'weightprep-part-{part.index:05d}', daemon=True).start()":
        "daemon decides only whether the interpreter may exit while the part still runs (the map's final wait cut "
        "short by a second Ctrl-C): no in-process test ends its interpreter",
    "distribute/executors.py:LocalExecutor._stop:drop:pool.terminate_workers()":
        "Python 3.14's branch (hasattr(pool, 'terminate_workers')): never run on the 3.11 that CI and this machine run",
    "distribute/executors.py:LocalExecutor._stop:bool:pool.shutdown(wait=True, cancel_futures=True)#1":
        "no future is queued when _stop runs: after a broken pool or at close every future is done, and on a map left "
        "early the pool's processes were killed first, so the broken pool has already failed the queued ones",
    "distribute/executors.py:RayExecutor.__init__:bool:self._owned = False":
        "never read before start sets it (close returns first while no Ray is held)",
    "distribute/executors.py:RayExecutor.__init__:int+1:self._size = 1":
        "never read before start sets it (the actors are made in map, after start)",
    "distribute/executors.py:RayExecutor.__init__:int-1:self._size = 1":
        "never read before start sets it (the actors are made in map, after start)",
    "sources.py:copies:int+1:if cut == 0:":
        "a cut of 1 adds a copy only to the record whose epoch key is 0: one split key in 2**64 (SplitMix64 is a "
        "bijection)",
    "distribute/executors.py:LocalExecutor.__init__:int+1:self._processes = 1":
        "never read before start: the pool is used only after start set it (to the pool's size)",
    "distribute/executors.py:LocalExecutor.__init__:int-1:self._processes = 1":
        "never read before start: the pool is used only after start set it (to the pool's size)",
    "stages/chat.py:_Template.prepare:int+1:if kwargs is not self._kwargs[0]:":
        "the cache of converted keyword arguments then never hits: they are converted again, to the same values",
    "stages/chat.py:ChatRenderer._compiled:compare0:n = exc.lineno if 0 < exc.lineno <= len(lines) else len(lines)":
        _JINJA_LINE + "lineno is never 0",
    "stages/chat.py:ChatRenderer._compiled:compare1:n = exc.lineno if 0 < exc.lineno <= len(lines) else len(lines)":
        _JINJA_LINE + "at lineno == len(lines) the clamp gives len(lines) too",
    "stages/chat.py:ChatRenderer._compiled:boolop:problem = str(exc.message or exc).rstrip('.')":
        "Jinja's syntax errors always have a message, and one from a template compiled from a string is "
        "'translated': str(exc) is exc.message",
    'distribute/mixed.py:_source_blocks:bool:for (j, (seg, source)) in enumerate(zip(part.segments, part.sources, strict=True)):':
        _PAIRS,
    'distribute/mixed.py:_interleaved_reads:bool:totals = [sum((seg.size for seg, s in zip(part.segments, part.sources, strict=True) if s == i)) f...':
        _PAIRS,
    'distribute/mixed.py:_interleaved_reads:int+1:yield (s, -1, None, [], 1.0, math.inf)':
        _END_MARKER,
    'distribute/mixed.py:_interleaved_reads:int-1:yield (s, -1, None, [], 1.0, math.inf)':
        _END_MARKER,
    'distribute/mixed.py:_Interleave.__init__:int+1:self.order = 0':
        "every read number shifted by one: their order is the same",
    'distribute/mixed.py:_Interleave.add:int+1:self.pending.append((t, np.full(len(docs), s, dtype=np.int64) * (1 << 40) + seq, docs, times))':
        _SOURCE_BITS,
    'distribute/mixed.py:_Interleave.add:int+1:self.pending.append((t, np.full(len(docs), s, dtype=np.int64) * (1 << 40) + seq, docs, times))#1':
        _SOURCE_BITS,
    'distribute/mixed.py:_Interleave.add:int-1:self.pending.append((t, np.full(len(docs), s, dtype=np.int64) * (1 << 40) + seq, docs, times))#1':
        _SOURCE_BITS,
    'distribute/mixed.py:_Interleave.release:boolop:if len(ready) > 1 and (order[1:] < order[:-1]).any():':
        _ONE_READY,
    'distribute/mixed.py:_Interleave.release:compare0:if len(ready) > 1 and (order[1:] < order[:-1]).any():':
        _ONE_READY,
    'distribute/mixed.py:_Interleave.release:int-1:if len(ready) > 1 and (order[1:] < order[:-1]).any():':
        _ONE_READY,
    'distribute/mixed.py:_Interleave.release:compare0:if len(ready) > 1 and (order[1:] < order[:-1]).any():#1':
        "order is a permutation: no two neighbours are equal, so <= is <",
    'distribute/mixed.py:run_mixed:int-1:keys = [(train, p) for p in range(passes)] + [(n, 0) for n in (names or ())[1:]]':
        "[0:] adds (\"train\", 0) a second time; the dict keeps one packer for it",
    'distribute/mixed.py:run_mixed:compare0:sink.put(((train, p), docs.take(chosen) if len(chosen) < len(docs) else docs))':
        "taking every document gives the same documents",
    'distribute/mixed.py:run_mixed:int-1:t = before + (np.arange(n, dtype=np.float64) + 0.5) / max(n, 1) * (after - before)':
        "max(n, 1) only guards n = 0, where the arange is empty anyway",
    'distribute/mixed.py:run_mixed:int-1:if source.epochs != 1:':
        "with epochs 1 every copy count is 1: _count_repeats adds only zeros, read as 0 downstream",
    'distribute/mixed.py:run_mixed:drop:w.close()':
        "the rejects writers are closed (flushed) when run_mixed returns and their last reference goes (CPython)",
    'distribute/mixed.py:_kept:int+1:return min(count, math.ceil(fraction * count + 6 * math.sqrt(count) + 16))':
        _MARGIN,
    'distribute/mixed.py:_kept:int-1:return min(count, math.ceil(fraction * count + 6 * math.sqrt(count) + 16))':
        _MARGIN,
    'distribute/mixed.py:_kept:int+1:return min(count, math.ceil(fraction * count + 6 * math.sqrt(count) + 16))#1':
        _MARGIN,
    'distribute/mixed.py:_kept:int-1:return min(count, math.ceil(fraction * count + 6 * math.sqrt(count) + 16))#1':
        _MARGIN,
    'distribute/mixed.py:part_epoch_keys:compare0:smallest = np.sort(np.partition(every, take - 1)[:take]) if 0 < take < len(every) else np.sort(ev...':
        _TAKE_EDGE,
    'distribute/mixed.py:part_epoch_keys:compare1:smallest = np.sort(np.partition(every, take - 1)[:take]) if 0 < take < len(every) else np.sort(ev...':
        _TAKE_EDGE,
    'distribute/mixed.py:part_epoch_keys:int+1:smallest = np.sort(np.partition(every, take - 1)[:take]) if 0 < take < len(every) else np.sort(ev...':
        _TAKE_EDGE,
    'distribute/mixed.py:part_epoch_keys:int-1:smallest = np.sort(np.partition(every, take - 1)[:take]) if 0 < take < len(every) else np.sort(ev...':
        "a partition at index take also puts exactly the take smallest keys before it",
    "sources.py:_source:bool:ok = False":
        "the name's problem is always appended on that path, so every caller raises ConfigError and throws the "
        "returned Source away (Source() accepts any name)",
    "stages/chat.py:ChatRenderer._empty:bool:key = ('', '') if chat.tools is None and chat.template_kwargs is None else (json.dumps(chat.tools...":
        _CACHE_KEY,
    "stages/chat.py:ChatRenderer._empty:bool:key = ('', '') if chat.tools is None and chat.template_kwargs is None else (json.dumps(chat.tools...#1":
        _CACHE_KEY,
    "stages/chat.py:ChatRenderer.runs:int-1:owners = assistants if len(tagged_spans) == len(assistants) else [assistants[-1]] * len(tagged_sp...":
        "that branch runs only when every assistant weighs the same (in_order): any assistant gives that weight",
    "stages/chat.py:ChatRenderer.runs:bool:for ((a, b), i) in zip(tagged_spans, owners, strict=True):":
        "owners is assistants where the lengths are equal, else a list of len(tagged_spans): always equal lengths",
    "stages/chat.py:ChatRenderer.runs:compare0:claimed[k] = a < b":
        "claimed is read only for blocks with a < b (stray): an empty block's flag is never read",
    "stages/chat.py:ChatRenderer.runs:int+1:probes = [self.render(self.prepare(chat, [*messages[:i], {**m, 'content': p}]), i + 1)[0] for p i...":
        "a probe conversation has i + 1 messages: rendering its first i + 2 renders all of them, as i + 1 does",
    "stages/chat_prefixes.py:compile_tracked:int+1:loop.body.insert(0, probe.set_lineno(loop.lineno))":
        "the probe (an if without body) only makes Jinja give the loop a loop object, which it does for a read of "
        "`loop` anywhere in the body; it writes nothing wherever it stands",
    "stages/chat_prefixes.py:_prefix_shape:boolop:if env.is_async or env.finalize is not None or env.autoescape is not False:":
        "the one environment the chat stage compiles with (transformers' sandbox) is synchronous, with no finalize "
        "and no autoescape: all three tests are false, so `and` is false as `or` is",
    "stages/chat_prefixes.py:_prefix_shape:bool:if any((True for _ in tree.find_all((nodes.Extends, nodes.Include, nodes.Import, nodes.FromImport...":
        "the environment has no loader: extends, include and import raise at render, cut or not (template_error "
        "either way); a block renders in place, and its names are checked with the rest of the tree",
    "stages/chat_prefixes.py:_prefix_shape:boolop:if loop.else_ or loop.test is not None or loop.recursive:":
        "each alone is harmless or caught: a filtered loop iterates a generator, not the messages (no start is "
        "tracked: no cuts); else writes only for no message (never cut); recursion needs a bare `loop(...)`, "
        "which _names_ok refuses",
    "stages/chat_prefixes.py:_names_ok:return_none:return False": _NAMES_TEST,
    "stages/chat_prefixes.py:_names_ok:return_none:return False#1": _NAMES_TEST,
    "stages/chat_prefixes.py:_names_ok:return_none:return False#2": _NAMES_TEST,
    "stages/chat_prefixes.py:_names_ok:return_none:return False#3": _NAMES_TEST,
    "stages/chat.py:ChatRenderer._trails_eos:int+1:one, two = (self.render(prepared, k)[0] for k in (1, 2))#2":
        "the probe conversation has two messages: rendering its first three renders both, as two does",
    "stages/chat.py:ChatRenderer._joins:negate:if self._joinable is None:": _JOINED,
    "stages/chat.py:ChatRenderer._joins:compare0:if self._joinable is None:": _JOINED,
    "stages/chat.py:ChatRenderer._joins:not:self._joinable = not any((SEPARATOR in t for t in self.control_tokens()[0]))":
        _JOINED,
    "stages/chat.py:ChatRenderer._joins:compare0:self._joinable = not any((SEPARATOR in t for t in self.control_tokens()[0]))":
        _JOINED,
    "stages/chat.py:ChatRenderer._joins:int+1:self._joinable = not any((SEPARATOR in t for t in self.control_tokens()[0]))":
        _JOINED,
    "stages/chat_control.py:first_turn_token:negate:if joinable:": _JOINED,
    "stages/chat.py:ChatRenderer._marked_offsets:int+1:enc, shift = (backend.encode('\\n' + piece, add_special_tokens=False), 1) if i else (None, 0)#1":
        "for the first piece enc is None, so the next line encodes it again and sets shift to 0 whatever it was",
    "stages/chat.py:ChatRenderer._marked_offsets:int+1:ends += [at + max(e - shift, 0) for _, e in enc.offsets[drop:]]":
        "tokenizers gives each token of a non-empty piece at least its first character (SentencePiece's prepended "
        "'\u2581' included: (0, 1)), and after the newline dropped at least one past it: no end is below 1 there",
    "stages/chat.py:ChatRenderer._token_spans:bool:for (d, enc) in zip(missing, tokenize.encodings([texts[d] for d in missing]), strict=True):":
        "encodings gives one encoding per text: strict changes nothing on equal lengths",
    'stages/chat.py:ChatRenderer._char_turns:int+1:for k in range(len(messages) + 1):':
        'a render of more messages than the conversation has is the whole conversation: the extra boundary is never read',
    'stages/chat.py:ChatRenderer._turns:compare0:if a is not None and b is not None and (b > a):#2':
        'b == a: turns[a:b] is empty, so writing it changes nothing',
    "stages/chat.py:ChatRenderer._runs_of_cuts:compare0:if end < a:": _TO_STEPS,
    "stages/chat.py:ChatRenderer._runs_of_cuts:compare0:if m['role'] != 'assistant' or not i or start > end or (not text.startswith(generation, a)):#1": _TO_STEPS,
    "stages/chat.py:ChatRenderer._runs_of_cuts:compare0:if start < a:": _TO_STEPS,
    "stages/chat.py:ChatRenderer._runs_of_cuts:int+1:turns.append(0)": (
        "the cuts end where the whole render does (chat_prefixes.Tracker.cuts refuses any other end): the run after "
        "the last message starts at the text's end and holds no character"
    ),
    "stages/chat.py:ChatRenderer._align_exact:bool:return align_runs(char_base, joined_runs, tok_base, ids, starts, ends, self._bos, within=True)": (
        "within=False clips the ends to their documents: TokenSpans' spans (the only ones aligned here) end within them"
    ),
    "stages/chat.py:ChatRenderer._sanitized:int+1:found = self._spans.spans([clean], ids, np.array([0, len(ids)])) if self._spans.supported else [N...": _SPAN_SOURCE,
    "stages/chat.py:ChatRenderer._sanitized:bool:return (clean, kept, ids, *found[0], True)": _SPAN_SOURCE,
    "stages/chat.py:ChatRenderer._sanitized:bool:return (clean, kept, ids, *self._marked_offsets(text, ids), False)": _SPAN_SOURCE,
    "stages/chat.py:ChatRenderer._token_spans:binop:if len(good) == e - d:": (
        "with every document good the other branch selects them all (take all True, base the same counts, nothing "
        "dropped): the same arrays, copied"
    ),
    "stages/chat.py:ChatRenderer._token_spans:binop:dropped = np.cumsum(np.where(ok, 0, lengths)) - np.where(ok, 0, lengths)": (
        "dropped is read at the good documents only, where the term added or taken away is 0"
    ),
    "stages/chat.py:ChatRenderer._token_spans:bool:for (k, two, straddling) in zip(good.tolist(), got.double_bos.tolist(), got.straddling.tolist(), ...": (
        "align_runs says one double_bos and one straddling count per document aligned: strict changes nothing on "
        "equal lengths"
    ),
    "stages/chat.py:ChatRenderer._token_spans:bool:found[d + k] = (ids[x:y], *self._spans.spans([texts[d + k]], ids[x:y], np.array([0, y - x]))[0], ...": (
        "align refuses a document with two leading BOS whether it checks its offsets first or not, and the spans "
        "from its ids' bytes pass that check"
    ),
    "stages/chat.py:ChatRenderer._token_spans:int+1:found[d + k] = ChatTokens(ids[x:y], weights[x:y], none, turns[x:y], None, 0, 0, straddling, batch...": _PART_COUNTS,
    "stages/chat.py:ChatRenderer._token_spans:int+1:found[d + k] = ChatTokens(ids[x:y], weights[x:y], none, turns[x:y], None, 0, 0, straddling, batch...#1": _PART_COUNTS,
    'stages/chat.py:ChatRenderer.tokens_batch:bool:for (d, found) in zip(plain, spans, strict=True):':
        '_token_spans returns one result per text: strict changes nothing on equal lengths',
    'stages/chat.py:render_chats:return_none:return records':
        'Chats calls render_chats only for records that hold conversations (it returns the others itself)',
    "stages/read.py:_RangeReader.readinto:compare0:if self._left <= 0:":
        "at _left == 0 the read goes on into an empty view: the file gives 0 bytes, _left stays 0, 0 is returned",
    "stages/read.py:_RangeReader.readinto:return_none:return 0":
        "_HashingReader, its only reader, takes what it returns as `n or 0`: None is 0",
    "stages/read.py:_RangeReader.readinto:int+1:self._left -= n or 0":
        "n is 0 only at the file's end, after which every read gives 0 again: _left only gates reads",
    "stages/read.py:expand_inputs:int+1:found = [c for c in _files(p) if not c.rsplit('/', 1)[-1].startswith('.') and c.endswith(_DIR_SUF...":
        "rsplit('/', 2)[-1] is still the last component of the path",
    "stages/read.py:_head:compare0:if n >= HEAD_BYTES:":
        "at n == HEAD_BYTES the loop goes on appending empty slices (p[:0]): the same bytes",
    "distribute/executors.py:RayExecutor.close:bool:self._ray, self._owned = (None, False)":
        "_owned is read only in close, after _ray is set, and start sets both: with _ray None, close returns first",
    # storage.py, stages/publish.py, redact.py (seventh session)
    "stages/write.py:empty_shard:int+1:return _ShardSet(directory, arrow_schema(seq_len, packed=packed), 1).empty_shard()":
        "the rows per shard of a shard that gets no row: the empty shard is the same file",
    "stages/write.py:empty_shard:int-1:return _ShardSet(directory, arrow_schema(seq_len, packed=packed), 1).empty_shard()":
        "the rows per shard of a shard that gets no row: the empty shard is the same file",
    "stages/write.py:_metadata:bool:return [('dataset_info.json', (json.dumps(info, indent=2, sort_keys=True) + '\\n').encode()), ('st...#1":
        "state.json's dict is built with its keys in sorted order: sorting them again changes nothing",
    "redact.py:_mask_params:int+1:out.append(part.split('=', 1)[0] + '=' + MASK)": "the first part of a split at '=' is the same however many splits are allowed",
    'stages/publish.py:Output.__init__:bool:self.tmp.mkdir(parents=True, exist_ok=True)': "prepare_output made out's parent: the temporary directory beside out needs no parents",
    'stages/publish.py:Output.__init__:bool:shutil.rmtree(candidate, ignore_errors=True)': _IGNORE_ERRORS,
    'stages/publish.py:Output.abort:bool:shutil.rmtree(self.tmp, ignore_errors=True)': _IGNORE_ERRORS,
    'stages/publish.py:Output.publish:bool:(self.tmp / self.PLAN).unlink(missing_ok=True)': "plan.json is always there: __init__ wrote it",
    'stages/publish.py:Output.publish:bool:directory.mkdir(parents=True, exist_ok=True)': "a split's directory is one level below the temporary directory, which exists",
    'stages/publish.py:Output.publish:bool:shutil.rmtree(discard, ignore_errors=True)': _IGNORE_ERRORS,
    'stages/publish.py:StoreOutput.abort:bool:shutil.rmtree(self.tmp, ignore_errors=True)': _FINALIZED,
    'stages/publish.py:StoreOutput.abort:drop:shutil.rmtree(self.tmp, ignore_errors=True)': _FINALIZED,
    "stages/publish.py:_alive:int+1:return stat.rsplit(')', 1)[1].split()[0] != 'Z'": "/proc/PID/stat holds one ')' unless the command name holds one: the state field is the same",
    'stages/publish.py:_alive:return_none:return False': _NOT_ALIVE,
    "stages/publish.py:_loadable_order:int+1:name = rel.rsplit('/', 1)[-1]": _LOADABLE_NAMES,
    "stages/publish.py:_loadable_order:int+1:return (0 if '/' in rel else 1, _LOADABLE.index(name) if name in _LOADABLE else -1, rel)": _LOADABLE_NAMES,
    "stages/publish.py:_loadable_order:int+1:return (0 if '/' in rel else 1, _LOADABLE.index(name) if name in _LOADABLE else -1, rel)#1": _LOADABLE_NAMES,
    "stages/publish.py:_loadable_order:int+1:return (0 if '/' in rel else 1, _LOADABLE.index(name) if name in _LOADABLE else -1, rel)#2": _LOADABLE_NAMES,
    "stages/publish.py:_loadable_order:int-1:name = rel.rsplit('/', 1)[-1]": _LOADABLE_NAMES,
    "stages/publish.py:_loadable_order:int-1:name = rel.rsplit('/', 1)[-1]#1": _LOADABLE_NAMES,
    "stages/publish.py:_loadable_order:int-1:return (0 if '/' in rel else 1, _LOADABLE.index(name) if name in _LOADABLE else -1, rel)": _LOADABLE_NAMES,
    "stages/publish.py:_loadable_order:int-1:return (0 if '/' in rel else 1, _LOADABLE.index(name) if name in _LOADABLE else -1, rel)#1": _LOADABLE_NAMES,
    'stages/publish.py:prepare_output:drop:out.parent.mkdir(parents=True, exist_ok=True)': "Output makes its temporary directory beside out with parents=True, which makes the parent too",
    'stages/publish.py:recover_stale:bool:shutil.rmtree(p, ignore_errors=True)': _IGNORE_ERRORS,
    "stages/publish.py:recover_stale:compare0:stale.append((m['kind'] != 'old', p))": "each leftover is handled on its own (an .old put back or removed, a .tmp kept or removed): their order changes nothing",
    "stages/publish.py:remove_output:int+1:for url in sorted((u for u in objects if u.rsplit('/', 1)[-1] in _LOADABLE), key=lambda u: _loada...": _LAST_PART,
    'storage.py:download_tree:bool:target.parent.mkdir(parents=True, exist_ok=True)': "fsspec's get_file makes the local parent directories itself",
    'storage.py:download_tree:drop:target.parent.mkdir(parents=True, exist_ok=True)': "fsspec's get_file makes the local parent directories itself",
    "storage.py:find:boolop:return {_url(fs, name, url): int(info.get('size') or 0) for name, info in sorted(found.items())}": "every filesystem's listing gives a file its size: the fallback for a missing one is never used",
    "storage.py:find:int+1:return {_url(fs, name, url): int(info.get('size') or 0) for name, info in sorted(found.items())}": "every filesystem's listing gives a file its size: the fallback for a missing one is never used",
    "stages/validate.py:_nonblank_lines:int+1:solid = np.concatenate([[0], np.cumsum(~_SPACE[data], dtype=np.int64)])": _LINE_BASE,
    "stages/validate.py:_nonblank_lines:int+1:starts = np.concatenate([[0], ends[:-1] + 1])": _LINE_BASE,
    "stages/validate.py:_nonblank_lines:int+1:starts = np.concatenate([[0], ends[:-1] + 1])#2": _LINE_BASE,
    "stages/validate.py:_nonblank_lines:int-1:starts = np.concatenate([[0], ends[:-1] + 1])#1": _LINE_BASE,
    "stages/validate.py:_check_deep:bool:return (list(zip(records.texts, records.piece_weights.tolist(), strict=True)), None)": "a record's texts and weights are one per piece: strict changes nothing on equal lengths",
    "stages/validate.py:_nonblank_lines:int+1:keep = solid[ends] - solid[starts] > 0": _LINE_BASE,
    'stages/validate.py:_parse_fast:binop:table = pa_json.read_json(io.BytesIO(block.data), read_options=pa_json.ReadOptions(block_size=max...': _ONE_BLOCK,
    'stages/validate.py:_parse_fast:int+1:table = pa_json.read_json(io.BytesIO(block.data), read_options=pa_json.ReadOptions(block_size=max...': _ONE_BLOCK,
    'stages/validate.py:_parse_fast:int-1:table = pa_json.read_json(io.BytesIO(block.data), read_options=pa_json.ReadOptions(block_size=max...': _ONE_BLOCK,
    'stages/validate.py:_parse_fast:int+1:table = pa_json.read_json(io.BytesIO(block.data), read_options=pa_json.ReadOptions(block_size=max...#1': _ONE_BLOCK,
    'stages/validate.py:_parse_fast:int-1:table = pa_json.read_json(io.BytesIO(block.data), read_options=pa_json.ReadOptions(block_size=max...#1': _ONE_BLOCK,
    'stages/validate.py:_parse_fast:int+1:table = pa_json.read_json(io.BytesIO(block.data), read_options=pa_json.ReadOptions(block_size=max...#2': _ONE_BLOCK,
    'stages/validate.py:_parse_fast:int-1:table = pa_json.read_json(io.BytesIO(block.data), read_options=pa_json.ReadOptions(block_size=max...#2': _ONE_BLOCK,
    'stages/validate.py:_parse_fast:compare0:if len(offsets) > 1 and (np.diff(offsets) == 0).any():': "np.diff of one offset (no row) is empty: any() is False either way",
    'stages/validate.py:_parse_fast:int-1:if len(offsets) > 1 and (np.diff(offsets) == 0).any():': "np.diff of one offset (no row) is empty: any() is False either way",
    'stages/validate.py:_parse_fast:augop:offsets -= first': "a list column read from JSON and combined starts its offsets at 0: first is 0",
    "stages/validate.py:_check_deep:int+1:records = _parse_fast(Block('<line>', 1, 1, raw + b'\\n'))": _DEEP_BLOCK,
    "stages/validate.py:_check_deep:int-1:records = _parse_fast(Block('<line>', 1, 1, raw + b'\\n'))": _DEEP_BLOCK,
    "stages/validate.py:_check_deep:int+1:records = _parse_fast(Block('<line>', 1, 1, raw + b'\\n'))#1": _DEEP_BLOCK,
    "stages/validate.py:_check_deep:int-1:records = _parse_fast(Block('<line>', 1, 1, raw + b'\\n'))#1": _DEEP_BLOCK,
    "stages/write.py:_ShardSet._open_next:int+1:self._shards.append((path, 0))": "every opened shard is closed (by the next _open_next or by close), which sets its rows",
    "stages/write.py:_ShardSet.empty_shard:int-1:return self._shards[-1][0]": "called only on a new set (the module's empty_shard): its one shard is the first and the last",
    "blocks.py:_chat_documents:bool:return Documents(input_ids=ids.astype(np.int32, copy=False), weights=weights.astype(np.float32, c...": _COPY,
    "blocks.py:_chat_documents:bool:return Documents(input_ids=ids.astype(np.int32, copy=False), weights=weights.astype(np.float32, c...#1": _COPY,
    "blocks.py:_chat_documents:bool:return Documents(input_ids=ids.astype(np.int32, copy=False), weights=weights.astype(np.float32, c...#2": _COPY,
    "blocks.py:_chat_documents:augassign:counts['weight_accepted'] += float(weights.sum(dtype=np.float64))": _FIRST_COUNT,
    "blocks.py:_chat_documents:augassign:counts['empty_documents'] += int((lengths == 0).sum())": _FIRST_COUNT,
    "stages/chat_align.py:char_runs:int+1:return Runs(np.zeros(0, dtype=np.int64), w[:0], t[:0])#1": _EMPTY_SLICE,
    "stages/chat_align.py:char_runs:int+1:return Runs(np.zeros(0, dtype=np.int64), w[:0], t[:0])#2": _EMPTY_SLICE,
    "stages/chat_align.py:char_runs:bool:return Runs(starts.astype(np.int64, copy=False), w[starts], t[starts])": _COPY,
    "stages/chat_align.py:align_runs:int+1:found = np.bincount(bounds, minlength=n + 1)": _BINCOUNT,
    "stages/chat_align.py:align_runs:int-1:found = np.bincount(bounds, minlength=n + 1)": _BINCOUNT,
    "stages/chat_align.py:align_runs:boolop:if len(changes) and n:": "a change of weight needs two characters, and a document with characters has tokens: no batch has changes and no ids",
    "stages/chat_align.py:align_runs:binop:if ((g_starts[k] < changes) & (g_ends[k] > changes)).any():": _PRECHECK,
    "stages/chat_align.py:align_runs:compare0:if ((g_starts[k] < changes) & (g_ends[k] > changes)).any():": _PRECHECK,
    "stages/chat_align.py:align_runs:compare0:if ((g_starts[k] < changes) & (g_ends[k] > changes)).any():#1": _PRECHECK,
    "stages/chat_align.py:align_runs:string:across = np.flatnonzero(np.searchsorted(changes, g_ends, side='left') > np.searchsorted(changes, ...": _AT_EDGE,
    "stages/chat_align.py:align_runs:string:across = np.flatnonzero(np.searchsorted(changes, g_ends, side='left') > np.searchsorted(changes, ...#1": _AT_EDGE,
    "tokenizer_class.py:load:bool:tok = AutoTokenizer.from_pretrained(name_or_path, use_fast=True, trust_remote_code=trust_remote_c...": "transformers 5 (this suite's) ignores use_fast: AutoTokenizer always builds the fast class; under transformers 4 the slow class it would give is refused by load_tokenizer (is_fast)",
    "stages/json_array.py:ArrayScanner.__init__:int+1:self.last_solid = ord(',') if inside else -1": _NO_SOLID,
    "stages/json_array.py:ArrayScanner.__init__:int-1:self.last_solid = ord(',') if inside else -1": _NO_SOLID,
    "stages/json_array.py:ArrayScanner.scan:binop:self.in_string = bool(((int(count[-1]) if len(count) else 0) + was_inside) % 2)#1": _PARITY,
    "stages/json_array.py:ArrayScanner.scan:binop:inside = (count + was_inside & 1).astype(bool)#1": _PARITY,
    "stages/json_array.py:ArrayScanner.scan:int+1:where, comma, before, after = (where[:k + 1], comma[:k + 1], before[:k + 1], after[:k + 1])": _PAST_CLOSE,
    "stages/json_array.py:ArrayScanner.scan:int+1:where, comma, before, after = (where[:k + 1], comma[:k + 1], before[:k + 1], after[:k + 1])#1": _PAST_CLOSE,
    "stages/json_array.py:ArrayScanner.scan:int+1:where, comma, before, after = (where[:k + 1], comma[:k + 1], before[:k + 1], after[:k + 1])#2": _PAST_CLOSE,
    "stages/json_array.py:ArrayScanner.scan:int+1:where, comma, before, after = (where[:k + 1], comma[:k + 1], before[:k + 1], after[:k + 1])#3": _PAST_CLOSE,
    "stages/json_array.py:ArrayScanner._check_elements:compare0:suspect = SPACE[before] | (before == ord(',')) | (before == ord('[')) | (separators == 0)#1": _SUSPECT,
    "stages/json_array.py:ArrayScanner._check_elements:compare0:suspect = SPACE[before] | (before == ord(',')) | (before == ord('[')) | (separators == 0)#2": _SUSPECT,
    "stages/json_array.py:Scratch.__init__:int+1:self.other = np.zeros(0, dtype=bool)": _SCRATCH,
    "stages/json_array.py:Scratch.__init__:int+1:self.bytes = np.zeros(0, dtype=np.uint8)": _SCRATCH,
    "stages/json_array.py:Scratch.__init__:int+1:self.out = np.zeros(0, dtype=np.uint8)": _SCRATCH,
    "stages/json_array.py:Scratch.output:compare0:if len(self.out) < len(chunk):": _SCRATCH,
    "stages/json_array.py:array_blocks:int+1:step = max(1, min(block_bytes, max_record_bytes))": _STEP,
    "stages/json_array.py:array_blocks:int+1:yield Block(path, record, 1, head, begin, too_long=pending_len + first - 1)": _ONE_REJECT,
    "stages/json_array.py:array_blocks:int-1:yield Block(path, record, 1, head, begin, too_long=pending_len + first - 1)": _ONE_REJECT,
    "stages/json_array.py:array_blocks:boolop:if body and (not scanner.closed):": _AFTER_CLOSE,
    "distribute/plan_array.py:layout:compare0:while at >= 0:": _NO_GAP_AT_0,
    "distribute/plan_array.py:layout:int+1:after = np.searchsorted(solid, commas + 1)": "a separator followed at once by a byte other than whitespace gives a gap without a newline either way: no layout",
    "distribute/plan_array.py:layout:bool:gaps = {head[p:q + 1] for p, q in zip(commas, ends, strict=True)}": _STRICT,
    "distribute/plan_array.py:_summary:int+1:first = int(quotes[0]) if len(quotes) else -1#1": _ODD_CASE,
    "distribute/plan_array.py:_summary:int-1:first = int(quotes[0]) if len(quotes) else -1": _ODD_CASE,
    "distribute/plan_array.py:_summary:boolop:if first >= 0 and (not chunk[:first].strip(b'\\\\')):": _ODD_CASE,
    'distribute/plan_array.py:_cut_from:int+1:offset, step = (offset + len(chunk), min(2 * step, chunk_bytes))': _READ_SIZE,
    'distribute/plan_array.py:_cut_from:int-1:offset, step = (offset + len(chunk), min(2 * step, chunk_bytes))': _READ_SIZE,
    "distribute/plan_array.py:record_cuts:int+1:threads = threads or min(4, len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else...": _THREADS,
    "distribute/plan_array.py:record_cuts:int-1:threads = threads or min(4, len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else...": _THREADS,
    "distribute/plan_array.py:record_cuts:int+1:threads = threads or min(4, len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else...#1": _THREADS,
    "distribute/plan_array.py:record_cuts:boolop:threads = threads or min(4, len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else...#1": _THREADS,
    "distribute/plan_array.py:record_cuts:int+1:threads = threads or min(4, len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else...#2": _THREADS,
    "distribute/plan_array.py:record_cuts:int-1:threads = threads or min(4, len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else...#1": _THREADS,
    'distribute/plan_array.py:_two_pass:int+1:bounds = sorted({max(0, t - 1) for t in targets})': _TARGET_1,
    'distribute/plan_array.py:_two_pass:int+1:while pending and max(0, pending[0] - 1) <= offset:': _TARGET_1,
    'distribute/plan_array.py:_two_pass:int+1:in_string, depth, tail, offset = (False, 0, 0, 0)#1': "the first chunk starts outside a string: the carried run is read only inside one, and the first summary sets it",
    'distribute/plan_array.py:_two_pass:int-1:if depth < 1:': "depth 0 at a bound is only before the opening '[' (the cut's scanner opens it and finds the same separator): a close before a bound is caught by the chunk's lowest depth first",
    'distribute/plan_array.py:_two_pass:drop:pending.clear()': _CLOSED,
    'distribute/plan_array.py:_two_pass:return_none:return False': _CLOSED,
    'distribute/plan_array.py:_two_pass:bool:return False': _CLOSED,
    "distribute/plan_array.py:_two_pass:return_none:return cuts": "at the start only targets 0 and 1 are due, and they raise _Fallback (depth 0): at_bound() is never False there",
    "distribute/plan_array.py:_two_pass:compare0:while len(inflight) < 2 * threads:": "one more chunk in flight: memory only, the summaries are chained in order",
    "distribute/plan_array.py:_two_pass:int+1:while len(inflight) < 2 * threads:": "more or fewer chunks in flight: memory and overlap only, the summaries are chained in order",
    "distribute/plan_array.py:_two_pass:int-1:while len(inflight) < 2 * threads:": "more or fewer chunks in flight: memory and overlap only, the summaries are chained in order",
    "distribute/plan_array.py:_two_pass:drop:future.cancel()": "cancelling the summaries no longer needed saves work only: their results are not read",
    "distribute/plan_array.py:_two_pass:return_none:return cuts#2": "the chunks end at the last target's bound, where at_bound() empties the targets and returns: the loop's end is reached only by a file shorter than its size",
    "distribute/plan_array.py:sequential_cuts:augassign:i += 1#1": _SKIPPED_AGAIN,
    "distribute/plan_array.py:sequential_cuts:int-1:i += 1#1": _SKIPPED_AGAIN,
    "distribute/plan_array.py:_cut_from:bool:scanner = ArrayScanner(inside=True, check=False)": "the plan's scanner is given its depth and string state by hand and checks no element: `inside` only decides `opened`, which sets `start`, and _cut_from does not read it",
    "distribute/plan_array.py:guessed_cuts:int+1:at = _find(stream, max(0, target - 1), gap, chunk_bytes)": _NO_GAP_AT_0,
    "distribute/plan_array.py:_find:int+1:step = min(2 * step, chunk_bytes)": _READ_SIZE,
    "distribute/plan_array.py:_find:int-1:step = min(2 * step, chunk_bytes)": _READ_SIZE,
    "distribute/plan_array.py:_find:binop:held = window[max(0, len(window) - len(gap) + 1):]": "held keeps two bytes more than a gap spanning two reads needs, and base counts what it keeps: a gap wholly inside it was found in the window before",
    "distribute/plan_array.py:layout:int+1:at = head.find(gap, at + 1)": "a gap cannot start one byte into another: its first byte is a ',', its second a newline",
    'distribute/plan.py:plan_parts:bool:for (number, (start, end, check)) in enumerate(zip(cuts[:-1], cuts[1:], checks, strict=True)):': _STRICT,
    'distribute/plan.py:plan_mixed:bool:for (number, (start, end, check)) in enumerate(zip(cuts[:-1], cuts[1:], checks, strict=True)):': _STRICT,
    'distribute/plan.py:plan_mixed:bool:for (s, (paths, file_sizes)) in enumerate(zip(sources, sizes, strict=True)):': _STRICT,
    'distribute/plan.py:plan_mixed:bool:for (path, size) in zip(paths, file_sizes, strict=True):': _STRICT,
    'distribute/plan.py:plan_mixed:int+1:part = InputPart(-1, file_index, path, start, end, number, len(cuts) == 2, check)': _PLACEHOLDER,
    'distribute/plan.py:plan_mixed:int-1:part = InputPart(-1, file_index, path, start, end, number, len(cuts) == 2, check)': _PLACEHOLDER,
    'distribute/plan.py:plan_mixed:compare1:inside = [t - base for t in targets if base < t < base + size]': "a target at a file's end finds no line start inside it: the cut at its size is dropped",
    "distribute/plan_array.py:_find:int-1:held = window[max(0, len(window) - len(gap) + 1):]": "held keeps one byte more than a gap spanning two reads needs, and base counts what it keeps: a gap wholly inside it was found in the window before",
    "distribute/plan_array.py:layout:int+1:while at >= 0:": _NO_GAP_AT_0,
    "distribute/plan_array.py:layout:bool:scanner = ArrayScanner(check=False)": "an empty element in the head gives a gap that ends in ',' beside the others, so no layout either way (the part that holds it names it)",
    "stages/json_array.py:array_blocks:int-1:step = max(1, min(block_bytes, max_record_bytes))": _STEP,
    "stages/json_array.py:Scratch.get:compare0:if len(self.mask) < n:": _SCRATCH,
    "stages/json_array.py:Scratch.marks:compare0:if len(self.other) < len(data):": _SCRATCH,
    "stages/json_array.py:_changes:int+1:return np.where(byte == _COMMA, 0, np.where(byte | 32 == ord('{'), 1, -1)).astype(np.int64)#1": "only brackets and commas reach it: | 0x21 maps '[' and '{' to '{', and ']' and '}' elsewhere, as | 0x20 does",
    "prefetch.py:FastokensPrefetch._load:drop:tok.no_padding()": "fastokens' encode_batch_flat never pads (its ids are flat): the file's padding is off for the tokenizers backend the probes and the guard compare with",
    "tokenizer_class.py:load:bool:return cls.from_pretrained(name_or_path, _from_auto=True)": "_from_auto sets only transformers' telemetry user agent (PreTrainedTokenizerBase.from_pretrained)",
    "tokenizer_snapshot.py:_put:bool:shutil.rmtree(aside, ignore_errors=True)": "the folder just moved aside is removed whole unless the disk fails, and then the new snapshot is in place either way (remember answers False; _drop_oldest removes the rest an hour on)",
    "tokenizer_snapshot.py:_drop_oldest:compare0:stale = [p for p, t in folders if p.name.startswith(('.new-', '.old-')) and t < time.time() - _ST...": "a folder exactly an hour old to the float second: dropped now or at the next write, either way once its writer has stopped",
    "tokenizer_snapshot.py:_drop_oldest:bool:shutil.rmtree(old, ignore_errors=True)": "a folder that cannot be removed (another process removed it first) raises OSError, which the loop's suppress(OSError) drops: the others are left for the next write, which drops them",
    "tokenizer_class.py:_remember:bool:Path(tmp).unlink(missing_ok=True)": "the temporary file exists (mkstemp made it): missing_ok is never consulted",
    "stages/write.py:_ShardSet.abort:drop:self._writer.close()": "an aborted shard is thrown away: closing its file alone releases it (what the writer would add is never read)",
    "stages/write.py:_ShardSet.__init__:int+1:self._rows_in_shard = 0": "read only once a shard is open, and _open_next sets it to 0 first",
    "stages/write.py:_ShardSet.__init__:bool:directory.mkdir(parents=True, exist_ok=True)": "a shard set's directory is a part's temporary directory, made before its writer, or a split directory inside it",
    "storage.py:arrow_filesystem:int+1:return pa.PythonFile(_RangeFile(_url(fs, p, url), chunk=1 << 62, located=(fs, p)), mode='r')": _UNBOUNDED,
    "storage.py:arrow_filesystem:int+1:return pa.PythonFile(_RangeFile(_url(fs, p, url), chunk=1 << 62, located=(fs, p)), mode='r')#1": _UNBOUNDED,
    "storage.py:arrow_filesystem:int-1:return pa.PythonFile(_RangeFile(_url(fs, p, url), chunk=1 << 62, located=(fs, p)), mode='r')#1": _UNBOUNDED,
    "storage.py:open_text:int+1:return io.TextIOWrapper(io.BufferedReader(_RangeFile(str(path)), 1 << 20), encoding='utf-8', newl...": "the text reader's buffer size sets how many bytes each range request asks for, not the text read",
    "storage.py:open_text:int+1:return io.TextIOWrapper(io.BufferedReader(_RangeFile(str(path)), 1 << 20), encoding='utf-8', newl...#1": "the text reader's buffer size sets how many bytes each range request asks for, not the text read",
    "storage.py:open_text:int-1:return io.TextIOWrapper(io.BufferedReader(_RangeFile(str(path)), 1 << 20), encoding='utf-8', newl...#1": "the text reader's buffer size sets how many bytes each range request asks for, not the text read",
    "storage.py:glob:int+1:hidden = pattern.rstrip('/').rsplit('/', 1)[-1].startswith('.')": _LAST_PART,
    "storage.py:glob:int+1:if hidden or not m.rstrip('/').rsplit('/', 1)[-1].startswith('.'):": _LAST_PART,
    "storage.py:names_under:int+1:return [str(e).rstrip('/').rsplit('/', 1)[-1] for e in fs.ls(p, detail=False)]": _LAST_PART,
}

_COMPARE_SWAP = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In,
}
_BINOP_SWAP = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult, ast.Div: ast.Mult,
    ast.Mod: ast.FloorDiv, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd,
}
_STRING_SWAP = {"right": "left", "left": "right", "stable": "quicksort"}


@dataclass(frozen=True)
class Mutant:
    module: str  # relative to weightprep/
    function: str  # qualified name of the patched (outermost) function
    line: int
    col: int
    kind: str
    before: str
    after: str
    occurrence: int = 0  # among the mutants of the same function, kind and text

    @property
    def id(self) -> str:
        """Stable across edits elsewhere in the module (no line numbers)."""
        suffix = f"#{self.occurrence}" if self.occurrence else ""
        return f"{self.module}:{self.function}:{self.kind}:{self.before}{suffix}"


def _children(node: ast.AST) -> list[ast.AST]:
    return list(ast.iter_child_nodes(node))


def _kinds(node: ast.AST) -> list[str]:
    kinds: list[str] = []
    if isinstance(node, ast.Compare):
        kinds += [f"compare{i}" for i, op in enumerate(node.ops) if type(op) in _COMPARE_SWAP]
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAP:
        kinds.append("binop")
    elif isinstance(node, ast.AugAssign) and type(node.op) in _BINOP_SWAP:
        kinds += ["augop", "augassign"]
    elif isinstance(node, ast.BoolOp):
        kinds.append("boolop")
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        kinds.append("not")
    elif isinstance(node, ast.Constant):
        if isinstance(node.value, bool):
            kinds.append("bool")
        elif isinstance(node.value, int):
            kinds.append("int+1")
            if node.value != 0:
                kinds.append("int-1")
        elif isinstance(node.value, str) and node.value in _STRING_SWAP:
            kinds.append("string")
    elif isinstance(node, (ast.If, ast.While)):
        kinds.append("negate")
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        kinds.append("drop")
    elif isinstance(node, ast.Return) and node.value is not None:
        kinds.append("return_none")
    return kinds


def _apply(node: ast.AST, kind: str) -> ast.AST:
    """The mutated copy of ``node``."""
    new = copy.deepcopy(node)
    if kind.startswith("compare"):
        i = int(kind[len("compare"):])
        new.ops[i] = _COMPARE_SWAP[type(new.ops[i])]()  # type: ignore[attr-defined]
    elif kind in ("binop", "augop"):
        new.op = _BINOP_SWAP[type(new.op)]()  # type: ignore[attr-defined]
    elif kind == "augassign":
        return ast.copy_location(ast.Assign(targets=[new.target], value=new.value), node)  # type: ignore[attr-defined]
    elif kind == "boolop":
        new.op = ast.Or() if isinstance(new.op, ast.And) else ast.And()  # type: ignore[attr-defined]
    elif kind == "not":
        return new.operand  # type: ignore[attr-defined, no-any-return]
    elif kind == "bool":
        new.value = not new.value  # type: ignore[attr-defined]
    elif kind == "int+1":
        new.value += 1  # type: ignore[attr-defined]
    elif kind == "int-1":
        new.value -= 1  # type: ignore[attr-defined]
    elif kind == "string":
        new.value = _STRING_SWAP[new.value]  # type: ignore[attr-defined]
    elif kind == "negate":
        new.test = ast.UnaryOp(op=ast.Not(), operand=new.test)  # type: ignore[attr-defined]
    elif kind == "drop":
        if any(isinstance(n, ast.Name) and n.id == "super" for n in ast.walk(node)):
            # a method's code keeps its __class__ cell (the live function's closure), read and thrown away
            return ast.copy_location(ast.Expr(ast.Name("__class__", ast.Load())), node)
        return ast.copy_location(ast.Pass(), node)
    elif kind == "return_none":
        new.value = ast.Constant(value=None)  # type: ignore[attr-defined]
    return new


def _get(tree: ast.AST, path: tuple[int, ...]) -> ast.AST:
    node = tree
    for i in path:
        node = _children(node)[i]
    return node


def _replace(tree: ast.AST, path: tuple[int, ...], new: ast.AST) -> ast.AST:
    """A copy of ``tree`` with the node at ``path`` replaced by ``new``."""
    tree = copy.deepcopy(tree)
    parent = _get(tree, path[:-1])
    old = _children(parent)[path[-1]]
    for field, value in ast.iter_fields(parent):
        if value is old:
            setattr(parent, field, new)
            break
        if isinstance(value, list) and any(v is old for v in value):
            value[[i for i, v in enumerate(value) if v is old][0]] = new
            break
    return ast.fix_missing_locations(tree)


def mutants(module: str, *, trees: bool = True) -> list[tuple[Mutant, ast.AST | None]]:
    """Every mutant of ``module`` with the mutated module tree, each shown as the statement it changes
    (``trees=False``: the mutants alone, each statement mutated in a copy of itself rather than of the module)."""
    source = (ROOT / "weightprep" / module).read_text()
    tree = ast.parse(source)
    out: list[tuple[Mutant, ast.AST | None]] = []
    seen: dict[tuple[str, str, str], int] = {}
    for path, kind, function in _points(tree):
        node = _get(tree, path)
        new = _apply(node, kind)
        if ast.unparse(node) == ast.unparse(new):
            continue
        at = _statement(tree, path)
        mutated = _replace(tree, path, new) if trees else None
        if mutated is not None:
            changed = _get(mutated, at)
        else:  # the statement alone: the same header, without a copy of the whole module per mutant
            changed = new if at == path else _replace(_get(tree, at), path[len(at) :], new)
        before, after = _header(_get(tree, at)), _header(changed)
        line, col = getattr(node, "lineno", 0), getattr(node, "col_offset", 0)
        key = (function, kind, _short(before))
        seen[key] = seen.get(key, -1) + 1
        out.append((Mutant(module, function, line, col, kind, *key[2:], _short(after), seen[key]), mutated))
    return out


def _statement(tree: ast.AST, path: tuple[int, ...]) -> tuple[int, ...]:
    """The path of the innermost statement at or above ``path``."""
    for end in range(len(path), -1, -1):
        if isinstance(_get(tree, path[:end]), ast.stmt):
            return path[:end]
    return path


def _header(stmt: ast.AST) -> str:
    """A statement as one line: a compound statement by its header only."""
    if isinstance(stmt, (ast.If, ast.While)):
        return f"{'if' if isinstance(stmt, ast.If) else 'while'} {ast.unparse(stmt.test)}:"
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return f"for {ast.unparse(stmt.target)} in {ast.unparse(stmt.iter)}:"
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return f"with {', '.join(ast.unparse(i) for i in stmt.items)}:"
    if isinstance(stmt, (ast.Try, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return ast.unparse(stmt).splitlines()[0]
    return ast.unparse(stmt)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 100 else text[:97] + "..."


def _points(tree: ast.Module) -> list[tuple[tuple[int, ...], str, str]]:
    """Mutation points inside the module's functions and methods, with the outermost function's qualified name."""
    points: list[tuple[tuple[int, ...], str, str]] = []

    def visit(node: ast.AST, path: tuple[int, ...], owner: str | None, prefix: str) -> None:
        if isinstance(node, (ast.Raise, ast.Assert, ast.JoinedStr)):
            return
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # a docstring
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and owner is None:
            owner = prefix + node.name
        elif isinstance(node, ast.ClassDef) and owner is None:
            prefix = prefix + node.name + "."
        if owner is not None and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.arguments)):
            for kind in _kinds(node):
                points.append((path, kind, owner))
        for i, child in enumerate(_children(node)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                child in node.decorator_list or child is node.returns or isinstance(child, ast.arguments)
            ):
                continue  # decorators, annotations and defaults are evaluated at definition time
            if isinstance(node, ast.AnnAssign) and child is node.annotation:
                continue  # a variable's or attribute's annotation inside a function is never evaluated
            visit(child, (*path, i), owner, prefix)

    visit(tree, (), None, "")
    return points


def _code_of(code: types.CodeType, qualname: str) -> types.CodeType | None:
    """The code object named ``qualname`` among the constants of ``code``, recursively."""
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_qualname == qualname:
                return const
            found = _code_of(const, qualname)
            if found is not None:
                return found
    return None


def _live_function(mod: types.ModuleType, qualname: str) -> types.FunctionType:
    owner: object = mod
    parts = qualname.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    attr = owner.__dict__[parts[-1]] if isinstance(owner, type) else getattr(owner, parts[-1])
    if isinstance(attr, (staticmethod, classmethod)):
        attr = attr.__func__
    elif isinstance(attr, property):
        attr = attr.fget
    while hasattr(attr, "__wrapped__"):
        attr = attr.__wrapped__
    return attr  # type: ignore[return-value]


def patch(mutant: Mutant, tree: ast.AST) -> None:
    """Swap the mutated code into the live function (in this process)."""
    name = "weightprep." + mutant.module[:-3].replace("/", ".")
    mod = importlib.import_module(name)
    code = compile(tree, mod.__file__ or name, "exec")
    new = _code_of(code, mutant.function)
    if new is None:
        raise LookupError(f"no code object {mutant.function} in {name}")
    _live_function(mod, mutant.function).__code__ = new


def _run_tests(tests: list[str], coverage_file: str | None = None, module_file: str | None = None) -> int:
    import pytest

    plugins: list[object] = []
    if coverage_file is not None:
        plugins.append(_Coverage(module_file or "", coverage_file))
    args = [*tests, "-x", "-q", "-p", "no:cacheprovider", "--no-header", "-W", "ignore"]
    return int(pytest.main(args, plugins=plugins))


class _Coverage:
    """A pytest plugin that records which tests call which functions of one module, and how long each test takes:
    a mutant then runs only the tests that reach its function, quickest first."""

    def __init__(self, module_file: str, out: str) -> None:
        self.module_file, self.out = module_file, out
        self.current: str | None = None
        self.calls: dict[str, set[str]] = {}
        self.durations: dict[str, float] = {}

    def _profile(self, frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "call" and self.current is not None and frame.f_code.co_filename == self.module_file:
            function = frame.f_code.co_qualname.split(".<locals>")[0]
            self.calls.setdefault(function, set()).add(self.current)

    def pytest_sessionstart(self, session) -> None:  # type: ignore[no-untyped-def]
        import threading

        sys.setprofile(self._profile)
        threading.setprofile(self._profile)  # the build's read and write threads

    def pytest_runtest_setup(self, item) -> None:  # type: ignore[no-untyped-def]
        self.current = item.nodeid

    def pytest_runtest_logreport(self, report) -> None:  # type: ignore[no-untyped-def]
        self.durations[report.nodeid] = self.durations.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self, session) -> None:  # type: ignore[no-untyped-def]
        import json

        sys.setprofile(None)
        calls = {f: sorted(ids) for f, ids in self.calls.items()}
        Path(self.out).write_text(json.dumps({"calls": calls, "durations": self.durations}))


_UNPATCHABLE = 99  # the child's exit code when the mutant could not be swapped in


def _child(mutant: Mutant | None, tree: ast.AST | None, tests: list[str], **coverage: str) -> int:
    """Fork; in the child patch the mutant and run the tests, quietly. Returns the child's pid."""
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            if mutant is not None:
                code = _UNPATCHABLE
                patch(mutant, tree)  # type: ignore[arg-type]
            code = _run_tests(tests, **coverage)
        finally:
            os._exit(code)
    return pid


def _preload(tests: list[str]) -> None:
    """Import the package, the heavy libraries and the test modules once, before any fork."""
    import contextlib
    import io

    import pytest

    with contextlib.redirect_stdout(io.StringIO()):
        pytest.main([*tests, "--collect-only", "-q", "-p", "no:cacheprovider"], plugins=[])


def _wanted(mutant: Mutant, lines: tuple[int, int] | None, functions: list[str] | None) -> bool:
    """Whether ``--lines A-B`` and ``--function NAME`` (a qualified name or its prefix) keep this mutant."""
    if lines is not None and not lines[0] <= mutant.line <= lines[1]:
        return False
    return not functions or any(mutant.function == f or mutant.function.startswith(f + ".") for f in functions)


def check(  # type: ignore[no-untyped-def]
    module: str, jobs: int, timeout_factor: float, log,
    lines: tuple[int, int] | None = None, functions: list[str] | None = None,
) -> dict:
    import json
    import tempfile

    tests = MODULES[module]
    module_file = str(ROOT / "weightprep" / module)
    with tempfile.TemporaryDirectory() as tmp:
        coverage_file = str(Path(tmp) / "coverage.json")
        start = time.monotonic()
        pid = _child(None, None, tests, coverage_file=coverage_file, module_file=module_file)
        _, status = os.waitpid(pid, 0)
        baseline = time.monotonic() - start
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{module}: the unmutated tests fail ({' '.join(tests)}): fix them first")
        coverage = json.loads(Path(coverage_file).read_text())
    durations = coverage["durations"]
    todo = [(m, tree) for m, tree in mutants(module) if _wanted(m, lines, functions)]
    log(f"{module}: {len(todo)} mutants, tests {baseline:.0f} s unmutated (with call tracing)")
    results: dict[str, list[Mutant]] = {"killed": [], "timeout": [], "survived": [], "equivalent": []}
    queue = []
    for mutant, tree in todo:
        reach = sorted(coverage["calls"].get(mutant.function, []), key=lambda t: durations.get(t, 0.0))
        if reach:
            limit = timeout_factor * sum(durations.get(t, 0.0) for t in reach) + 15
            queue.append((mutant, tree, reach, limit))
        elif mutant.id in EQUIVALENT:
            results["equivalent"].append(mutant)
        else:  # no test runs this function
            results["survived"].append(mutant)
            log(f"  survived line {mutant.line} (no test calls it): {mutant.id}  ->  {mutant.after}")
    running: dict[int, tuple[Mutant, float, float]] = {}
    while queue or running:
        while queue and len(running) < jobs:
            mutant, tree, reach, limit = queue.pop(0)
            running[_child(mutant, tree, reach)] = (mutant, time.monotonic(), limit)
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            time.sleep(0.05)
            for other, (_, began, limit) in list(running.items()):
                if time.monotonic() - began > limit:
                    os.kill(other, signal.SIGKILL)
            continue
        mutant, _, _ = running.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        if code == _UNPATCHABLE:
            raise SystemExit(f"{mutant.id}: could not swap the mutated code into {mutant.function}")
        if code == -signal.SIGKILL:
            outcome = "timeout"
        elif code == 0:
            outcome = "equivalent" if mutant.id in EQUIVALENT else "survived"
        else:
            outcome = "killed"
        results[outcome].append(mutant)
        if outcome in ("survived", "timeout"):  # a timeout on a loaded machine may hide a survivor: name it
            log(f"  {outcome} line {mutant.line}: {mutant.id}  ->  {mutant.after}")
        done = sum(len(found) for found in results.values())
        if done % 25 == 0:
            log(f"  {done} of {len(todo)} done, line {mutant.line}")
    return {"tests": tests, "baseline_s": baseline, "total": len(todo), **results}


def report(results: dict[str, dict], command: str) -> str:
    lines = [
        "# Mutation check",
        "",
        f"Generated {datetime.date.today().isoformat()} by `{command}` (`tools/mutate.py` says how it works).",
        "A surviving mutant is a change to the code that no test notices: make a test fail on it, or explain in",
        "`EQUIVALENT` (tools/mutate.py) why no test can (an equivalent mutant).",
        "",
        "| module | mutants | killed | timeout | equivalent | survived | tests |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for module, r in results.items():
        lines.append(
            f"| weightprep/{module} | {r['total']} | {len(r['killed'])} | {len(r['timeout'])} | "
            f"{len(r['equivalent'])} | {len(r['survived'])} | {', '.join(Path(t).name for t in r['tests'])} |"
        )
    for title, key in (("Surviving mutants", "survived"), ("Equivalent mutants", "equivalent"),
                       ("Timed out (counted as killed: an endless loop, or a run slowed past its limit)", "timeout")):
        rows = [(m, r) for r in results.values() for m in r[key]]
        lines += ["", f"## {title}", ""]
        if not rows:
            lines.append("None.")
            continue
        lines += ["| line | function | change | why equivalent |" if key == "equivalent" else
                  "| line | function | change |", "|---|---|---|" + ("---|" if key == "equivalent" else "")]
        for m, _ in rows:
            why = f" {EQUIVALENT[m.id]} |" if key == "equivalent" else ""
            # a timed-out mutant explained as equivalent: only a run on an idle machine tells which it is
            note = ", listed in `EQUIVALENT`" if key == "timeout" and m.id in EQUIVALENT else ""
            before, after = (text.replace("|", "\\|") for text in (m.before, m.after))  # a table cell
            lines.append(f"| {m.line} | `{m.function}` | `{before}` → `{after}` ({m.kind}{note}) |{why}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--module", action="append", choices=sorted(MODULES), help="default: all of MODULES")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--timeout-factor", type=float, default=3.0)
    parser.add_argument("--lines", help="only mutants on lines A-B of the module (a run in parts)")
    parser.add_argument("--function", action="append", help="only mutants of this function or class (repeatable)")
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    parser.add_argument("--out", help="write the report (markdown) here")
    args = parser.parse_args()
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # the children run the tests traced (the first run) or beside other mutants on a loaded machine: Hypothesis'
    # per-example deadline would fail the unmutated run, or kill a mutant for being slow rather than wrong
    from hypothesis import settings

    settings.register_profile("mutate", deadline=None)
    settings.load_profile("mutate")
    modules = args.module or list(MODULES)
    lines = None
    if args.lines:
        lo, _, hi = args.lines.partition("-")
        lines = (int(lo or 0), int(hi) if hi else sys.maxsize)
    if args.list:
        for module in modules:
            for m, _ in mutants(module, trees=False):
                if not _wanted(m, lines, args.function):
                    continue
                print(f"{m.line}\t{m.id}\t-> {m.after}")
        return
    _preload(sorted({t for m in modules for t in MODULES[m]}))
    results = {}
    for module in modules:
        results[module] = check(
            module, args.jobs, args.timeout_factor, lambda s: print(s, flush=True), lines, args.function
        )
        r = results[module]
        print(
            f"{module}: {r['total']} mutants, {len(r['killed'])} killed, {len(r['timeout'])} timeout, "
            f"{len(r['equivalent'])} equivalent, {len(r['survived'])} survived",
            flush=True,
        )
    if args.out:
        command = " ".join(["python tools/mutate.py", *sys.argv[1:]])  # as run: --jobs and --timeout-factor matter
        Path(args.out).write_text(report(results, command))


if __name__ == "__main__":
    main()
