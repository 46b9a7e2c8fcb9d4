"""Train the bundled sample tokenizer: byte-level BPE, 4096 ids, on the texts of ``sample_data/raw.jsonl``.

The result, ``sample_data/tokenizer/``, is a ``transformers.PreTrainedTokenizerFast`` directory that
``AutoTokenizer.from_pretrained`` loads offline. It behaves like a Llama-3-style tokenizer in the ways that
matter to weightprep:

- byte-level pre-tokenizer (``add_prefix_space=False``) and decoder: every string round-trips exactly;
- special tokens ``<|bos|>`` (id 0), ``<|eos|>`` (id 1), ``<|pad|>`` (id 2), all distinct;
- a ``TemplateProcessing`` post-processor that puts BOS in front of a single sequence when called with
  ``add_special_tokens=True``, so a pipeline that adds BOS itself must call it with ``add_special_tokens=False``
  (weightprep does) or the document starts with two BOS tokens.

Training is deterministic: ``RAYON_NUM_THREADS=1`` is set before ``tokenizers`` is imported, and the texts are
fed in file order. Running the script twice gives a byte-identical ``tokenizer.json``.
It ends with a self-check: loading, special tokens, exact round trip of every piece text, the token count.

Usage: ``python sample_data/make_tokenizer.py [--raw sample_data/raw.jsonl] [--out sample_data/tokenizer]``
(a few seconds on one core).
"""

from __future__ import annotations

import os

# Before tokenizers is imported: one Rayon thread makes the trainer's merge order reproducible.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import json  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

HERE = Path(__file__).resolve().parent
BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
VOCAB_SIZE = 4096
MODEL_MAX_LENGTH = 4096


def records(raw: Path) -> Iterator[list[str]]:
    """The piece texts of each record, in file order."""
    with open(raw, encoding="utf-8") as f:
        for line in f:
            yield [p["text"] for p in json.loads(line)["pieces"]]


def train(raw: Path) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS, PAD],  # ids 0, 1, 2
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: nothing is ever unknown
        show_progress=False,
    )
    # Train on whole documents (what the model sees), not on pieces cut mid-sentence.
    tok.train_from_iterator(("".join(pieces) for pieces in records(raw)), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    # Like Llama 3: byte-level offsets, then BOS in front of each sequence.
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS} $A",
                pair=f"{BOS} $A {BOS} $B:1",
                special_tokens=[(BOS, bos_id)],
            ),
        ]
    )
    return tok


def save(tok: Tokenizer, out: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=MODEL_MAX_LENGTH,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    # transformers 5 names the class "TokenizersBackend", which 4.x cannot resolve; the 4.x name loads in both.
    # It also no longer writes special_tokens_map.json, which older loaders and users look for.
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.pop("backend", None)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    specials = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    for path, obj in ((config_path, config), (out / "special_tokens_map.json", specials)):
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def self_check(raw: Path, out: Path) -> None:
    from transformers import AutoTokenizer
    from transformers.utils import logging

    logging.set_verbosity_error()  # the overlong documents trigger a "longer than model_max_length" warning
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.is_fast, type(tok)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == (BOS, EOS, PAD)
    ids = {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}
    assert len(ids) == 3 and None not in ids, ids
    assert tok.model_max_length == MODEL_MAX_LENGTH
    with_bos = tok("hello world", add_special_tokens=True)["input_ids"]
    without = tok("hello world", add_special_tokens=False)["input_ids"]
    assert with_bos == [tok.bos_token_id, *without] and tok.bos_token_id not in without, (with_bos, without)

    # Each piece on its own, as weightprep tokenizes it; a document is BOS + its pieces + EOS.
    n_pieces, piece_tokens, doc_tokens = 0, 0, []
    for pieces in records(raw):
        enc = tok(pieces, add_special_tokens=False)["input_ids"]
        for text, ids in zip(pieces, enc, strict=True):
            assert tok.decode(ids) == text, f"piece does not round-trip: {text[:200]!r}"
        n_pieces += len(pieces)
        piece_tokens += sum(len(ids) for ids in enc)
        doc_tokens.append(2 + sum(len(ids) for ids in enc))
    doc_tokens.sort()
    print(f"vocab size: {len(tok)}")
    print(f"round trip: {n_pieces} piece texts decode exactly")
    print(f"tokens in {raw.name}: {piece_tokens} (piece tokens), {sum(doc_tokens)} with BOS+EOS per document")
    print(
        f"documents: {len(doc_tokens)}, tokens min {doc_tokens[0]}, median {doc_tokens[len(doc_tokens) // 2]}, "
        f"max {doc_tokens[-1]}; over 2048: {sum(n > 2048 for n in doc_tokens)}; "
        f"1024-2048: {sum(1024 < n <= 2048 for n in doc_tokens)}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raw", type=Path, default=HERE / "raw.jsonl")
    ap.add_argument("--out", type=Path, default=HERE / "tokenizer")
    args = ap.parse_args()
    save(train(args.raw), args.out)
    print(f"wrote {args.out}")
    self_check(args.raw, args.out)


if __name__ == "__main__":
    main()
