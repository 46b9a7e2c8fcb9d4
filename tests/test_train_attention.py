"""Packed documents stay apart under every attention implementation, at micro-batch 1 and 4.

flash-attention runs transformers' real dispatch (``flash_attention_forward`` -> ``_flash_attention_forward``)
with CPU reference kernels in place of flash_attn's (``tests/flash_reference.py``). The check: each document's
log-probabilities inside a batch of packed rows equal those of the same document run alone, through the custom
loop (``WeightedCollator()`` + ``weighted_lm_loss``) and through ``WeightedSFTTrainer``'s own data path.
"""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch
import train_support as ts
from flash_reference import CALLS, reference_flash_attention, use_attention
from hypothesis import given, settings
from hypothesis import strategies as st

from weightprep.constants import POSITION_IDS, SEQ_LENGTHS
from weightprep.errors import UsageError
from weightprep.train import WeightedCollator, weighted_lm_loss
from weightprep.train.attention import (
    VARLEN_KEYS,
    isolation_mode,
    varlen_kwargs_from_position_ids,
    varlen_kwargs_from_seq_lengths,
)

VOCAB = ts.VOCAB_FOR_STEPS
SEQ = 40
TOL = 2e-5
FLASH = ("flash_attention_2", "flash_attention_3", "kernels-community/flash-attn2")


def _rows(seed: int = 3, n: int = 4) -> list[dict]:
    rows = ts.random_rows(seed, n, SEQ, VOCAB, docs_per_row=(2, 4))
    assert all(len(r[SEQ_LENGTHS]) >= 2 for r in rows)  # every row packs documents (and maybe a pad tail)
    return rows


def _documents(row: dict) -> list[tuple[int, int]]:
    """(start, length) of each document of a row; the pad tail has weight 0 everywhere and is skipped."""
    spans, start = [], 0
    for n in row[SEQ_LENGTHS].tolist():
        if row["weights"][start : start + n].any() or row["input_ids"][start] == ts.BOS:
            spans.append((start, int(n)))
        start += int(n)
    return spans


def _alone(row: dict, start: int, n: int) -> list[dict]:
    doc = {"ids": row["input_ids"][start : start + n], "weights": row["weights"][start : start + n].copy()}
    doc["weights"][0] = 0.0
    return ts.pack_rows([[doc]], n)


def _max_leak(log_probs_of, rows: list[dict]) -> float:
    """Largest |log p(inside the packed batch) - log p(document alone)| over every document of every row."""
    packed = log_probs_of(rows)
    worst = 0.0
    for b, row in enumerate(rows):
        for start, n in _documents(row):
            alone = log_probs_of(_alone(row, start, n))[0]
            inside = packed[b, start : start + n - 1]
            assert alone.abs().sum() > 0  # the document has supervised tokens to compare
            worst = max(worst, (inside - alone).abs().max().item())
    return worst


@pytest.fixture(scope="module")
def model():
    return ts.tiny_llama(VOCAB, layers=2)


@pytest.mark.parametrize("micro_batch", [1, 4])
@pytest.mark.parametrize("impl", ["sdpa", "eager", *FLASH])
def test_custom_loop_isolates_documents(model, impl, micro_batch):
    rows = _rows()[:micro_batch]
    collate = WeightedCollator()

    def log_probs_of(rs):
        return weighted_lm_loss(model, collate(rs)).log_probs.detach()

    use_attention(model, impl)
    try:
        with reference_flash_attention(impl if impl in FLASH else "flash_attention_2"):
            before = dict(CALLS)
            leak = _max_leak(log_probs_of, rows)
            varlen_calls = CALLS["varlen"] - before["varlen"]
    finally:
        use_attention(model, "sdpa")
    assert leak < TOL, f"{impl}, micro-batch {micro_batch}: documents see each other (max diff {leak:.3g})"
    if impl in FLASH:  # the flash path ran, through the varlen kernel (packed rows) for every layer
        assert varlen_calls > 0
    else:
        assert varlen_calls == 0


