"""``weightprep plan``: per-GPU memory of a fine-tune, from the model's config alone.

>>> from weightprep.plan import estimate_memory
>>> est = estimate_memory("llama-3-8b", seq_len=4096, micro_batch=2, gpus=2, strategy="fsdp")
>>> est.fits is None  # no GPU size given
True

``check_fits`` is the call ``weightprep train`` makes before it starts; ``format_advice`` turns its
result into the message it prints. Nothing here imports torch or loads weights.
"""

from weightprep.plan.advice import PlanResult, check_fits, format_advice, largest_micro_batch, parse_gpus
from weightprep.plan.estimate import DEFAULT_LOSS_CHUNK_TOKENS, MemoryEstimate, Term, estimate_memory
from weightprep.plan.models import ModelShape, load_model_config, model_shape

__all__ = [
    "estimate_memory",
    "MemoryEstimate",
    "Term",
    "ModelShape",
    "model_shape",
    "load_model_config",
    "check_fits",
    "format_advice",
    "PlanResult",
    "largest_micro_batch",
    "parse_gpus",
    "DEFAULT_LOSS_CHUNK_TOKENS",
]
