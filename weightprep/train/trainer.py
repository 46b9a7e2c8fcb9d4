"""``WeightedSFTTrainer``: TRL's ``SFTTrainer`` trained on weightprep shards with the weighted loss.

What it changes, and why:

- Data passes straight through. Shards are already tokenized, weighted, masked and packed, so dataset
  preparation is skipped (``dataset_kwargs={"skip_prepare_dataset": True}``), column pruning keeps ``weights``,
  ``position_ids`` and ``attention_mask`` (TRL keeps only ``input_ids``/``labels``/``seq_lengths``), and the
  collator is :class:`~weightprep.train.collator.WeightedCollator` (a stack, no padding, no label masking).
- The loss is :func:`~weightprep.train.loss.weighted_lm_loss`: one forward per micro-batch, ``use_cache=False``,
  the decoder body plus a tiled LM-head projection of the supervised positions only; no full logits, no
  second forward for metrics.
- The denominator is exact for the optimizer step: before the step's first forward, :meth:`get_batch_samples`
  (which the transformers loop calls with all the step's micro-batches) sums the supervised weights (or counts
  the supervised tokens) over every micro-batch, then over every process with one all-gather. Each micro-batch
  loss is ``world_size * nll_sum / denominator`` (DDP/FSDP average gradients over ranks), already scaled for
  accumulation (``loss_is_scaled_for_ga = True``). Hence 8 x 1 == 1 x 8 accumulation == 2 ranks x 4.
- Logs add ``tokens_per_second`` (positions processed, all ranks), ``supervised_tokens_per_second``,
  ``weighted_tokens_per_second`` (sum of weights per second), ``supervised_tokens`` and the peak memory in GiB:
  ``peak_cuda_allocated_gib`` on a GPU, ``peak_rss_gib`` (this process's peak resident set) on CPU.
- Refused at construction, each with the reason: an attention implementation that cannot keep packed documents
  apart (see :mod:`weightprep.train.attention`), ``compute_metrics`` / ``preprocess_logits_for_metrics`` (they need
  logits, which are never built: evaluation reports the weighted ``eval_loss``), and DeepSpeed ZeRO-3 (it
  partitions ``lm_head.weight``, which the weighted head reads directly).

TRL's ``SFTTrainer`` is kept as the base (rather than transformers' ``Trainer``) so users keep its PEFT
handling (``peft_config``, gradient checkpointing with adapters, QLoRA casting), its model-from-name loading
and its config class; nothing of its dataset preparation or loss runs.
"""

from __future__ import annotations

import resource
import sys
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from transformers.trainer_utils import EvalLoopOutput
from trl import SFTConfig, SFTTrainer

from weightprep.constants import ATTENTION_MASK, EVAL_SOURCE, PACKED_COLUMNS
from weightprep.errors import UsageError
from weightprep.train.attention import attention_implementation, isolation_mode
from weightprep.train.collator import WeightedCollator
from weightprep.train.data import Shards
from weightprep.train.evaluate import EvalTotals, buckets_for, source_names, tag_sources
from weightprep.train.loss import (
    DEFAULT_VOCAB_CHUNK,
    Normalize,
    attach_weighted_head,
    check_normalize,
    step_totals,
    weighted_lm_loss,
)

__all__ = ["WeightedSFTTrainer", "peak_memory", "prepare_args"]

#: transformers 5's deprecation of the gradient_checkpointing names, as libraries built on it still trigger it.
_LIBRARY_DEPRECATION = r"`(is_)?gradient_checkpointing\w*` is deprecated"
#: What TRL's model card template writes for a base model it does not name (one loaded from a local directory).
_NO_BASE = "[None](https://huggingface.co/None)"


