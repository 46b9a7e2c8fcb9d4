"""The tokenize stage: later pieces of a document are continuations, for every tokenizer family.

The bug these guard: tokenizers that put a word-start marker at the start of every call (SentencePiece
conversions, ByteLevel with a prefix space) put a space in front of every piece after the first when each
piece is tokenized alone, so a document no longer decodes to its pieces back to back.
"""

from __future__ import annotations

import copy
import json

import datasets
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import continuation_ids
from tokenizer_factory import (
    FAMILIES,
    bos_eos_distinct,
    byte_level_prefix_space,
    sample_tokenizer,
    sentencepiece_legacy,
    sentencepiece_metaspace,
)

from weightprep.batches import Records
from weightprep.cli import main
from weightprep.errors import UsageError
from weightprep.stages.tokenize import PieceTokenizer, continuation_spec, document_starts


def _records(texts: list[str], piece_offsets: list[int]) -> Records:
    n = len(piece_offsets) - 1
    return Records(
        path="mem.jsonl", lines=np.arange(1, n + 1), texts=texts, piece_weights=np.ones(len(texts)),
        piece_offsets=np.asarray(piece_offsets, dtype=np.int64),
    )


MARKER_FAMILIES = [sentencepiece_legacy, sentencepiece_metaspace, byte_level_prefix_space]
#: the issue's example: a prompt ending in a blank line, then the next turn
PIECES = [{"text": "System: be brief.\n[]\n\n", "weight": 0}, {"text": "User:", "weight": 0}, {"text": " hi there", "weight": 1}]


@pytest.mark.parametrize("make_tok", MARKER_FAMILIES, ids=lambda f: f.__name__)
def test_the_cli_build_from_a_saved_tokenizer_joins_pieces_without_spaces(make_tok, tmp_path):
    """The user's path: a tokenizer directory loaded by AutoTokenizer, `weightprep build`, shards read back."""
    tok = make_tok()
    tok.save_pretrained(tmp_path / "tok")
    raw = tmp_path / "raw.jsonl"
    raw.write_text(json.dumps({"pieces": PIECES}) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["build", str(raw), "--tokenizer", str(tmp_path / "tok"), "--out", str(out), "--seq-len", "64"])
    assert result.exit_code == 0, result.output
    row = datasets.load_from_disk(str(out))[0]
    doc = row["input_ids"][: row["seq_lengths"][0]]
    joined = "".join(p["text"] for p in PIECES)
    assert tok.decode(doc, skip_special_tokens=True) == tok.decode(tok(joined)["input_ids"], skip_special_tokens=True)
    assert "\n\n User:" not in tok.decode(doc) and "\n\nUser: hi there" in tok.decode(doc)


@pytest.mark.parametrize("make_tok", MARKER_FAMILIES, ids=lambda f: f.__name__)
def test_later_pieces_are_continuations_and_the_first_is_a_start(make_tok):
    tok = make_tok()
    texts = ["Hello", " world", "x"]
    ids, offsets = PieceTokenizer(tok)(_records(texts, [0, 3]))
    pieces = [ids[offsets[i] : offsets[i + 1]].tolist() for i in range(3)]
    assert pieces[0] == tok("Hello", add_special_tokens=False)["input_ids"]
    assert pieces[1:] == [continuation_ids(tok, " world"), continuation_ids(tok, "x")]
    assert pieces[2] != tok("x", add_special_tokens=False)["input_ids"]  # the marker is what differs


@pytest.mark.parametrize("make_tok", MARKER_FAMILIES, ids=lambda f: f.__name__)
def test_empty_leading_pieces_do_not_make_the_first_text_a_continuation(make_tok):
    tok = make_tok()
    ids, offsets = PieceTokenizer(tok)(_records(["", "", "Hello", "", " you", "Hi"], [0, 5, 6]))
    assert ids[offsets[2] : offsets[3]].tolist() == tok("Hello", add_special_tokens=False)["input_ids"]
    assert ids[offsets[4] : offsets[5]].tolist() == continuation_ids(tok, " you")
    assert ids[offsets[5] : offsets[6]].tolist() == tok("Hi", add_special_tokens=False)["input_ids"]  # a new record


