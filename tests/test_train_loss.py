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
from weightprep.train.loss import (
    WeightedLMOutput,
    _gathered,
    _logit_transform,
    attach_weighted_head,
    default_vocab_chunk,
    loss_denominator,
    step_totals,
    supervised_mask,
)

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


@pytest.mark.parametrize(
    "family", ["llama", "qwen2-tied", "gpt2", "phi-bias", "gemma2-softcap", "granite-scaling", "cohere-scale"]
)
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


# --- the parts of the loss that the reference comparisons above cannot reach (found by the mutation check) ---


def test_a_target_needs_both_a_label_and_a_positive_weight(llama):
    """Shards keep labels and weights in step; a hand-made batch need not. A label with weight 0 is not trained
    on, nor is a weight under an ignored label: the loss, its denominator and the log-probs all agree on that."""
    labels = torch.tensor([[-100, 5, -100, 7, 8, 9]])
    weights = torch.tensor([[0.0, 1.0, 2.0, 0.0, -1.0, 0.5]])
    assert supervised_mask(labels, weights).tolist() == [[True, False, False, False, True]]

    batch = _batch(9, packed=True)
    kept = batch[LABELS] != IGNORE_INDEX
    batch[WEIGHTS][kept & (torch.arange(batch[LABELS].shape[1]) % 3 == 0)] = 0.0  # labels kept, weight 0
    batch[LABELS][~kept] = IGNORE_INDEX
    dropped = kept & (torch.arange(batch[LABELS].shape[1]) % 3 == 1)
    batch[LABELS][dropped] = IGNORE_INDEX  # weights kept (> 0), label ignored
    assert (batch[WEIGHTS][dropped] > 0).all() and dropped.any()
    assert ((batch[LABELS] != IGNORE_INDEX) & (batch[WEIGHTS] == 0)).any()
    for normalize in ("weight", "tokens"):
        out = weighted_lm_loss(llama, batch, normalize=normalize)
        ref = ts.reference_loss(llama, batch, normalize)
        assert abs(out.loss.item() - ref.item()) < TOL, (normalize, out.loss.item(), ref.item())
    targets = (batch[LABELS][:, 1:] != IGNORE_INDEX) & (batch[WEIGHTS][:, 1:] > 0)
    assert out.num_supervised.item() == int(targets.sum())
    assert ((out.log_probs != 0) == targets).all()


def _one_target(weight: float) -> dict[str, torch.Tensor]:
    batch = _batch(4, packed=True, rows=2, seq_len=24)
    batch[WEIGHTS].zero_()
    batch[WEIGHTS][1, 10] = weight
    batch[LABELS] = torch.where(batch[WEIGHTS] > 0, batch[INPUT_IDS], IGNORE_INDEX)
    return batch


@pytest.mark.parametrize("weight", [0.5, 1.75])
def test_a_single_target_with_a_small_or_large_weight(llama, weight):
    """One supervised token in the batch (the loss takes its own path for none), whose weight is below or above 1:
    the weighted mean is that token's own loss, whatever its weight."""
    batch = _one_target(weight)
    for normalize in ("weight", "tokens"):
        out = weighted_lm_loss(llama, batch, normalize=normalize)
        ref = ts.reference_loss(llama, batch, normalize)
        assert out.num_supervised.item() == 1 and out.weight_sum.item() == pytest.approx(weight)
        assert abs(out.loss.item() - ref.item()) < TOL, (normalize, out.loss.item(), ref.item())


@pytest.mark.parametrize("family", ["llama", "phi-bias"])
def test_a_step_without_targets_is_a_zero_loss_with_a_zero_gradient_for_every_parameter(family):
    """No supervised token anywhere: the loss is 0 (never 0 / 0) and every parameter, the head's bias included,
    still gets a gradient (of zeros), so that DDP and FSDP reduce every parameter on every rank."""
    model = ts.tiny_family(family, VOCAB)
    batch = _one_target(0.0)
    model.zero_grad()
    out = weighted_lm_loss(model, batch)
    assert out.loss.item() == 0.0 and out.weight_sum.item() == 0.0 and out.num_supervised.item() == 0
    assert out.log_probs.shape == (2, 23) and not out.log_probs.any()
    out.loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert not p.grad.any(), name


