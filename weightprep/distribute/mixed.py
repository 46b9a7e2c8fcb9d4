"""The job of one mixed part of a build with sources (``weightprep.sources``, ``plan.plan_mixed``).

A mixed part holds a slice of every source. Its job reads them side by side and makes one stream of documents:

1. **Reading order.** Each source's segments are one stream of blocks; the next block is read from the source
   that has consumed the smallest share of its bytes in this part (ties: the earlier source). A record is placed
   at its share ``t`` in ``[0, 1]``: its block's share before it plus its rank in the block (interpolated).
2. **Interleaving.** Each block is tokenized with its source's settings (weight, columns, role weights) and its
   training documents wait until no source can still give a smaller ``t`` (every source's share read so far is
   past it); they then go on, ordered by ``(t, source, order read)``. The stream is therefore every training
   document of the part sorted by that key, whatever the block sizes or thread timing: the sources are mixed in
   proportion to their bytes, before packing, so a packing window holds all of them.
3. **Epochs.** A training record of a source with ``epochs`` E has ``floor(E)`` or ``floor(E) + 1`` copies
   (``sources.copies``). Pass ``p`` of the part (``p = 0, 1, ...``) holds the documents of every record with more
   than ``p`` copies, in the stream's order, and is packed by its own packer: its rows are its own, so two copies
   of one record never share a row (nor a packing window).
4. **Validation.** With a validation split, each source's held-out records are packed on their own, once, into the
   split ``validation_NAME``: never mixed, never repeated.

Every count is kept per source and split (the accounting identity of ``weightprep.accounting`` holds for each
source, with its repeats), beside the split's row counts. A bad line raises as in a plain part, with the index of
its segment, so the driver can number it within its file.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from weightprep.batches import ChatTokens, Documents, Records
from weightprep.blocks import Chats, count_rows, document_batch, parsed_blocks
from weightprep.config import BuildConfig
from weightprep.constants import IGNORE_INDEX
from weightprep.distribute.plan import MixedPart
from weightprep.errors import InputError
from weightprep.overlap import BackgroundSink, background
from weightprep.sources import Source, copies, epoch_keys, scaled_weights
from weightprep.stages.pack import Packer
from weightprep.stages.read import InputFile
from weightprep.stages.rejects import RejectsWriter
from weightprep.stages.split import TRAIN, record_keys, smallest_keys
from weightprep.stages.write import ShardWriter
from weightprep.weights import valid_weights

__all__ = ["source_config", "validation_name", "split_names", "run_mixed", "mixed_keys", "segment_of", "part_epoch_keys",
           "epoch_cuts_from"]


def validation_name(source: Source) -> str:
    """The split of a source's held-out records."""
    return f"validation_{source.name}"


def split_names(sources: list[Source], validation: bool) -> tuple[str, ...] | None:
    """The splits of a build with sources: none (one dataset) without a validation split."""
    return (TRAIN, *(validation_name(s) for s in sources)) if validation else None


def source_config(cfg: BuildConfig, source: Source) -> BuildConfig:
    """The build's configuration as it applies to ``source``: its columns and role weights, and its EOS weight
    scaled by its weight (``float32(W * eos_weight)`` once assemble casts it)."""
    return dataclasses.replace(
        cfg,
        read=dataclasses.replace(cfg.read, columns=source.columns if source.columns is not None else cfg.read.columns),
        chat=dataclasses.replace(
            cfg.chat, role_weights=source.role_weights if source.role_weights is not None else cfg.chat.role_weights
        ),
        assemble=dataclasses.replace(cfg.assemble, eos_weight=source.weight * cfg.assemble.eos_weight),
    )


def segment_of(part: MixedPart, path: str) -> int:
    """The segment of ``part`` that reads ``path`` (a file is in one segment of a part at most)."""
    return next(j for j, seg in enumerate(part.segments) if seg.path == path)


def _source_blocks(
    part: MixedPart, s: int, files: dict[int, InputFile], cfg: BuildConfig, chats: Chats | None
) -> Iterator[tuple[int, Records, list[Any], int]]:
    """(segment, records, rejects, bytes of source ``s`` consumed in this part) of each block of its segments."""
    done = 0
    for j, (seg, source) in enumerate(zip(part.segments, part.sources, strict=True)):
        if source != s:
            continue
        record = files[j] = InputFile(seg.path)
        for records, rejects, consumed in parsed_blocks(seg, record, cfg, chats):
            yield j, records, rejects, done + min(consumed, seg.size)
        done += seg.size