@settings(max_examples=200, deadline=None)
@given(records=st.lists(st.lists(st.sampled_from(["", "a", " b"]), max_size=5), max_size=8))
def test_document_starts_are_each_records_first_non_empty_piece(records):
    texts = [t for r in records for t in r]
    offsets = np.cumsum([0, *map(len, records)])
    expected = []
    for r, record in enumerate(records):
        first = next((i for i, t in enumerate(record) if t), None)
        if first is not None:
            expected.append(int(offsets[r]) + first)
    assert document_starts(texts, offsets).tolist() == expected


@pytest.mark.parametrize("make_tok", [bos_eos_distinct, sample_tokenizer], ids=["byte_level", "sample"])
def test_tokenizers_without_a_marker_use_one_backend(make_tok):
    """GPT-2/Llama-3/Qwen-style byte-level BPE adds nothing at the start of a call: no continuation copy."""
    tok = make_tok()
    assert continuation_spec(json.loads(tok.backend_tokenizer.to_str())) is None
    assert PieceTokenizer(tok).continuation is None


def test_the_continuation_is_configured_not_the_text():
    legacy = continuation_spec(json.loads(sentencepiece_legacy().backend_tokenizer.to_str()))
    assert [n["type"] for n in legacy["normalizer"]["normalizers"]] == ["Replace"]
    metaspace = continuation_spec(json.loads(sentencepiece_metaspace().backend_tokenizer.to_str()))
    assert metaspace["pre_tokenizer"]["prepend_scheme"] == "never" and metaspace["normalizer"] is None
    prefix = continuation_spec(json.loads(byte_level_prefix_space().backend_tokenizer.to_str()))
    assert prefix["pre_tokenizer"]["add_prefix_space"] is False
    assert sentencepiece_legacy().backend_tokenizer.normalizer is not None  # the caller's tokenizer is untouched


def _with_normalizer(normalizer):
    tok = copy.deepcopy(bos_eos_distinct())
    tok.backend_tokenizer.normalizer = normalizer
    return tok


def test_a_tokenizer_that_strips_every_call_is_refused():
    from tokenizers import normalizers

    with pytest.raises(UsageError, match="Strip removes the leading whitespace"):
        PieceTokenizer(_with_normalizer(normalizers.Strip(left=True, right=False)))


def test_an_unknown_component_is_refused():
    spec = json.loads(bos_eos_distinct().backend_tokenizer.to_str())
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [{"type": "FancyPrefixer"}]}
    with pytest.raises(UsageError, match="pre-tokenizer 'FancyPrefixer'"):
        continuation_spec(spec)


def test_a_marker_left_after_the_known_ones_are_off_is_refused():
    """The probe: a Prepend the spec cannot see, as a second normalizer in a Sequence, still raises."""
    from tokenizers import normalizers

    tok = _with_normalizer(normalizers.Sequence([normalizers.Replace("x", "▁x")]))
    with pytest.raises(UsageError, match="still change 'x'"):
        PieceTokenizer(tok)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_establishes_its_continuation(family):
    PieceTokenizer(FAMILIES[family]())  # raises for none of the suite's tokenizers


# --- backends: fastokens and tokenizers give the same shards ---------------------------------------------------

FASTOKENS_LOADS = {"bos_eos_distinct", "no_bos_pad_is_eos", "bos_eos_pad_same", "template_adds_bos",
                   "sentencepiece_legacy", "byte_level_prefix_space"}  # fastokens 0.3.5 lacks Metaspace, Whitespace


def _backend_build(tok, raw, out, backend, notes=None, part_bytes=1 << 28):
    from weightprep.config import config_from_dict
    from weightprep.pipeline import build

    read = {"block_bytes": 1 << 14, "part_bytes": part_bytes}
    cfg = config_from_dict({"pack": {"seq_len": 128}, "tokenizer": {"backend": backend}, "read": read})
    return build([str(raw)], out, cfg, tokenizer=tok, notify=None if notes is None else notes.append)