def test_step_totals_by_hand():
    """``[denominator, positions, supervised tokens, weight]``: positions are the attended ones when unpacked
    (the mask's sum), every position when packed; zeros for no batch."""
    packed = [WeightedCollator()(ts.random_rows(s, 2, 32, VOCAB, packed=True)) for s in (1, 2)]
    unpacked = WeightedCollator()(ts.random_rows(3, 3, 32, VOCAB, packed=False))
    attended = int(unpacked[ATTENTION_MASK].sum())
    assert attended < unpacked[LABELS].numel()  # a pad tail that is not counted
    for batches, positions in ((packed, 2 * 2 * 32), ([unpacked], attended)):
        targets = [b[WEIGHTS][:, 1:][(b[LABELS][:, 1:] != IGNORE_INDEX) & (b[WEIGHTS][:, 1:] > 0)] for b in batches]
        supervised = float(sum(len(t) for t in targets))
        weight = float(sum(t.double().sum() for t in targets))
        assert weight != supervised
        for normalize, denominator in (("weight", weight), ("tokens", supervised)):
            totals = step_totals(batches, normalize)
            assert totals.dtype == torch.float64
            assert totals.tolist() == pytest.approx([denominator, positions, supervised, weight], rel=1e-12)
    assert step_totals([]).tolist() == [0.0, 0.0, 0.0, 0.0]


def test_an_unknown_normalization_is_refused_everywhere(llama):
    batch = _batch(0, packed=True, rows=1)
    for call in (lambda: step_totals([batch], "mean"), lambda: loss_denominator([batch], "mean"),
                 lambda: weighted_lm_loss(llama, batch, normalize="mean")):
        with pytest.raises(UsageError, match="normalize must be one of weight, tokens, got 'mean'"):
            call()
    with pytest.raises(ValueError, match="at least one batch"):
        loss_denominator([])


@pytest.mark.parametrize(
    ("device", "triton", "chunk"),
    [("cuda", True, 32768), ("xpu", True, 32768), ("cuda", False, 2048), ("cpu", True, 2048), ("cpu", False, 2048),
     ("mps", True, 2048)],
)
def test_default_vocab_chunk_is_wide_only_where_triton_folds_the_tile(monkeypatch, device, triton, chunk):
    """The device and Triton's presence are injected: no GPU needed to check the CUDA/XPU branch."""
    import transformers.utils

    monkeypatch.setattr(transformers.utils, "is_triton_available", lambda: triton)
    assert default_vocab_chunk(torch.device(device)) == chunk


@pytest.mark.parametrize(
    ("vocab_chunk", "tile"), [(None, VOCAB), (0, VOCAB), (-1, 1), (1, 1), (8, 8), (10**6, VOCAB)]
)
def test_the_tile_width_given_to_the_kernel(llama, monkeypatch, vocab_chunk, tile):
    """``vocab_chunk`` columns per tile, at least one and at most the vocabulary; ``None`` (or 0) takes the
    device's default (2048 on CPU, wider than this vocabulary)."""
    import trl.kernels

    real = trl.kernels.ChunkedLogProbFunction
    seen = []

    class Spy:
        @staticmethod
        def apply(*args):
            seen.append(args[5])
            return real.apply(*args)

    monkeypatch.setattr(trl.kernels, "ChunkedLogProbFunction", Spy)
    batch = _batch(1, packed=True, rows=2)
    out = weighted_lm_loss(llama, batch, vocab_chunk=vocab_chunk)
    assert seen == [tile]
    assert abs(out.loss.item() - ts.reference_loss(llama, batch, "weight").item()) < TOL