def _interleaved_reads(
    part: MixedPart, n_sources: int, files: dict[int, InputFile], cfgs: list[BuildConfig], chats: list[Chats | None]
) -> Iterator[tuple[int, int, Records | None, list[Any], float, float]]:
    """(source, segment, records, rejects, share before, share after) of each block, read from the source whose
    share read so far is smallest (step 1 of the module docstring); ``records`` None: the source has ended."""
    totals = [sum(seg.size for seg, s in zip(part.segments, part.sources, strict=True) if s == i)
              for i in range(n_sources)]  # fmt: skip
    present = sorted(set(part.sources))
    streams = {s: _source_blocks(part, s, files, cfgs[s], chats[s]) for s in present}
    share = dict.fromkeys(present, 0.0)
    while share:
        s = min(share, key=lambda i: (share[i], i))
        item = next(streams[s], None)
        if item is None:
            del share[s]
            yield s, -1, None, [], 1.0, math.inf
            continue
        j, records, rejects, consumed = item
        before = share[s]
        share[s] = min(1.0, consumed / totals[s]) if totals[s] else 1.0
        yield s, j, records, rejects, before, max(before, share[s])


def _check_scaled(records: Records, source: Source) -> None:
    """A weight that the source's weight multiplies beyond float32 would be inf in the shards: refused."""
    bad = np.flatnonzero(~valid_weights(records.piece_weights))  # scaled weights are >= 0: only overflow is left
    rows = (np.searchsorted(records.piece_offsets, bad, side="right") - 1).tolist()
    for r, chat in enumerate(records.chats or []):
        if isinstance(chat, ChatTokens) and not np.isfinite(chat.weights).all():
            rows.append(r)
    if rows:
        r = min(rows)
        raise InputError(
            records.path, int(records.lines[r]), "weight",
            f"a weight of this record times source {source.name!r}'s weight {source.weight} is beyond float32's "
            "largest (the shards store weights as float32): lower the source's weight",
            reason="bad_weight",
        )  # fmt: skip


def _scaled(records: Records, source: Source) -> Records:
    """``records`` with their piece weights multiplied by the source's weight (float64; cast by assemble)."""
    if source.weight == 1.0:
        return records
    scaled = dataclasses.replace(records, piece_weights=scaled_weights(records.piece_weights, source.weight))
    _check_scaled(scaled, source)
    return scaled


def _doc_weights(docs: Documents) -> np.ndarray:
    """float64 sum of each document's weights."""
    if not len(docs):
        return np.zeros(0)
    return np.add.reduceat(docs.weights, docs.offsets[:-1], dtype=np.float64)


def _count_written(docs: Documents, times: np.ndarray, counts: Counter) -> None:
    """The written side of one source's identity, from its documents (each written ``times`` times)."""
    supervised = docs.labels != IGNORE_INDEX
    counts["documents_written"] += int(times.sum())
    if (times == 1).all():  # one epoch: totals, without a per-document sum
        counts["tokens"] += len(docs.input_ids)
        counts["supervised_tokens"] += int(np.count_nonzero(supervised))
        counts["total_weight"] += float(docs.weights.sum(dtype=np.float64))
        return
    per_doc = np.add.reduceat(supervised, docs.offsets[:-1], dtype=np.int64) if len(docs) else times
    counts["tokens"] += int((docs.lengths * times).sum())
    counts["supervised_tokens"] += int((per_doc * times).sum())
    counts["total_weight"] += float((_doc_weights(docs) * times).sum())


def _count_repeats(docs: Documents, times: np.ndarray, record_copies: np.ndarray, counts: Counter) -> None:
    """The copies of epochs beyond one per document: records repeated and left out (epochs < 1), and the net
    documents, tokens and weight they add (the identity adds them; negative where records are left out)."""
    extra = times - 1
    counts["repeats"] += int(np.maximum(record_copies - 1, 0).sum())
    counts["omitted"] += int((record_copies == 0).sum())
    counts["documents_repeated"] += int(extra.sum())
    counts["tokens_repeated"] += int((docs.lengths * extra).sum())
    counts["weight_repeated"] += float((_doc_weights(docs) * extra).sum())