def prepare_args(args: SFTConfig | None, output_dir: str = "weightprep-run") -> SFTConfig:
    """``args`` (an ``SFTConfig``, created or converted if needed), set to let prepared shards through untouched:
    dataset preparation skipped, no packing or padding-free flattening, non-reentrant checkpointing."""
    if args is None:  # TRL's default (checkpointing on), by its transformers 5 name: the gradient_* one warns
        new_names = "activation_checkpointing" in SFTConfig.__dataclass_fields__
        args = SFTConfig(output_dir=output_dir, **{"activation_checkpointing" if new_names else "gradient_checkpointing": True})
    elif not isinstance(args, SFTConfig):  # a plain TrainingArguments
        args = SFTConfig(**{**args.to_dict(), "hub_token": getattr(args, "hub_token", None)})
    dataset_kwargs = dict(args.dataset_kwargs or {})
    dataset_kwargs["skip_prepare_dataset"] = True
    args.dataset_kwargs = dataset_kwargs
    # Rows are already packed and padded to one length: TRL must neither pack nor flatten them again
    args.packing = False
    args.padding_free = False
    # transformers >= 5.x names it activation_checkpointing (the gradient_* names are deprecated mirrors)
    new_names = hasattr(args, "activation_checkpointing_kwargs")
    enabled = args.activation_checkpointing if new_names else args.gradient_checkpointing
    if enabled:
        key = "activation_checkpointing_kwargs" if new_names else "gradient_checkpointing_kwargs"
        kwargs = dict(getattr(args, key) or {})
        kwargs.setdefault("use_reentrant", False)  # reentrant checkpointing and DDP do not mix
        setattr(args, key, kwargs)
    return args


def peak_memory(device: torch.device | None = None) -> tuple[str, float]:
    """``(log key, GiB)`` of the peak memory so far: ``peak_cuda_allocated_gib`` (``torch.cuda.max_memory_allocated``)
    on a GPU, else ``peak_rss_gib``, the peak resident set of this process (tensors, libraries, everything)."""
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        return "peak_cuda_allocated_gib", torch.cuda.max_memory_allocated(device) / 2**30
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return "peak_rss_gib", rss / (2**30 if sys.platform == "darwin" else 2**20)


