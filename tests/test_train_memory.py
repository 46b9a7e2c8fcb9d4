"""The weighted loss never allocates the ``batch x length x vocab`` logits.

Measured in this process with torch's profiler (every CPU allocation and free, in order; see
``train_support.peak_allocated_bytes``): the peak memory of one forward + backward of the weighted loss against
the same step through the model's own full-logits loss, on a model whose vocabulary dominates its memory.
"""

from __future__ import annotations

import pytest
import train_support as ts

from weightprep.constants import INPUT_IDS, LABELS, POSITION_IDS, WEIGHTS
from weightprep.train import WeightedCollator, weighted_lm_loss
from weightprep.train.loss import supervised_mask

VOCAB = 49152
ROWS, SEQ = 1, 1536


@pytest.fixture(scope="module")
def setup():
    model = ts.tiny_llama(VOCAB, layers=1, hidden=16)
    model.train()
    batch = WeightedCollator()(ts.random_rows(9, ROWS, SEQ, VOCAB, packed=True))
    return model, batch


def _full_logits_step(model, batch):
    out = model(
        input_ids=batch[INPUT_IDS], position_ids=batch[POSITION_IDS], labels=batch[LABELS], use_cache=False
    )
    out.loss.backward()
    return out.loss.detach()


@pytest.mark.parametrize("vocab_chunk", [None, 1024])
def test_loss_step_does_not_allocate_full_logits(setup, vocab_chunk):
    model, batch = setup
    logits_bytes = ROWS * SEQ * VOCAB * 4  # one float32 copy of the full logits: 288 MiB here

    model.zero_grad(set_to_none=True)
    ref_peak, _ = ts.peak_allocated_bytes(lambda: _full_logits_step(model, batch))
    model.zero_grad(set_to_none=True)

    def ours():
        loss = weighted_lm_loss(model, batch, vocab_chunk=vocab_chunk).loss
        loss.backward()
        return loss.detach()

    our_peak, _ = ts.peak_allocated_bytes(ours)
    model.zero_grad(set_to_none=True)
    supervised = int(supervised_mask(batch[LABELS], batch[WEIGHTS]).sum())
    tile_bytes = min(4096, supervised) * min(vocab_chunk or 2048, VOCAB) * 4
    print(
        f"\nvocab_chunk={vocab_chunk}: full-logits step peak {ref_peak / 2**20:.0f} MiB, weighted step peak "
        f"{our_peak / 2**20:.0f} MiB (ratio {our_peak / ref_peak:.3f}); one logits copy {logits_bytes / 2**20:.0f} MiB"
    )
    assert ref_peak >= logits_bytes  # the measurement sees the reference's logits
    assert our_peak < 0.5 * logits_bytes  # ours never holds even one copy of them
    assert our_peak < 0.25 * ref_peak
    # bounded by a few tile-sized temporaries of the kernel's torch fallback (float32 tile, exponentials, target
    # mask, gradient) plus the LM head's float32 gradient: set by the tile, not by batch x length x vocab
    assert our_peak < 12 * tile_bytes + 4 * VOCAB * 16 * 4 + (16 << 20)