def _digests(out):
    import hashlib

    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("*.arrow"))}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_both_backends_write_byte_identical_shards(family, tmp_path):
    from conftest import SAMPLE_RAW

    tok = FAMILIES[family]()
    hf = _backend_build(tok, SAMPLE_RAW, tmp_path / "hf", "hf")
    notes: list[str] = []
    auto = _backend_build(tok, SAMPLE_RAW, tmp_path / "auto", "auto", notes)
    assert hf["tokenizer"]["backend"] == "hf"
    assert auto["tokenizer"]["backend"] == ("fastokens" if family in FASTOKENS_LOADS else "hf")
    assert bool(notes) == (family not in FASTOKENS_LOADS) and all("not fastokens" in n for n in notes)
    assert _digests(tmp_path / "hf") and _digests(tmp_path / "hf") == _digests(tmp_path / "auto")
    assert hf["counts"] == auto["counts"]


def test_fastokens_on_a_tokenizer_it_cannot_load_is_a_clear_error(tmp_path, write_jsonl):
    tok = FAMILIES["sentencepiece_metaspace"]()
    with pytest.raises(UsageError, match="fastokens cannot load this tokenizer.*--tokenizer-backend hf"):
        _backend_build(tok, write_jsonl([{"pieces": PIECES}]), tmp_path / "out", "fastokens")
    assert not (tmp_path / "out").exists()


def test_without_fastokens_auto_falls_back_and_says_so(tmp_path, write_jsonl, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "fastokens", None)  # import fails
    notes: list[str] = []
    manifest = _backend_build(bos_eos_distinct(), write_jsonl([{"pieces": PIECES}]), tmp_path / "out", "auto", notes)
    assert manifest["tokenizer"]["backend"] == "hf" and "not installed" in notes[0]
    with pytest.raises(UsageError, match="not installed"):
        _backend_build(bos_eos_distinct(), write_jsonl([{"pieces": PIECES}]), tmp_path / "o2", "fastokens")


@pytest.mark.parametrize("part_bytes", [1 << 28, 100], ids=["one-part", "input-parts"])
def test_the_guard_stops_the_build_at_a_piece_fastokens_gets_wrong(tmp_path, write_jsonl, monkeypatch, part_bytes):
    """A fastokens bug on one text: the sampled re-encode catches it, names file:line and both ids, writes nothing.
    With input parts the line is still the line in the file."""
    from weightprep.stages import tokenize as stage

    real = stage._FastokensEncoder.__call__

    def wrong_on_weird(self, texts):
        ids, offsets = real(self, texts)
        ids = ids.copy()
        for i, t in enumerate(texts):
            if t == "weird" and offsets[i + 1] > offsets[i]:
                ids[offsets[i]] += 1
        return ids, offsets

    monkeypatch.setattr(stage._FastokensEncoder, "__call__", wrong_on_weird)
    lines = [{"pieces": [{"text": "fine", "weight": 1}]}] * 4 + [{"pieces": [{"text": "ok ", "weight": 0}, {"text": "weird", "weight": 1}]}]
    raw = write_jsonl(lines)
    monkeypatch.setattr(stage, "GUARD_PIECES", 10)  # every piece of this small block is sampled
    with pytest.raises(UsageError) as err:
        _backend_build(bos_eos_distinct(), raw, tmp_path / "out", "auto", part_bytes=part_bytes)
    want = bos_eos_distinct()("weird", add_special_tokens=False)["input_ids"]
    assert f"{raw}:5: pieces[1].text" in str(err.value) and f"tokenizers {want}" in str(err.value)
    assert "--tokenizer-backend hf" in str(err.value) and not (tmp_path / "out").exists()


