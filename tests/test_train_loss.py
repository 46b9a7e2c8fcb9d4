"""The weighted loss against an independent reference, across normalizations, row layouts and model families.

Reference (``train_support.reference_loss``): the model's ordinary forward with full logits, then an explicit
per-token Python loop over ``log_softmax``. Ours: ``weighted_lm_loss`` (decoder body + tiled LM head on the
supervised positions only). Everything float32 on CPU, tolerance 1e-5.
"""

from __future__ import annotations

import pytest
import torch
import train_support as ts

from weightprep.constants import ATTENTION_MASK, IGNORE_INDEX, INPUT_IDS, LABELS, POSITION_IDS, WEIGHTS
from weightprep.errors import UsageError
from weightprep.train import WeightedCollator, weighted_lm_loss
from weightprep.train.attention import VARLEN_KEYS
from weightprep.train.loss import loss_denominator

VOCAB = 96
TOL = 1e-5


@pytest.fixture(scope="module")
def llama():
    return ts.tiny_llama(VOCAB)


def _batch(seed: int, *, packed: bool, rows: int = 4, seq_len: int = 48) -> dict[str, torch.Tensor]:
    return WeightedCollator()(ts.random_rows(seed, rows, seq_len, VOCAB, packed=packed))


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
@pytest.mark.parametrize("normalize", ["weight", "tokens"])
@pytest.mark.parametrize("seed", [0, 1])
def test_weighted_loss_matches_reference(llama, packed, normalize, seed):
    batch = _batch(seed, packed=packed)
    assert (ATTENTION_MASK in batch) is (not packed)
    ours = weighted_lm_loss(llama, batch, normalize=normalize).loss
    ref = ts.reference_loss(llama, batch, normalize)
    assert torch.isfinite(ours)
    assert abs(ours.item() - ref.item()) < TOL, (ours.item(), ref.item())


def _ours_and_reference(model, batch, normalize):
    """(our loss, our gradients, reference loss, reference gradients), each from its own backward."""
    results = []
    for loss_fn in (lambda: weighted_lm_loss(model, batch, normalize=normalize).loss,
                    lambda: ts.reference_loss(model, batch, normalize)):
        model.zero_grad()
        loss = loss_fn()
        loss.backward()
        results += [loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}]
    model.zero_grad()
    return tuple(results)


@pytest.mark.parametrize("family", ["llama", "qwen2-tied", "gpt2", "phi-bias", "gemma2-softcap"])
def test_loss_and_gradients_match_reference_across_heads(family):
    model = ts.tiny_family(family, VOCAB)
    batch = _batch(3, packed=False, rows=3, seq_len=40)  # unpacked: every family honours attention_mask
    ours, g_ours, ref, g_ref = _ours_and_reference(model, batch, "weight")
    assert abs(ours - ref) < TOL, (family, ours, ref)
    assert g_ours.keys() == g_ref.keys()
    for name, grad in g_ref.items():
        torch.testing.assert_close(g_ours[name], grad, atol=TOL, rtol=1e-4, msg=f"{family}: {name}")


def test_all_ones_weights_give_the_models_own_causal_lm_loss(llama):
    batch = _batch(5, packed=True)
    batch[WEIGHTS] = (batch[LABELS] != IGNORE_INDEX).float()
    own = llama(
        input_ids=batch[INPUT_IDS], position_ids=batch[POSITION_IDS], labels=batch[LABELS], use_cache=False
    ).loss
    for normalize in ("weight", "tokens"):  # identical when every weight is 1
        ours = weighted_lm_loss(llama, batch, normalize=normalize).loss
        assert abs(ours.item() - own.item()) < TOL, (normalize, ours.item(), own.item())