def test_the_reference_flash_path_leaks_without_varlen_kwargs(model):
    """The check has teeth: transformers' flash path at micro-batch 4 with position_ids only (what weightprep
    passed before) runs causal attention over each whole row, and documents after the first change."""
    rows = _rows()
    batch = WeightedCollator()(rows)
    use_attention(model, "flash_attention_2")
    try:
        with reference_flash_attention("flash_attention_2"), torch.no_grad():
            leaky = model(input_ids=batch["input_ids"], position_ids=batch[POSITION_IDS], use_cache=False).logits
            isolated = model(
                input_ids=batch["input_ids"], position_ids=batch[POSITION_IDS], use_cache=False,
                **{k: batch[k] for k in VARLEN_KEYS},
            ).logits  # fmt: skip
    finally:
        use_attention(model, "sdpa")
    with torch.no_grad():
        sdpa = model(input_ids=batch["input_ids"], position_ids=batch[POSITION_IDS], use_cache=False).logits
    torch.testing.assert_close(isolated, sdpa, atol=TOL, rtol=0)
    assert (leaky - sdpa).abs().max() > 1e-2


def _trainer(tmp_path, rows, impl, micro_batch, **kwargs):
    from trl import SFTConfig

    from weightprep.tokenizer import load_tokenizer
    from weightprep.train import WeightedSFTTrainer

    ds = datasets.load_from_disk(str(ts.write_shards(tmp_path / "s", rows, SEQ)))
    model = use_attention(ts.tiny_llama(VOCAB, layers=2), impl)
    args = SFTConfig(
        output_dir=str(tmp_path / "o"), use_cpu=True, bf16=False, report_to="none", activation_checkpointing=False,
        per_device_train_batch_size=micro_batch, dataloader_drop_last=False,
    )  # fmt: skip
    return WeightedSFTTrainer(model, args=args, train_dataset=ds, processing_class=load_tokenizer(None), **kwargs)


@pytest.mark.parametrize(
    ("impl", "micro_batch"), [("flash_attention_2", 1), ("flash_attention_2", 4), ("sdpa", 4)]
)
def test_trainer_isolates_documents_through_its_own_data_path(tmp_path, impl, micro_batch):
    """Batches come from the trainer's dataloader (its collator, column pruning, _prepare_inputs) into
    compute_loss, as in ``trainer.train()``."""
    rows = _rows()
    with reference_flash_attention("flash_attention_2"):
        trainer = _trainer(tmp_path, rows, impl, micro_batch)
        loader = trainer.get_train_dataloader()
        seen = 0
        for raw in loader:
            batch = trainer._prepare_inputs(raw)
            assert set(VARLEN_KEYS) <= set(batch)
            _, out = trainer.compute_loss(trainer.model, batch, return_outputs=True)
            # the loader shuffles: find each batch row among the rows by its ids
            for b in range(batch["input_ids"].shape[0]):
                row = next(r for r in rows if np.array_equal(r["input_ids"], batch["input_ids"][b].numpy()))
                for start, n in _documents(row):
                    one = trainer._prepare_inputs(trainer.data_collator(_alone(row, start, n)))
                    _, alone = trainer.compute_loss(trainer.model, one, return_outputs=True)
                    inside = out.log_probs[b, start : start + n - 1].detach()
                    torch.testing.assert_close(inside, alone.log_probs[0].detach(), atol=TOL, rtol=0)
                seen += 1
    assert seen == len(rows)


