"""Peak GPU memory of one training step, per GPU, from a model's config alone.

The estimate adds up what PyTorch's caching allocator holds at the moment of the peak
(``torch.cuda.max_memory_allocated``), then adds what lives outside it (CUDA context, NCCL,
allocator fragmentation). Every term is a formula over the config fields; the module docstring of
each helper says what it counts and in which dtype. Notation: P parameters, P_t trainable
parameters, N GPUs, T = micro_batch x seq_len tokens per micro-batch, V vocabulary, H hidden,
I MLP width, c bytes of the compute dtype (2 for bf16/fp16, 4 for fp32).

Precision (``precision=``), for ``dtype`` bf16/fp16:

* ``"mixed"``: fp32 master weights, gradients and AdamW states (16 B/param), compute under
  ``torch.autocast``. This is what transformers' ``Trainer(bf16=True)`` does with a model loaded in
  fp32 (accelerate wraps ``model.forward`` in autocast; the Trainer never casts the weights).
* ``"pure"``: weights and gradients stored in bf16, and torch's AdamW keeps its two states in the
  parameter's dtype, so bf16 too (8 B/param). transformers 5 loads ``dtype="auto"``, i.e. bf16 for
  bf16 checkpoints, so ``Trainer(bf16=True)`` on a default ``from_pretrained`` model is this mode.

The step's peak is the largest of four moments, each a sum of the terms alive then:

* forward end: weights, optimizer states, saved activations, autocast's cached weight copies and,
  for the full-logits recipe, the model-dtype logits;
* loss: saved activations plus the loss's own buffers (full logits and their fp32 copies, or the
  forward of TRL's chunked log-prob kernel that ``weighted_lm_loss`` runs: one projection tile);
* loss backward: the kernel's backward, which accumulates fp32 gradients of the supervised hidden
  states and of the *whole* LM head (V x H x 4 B, on every rank, whatever the sharding), then casts
  them to the parameters' dtypes (:func:`weighted_loss_bytes`);
* backward, top layer: activations still saved + lm_head gradient + one layer recomputed;
* backward, bottom layer: all gradients + one layer's activations.
Gradients of the previous micro-batch are alive throughout when gradient accumulation > 1.
Under DDP (N > 1), the reducer's buckets hold a second copy of all gradients
(``gradient_as_bucket_view=False``, the default). FSDP (full shard) divides weights, gradients and
optimizer states by N and adds the unsharded units it all-gathers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from weightprep.errors import UsageError
from weightprep.plan.models import ModelShape, load_model_config, model_shape

__all__ = [
    "Term",
    "MemoryEstimate",
    "estimate_memory",
    "DTYPE_BYTES",
    "DEFAULT_LOSS_CHUNK_TOKENS",
    "DEFAULT_LOSS_VOCAB_CHUNK",
    "GiB",
    "layer_activation_bytes_per_token",
    "weighted_loss_bytes",
]

GiB = 1024**3
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
#: tokens per chunk of weightprep's chunked weighted loss (chunk x V fp32 logits at a time)
DEFAULT_LOSS_CHUNK_TOKENS = 4096
#: vocabulary columns per tile of that loss on CUDA (``weightprep.train.loss.default_vocab_chunk``):
#: a tile is chunk x min(V, 32768), so at V = 128k the loss never holds more than a quarter of a chunk's logits
DEFAULT_LOSS_VOCAB_CHUNK = 32768
#: bytes outside the allocator: CUDA context + cuBLAS/cuDNN handles; NCCL buffers when N > 1
CUDA_CONTEXT_BYTES = int(0.6 * GiB)
NCCL_BYTES = int(0.5 * GiB)
#: reserved-but-unallocated share of the peak (expandable_segments:True keeps it small)
FRAGMENTATION = 0.05
#: bytes per token of the collated batch on the GPU (int64 ids, labels, position_ids; fp32 weights)
BATCH_BYTES_PER_TOKEN = 8 + 8 + 8 + 4


def weighted_loss_bytes(
    n_supervised: int, hidden: int, vocab: int, *, compute: int, hidden_dtype: int, weight_dtype: int,
    head_trainable: bool, bias: bool = False, token_tile: int = DEFAULT_LOSS_CHUNK_TOKENS,
    vocab_tile: int = DEFAULT_LOSS_VOCAB_CHUNK,
) -> dict[str, int]:  # fmt: skip
    """Bytes that ``trl.kernels.ChunkedLogProbFunction`` (the kernel of ``weighted_lm_loss``) allocates on a GPU,
    beyond its saved inputs, at the peak of its forward and of its backward. Byte sizes: ``compute`` of the
    autocast (or model) dtype, ``hidden_dtype`` of the supervised hidden states, ``weight_dtype`` of the LM head
    as the kernel sees it (gathered, under FSDP). The Triton kernels fold each tile in registers: the torch
    tensors below are all there is, which is why Triton's CPU interpreter measures them exactly on CPU.

    * forward: the projection tile ``mm_buf`` (T x Vt x c), the token chunk cast to c (T x H, if the dtypes
      differ), one weight tile cast (Vt x H, idem), 7 fp32 statistics per token, the fp32 log-probabilities;
    * backward, at its return: fp32 ``grad_hidden`` (N x H) and ``grad_weight`` (V x H, the whole head, when it
      is trained) and ``grad_bias``, ``mm_buf`` and the casts as in forward, and the casts of the gradients to
      the inputs' dtypes (N x H x hidden_dtype, V x H x weight_dtype; none for fp32).
    """
    n = max(1, n_supervised)
    t, vt = min(n, token_tile), min(vocab, vocab_tile)
    tile = t * vt * compute
    casts = (t * hidden * compute if hidden_dtype != compute else 0) + (vt * hidden * compute if weight_dtype != compute else 0)
    forward = tile + casts + 8 * n * 4
    head = vocab * hidden * 4 + (vocab * 4 if bias else 0) if head_trainable else 0
    head_cast = vocab * hidden * weight_dtype if head_trainable and weight_dtype != 4 else 0
    hidden_grad = n * hidden * 4 + (n * hidden * hidden_dtype if hidden_dtype != 4 else 0)
    backward = hidden_grad + head + head_cast + tile + casts + 2 * n * 4
    return {"forward": forward, "backward": backward, "head_fp32": head, "head_cast": head_cast}


@dataclass(frozen=True)
class Term:
    """One line of the plan: the term's full size, what of it is alive at the peak, and why."""

    key: str
    label: str
    size: int
    at_peak: int
    formula: str
    used: bool = True  # False: an alternative shown for comparison (other recipe, other checkpointing)


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-GPU memory of one training step. All sizes in bytes.

    ``peak_allocated`` is the prediction for ``torch.cuda.max_memory_allocated``; ``total`` adds
    the CUDA context, NCCL buffers and fragmentation, and is compared with ``gpu_memory``.
    ``alternatives`` gives ``total`` for each (gradient checkpointing, loss recipe) choice.
    """

    model_type: str
    params: int
    trainable_params: int
    terms: tuple[Term, ...]
    peak_phase: str
    phases: dict[str, int]
    peak_allocated: int
    overhead: int
    total: int
    gpu_memory: int | None
    settings: dict[str, Any]
    alternatives: dict[str, int] = field(default_factory=dict)

    @property
    def fits(self) -> bool | None:
        """True if ``total`` fits in ``gpu_memory``; None when no GPU size was given."""
        return None if self.gpu_memory is None else self.total <= self.gpu_memory

    def term(self, key: str) -> Term:
        """The term named ``key`` (e.g. ``"weights"``, ``"activations_ckpt"``, ``"logits_full"``)."""
        for t in self.terms:
            if t.key == key:
                return t
        raise KeyError(key)

    def explain(self) -> str:
        """One line per term: label, size, bytes at the peak, formula."""
        rows = [f"{t.label}: {t.size / GiB:.2f} GiB (at peak {t.at_peak / GiB:.2f}) = {t.formula}" for t in self.terms]
        return "\n".join(rows)


# ---------------------------------------------------------------------------------------
# activations


def _norm_bytes(shape: ModelShape, mode: str, c: int, weight_grad: bool, consumers: list[str] | int,
                lora_targets: set[str] | None, width: int | None = None) -> float:
    """Bytes per token an RMSNorm/LayerNorm keeps for backward, plus its output as saved by the linears
    that consume it.

    * its input in fp32 (the norm upcasts; in mixed precision the residual stream is already fp32): 4 W
    * with a trainable weight, the normalized value that multiplies it: Llama's RMSNorm multiplies the
      compute-dtype copy (c W; 4 W in mixed/fp32 where it is fp32), Gemma's multiplies fp32 (4 W)
    * the output as saved by the consuming linears: fp32 and pure bf16 save the output tensor once
      (4 W or c W); under autocast with an fp32 output (mixed) every linear casts its own copy (c W each);
      LoRA: frozen base linears save nothing, each adapter saves its own copy (none extra in fp32)
    """
    w = width if width is not None else shape.hidden
    out = 4.0 * w + 4  # fp32 input + rsqrt/mean-rstd per token
    if weight_grad:
        if shape.family == "gemma" or mode in ("mixed", "fp32"):
            out += 4 * w
        else:
            out += c * w
    if isinstance(consumers, int):
        n_cons, cons_names = consumers, []
    else:
        n_cons, cons_names = len(consumers), consumers
    # the output's dtype: fp32 in mixed precision, and for GPT-2 whenever autocast runs layer_norm in fp32
    fp32_output_cast = mode == "mixed" or (shape.family == "gpt2" and mode != "fp32")
    if lora_targets is None:  # full fine-tune: every consumer saves its input
        if n_cons and fp32_output_cast:
            out += n_cons * c * w  # one autocast copy per consuming linear
        elif n_cons:
            out += (4 if mode == "fp32" else c) * w  # the output itself, shared
    else:
        adapted = [n for n in cons_names if n in lora_targets]
        if adapted:
            out += 4 * w if mode == "fp32" else len(adapted) * c * w
    return out


def layer_activation_bytes_per_token(shape: ModelShape, *, dtype: str = "bf16", precision: str = "mixed",
                                     seq_len: int = 2048, attention: str = "sdpa", packed: bool = True,
                                     lora_targets: set[str] | None = None) -> float:
    """Bytes one decoder layer saves for backward, per token, without checkpointing.

    Llama family (Llama, Mistral, Qwen2/3, Gemma), with flash/sdpa attention (no L x L scores):
    two norms (see ``_norm_bytes``) + q, k, v after RoPE and the attention output in the compute
    dtype, (2 heads + 2 kv_heads) x head_dim x c (k and v expanded to all heads when sdpa gets a
    mask, which transformers builds for packed rows) + the log-sum-exp, 4 x heads + for sdpa with a
    packed-row mask, the mask converted to the compute dtype, seq_len x c + gated MLP: gate, its
    activation, up and their product, 4 I c + LoRA: per adapted linear an input copy (c x fan_in,
    none in fp32) and its rank-r intermediate.
    GPT-2: two LayerNorms, the fused qkv output (3 H c), attention output, dropout masks (1 B),
    GELU MLP (``gelu_new`` is written as Python ops and saves 5 I-wide tensors in fp32, 12 I + 2 I c
    under autocast; a fused GELU saves 2).
    """
    c = DTYPE_BYTES[dtype]
    mode = "fp32" if dtype == "fp32" else precision
    lora = lora_targets
    full = lora is None
    h, hd, nh, kvh, inter = shape.hidden, shape.head_dim, shape.heads, shape.kv_heads, shape.intermediate
    mask_present = attention == "sdpa" and packed or attention == "eager"

    def adapter_extra(name: str, fan_in: int) -> float:
        if full or name not in lora:
            return 0.0
        return 0.0 if mode == "fp32" else c * fan_in

    lora_mid = 0.0
    if not full:
        # rank-r intermediate (lora_A output) saved by lora_B, in the adapter's compute dtype
        lora_mid = sum(4 if mode == "fp32" else c for lin in shape.linears if lin.name in lora) * 1.0
    if shape.family == "gpt2":
        drop = 2 * h if shape.dropout > 0 else 0  # bool masks of the two residual dropouts
        ln1 = _norm_bytes(shape, mode, c, full, ["c_attn"], lora)
        attn = (3 * h + h) * c + 4 * nh + adapter_extra("c_proj", h)
        ln2 = _norm_bytes(shape, mode, c, full, ["c_fc"], lora)
        if shape.activation == "gelu_new":
            mlp = (20 * inter) if mode == "fp32" else (12 * inter + 2 * c * inter)
        else:
            mlp = 2 * c * inter
        if mask_present and attention == "eager":
            attn += nh * seq_len * (2 * c + 1)
        elif mask_present:
            attn += seq_len * c
        return ln1 + attn + ln2 + mlp + drop + lora_mid

    attn_in = ["q_proj", "k_proj", "v_proj"]
    mlp_in = ["gate_proj", "up_proj"]
    norm1 = _norm_bytes(shape, mode, c, full, attn_in, lora)
    norm2 = _norm_bytes(shape, mode, c, full, mlp_in, lora)
    extra_norms = 0.0
    if shape.norms_per_layer == 4:  # Gemma2: post-attention and post-MLP norms, output not saved
        extra_norms = 2 * _norm_bytes(shape, mode, c, full, 0, lora)
    k_heads = nh if mask_present and kvh != nh else kvh
    core = (nh + 2 * k_heads + nh) * hd * c + 4 * nh
    if shape.qk_norm:
        core += (4 + ((4 if mode == "fp32" else c) if full else 0)) * (nh + kvh) * hd
    if attention == "eager":
        core += nh * seq_len * (2 * c + 4)  # scores, softmax output (fp32 upcast), its compute-dtype copy
    elif mask_present:
        core += seq_len * c  # sdpa's float copy of the boolean block mask, saved per layer
    core += adapter_extra("o_proj", nh * hd)
    mlp = 3 * inter * c  # gate (saved by the activation), activation output and up (saved by the product)
    if full or "down_proj" in lora:
        mlp += inter * c  # the product, saved by down_proj (or its adapter's copy)
    return norm1 + norm2 + extra_norms + core + mlp + lora_mid


# ---------------------------------------------------------------------------------------


def _parse_lora_targets(shape: ModelShape, targets: Any) -> set[str]:
    return {lin.name for lin in shape.lora_linears(targets)}


def estimate_memory(
    model: Any,
    *,
    seq_len: int,
    micro_batch: int = 1,
    gpus: int = 1,
    gpu_memory: int | None = None,
    strategy: str = "ddp",
    dtype: str = "bf16",
    precision: str = "mixed",
    gradient_checkpointing: bool = True,
    lora_r: int | None = None,
    lora_targets: Any = "all-linear",
    loss: str = "weightprep",
    loss_chunk_tokens: int = DEFAULT_LOSS_CHUNK_TOKENS,
    supervised_fraction: float = 1.0,
    grad_accum: int = 1,
    attention: str = "sdpa",
    packed: bool = True,
    fragmentation: float = FRAGMENTATION,
) -> MemoryEstimate:
    """Estimate per-GPU peak memory of one training step (see the module docstring for the model).

    ``model``: a :class:`ModelShape`, a transformers config, a dict of config fields, or anything
    ``load_model_config`` accepts (path, preset, hub id). ``loss``: ``"weightprep"`` (chunked
    weighted loss, only supervised positions through lm_head) or ``"full"`` (the seed recipe:
    full B x L x V logits, an fp32 copy, ``cross_entropy(reduction="none")``). ``attention``:
    ``"sdpa"``, ``"flash"`` (flash-attention 2/3 kernels: no mask) or ``"eager"``.

    >>> est = estimate_memory("llama-2-7b", seq_len=2048, micro_batch=1, gpus=2, strategy="fsdp")
    >>> round(est.term("weights").size / 2**30, 1)  # 6.74e9 fp32 master weights / 2 GPUs
    12.6
    """
    _check_choice("dtype", dtype, DTYPE_BYTES)
    _check_choice("precision", precision, ("mixed", "pure"))
    _check_choice("strategy", strategy, ("ddp", "fsdp"))
    _check_choice("loss", loss, ("weightprep", "full"))
    _check_choice("attention", attention, ("sdpa", "flash", "eager"))
    for name, value in (("seq_len", seq_len), ("micro_batch", micro_batch), ("gpus", gpus),
                        ("grad_accum", grad_accum), ("loss_chunk_tokens", loss_chunk_tokens)):
        if not isinstance(value, int) or value < 1:
            raise UsageError(f"{name} must be a positive integer, got {value!r}")
    if not 0.0 < supervised_fraction <= 1.0:
        raise UsageError(f"supervised_fraction must be in (0, 1], got {supervised_fraction}")
    if lora_r is not None and lora_r < 1:
        raise UsageError(f"lora_r must be a positive integer, got {lora_r}")
    shape = model if isinstance(model, ModelShape) else model_shape(load_model_config(model))

    settings = dict(seq_len=seq_len, micro_batch=micro_batch, gpus=gpus, strategy=strategy, dtype=dtype,
                    precision=precision, gradient_checkpointing=gradient_checkpointing, lora_r=lora_r,
                    lora_targets=lora_targets, loss=loss, loss_chunk_tokens=loss_chunk_tokens,
                    supervised_fraction=supervised_fraction, grad_accum=grad_accum, attention=attention,
                    packed=packed, fragmentation=fragmentation)
    variants = {}
    for ckpt in (True, False):
        for recipe in ("weightprep", "full"):
            variants[(ckpt, recipe)] = _estimate(shape, settings | {"gradient_checkpointing": ckpt, "loss": recipe},
                                                 gpu_memory)
    chosen = variants[(gradient_checkpointing, loss)]
    alternatives = {
        f"{'checkpointing' if ck else 'no checkpointing'}, {'weightprep loss' if rc == 'weightprep' else 'full logits'}":
            est.total for (ck, rc), est in variants.items()
    }
    # show the other activation and logits variants beside the chosen ones
    other_ckpt = variants[(not gradient_checkpointing, loss)].term(
        "activations_nockpt" if gradient_checkpointing else "activations_ckpt")
    other_loss = variants[(gradient_checkpointing, "full" if loss == "weightprep" else "weightprep")].term(
        "logits_full" if loss == "weightprep" else "logits_weightprep")
    terms = list(chosen.terms)
    act_i = next(i for i, t in enumerate(terms) if t.key.startswith("activations"))
    terms.insert(act_i + 1, replace(other_ckpt, used=False, at_peak=0))
    log_i = next(i for i, t in enumerate(terms) if t.key.startswith("logits"))
    terms.insert(log_i + 1, replace(other_loss, used=False, at_peak=0))
    return replace(chosen, terms=tuple(terms), alternatives=alternatives)


def _check_choice(name: str, value: Any, allowed: Any) -> None:
    if value not in allowed:
        raise UsageError(f"{name} must be one of {', '.join(map(str, allowed))}; got {value!r}")


def _estimate(shape: ModelShape, s: dict[str, Any], gpu_memory: int | None) -> MemoryEstimate:
    c = DTYPE_BYTES[s["dtype"]]
    mode = "fp32" if s["dtype"] == "fp32" else s["precision"]
    n = s["gpus"]
    fsdp = s["strategy"] == "fsdp" and n > 1
    shard = n if fsdp else 1
    ckpt = s["gradient_checkpointing"]
    tokens = s["micro_batch"] * s["seq_len"]
    sup_tokens = max(1, math.ceil(tokens * s["supervised_fraction"]))
    lora = s["lora_r"] is not None
    targets = _parse_lora_targets(shape, s["lora_targets"]) if lora else None

    P = shape.total_params
    P_lora = shape.lora_params(s["lora_r"], s["lora_targets"]) if lora else 0
    P_t = P_lora if lora else P
    w_b = c if mode == "pure" else 4  # stored weight bytes
    t_b = 4 if lora else w_b  # trainable parameter (and gradient, AdamW state) bytes; peft upcasts adapters
    r_b = c if mode == "pure" else 4  # residual stream: fp32 under autocast with fp32 embeddings
    out_b = r_b  # final norm output dtype

    terms: list[Term] = []
    weights = (P * w_b + P_lora * 4) // shard
    terms.append(Term("weights", "parameters", weights, weights,
                      f"{P:,} params x {w_b} B" + (f" + {P_lora:,} LoRA params x 4 B" if lora else "")
                      + (f" / {n} GPUs (FSDP)" if fsdp else "")))

    fsdp_units = 0
    if fsdp:
        gathered_b = c if mode != "fp32" else 4
        lm_trainable = 0 if lora else shape.root_params
        layer_trainable = (P_lora // shape.layers) if lora else shape.layer_params
        fsdp_units = gathered_b * (shape.root_params + 2 * shape.layer_params) + t_b * (lm_trainable + layer_trainable)
        terms.append(Term("fsdp_units", "FSDP all-gathered units", fsdp_units, fsdp_units,
                          f"({shape.root_params:,} root + 2 x {shape.layer_params:,} layer params) x {gathered_b} B"
                          f" + unsharded grads of root and one layer x {t_b} B"))

    cast_all = cast_layer = 0
    if mode == "mixed" and not fsdp:
        p_mm = shape.layers * shape.layer_matmul_params + shape.vocab * shape.hidden
        cast_all = c * p_mm
        cast_layer = c * shape.layer_matmul_params
    cast_saved = cast_all if not ckpt else 0  # saved by autograd for backward
    cast_fwd_end = cast_all if (not lora or not ckpt) else cast_layer  # autocast caches casts of leaves requiring grad

    grads = P_t * t_b // shard
    optim = 2 * P_t * t_b // shard  # torch AdamW: exp_avg and exp_avg_sq in the parameter's dtype
    buckets = P_t * t_b if (s["strategy"] == "ddp" and n > 1) else 0
    head_grad = 0 if lora else shape.vocab * shape.hidden * t_b // shard
    accum = s["grad_accum"] > 1

    act_layer = layer_activation_bytes_per_token(
        shape, dtype=s["dtype"], precision=s["precision"], seq_len=s["seq_len"], attention=s["attention"],
        packed=s["packed"], lora_targets=targets) * tokens
    fin_consumers = ["lm_head"] if s["loss"] == "full" and not lora else []
    final = _norm_bytes(shape, mode, c, not lora, fin_consumers, set() if lora else None) * tokens
    if s["loss"] == "weightprep":
        final += sup_tokens * shape.hidden * out_b  # supervised hidden states gathered for the chunked loss
    mask = s["micro_batch"] * s["seq_len"] ** 2 if (s["attention"] == "sdpa" and s["packed"]) else 0
    embed = tokens * shape.hidden * (1 if shape.dropout > 0 else 0)  # embedding-dropout mask
    boundary = shape.layers * tokens * shape.hidden * r_b
    act_nockpt = int(shape.layers * act_layer + final + mask + embed)
    act_ckpt = int(boundary + final + mask + embed)
    act_fwd = act_ckpt if ckpt else act_nockpt
    recompute = int(act_layer) if ckpt else 0

    v = shape.vocab
    softcap = 2 * c if shape.final_logit_softcapping else 0
    up = 4 if c < 4 else 0  # the fp32 copy of the full logits (a no-op in fp32)
    full_fwd = (c + up + 4 + softcap) * tokens * v
    full_peak = max(full_fwd, 12 * tokens * v)
    chunk = min(s["loss_chunk_tokens"], sup_tokens)
    tile_v = min(v, DEFAULT_LOSS_VOCAB_CHUNK)
    kernel = weighted_loss_bytes(
        sup_tokens, shape.hidden, v, compute=c, hidden_dtype=out_b, weight_dtype=c if (fsdp and mode == "mixed") else w_b,
        head_trainable=not lora, token_tile=s["loss_chunk_tokens"],
    )  # fmt: skip
    chunk_peak = max(kernel["forward"], kernel["backward"])
    logits_in_forward = c * tokens * v if s["loss"] == "full" else 0
    logits_peak = full_peak if s["loss"] == "full" else kernel["forward"]
    loss_backward = kernel["backward"] if s["loss"] == "weightprep" else 0
    batch = tokens * BATCH_BYTES_PER_TOKEN

    static = weights + fsdp_units + optim + buckets + batch
    g_live = grads if accum else 0
    phases = {
        "forward end": static + g_live + act_fwd + cast_fwd_end + logits_in_forward,
        "loss": static + g_live + act_fwd + cast_saved + logits_peak,
        "loss backward": static + g_live + act_fwd + cast_saved + loss_backward,
        "backward (top layer)": static + (grads if accum else head_grad) + act_fwd + recompute
        + (cast_saved if not ckpt else cast_layer),
        "backward (bottom layer)": static + grads + int(act_layer) + cast_layer + mask,
    }
    peak_phase = max(phases, key=lambda k: phases[k])
    at = {
        "forward end": dict(grads=g_live, act=act_fwd, cast=cast_fwd_end, logits=logits_in_forward),
        "loss": dict(grads=g_live, act=act_fwd, cast=cast_saved, logits=logits_peak),
        "loss backward": dict(grads=g_live, act=act_fwd, cast=cast_saved, logits=loss_backward),
        "backward (top layer)": dict(grads=grads if accum else head_grad, act=act_fwd + recompute,
                                     cast=cast_saved if not ckpt else cast_layer, logits=0),
        "backward (bottom layer)": dict(grads=grads, act=int(act_layer) + mask, cast=cast_layer, logits=0),
    }[peak_phase]

    if mode == "mixed" and not fsdp:
        terms.append(Term("autocast_copies", "autocast weight copies", cast_all, at["cast"],
                          f"{c} B x matmul weights ({cast_all // c:,}): cached during forward, saved for backward"
                          " without checkpointing"))
    terms.append(Term("gradients", "gradients", grads, at["grads"],
                      f"{P_t:,} trainable x {t_b} B" + (f" / {n}" if fsdp else "")
                      + ("; alive during forward (accumulation)" if accum else "; allocated during backward")))
    if buckets:
        terms.append(Term("ddp_buckets", "DDP gradient buckets", buckets, buckets,
                          f"{P_t:,} x {t_b} B: DDP's reducer copy of the gradients (gradient_as_bucket_view=False)"))
    terms.append(Term("optimizer", "optimizer states (AdamW)", optim, optim,
                      f"2 states x {P_t:,} x {t_b} B" + (f" / {n}" if fsdp else "")))
    per_tok_layer = act_layer / tokens
    ck_formula = (f"{shape.layers} layer inputs x {tokens:,} tokens x {shape.hidden} x {r_b} B"
                  f" + one layer recomputed ({per_tok_layer:,.0f} B/token) in backward + final norm"
                  + (" + block mask" if mask else ""))
    nock_formula = f"{shape.layers} layers x {tokens:,} tokens x {per_tok_layer:,.0f} B/token + final norm" + (
        " + block mask" if mask else "")
    if ckpt:
        terms.append(Term("activations_ckpt", "activations (checkpointing)", act_ckpt + int(act_layer),
                          at["act"], ck_formula))
    else:
        terms.append(Term("activations_nockpt", "activations (no checkpointing)", act_nockpt, at["act"],
                          nock_formula))
    if s["loss"] == "full":
        terms.append(Term("logits_full", "logits + loss, full-logits recipe", full_peak, at["logits"],
                          f"{tokens:,} tokens x {v:,} vocab x max({c + up + 4 + softcap} B forward, 12 B backward):"
                          " logits, fp32 copy, log-softmax, its gradient"))
    else:
        head_note = (f" + fp32 gradient of the whole head {v:,} x {shape.hidden:,} x 4 B"
                     + (f" and its {kernel['head_cast'] // (v * shape.hidden)} B cast" if kernel["head_cast"] else "")
                     if not lora else "")  # fmt: skip
        terms.append(Term("logits_weightprep", "logits + loss, weightprep (TRL kernel)", chunk_peak, at["logits"],
                          f"max(forward {kernel['forward'] / GiB:.2f} GiB, backward {kernel['backward'] / GiB:.2f} "
                          f"GiB): {chunk:,}-token x {tile_v:,}-column tile x {c} B, fp32 grad of {sup_tokens:,}"
                          f" supervised hidden states{head_note}"))
    terms.append(Term("batch", "input batch", batch, batch, f"{tokens:,} tokens x {BATCH_BYTES_PER_TOKEN} B"))

    peak = phases[peak_phase]
    overhead = CUDA_CONTEXT_BYTES + (NCCL_BYTES if n > 1 else 0) + int(s["fragmentation"] * peak)
    terms.append(Term("overhead", "framework overhead", overhead, overhead,
                      f"CUDA context {CUDA_CONTEXT_BYTES / GiB:.1f} GiB" + (
                          f" + NCCL {NCCL_BYTES / GiB:.1f} GiB" if n > 1 else "")
                      + f" + fragmentation {s['fragmentation']:.0%} of peak"))
    return MemoryEstimate(
        model_type=shape.model_type, params=P, trainable_params=P_t, terms=tuple(terms), peak_phase=peak_phase,
        phases=phases, peak_allocated=peak, overhead=overhead, total=peak + overhead, gpu_memory=gpu_memory,
        settings=s,
    )
