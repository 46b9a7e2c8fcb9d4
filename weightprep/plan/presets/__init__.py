"""Hand-written config fields of a few well-known models, for ``weightprep plan --model NAME``.

Only the fields the memory plan reads, copied from the models' published ``config.json`` files,
so the worked examples run offline. Any local ``config.json`` or hub id works the same way.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PRESETS"]

PRESETS: dict[str, dict[str, Any]] = {
    # meta-llama/Llama-2-7b-hf: 6.74B parameters
    "llama-2-7b": {
        "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 32, "intermediate_size": 11008, "vocab_size": 32000,
        "tie_word_embeddings": False, "hidden_act": "silu", "max_position_embeddings": 4096,
    },
    # meta-llama/Meta-Llama-3-8B: 8.03B parameters, vocabulary 128k
    "llama-3-8b": {
        "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
        "tie_word_embeddings": False, "hidden_act": "silu", "max_position_embeddings": 8192,
    },
    # mistralai/Mistral-7B-v0.1: 7.24B parameters
    "mistral-7b": {
        "model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
        "tie_word_embeddings": False, "hidden_act": "silu",
    },
    # Qwen/Qwen2.5-7B: 7.62B parameters, vocabulary 152k
    "qwen2.5-7b": {
        "model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064,
        "tie_word_embeddings": False, "hidden_act": "silu",
    },
    # Qwen/Qwen2.5-0.5B: 0.49B parameters, tied embeddings
    "qwen2.5-0.5b": {
        "model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
        "tie_word_embeddings": True, "hidden_act": "silu",
    },
    # Qwen/Qwen3-8B: 8.19B parameters, q/k norms
    "qwen3-8b": {
        "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936,
        "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
    },
    # google/gemma-2b: 2.51B parameters, vocabulary 256k, tied
    "gemma-2b": {
        "model_type": "gemma", "hidden_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 8,
        "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 16384, "vocab_size": 256000,
        "tie_word_embeddings": True, "hidden_activation": "gelu_pytorch_tanh",
    },
    # openai-community/gpt2: 124M parameters
    "gpt2": {
        "model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
        "n_positions": 1024, "activation_function": "gelu_new", "resid_pdrop": 0.1, "embd_pdrop": 0.1,
        "attn_pdrop": 0.1,
    },
    # a ~0.57B Llama-style model with Llama-3's vocabulary: what benchmarks/plan_gpu_check.py measures
    "llama-0.5b-bench": {
        "model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
        "num_key_value_heads": 8, "intermediate_size": 2816, "vocab_size": 128256,
        "tie_word_embeddings": False, "hidden_act": "silu",
    },
}