class WeightedSFTTrainer(SFTTrainer):
    """``SFTTrainer`` for weightprep shards: weighted loss, exact normalization, no full logits.

    >>> shards = load_shards("shards/", model_config=model.config)  # doctest: +SKIP
    >>> trainer = WeightedSFTTrainer(model, args=SFTConfig("out", bf16=True), train_dataset=shards,
    ...                              processing_class=tokenizer, normalize="weight")  # doctest: +SKIP
    >>> trainer.train()  # doctest: +SKIP

    ``train_dataset`` is a :class:`~weightprep.train.data.Shards` or a ``datasets.Dataset`` of shard rows.
    ``eval_dataset`` is a ``datasets.Dataset`` of shard rows (``shards.validation``), or a dict ``{name: Dataset}``
    of several: unlike transformers, which evaluates a dict one set at a time, they are evaluated together, logging
    the pooled ``eval_loss``, ``eval_<name>_loss`` per set and the buckets of the union (see
    :mod:`weightprep.train.evaluate`), so ``metric_for_best_model="eval_loss"`` keeps working.
    ``normalize``: ``"weight"`` (default) or ``"tokens"``, see :mod:`weightprep.train.loss`. Other arguments are
    ``SFTTrainer``'s (``peft_config=LoraConfig(...)`` for LoRA; ``lm_head`` must not be a LoRA target).
    """

    # compute_loss divides by the whole step's denominator already
    loss_is_scaled_for_ga = True

    def __init__(
        self,
        model: Any,
        args: SFTConfig | None = None,
        train_dataset: Any = None,
        *,
        normalize: Normalize = "weight",
        vocab_chunk: int | None = DEFAULT_VOCAB_CHUNK,
        data_collator: Any = None,
        **kwargs: Any,
    ) -> None:
        check_normalize(normalize)
        for name in ("compute_metrics", "preprocess_logits_for_metrics"):
            if kwargs.get(name) is not None:
                raise UsageError(
                    f"{name} is not supported: it needs the model's logits, and WeightedSFTTrainer never builds "
                    "them (that is what keeps its memory low). Evaluation reports the weighted eval_loss; for other "
                    "metrics run your own evaluation on the saved model."
                )
        _refuse_zero3()
        self.normalize: Normalize = normalize
        self.vocab_chunk = vocab_chunk
        packed = None
        if isinstance(train_dataset, Shards):
            packed = train_dataset.packed
            train_dataset = train_dataset.dataset
        elif train_dataset is not None and hasattr(train_dataset, "column_names"):
            packed = ATTENTION_MASK not in train_dataset.column_names
        eval_dataset = kwargs.get("eval_dataset")
        if isinstance(eval_dataset, Shards):
            kwargs["eval_dataset"] = eval_dataset.dataset
        elif isinstance(eval_dataset, Mapping):
            kwargs["eval_dataset"] = tag_sources(eval_dataset)
        self._eval_buckets: dict[int, Any] = {}  # per evaluation set, chosen at its first evaluation
        # positions, supervised tokens, weight: summed over all ranks since the last log
        self._window = torch.zeros(3, dtype=torch.float64)
        self._window_start: float | None = None
        with warnings.catch_warnings():
            # PEFT's get_peft_model (called by SFTTrainer for --lora-r) still reads transformers' deprecated
            # is_gradient_checkpointing: a note for PEFT's authors that the user can do nothing about
            warnings.filterwarnings("ignore", message=_LIBRARY_DEPRECATION, category=FutureWarning)
            super().__init__(
                model,
                args=prepare_args(args),
                train_dataset=train_dataset,
                data_collator=data_collator if data_collator is not None else WeightedCollator(packed=packed),
                **kwargs,
            )
        if packed is not False:  # packed rows (or not known yet): documents must be kept apart
            isolation_mode(attention_implementation(self.model))
        attach_weighted_head(self.model)

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """TRL's model card, naming the base model when it was loaded from a local directory too (TRL then writes
        "a fine-tuned version of [None](https://huggingface.co/None)")."""
        super().create_model_card(*args, **kwargs)
        card = Path(self.args.output_dir) / "README.md"
        base = str(getattr(self.model.config, "_name_or_path", "") or "")
        if self.is_world_process_zero() and base and card.is_file():
            text = card.read_text(encoding="utf-8")
            if _NO_BASE in text:
                card.write_text(text.replace(_NO_BASE, f"`{base}` (a local model directory)"), encoding="utf-8")

    # -- data ---------------------------------------------------------------------------------------------------
    def _set_signature_columns_if_needed(self) -> None:
        # Column pruning keeps exactly what a shard row has for training; metadata columns go
        if self._signature_columns is None:
            self._signature_columns = [*PACKED_COLUMNS, ATTENTION_MASK, EVAL_SOURCE]

    # -- normalization ------------------------------------------------------------------------------------------
    def get_batch_samples(
        self, epoch_iterator: Iterator, num_batches: int, device: torch.device
    ) -> tuple[list, torch.Tensor | None]:
        """The step's micro-batches and the denominator of its loss, taken over all of them and all ranks."""
        batches = []
        for _ in range(num_batches):
            try:
                batches.append(next(epoch_iterator))
            except StopIteration:
                break
        if self._window_start is None:
            self._window_start = time.perf_counter()
        # Every rank takes part in the gather, even one whose iterator ran dry, so the collective never hangs
        totals = step_totals(batches, self.normalize).to(device)
        if self.accelerator.num_processes > 1:
            totals = self.accelerator.gather(totals.unsqueeze(0)).view(-1, 4).sum(0)
        self._window += totals[1:].cpu()
        return batches, (totals[0] if batches else None)

    # -- loss ---------------------------------------------------------------------------------------------------
    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | None = None,
    ) -> Any:
        """``nll_sum / denominator``, times the number of processes when the denominator is global."""
        out = weighted_lm_loss(
            model,
            inputs,
            normalize=self.normalize,
            denominator=num_items_in_batch,
            vocab_chunk=self.vocab_chunk,
        )
        loss = out.loss
        if num_items_in_batch is not None and self.accelerator.num_processes > 1:
            loss = loss * self.accelerator.num_processes
        return (loss, out) if return_outputs else loss

    def prediction_step(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: Any = None,
    ) -> tuple[torch.Tensor, None, None]:
        """The weighted loss of one batch, no logits (``predict()``; ``evaluate()`` goes through
        :meth:`evaluation_loop`)."""
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    # -- evaluation ---------------------------------------------------------------------------------------------
    def evaluate(
        self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        """transformers' ``evaluate``, with a dict ``{name: Dataset}`` evaluated as one tagged set (see the class)."""
        if isinstance(eval_dataset, Mapping):
            eval_dataset = tag_sources(eval_dataset)
        return super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def evaluation_loop(
        self,
        dataloader: Any,
        description: str,
        prediction_loss_only: bool | None = None,
        ignore_keys: Any = None,
        metric_key_prefix: str = "eval",
    ) -> EvalLoopOutput:
        """The weighted ``eval_loss`` over the whole set (not a mean of batch losses), per source of a tagged set,
        per weight bucket, with ``eval_tokens_per_second``; see :mod:`weightprep.train.evaluate`. ``evaluate()`` logs and returns them,
        so ``load_best_model_at_end`` with ``metric_for_best_model="eval_loss"`` works as usual."""
        model = self._wrap_model(self.model, training=False)
        if len(self.accelerator._models) == 0 and model is self.model:  # evaluate() before train(): prepare
            model = self.accelerator.prepare_model(model, evaluation_mode=True)
            if model is not self.model:
                self.model_wrapped = model
        model.eval()
        dataset = getattr(dataloader, "dataset", None)
        key = id(dataset)
        if key not in self._eval_buckets:
            self._eval_buckets[key] = buckets_for(dataset)
        totals = EvalTotals(self._eval_buckets[key], device=self.args.device, sources=source_names(dataset))
        start = time.perf_counter()
        for raw in dataloader:
            batch = self._prepare_inputs(raw)
            with torch.no_grad(), self.compute_loss_context_manager():
                out = weighted_lm_loss(model, batch, normalize=self.normalize, vocab_chunk=self.vocab_chunk)
            # every rank's rows, each once: the same totals on every rank, no reduction after the loop
            totals.add(out.log_probs, batch, gather=self.accelerator.gather_for_metrics)
        elapsed = max(time.perf_counter() - start, 1e-9)
        metrics = totals.metrics(self.normalize, metric_key_prefix)
        metrics[f"{metric_key_prefix}_tokens_per_second"] = round(float(totals.positions) / elapsed, 1)
        return EvalLoopOutput(predictions=None, label_ids=None, metrics=metrics, num_samples=totals.rows)

    # -- logging ------------------------------------------------------------------------------------------------
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add throughput (all ranks) and peak memory to the training logs."""
        if "loss" in logs and self._window_start is not None:
            elapsed = max(time.perf_counter() - self._window_start, 1e-9)
            positions, supervised, weight = self._window.tolist()
            logs["tokens_per_second"] = round(positions / elapsed, 1)
            logs["supervised_tokens_per_second"] = round(supervised / elapsed, 1)
            logs["weighted_tokens_per_second"] = round(weight / elapsed, 1)
            logs["supervised_tokens"] = int(supervised)
            key, gib = peak_memory(self.args.device)
            logs[key] = round(gib, 3)
            self._window.zero_()
            self._window_start = time.perf_counter()
        super().log(logs, start_time)


def _refuse_zero3() -> None:
    """DeepSpeed ZeRO-3 partitions every parameter, so the weighted head would read an empty ``lm_head.weight``."""
    from transformers.integrations import is_deepspeed_zero3_enabled

    if is_deepspeed_zero3_enabled():
        raise UsageError(
            "DeepSpeed ZeRO-3 is not supported: it partitions lm_head.weight across ranks, and the weighted loss "
            "reads that weight directly (it never calls lm_head), so it would see an empty tensor. Use FSDP "
            "(`weightprep train --strategy fsdp`, which gathers the head), or DeepSpeed ZeRO-1/2."
        )