def test_the_guard_samples_every_block_deterministically():
    from weightprep.stages import tokenize as stage

    tok = PieceTokenizer(sentencepiece_legacy(), backend="fastokens")
    assert tok.backend == "fastokens"  # loaded (its agreement probes are not the guard's calls)
    seen: list[list[str]] = []
    ref_start, ref_cont = tok.reference

    class Spy:
        def __init__(self, inner):
            self.inner = inner

        def __call__(self, texts):
            seen.append(list(texts))
            return self.inner(texts)

    tok.reference = (Spy(ref_start), Spy(ref_cont))
    texts = [f"w{i}" for i in range(1000)]
    records = _records(texts, list(range(0, 1001, 4)))
    tok(records)
    first = [list(s) for s in seen]
    seen.clear()
    tok(records)
    assert seen == first and sum(map(len, first)) == stage.GUARD_PIECES
    assert {"w0", "w999"} <= {t for s in first for t in s}  # both ends of the block


@pytest.mark.parametrize("n", [5, 16, 300])
def test_the_guard_samples_every_call_of_documents_deterministically(n):
    """Rendered conversations (``documents``): ``GUARD_DOCUMENTS`` a call, evenly spaced, both ends included, all of
    them where there are fewer; the same ones again for the same call."""
    from weightprep.stages import tokenize as stage

    tok = PieceTokenizer(sentencepiece_legacy(), backend="fastokens")
    assert tok.backend == "fastokens"
    seen: list[list[str]] = []
    ref_start = tok.reference[0]

    def spy(texts):
        seen.append(list(texts))
        return ref_start(texts)

    tok.reference = (spy, tok.reference[1])
    texts = [f"document {i} " * 3 for i in range(n)]
    ids, offsets = tok.documents(texts, lambda d: ("x", d, "messages"))
    assert len(offsets) == n + 1
    first = [list(s) for s in seen]
    tok.documents(texts, lambda d: ("x", d, "messages"))
    assert seen == first + first and len(first) == 1
    assert len(first[0]) == min(n, stage.GUARD_DOCUMENTS) and {texts[0], texts[-1]} <= set(first[0])


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(0, 4), max_size=30), data=st.data())
def test_interleave_puts_pieces_back_in_order(lengths, data):
    from weightprep.stages.tokenize import _interleave

    pieces = [np.arange(n, dtype=np.int32) + 10 * i for i, n in enumerate(lengths)]
    order = np.asarray(data.draw(st.permutations(range(len(lengths)))), dtype=np.int64)
    cut = data.draw(st.integers(0, len(order)))

    def flat(index):
        parts = [pieces[i] for i in index]
        return (np.concatenate(parts) if parts else np.zeros(0, np.int32)), np.cumsum([0, *(len(p) for p in parts)])

    ids, offsets = _interleave([flat(order[:cut]), flat(order[cut:])], order)
    assert [ids[offsets[i] : offsets[i + 1]].tolist() for i in range(len(lengths))] == [p.tolist() for p in pieces]


def test_a_prefetched_fastokens_tokenizer_is_checked_like_any_other(tmp_path):
    """The build starts fastokens on tokenizer.json before loading the tokenizer itself; the agreement probes still
    decide: a prefetched file of another tokenizer is not used (fallback with a note, or an error when asked)."""
    from tokenizer_factory import SAMPLE_TOKENIZER_DIR

    from weightprep.prefetch import FastokensPrefetch

    same = PieceTokenizer(sample_tokenizer(), backend="auto", prefetched=FastokensPrefetch(SAMPLE_TOKENIZER_DIR / "tokenizer.json"))
    assert same.backend == "fastokens" and same.note is None
    bos_eos_distinct().save_pretrained(tmp_path / "other")
    notes: list[str] = []
    other = PieceTokenizer(sample_tokenizer(), backend="auto", notify=notes.append,
                           prefetched=FastokensPrefetch(tmp_path / "other" / "tokenizer.json"))  # fmt: skip
    assert other.backend == "hf" and "different ids" in notes[0]
    missing = PieceTokenizer(sample_tokenizer(), backend="fastokens", prefetched=FastokensPrefetch(tmp_path / "nope.json"))
    with pytest.raises(UsageError, match="fastokens cannot load"):
        _ = missing.backend