@pytest.mark.parametrize("impl", ["paged|eager", "my_custom_attention"])
def test_implementations_that_cannot_isolate_are_refused_for_packed_rows(model, impl):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, sdpa_attention_forward

    added = impl not in ALL_ATTENTION_FUNCTIONS._global_mapping
    if added:
        ALL_ATTENTION_FUNCTIONS.register(impl, sdpa_attention_forward)
    use_attention(model, impl)
    try:
        with pytest.raises(UsageError, match="cannot keep the documents of a packed row apart"):
            weighted_lm_loss(model, WeightedCollator()(_rows()))
        # unpacked rows carry their attention_mask, which every implementation honours: no refusal
        unpacked = WeightedCollator()(ts.random_rows(0, 2, SEQ, VOCAB, packed=False))
        if impl == "my_custom_attention":
            assert torch.isfinite(weighted_lm_loss(model, unpacked).loss)
    finally:
        use_attention(model, "sdpa")
        if added:
            ALL_ATTENTION_FUNCTIONS._global_mapping.pop(impl, None)
    assert isolation_mode("sdpa") == "mask"


def test_trainer_refuses_packed_shards_under_an_attention_that_cannot_isolate(tmp_path):
    with pytest.raises(UsageError, match="paged\\|eager"):
        _trainer(tmp_path, _rows(), "paged|eager", 2)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n_rows=st.integers(1, 5), docs=st.integers(1, 6))
def test_varlen_kwargs_from_seq_lengths_match_transformers_own_derivation(seed, n_rows, docs):
    """Ours (from seq_lengths, no device sync) == transformers' prepare_fa_kwargs_from_position_ids over the
    flattened batch (what its batch-1 inference computes), == ours from position_ids."""
    from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

    rows = ts.random_rows(seed, n_rows, SEQ, VOCAB, docs_per_row=(1, docs))
    batch = WeightedCollator()(rows)
    ours = varlen_kwargs_from_seq_lengths([r[SEQ_LENGTHS] for r in rows], SEQ)
    (cu_q, cu_k), (max_q, _) = prepare_fa_kwargs_from_position_ids(batch[POSITION_IDS])
    assert ours["cu_seq_lens_q"].dtype == torch.int32
    assert ours["cu_seq_lens_q"].tolist() == cu_q.tolist() == cu_k.tolist()
    assert ours["max_length_q"] == ours["max_length_k"] == int(max_q)
    derived = varlen_kwargs_from_position_ids(batch[POSITION_IDS])
    assert derived["cu_seq_lens_q"].tolist() == ours["cu_seq_lens_q"].tolist()
    assert derived["max_length_q"] == ours["max_length_q"]
    assert batch["cu_seq_lens_q"].tolist() == ours["cu_seq_lens_q"].tolist()


def test_collator_rejects_seq_lengths_that_do_not_cover_the_row():
    rows = _rows(n=2)
    rows[1] = {**rows[1], SEQ_LENGTHS: np.asarray([3, 4], dtype=np.int32)}
    with pytest.raises(UsageError, match="row 1 of the batch has seq_lengths \\[3, 4\\]"):
        WeightedCollator()(rows)


def test_trainer_refuses_deepspeed_zero3_and_compute_metrics(tmp_path):
    """ZeRO-3 (as transformers' own is_deepspeed_zero3_enabled reports it) would hand the weighted head an empty
    partitioned lm_head.weight; compute_metrics would never be called, since no logits are built."""
    from transformers.integrations.deepspeed import set_hf_deepspeed_config, unset_hf_deepspeed_config

    class Zero3Config:
        def is_zero3(self):
            return True

    config = Zero3Config()
    set_hf_deepspeed_config(config)
    try:
        with pytest.raises(UsageError, match="DeepSpeed ZeRO-3 is not supported"):
            _trainer(tmp_path, _rows(), "sdpa", 2)
    finally:
        unset_hf_deepspeed_config()
    with pytest.raises(UsageError, match="compute_metrics is not supported"):
        _trainer(tmp_path, _rows(), "sdpa", 2, compute_metrics=lambda p: {})
    assert _trainer(tmp_path, _rows(), "sdpa", 2).normalize == "weight"  # neither: builds