def _split(docs: Documents, n: int) -> tuple[Documents, Documents]:
    """The first ``n`` documents and the rest, as views (no copy)."""
    cut = int(docs.offsets[n])

    def part(lo: int, hi: int | None, offsets: np.ndarray) -> Documents:
        tokens = slice(lo, None if hi is None else hi)
        return Documents(
            input_ids=docs.input_ids[tokens], weights=docs.weights[tokens], offsets=offsets,
            lines=docs.lines[:n] if hi is not None else docs.lines[n:],
            labels=None if docs.labels is None else docs.labels[tokens],
            turns=None if docs.turns is None else docs.turns[tokens],
        )  # fmt: skip

    return part(0, cut, docs.offsets[: n + 1]), part(cut, None, docs.offsets[n:] - cut)


class _Interleave:
    """Step 2 of the module docstring: training documents held until every source has read past them. Each block's
    documents wait as they came (their ``t`` ascending); a release cuts every block at the bound (views), joins
    what is ready and orders it: each document is copied once here (``Documents.merge``)."""

    def __init__(self, sources: list[int]) -> None:
        self.frontier = dict.fromkeys(sources, 0.0)
        self.pending: list[tuple[np.ndarray, np.ndarray, Documents, np.ndarray]] = []
        self.order = 0

    def add(self, s: int, t: np.ndarray, docs: Documents, times: np.ndarray) -> None:
        if len(docs):
            seq = np.arange(self.order, self.order + len(docs), dtype=np.int64)
            self.order += len(docs)
            self.pending.append((t, np.full(len(docs), s, dtype=np.int64) * (1 << 40) + seq, docs, times))

    def release(self, s: int, share: float) -> tuple[Documents, np.ndarray] | None:
        """The documents no source can precede any more, in order, now that source ``s`` has read ``share``."""
        self.frontier[s] = share
        bound = min(self.frontier.values())
        ready, keep = [], []
        for t, tie, docs, times in self.pending:
            n = int(np.searchsorted(t, bound, side="left"))  # t < bound: ready
            if n == len(t):
                ready.append((t, tie, docs, times))
            elif n == 0:
                keep.append((t, tie, docs, times))
            else:
                head, tail = _split(docs, n)
                ready.append((t[:n], tie[:n], head, times[:n]))
                keep.append((t[n:], tie[n:], tail, times[n:]))
        self.pending = keep
        if not ready:
            return None
        t = np.concatenate([r[0] for r in ready])
        tie = np.concatenate([r[1] for r in ready])
        times = np.concatenate([r[3] for r in ready])
        order = np.lexsort((tie, t))
        parts = [r[2] for r in ready]
        if len(ready) > 1 and (order[1:] < order[:-1]).any():  # one copy, straight into order
            return Documents.merge(parts, order), times[order]
        return Documents.concat(parts), times


