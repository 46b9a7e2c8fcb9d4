"""Model shapes from a transformers config: the few numbers the memory plan needs.

``model_shape(config)`` reads a ``PretrainedConfig`` (or a plain dict of the same fields) of the
Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma2 and GPT-2 families and returns a :class:`ModelShape`:
hidden size, layers, heads, key/value heads, head size, MLP width, vocabulary, tied embeddings,
biases and norm/activation kinds. Parameter counts are computed from these fields exactly as the
transformers modules allocate them (``tests/test_plan.py`` checks them against
``AutoModelForCausalLM.from_config``). No weights are read, and nothing here imports torch.

Example (Llama-2-7B): 32 layers x (4 x 4096^2 attention + 3 x 4096 x 11008 MLP + 2 x 4096 norms)
+ 2 x 32000 x 4096 (embeddings, untied head) + 4096 (final norm) = 6,738,415,616 parameters.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightprep.errors import UsageError

__all__ = ["ModelShape", "Linear", "model_shape", "load_model_config", "SUPPORTED_MODEL_TYPES"]

#: model_type values read natively; others with Llama-style field names are read as Llama.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gpt2")


@dataclass(frozen=True)
class Linear:
    """One matrix-multiply module of a decoder layer: its leaf name (what peft's
    ``target_modules`` matches), input and output features, and whether it has a bias."""

    name: str
    fan_in: int
    fan_out: int
    bias: bool = False

    @property
    def params(self) -> int:
        return self.fan_in * self.fan_out + (self.fan_out if self.bias else 0)


@dataclass(frozen=True)
class ModelShape:
    """The shape of a decoder-only causal LM, as far as memory is concerned.

    ``family`` selects the per-layer activation formula: ``"llama"`` (RMSNorm, gated MLP, RoPE;
    also Mistral, Qwen2/3), ``"gemma"`` (Gemma's (1 + w) RMSNorm; Gemma2 adds two norms per
    layer and logit soft-capping) or ``"gpt2"`` (LayerNorm, biases, GELU MLP, learned positions).
    """

    model_type: str
    family: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    linears: tuple[Linear, ...]
    norms_per_layer: int = 2
    norm_params: int = 0  # parameters of one norm (weight, plus bias for LayerNorm)
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k
    max_positions: int = 0  # learned absolute positions (GPT-2); 0 for RoPE models
    activation: str = "silu"
    gated_mlp: bool = True
    dropout: float = 0.0  # residual/embedding dropout probability used in training
    final_logit_softcapping: float | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    # ---- parameter counts -------------------------------------------------------------
    @property
    def embedding_params(self) -> int:
        """Token embeddings plus learned position embeddings (GPT-2)."""
        return self.vocab * self.hidden + self.max_positions * self.hidden

    @property
    def lm_head_params(self) -> int:
        """The output projection; 0 when tied to the token embeddings (it is the same tensor)."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def layer_params(self) -> int:
        """One decoder layer: its linears, its norms and (Qwen3) the per-head q/k norms."""
        qk = 2 * self.head_dim if self.qk_norm else 0
        return sum(lin.params for lin in self.linears) + self.norms_per_layer * self.norm_params + qk

    @property
    def layer_matmul_params(self) -> int:
        """Weights of one layer's linears (what autocast casts to the compute dtype)."""
        return sum(lin.fan_in * lin.fan_out for lin in self.linears)

    @property
    def final_norm_params(self) -> int:
        return self.norm_params

    @property
    def root_params(self) -> int:
        """Everything outside the decoder layers: embeddings, final norm, untied head."""
        return self.embedding_params + self.final_norm_params + self.lm_head_params

    @property
    def total_params(self) -> int:
        return self.root_params + self.layers * self.layer_params

    def lora_params(self, r: int, targets: tuple[str, ...] | str = "all-linear") -> int:
        """Trainable parameters of LoRA rank ``r`` on ``targets`` (peft: A is r x in, B is out x r)."""
        return self.layers * sum(r * (lin.fan_in + lin.fan_out) for lin in self.lora_linears(targets))

    def lora_linears(self, targets: tuple[str, ...] | str = "all-linear") -> tuple[Linear, ...]:
        """The linears of one layer that LoRA adapts. ``"all-linear"`` is peft's meaning: every
        linear of the decoder layers, never the output head."""
        if targets == "all-linear":
            return self.linears
        names = (targets,) if isinstance(targets, str) else tuple(targets)
        chosen = tuple(lin for lin in self.linears if lin.name in names)
        if not chosen:
            have = sorted({lin.name for lin in self.linears})
            raise UsageError(f"LoRA targets {list(names)} match no linear of {self.model_type}; its linears: {have}")
        return chosen