def test_an_early_load_is_taken_once_and_only_for_its_own_file(tmp_path):
    """``prefetch.start`` (the command line, before the build's imports) and ``take`` (the build): one load per file,
    handed over once, none for a file that does not exist; a path naming the same file by another route is the
    same load."""
    from tokenizer_factory import SAMPLE_TOKENIZER_DIR

    from weightprep import prefetch

    path = SAMPLE_TOKENIZER_DIR / "tokenizer.json"
    link = tmp_path / "link"
    link.symlink_to(SAMPLE_TOKENIZER_DIR)
    before = set(prefetch._started)
    prefetch.start(path)
    first = prefetch._started[str(path.resolve())]
    prefetch.start(link / "tokenizer.json")  # the same file: no second load
    assert prefetch._started[str(path.resolve())] is first and set(prefetch._started) - before <= {str(path.resolve())}
    assert prefetch.take(tmp_path / "tokenizer.json") is None  # another file: not this load
    taken = prefetch.take(link / "tokenizer.json")
    assert taken is first and prefetch.take(path) is None
    assert PieceTokenizer(sample_tokenizer(), backend="auto", prefetched=taken).backend == "fastokens"
    prefetch.start(tmp_path / "missing" / "tokenizer.json")
    assert str((tmp_path / "missing" / "tokenizer.json").resolve()) not in prefetch._started


@pytest.mark.parametrize(
    ("config", "runs"),
    [({"tokenizer_class": "TokenizersBackend"}, True), ({"tokenizer_class": "PreTrainedTokenizerFast"}, True),
     ({"tokenizer_class": "Qwen2Tokenizer"}, False), ({}, False), (None, True), ("[not json", True)],
)  # fmt: skip
def test_no_early_load_of_a_file_transformers_builds_its_own_tokenizer_from(config, runs, tmp_path):
    """A class of its own (or none) in tokenizer_config.json: transformers builds the tokenizer (the build then
    reads its snapshot), so fastokens' load of the file would be thrown away. No config: the build says why."""
    import json
    import shutil

    from tokenizer_factory import SAMPLE_TOKENIZER_DIR

    from weightprep import prefetch

    shutil.copy(SAMPLE_TOKENIZER_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    if config is not None:
        text = config if isinstance(config, str) else json.dumps(config)
        (tmp_path / "tokenizer_config.json").write_text(text)
    assert prefetch.runs_as_is(tmp_path / "tokenizer.json") is runs
    assert prefetch.runs_as_is(tmp_path / "missing.json") is False
    prefetch.start(tmp_path / "tokenizer.json")
    started = prefetch.take(tmp_path / "tokenizer.json")
    assert (started is not None) is runs
    if started is not None:
        started.close()


def test_an_early_load_switches_off_the_files_truncation_and_padding_and_outlives_nothing(tmp_path):
    """A tokenizer.json saved with truncation and padding on (as a training script leaves it): the early load turns
    both off, as the build's copy of the tokenizers backend does, so fastokens passes the agreement probes and
    encodes whole texts. Its thread is no daemon (one killed in fastokens' native code at exit aborts the
    process), and ``close`` returns once the load has ended."""
    from weightprep.prefetch import FastokensPrefetch

    tok = sample_tokenizer()
    hf = copy.deepcopy(tok.backend_tokenizer)
    hf.enable_truncation(8)
    hf.enable_padding(length=16)
    (tmp_path / "tok").mkdir()
    hf.save(str(tmp_path / "tok" / "tokenizer.json"))
    early = FastokensPrefetch(tmp_path / "tok" / "tokenizer.json")
    assert early._thread.daemon is False
    early.close()
    assert not early._thread.is_alive()
    pieces = PieceTokenizer(tok, backend="auto", prefetched=early)
    assert pieces.backend == "fastokens"
    text = "a long text of many more than eight tokens, to be encoded whole " * 3
    ids, offsets = pieces.encoders[0]([text])
    assert ids.tolist() == tok.backend_tokenizer.encode(text, add_special_tokens=False).ids