def run_mixed(job: Any, part: MixedPart, tmp: Path, progress: Any) -> dict[str, Any]:
    """The result of mixed part ``part`` (what ``PartJob`` returns for a plain part, with per-source counts and
    per-segment inputs and rejects); see the module docstring."""
    cfg, state, sources = job.cfg, job.worker(), job.sources
    cfgs = [source_config(cfg, s) for s in sources]
    chats = state.source_chats(cfgs, sources)
    names = split_names(sources, job.cut is not None)
    train = TRAIN if names else None
    seq_len, packed = cfg.pack.seq_len, cfg.pack.enabled
    passes = max(math.ceil(s.epochs) for s in sources)
    keys = [(train, p) for p in range(passes)] + [(n, 0) for n in (names or ())[1:]]
    packers = {k: Packer(seq_len, state.specials.pad, packed=packed, window=cfg.pack.window) for k in keys}
    writer = ShardWriter(
        tmp, seq_len, packed=packed, max_shard_bytes=cfg.write.max_shard_bytes, splits=names, turn_roles=state.roles
    )
    skip = cfg.validate.on_invalid == "skip"
    rejects = {j: RejectsWriter(_made(tmp / f"segment-{j:05d}")) for j in range(len(part.segments))} if skip else {}
    split_keys = [n or "" for n in (names or (None,))]
    per_source = [{n: Counter() for n in split_keys} for _ in sources]  # this thread only
    source_rejected = [Counter[str]() for _ in sources]
    doc_counts = {n: Counter() for n in split_keys}  # this thread only
    row_counts = {n: Counter() for n in split_keys}  # the writer thread only

    def pack_and_write(item: tuple[tuple[str | None, int], Documents]) -> None:
        key, docs = item
        for rows in packers[key].add(docs):
            count_rows(rows, row_counts[key[0] or ""])
            writer.write(rows, key[0])

    def send(docs: Documents, times: np.ndarray) -> None:
        for p in range(passes):
            chosen = np.flatnonzero(times > p)
            if len(chosen):
                sink.put(((train, p), docs.take(chosen) if len(chosen) < len(docs) else docs))

    files: dict[int, InputFile] = {}
    mix = _Interleave(sorted(set(part.sources)))
    sink: BackgroundSink[tuple[tuple[str | None, int], Documents]] = BackgroundSink(pack_and_write)
    reads = background(_interleaved_reads(part, len(sources), files, cfgs, chats))
    try:
        accepted: Counter[str] = Counter()
        for s, j, records, block_rejects, before, after in reads:
            if records is None:
                released = mix.release(s, math.inf)
                if released is not None:
                    send(*released)
                continue
            source = sources[s]
            if block_rejects:
                if skip:
                    rejects[j].write(block_rejects)
                source_rejected[s].update(r.reason for r in block_rejects)
            n = len(records)
            t = before + (np.arange(n, dtype=np.float64) + 0.5) / max(n, 1) * (after - before)
            subsets = {train: (records, None)}
            if job.cut is not None:
                cut = job.cut[s]
                split_key = record_keys(records, cfg.split.seed)
                held = split_key < np.uint64(cut) if cut < (1 << 64) else np.ones(n, dtype=bool)
                subsets = {train: (records.where(~held), split_key[~held]), validation_name(source): (records.where(held), None)}
            for name, (subset, subset_keys) in subsets.items():
                docs, batch_counts = document_batch(_scaled(subset, source), state.tokenize, state.specials, cfgs[s])
                doc_counts[name or ""].update(batch_counts)
                per_source[s][name or ""].update(batch_counts)
                accepted["tokens"] += batch_counts["tokens_accepted"]
                at = np.searchsorted(subset.lines, docs.lines)
                if name != train:  # held out: packed on its own, once
                    _count_written(docs, np.ones(len(docs), dtype=np.int64), per_source[s][name])
                    if len(docs):
                        sink.put(((name, 0), docs))
                    continue
                if job.epoch_cuts is None or job.epoch_cuts[s] is None:  # whole epochs
                    record_copies = np.full(len(subset), int(source.epochs), dtype=np.int64)
                else:
                    k = subset_keys if subset_keys is not None else record_keys(subset, cfg.split.seed)
                    record_copies = copies(k, source.epochs, job.epoch_cuts[s])
                times = record_copies[at]
                _count_written(docs, times, per_source[s][name or ""])
                if source.epochs != 1:
                    for counter in (per_source[s][name or ""], doc_counts[name or ""]):
                        _count_repeats(docs, times, record_copies, counter)
                in_subset = np.searchsorted(records.lines, subset.lines)
                mix.add(s, t[in_subset][at], docs, times)
            released = mix.release(s, after)
            if released is not None:
                send(*released)
            accepted["accepted"] += n
            if progress is not None:
                progress(sum(f.size for f in list(files.values())), accepted)
        sink.close()
        for (name, _), packer in packers.items():
            for rows in packer.flush():
                count_rows(rows, row_counts[name or ""])
                writer.write(rows, name)
        written = writer.close()
        for w in rejects.values():
            w.close()
    except BaseException:
        reads.close()
        sink.cancel()
        writer.abort()
        for w in rejects.values():
            w.close()
        raise
    counts = {}
    for name in split_keys:
        merged = doc_counts[name].copy()
        merged.update(row_counts[name])
        counts[name] = dict(merged)
    rejected = sum(source_rejected, Counter[str]())
    return {
        "index": part.index,
        "error": None,
        "counts": counts,
        "sources": [{n: dict(c) for n, c in by_split.items()} for by_split in per_source],
        "source_rejected": [dict(c) for c in source_rejected],
        "rejected": dict(rejected),
        "rejects_files": [
            f"segment-{j:05d}/rejects.jsonl" if j in rejects and rejects[j].counts else None
            for j in range(len(part.segments))
        ],
        "inputs": [
            {"bytes": files[j].size, "lines": files[j].lines, "sha256": files[j].sha256} for j in range(len(part.segments))
        ],
        "written": written,
        "backend": state.tokenize.backend,
        "chat_template": next((c.template_sha256 for c in chats if c is not None and c.template_sha256), None),
        "notes": list(dict.fromkeys(state.notes)),
    }


def _made(directory: Path) -> Path:
    directory.mkdir()
    return directory