def _get(cfg: Mapping[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if name in cfg and cfg[name] is not None:
            return cfg[name]
    return default


def _as_dict(config: Any) -> dict[str, Any]:
    if isinstance(config, Mapping):
        data = dict(config)
    elif hasattr(config, "to_dict"):
        data = config.to_dict()
    else:
        raise UsageError(f"expected a transformers config or a dict of its fields, got {type(config).__name__}")
    # multimodal / nested configs keep the language model under text_config
    if "text_config" in data and isinstance(data["text_config"], Mapping) and "hidden_size" not in data:
        data = dict(data["text_config"])
    return data


def _require(cfg: Mapping[str, Any], key: str, model_type: str) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or value <= 0:
        raise UsageError(f"config of model_type {model_type!r} lacks a positive integer {key!r} (got {value!r})")
    return value


def model_shape(config: Any) -> ModelShape:
    """Read a :class:`ModelShape` from a transformers config object or a dict of its fields."""
    cfg = _as_dict(config)
    model_type = str(cfg.get("model_type") or "llama")
    if model_type == "gpt2":
        return _gpt2_shape(cfg)
    return _llama_like_shape(cfg, model_type)


def _llama_like_shape(cfg: Mapping[str, Any], model_type: str) -> ModelShape:
    hidden = _require(cfg, "hidden_size", model_type)
    layers = _require(cfg, "num_hidden_layers", model_type)
    heads = _require(cfg, "num_attention_heads", model_type)
    kv_heads = int(_get(cfg, "num_key_value_heads", default=heads))
    head_dim = int(_get(cfg, "head_dim", default=hidden // heads))
    inter = _require(cfg, "intermediate_size", model_type)
    vocab = _require(cfg, "vocab_size", model_type)
    default_tied = model_type in ("gemma", "gemma2")
    tied = bool(_get(cfg, "tie_word_embeddings", default=default_tied))
    if model_type == "qwen2":
        qkv_bias, o_bias, mlp_bias = True, False, False
    else:
        qkv_bias = o_bias = bool(cfg.get("attention_bias", False))
        mlp_bias = bool(cfg.get("mlp_bias", False))
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    linears = (
        Linear("q_proj", hidden, q_out, qkv_bias),
        Linear("k_proj", hidden, kv_out, qkv_bias),
        Linear("v_proj", hidden, kv_out, qkv_bias),
        Linear("o_proj", q_out, hidden, o_bias),
        Linear("gate_proj", hidden, inter, mlp_bias),
        Linear("up_proj", hidden, inter, mlp_bias),
        Linear("down_proj", inter, hidden, mlp_bias),
    )
    family = "gemma" if model_type in ("gemma", "gemma2", "gemma3_text") else "llama"
    act = str(_get(cfg, "hidden_activation", "hidden_act", default="silu"))
    return ModelShape(
        model_type=model_type,
        family=family,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=inter,
        vocab=vocab,
        tied_embeddings=tied,
        linears=linears,
        norms_per_layer=4 if model_type in ("gemma2", "gemma3_text") else 2,
        norm_params=hidden,
        qk_norm=model_type in ("qwen3", "gemma3_text"),
        activation=act,
        gated_mlp=True,
        final_logit_softcapping=cfg.get("final_logit_softcapping"),
    )


def _gpt2_shape(cfg: Mapping[str, Any]) -> ModelShape:
    hidden = int(_get(cfg, "n_embd", "hidden_size", default=768))
    layers = int(_get(cfg, "n_layer", "num_hidden_layers", default=12))
    heads = int(_get(cfg, "n_head", "num_attention_heads", default=12))
    inner = int(_get(cfg, "n_inner", default=4 * hidden))
    vocab = int(_get(cfg, "vocab_size", default=50257))
    positions = int(_get(cfg, "n_positions", "max_position_embeddings", default=1024))
    dropout = max(float(cfg.get("resid_pdrop", 0.1)), float(cfg.get("embd_pdrop", 0.1)))
    linears = (
        Linear("c_attn", hidden, 3 * hidden, True),
        Linear("c_proj", hidden, hidden, True),
        Linear("c_fc", hidden, inner, True),
        Linear("c_proj", inner, hidden, True),
    )
    return ModelShape(
        model_type="gpt2",
        family="gpt2",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=heads,
        head_dim=hidden // heads,
        intermediate=inner,
        vocab=vocab,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        linears=linears,
        norms_per_layer=2,
        norm_params=2 * hidden,
        max_positions=positions,
        activation=str(cfg.get("activation_function", "gelu_new")),
        gated_mlp=False,
        dropout=dropout,
    )


def load_model_config(model: str | Path | Mapping[str, Any] | Any) -> dict[str, Any]:
    """Resolve ``--model`` to a dict of config fields, never loading weights.

    Accepts a dict or config object (returned as its dict), a ``config.json`` path, a local model
    directory holding ``config.json``, a preset name from ``weightprep.plan.presets``
    (e.g. ``llama-3-8b``), or a hub id, read with ``AutoConfig.from_pretrained`` (config only).
    """
    if not isinstance(model, (str, Path)):
        return _as_dict(model)
    from weightprep.plan.presets import PRESETS

    text = str(model)
    if text.lower() in PRESETS:
        return dict(PRESETS[text.lower()])
    path = Path(text).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise UsageError(f"{model}: a directory without config.json; pass the model directory or its config.json")
    if path.is_file():
        try:
            return _as_dict(json.loads(path.read_text(encoding="utf-8")))
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}: not valid JSON ({exc})") from exc
    if text.endswith(".json") or text.startswith((".", "/", "~")):
        raise UsageError(f"{model}: no such file")
    try:
        from transformers import AutoConfig

        return _as_dict(AutoConfig.from_pretrained(text))
    except Exception as exc:  # network, unknown id, gated repo: all user-fixable
        raise UsageError(
            f"could not read the config of {model!r} ({type(exc).__name__}: {exc}). Pass a local model directory, "
            f"its config.json, or a preset ({', '.join(sorted(PRESETS))})."
        ) from exc