def test_lora_model_matches_reference_and_trains_only_adapters():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(ts.tiny_llama(VOCAB), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    # LoRA B starts at zero: give it values so the gradient check means something
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    batch = _batch(7, packed=True)
    ours, g_ours, ref, g_ref = _ours_and_reference(model, batch, "tokens")
    assert abs(ours - ref) < TOL
    assert g_ours and all("lora_" in n for n in g_ours)
    assert g_ours.keys() == g_ref.keys()
    for name, grad in g_ref.items():
        torch.testing.assert_close(g_ours[name], grad, atol=TOL, rtol=1e-4, msg=name)


def test_lora_on_lm_head_is_refused():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(ts.tiny_llama(VOCAB), LoraConfig(r=2, target_modules=["q_proj", "lm_head"]))
    with pytest.raises(UsageError, match="lm_head"):
        weighted_lm_loss(model, _batch(0, packed=True, rows=1))


def test_eos_keeps_label_and_weight_when_pad_is_eos(tmp_path):
    """Built by the real pipeline with a pad == eos tokenizer; the EOS of every document is trained on."""
    from tokenizer_factory import no_bos_pad_is_eos

    from weightprep.config import config_from_dict
    from weightprep.pipeline import build
    from weightprep.train import load_shards

    tok = no_bos_pad_is_eos()
    assert tok.pad_token_id == tok.eos_token_id
    eos = tok.eos_token_id
    records = [
        {"pieces": [{"text": f"Question {i}? ", "weight": 0}, {"text": f"Answer number {i}.", "weight": 1.5}]}
        for i in range(6)
    ]
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(__import__("json").dumps(r) + "\n" for r in records))
    cfg = config_from_dict({"pack": {"seq_len": 64}})
    build([str(raw)], tmp_path / "shards", cfg, tokenizer=tok)
    shards = load_shards(tmp_path / "shards")
    batch = WeightedCollator(packed=shards.packed)([shards.dataset[i] for i in range(len(shards.dataset))])

    ids, labels, weights = batch[INPUT_IDS], batch[LABELS], batch[WEIGHTS]
    seg_ends = []  # the EOS closing each document: the last token of every non-pad segment
    for r, row in enumerate(shards.dataset):
        start = 0
        for n in row["seq_lengths"]:
            if weights[r, start : start + n].sum() > 0:  # a document (a pad tail has no weight at all)
                seg_ends.append((r, start + n - 1))
            start += n
    assert len(seg_ends) == len(records)
    for r, t in seg_ends:
        assert ids[r, t] == eos and labels[r, t] == eos and weights[r, t] > 0
    pad_positions = (ids == eos) & (weights == 0)
    assert pad_positions.any(), "expected a pad tail of eos ids"
    assert (labels[pad_positions] == IGNORE_INDEX).all()

    model = ts.tiny_llama(len(tok))
    ours = weighted_lm_loss(model, batch, normalize="weight")
    ref = ts.reference_loss(model, batch, "weight")
    assert abs(ours.loss.item() - ref.item()) < TOL
    eos_logp = ours.log_probs[[r for r, _ in seg_ends], [t - 1 for _, t in seg_ends]]
    assert (eos_logp < 0).all()  # each EOS was scored as a target


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
def test_denominator_over_micro_batches_equals_whole_batch(packed):
    """Against sums by hand over the rows: a token is a target at t >= 1 (predicted from t - 1) when it has a
    label and a weight > 0; ``weight`` sums those weights, ``tokens`` counts them, whatever the micro-batching."""
    rows = ts.random_rows(11, 8, 32, VOCAB, packed=packed)
    targets = [
        float(row[WEIGHTS][t])
        for row in rows
        for t in range(1, len(row[LABELS]))
        if int(row[LABELS][t]) != IGNORE_INDEX and float(row[WEIGHTS][t]) > 0
    ]
    by_hand = {"weight": sum(targets), "tokens": float(len(targets))}
    assert by_hand["tokens"] > 20 and by_hand["weight"] != by_hand["tokens"]  # many targets, weights not all 1
    whole = [WeightedCollator()(rows)]
    singles = [WeightedCollator()([row]) for row in rows]
    uneven = [WeightedCollator()(rows[a:b]) for a, b in ((0, 3), (3, 4), (4, 8))]
    for normalize in ("weight", "tokens"):
        for batches in (whole, singles, uneven):
            assert loss_denominator(batches, normalize).item() == pytest.approx(by_hand[normalize], rel=1e-12)


def test_collator_stacks_without_touching_labels():
    rows = ts.random_rows(2, 3, 24, VOCAB, packed=True)
    rows[0][LABELS][5] = ts.PAD  # a label equal to the pad id must survive (never masked by id)
    rows[0][INPUT_IDS][5] = ts.PAD
    batch = WeightedCollator()(rows)
    # packed rows: the token columns plus flash-attention's varlen kwargs (tests/test_train_attention.py)
    assert set(batch) == {INPUT_IDS, LABELS, WEIGHTS, POSITION_IDS, *VARLEN_KEYS}
    assert batch[INPUT_IDS].dtype == torch.int64 and batch[WEIGHTS].dtype == torch.float32
    assert batch[LABELS][0, 5] == ts.PAD
    assert batch[INPUT_IDS].shape == (3, 24)
    unpacked = WeightedCollator()(ts.random_rows(2, 2, 24, VOCAB, packed=False))
    assert ATTENTION_MASK in unpacked and unpacked[ATTENTION_MASK].dtype == torch.int64
    assert not set(VARLEN_KEYS) & set(unpacked)  # unpacked rows carry their mask instead
    with pytest.raises(UsageError, match="weights"):
        WeightedCollator()([{INPUT_IDS: [1, 2], LABELS: [1, 2]}])