def mixed_keys(job: Any, part: MixedPart, render: bool) -> dict[str, Any]:
    """The first pass of ``--validation-records`` over a mixed part: each source's record count and smallest keys
    (``N`` held out per source)."""
    cfg, sources = job.cfg, job.sources
    cfgs = [source_config(cfg, s) for s in sources]
    chats = job.worker().source_chats(cfgs, sources) if render else [None] * len(sources)
    files: dict[int, InputFile] = {}
    totals, keys = [], []
    for s in range(len(sources)):
        blocks = (records for _, records, _, _ in _source_blocks(part, s, files, cfgs[s], chats[s]))
        total, smallest = smallest_keys(blocks, cfg.split.validation_records or 0, cfg.split.seed)
        totals.append(total)
        keys.append(smallest.tolist())
    return {"index": part.index, "records": totals, "keys": keys,
            "inputs": [{"lines": files[j].lines} for j in range(len(part.segments))]}  # fmt: skip


def _train_records(records: Records, cut: int | None, seed: int) -> tuple[Records, np.ndarray]:
    """The records of ``records`` that the validation split (``cut``; None: none) leaves to train, with their keys."""
    keys = record_keys(records, seed)
    if cut is None:
        return records, keys
    train = keys >= np.uint64(cut) if cut < (1 << 64) else np.zeros(len(records), dtype=bool)
    return records.where(train), keys[train]


def _kept(count: int, fraction: float) -> int:
    """How many of a part's smallest epoch keys it returns: the share it would give if its keys were spread evenly,
    with a margin of six standard deviations (the driver checks that it was enough, ``epoch_cuts_from``)."""
    return min(count, math.ceil(fraction * count + 6 * math.sqrt(count) + 16))


def part_epoch_keys(job: Any, part: MixedPart, cut: Any, n: Any = None) -> dict[str, Any]:
    """The epoch pass over a mixed part: for each source of fractional epochs, its training records' count and
    their smallest epoch keys (``n[s]`` of them; None: ``_kept``), for the driver's ``epoch_cuts_from``."""
    cfg, sources = job.cfg, job.sources
    cfgs = [source_config(cfg, s) for s in sources]
    files: dict[int, InputFile] = {}
    counts, kept = [], []
    for s, source in enumerate(sources):
        fraction = source.epochs - math.floor(source.epochs)
        if fraction == 0:
            counts.append(0)
            kept.append([])
            continue
        keys = [
            epoch_keys(_train_records(records, None if cut is None else cut[s], cfg.split.seed)[1])
            for _, records, _, _ in _source_blocks(part, s, files, cfgs[s], None)
        ]
        every = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
        take = _kept(len(every), fraction) if n is None else min(n[s], len(every))
        smallest = np.sort(np.partition(every, take - 1)[:take]) if 0 < take < len(every) else np.sort(every)[:take]
        counts.append(len(every))
        kept.append(smallest.tolist())
    return {"index": part.index, "records": counts, "keys": kept,
            "inputs": [{"lines": files[j].lines if j in files else 0} for j in range(len(part.segments))]}  # fmt: skip


def epoch_cuts_from(sources: list[Source], results: list[dict[str, Any]]) -> tuple[list[int | None], list[int]]:
    """Each source's epoch cut (records whose epoch key is below it get their extra copy: the ``round(f * N)`` of
    smallest key, ``f`` the fractional part of its epochs, ``N`` its training records), and the sources whose
    parts did not return enough keys to know it (the pass is then run again for them, asking for that many)."""
    cuts: list[int | None] = []
    again: list[int] = []
    for s, source in enumerate(sources):
        fraction = source.epochs - math.floor(source.epochs)
        if fraction == 0:
            cuts.append(None)
            continue
        total = sum(r["records"][s] for r in results)
        k = math.floor(fraction * total + 0.5)
        if k == 0:
            cuts.append(0)
            continue
        union = np.sort(np.fromiter((key for r in results for key in r["keys"][s]), dtype=np.uint64))
        kth = int(union[k - 1]) if len(union) >= k else None
        # a part that kept fewer keys than it has holds unseen keys above its largest kept one only
        enough = kth is not None and all(
            len(r["keys"][s]) == r["records"][s] or (r["keys"][s] and r["keys"][s][-1] >= kth) for r in results
        )
        if not enough:
            cuts.append(None)
            again.append(s)
            continue
        cuts.append(kth + 1)
    return cuts, again