class _TextConfig:
    def __init__(self, **fields):
        self.__dict__.update(fields)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, (1.0, None)),
        ({"final_logit_softcapping": 30.0}, (1.0, 30.0)),
        ({"final_logit_softcapping": 0.0}, (1.0, None)),  # 0 means no softcap
        ({"logit_scale": 0.0625}, (0.0625, None)),  # Cohere
        ({"output_multiplier": 3.0}, (3.0, None)),
        ({"lm_head_multiplier": 0.5}, (0.5, None)),  # Falcon-H1
        ({"logits_scaling": 8.0}, (0.125, None)),  # Granite divides
        ({"logits_scaling": 8.0, "model_type": "hyperclovax"}, (8.0, None)),  # HyperCLOVA X multiplies
        ({"logit_scale": 2.0, "output_multiplier": 3.0, "lm_head_multiplier": 5.0, "logits_scaling": 7.0}, (2.0, None)),
        ({"output_multiplier": 3.0, "lm_head_multiplier": 5.0, "logits_scaling": 7.0}, (3.0, None)),
        ({"lm_head_multiplier": 5.0, "logits_scaling": 7.0}, (5.0, None)),
    ],
)
def test_logit_multiplier_and_softcap_are_read_like_trls_fused_head(fields, expected):
    """Models without a tiny transformers class (HyperCLOVA X, Falcon-H1) by their config fields alone; Granite
    and Cohere are checked end to end against their own logits in the family test above."""
    assert _logit_transform(_TextConfig(**fields)) == expected

    class Multimodal:  # the text settings live in the text config
        def get_text_config(self):
            return _TextConfig(**fields)

    assert _logit_transform(Multimodal()) == expected


def test_attaching_the_head_is_idempotent_and_returns_the_inner_model():
    from peft import LoraConfig, get_peft_model

    model = ts.tiny_llama(VOCAB)
    assert attach_weighted_head(model) is model
    forward = model.forward
    assert attach_weighted_head(model) is model and model.forward is forward  # not wrapped twice
    wrapped = get_peft_model(ts.tiny_llama(VOCAB), LoraConfig(r=2, target_modules=["q_proj"]))
    inner = attach_weighted_head(wrapped)
    assert isinstance(inner, type(model)) and inner is not wrapped
    assert attach_weighted_head(wrapped) is inner


def test_a_model_without_an_lm_head_is_refused():
    from transformers import LlamaModel

    body = LlamaModel(ts.tiny_llama(VOCAB).config)  # the decoder alone: get_output_embeddings() is None
    for model in (body, torch.nn.Linear(4, 4)):  # and a module without get_output_embeddings at all
        with pytest.raises(UsageError, match="has no output embeddings"):
            attach_weighted_head(model)


def test_any_peft_adapter_on_the_lm_head_is_refused_not_only_lora():
    from peft import LoHaConfig, get_peft_model

    model = get_peft_model(ts.tiny_llama(VOCAB), LoHaConfig(r=2, target_modules=["q_proj", "lm_head"]))
    assert not hasattr(model.get_output_embeddings(), "lora_A")
    with pytest.raises(UsageError, match="peft adapter on the LM head"):
        weighted_lm_loss(model, _batch(0, packed=True, rows=1))


def test_a_sharded_head_is_gathered_whole_with_an_averaged_gradient():
    """FSDP2 leaves a head of its own sharded (a DTensor): one process of gloo is enough to make one."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    plain = torch.randn(6, 4)
    assert _gathered(plain) is plain
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        shard = torch.nn.Parameter(distribute_tensor(plain, init_device_mesh("cpu", (1,)), [Shard(0)]))
        full = _gathered(shard)
        assert not isinstance(full, DTensor) and torch.equal(full, plain)
        (full * torch.arange(24.0).view(6, 4)).sum().backward()
        assert isinstance(shard.grad, DTensor) and torch.equal(shard.grad.full_tensor(), torch.arange(24.0).view(6, 4))
    finally:
        dist.destroy_process_group()


def test_a_torch_without_dtensor_uses_the_head_as_it_is(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch.distributed.tensor", None)  # the import fails as on torch < 2.5
    plain = torch.randn(3, 2)
    assert _gathered(plain) is plain


def test_the_patched_forward_returns_its_output_whatever_return_dict_says(llama):
    """``model(..., token_weights=w, labels=y)`` is public: a caller's ``return_dict=False`` (which would make the
    decoder body return a tuple) still gives the weighted output, equal to ``weighted_lm_loss``'s."""
    batch = _batch(2, packed=True, rows=2)
    expected = weighted_lm_loss(llama, batch).nll_sum
    out = llama(
        input_ids=batch[INPUT_IDS], labels=batch[LABELS], token_weights=batch[WEIGHTS],
        position_ids=batch[POSITION_IDS], return_dict=False,
    )  # fmt: skip
    assert isinstance(out, WeightedLMOutput)
    torch.testing.assert_close(out.nll_sum, expected)
