"""Build ``sample_data/tiny-llama/``: a tiny random LlamaForCausalLM that matches the sample tokenizer.

Four layers, hidden size 64, tied embeddings, 2048 positions, float32 safetensors (about 1.5 MB), random
weights from a fixed seed, saved with a copy of ``sample_data/tokenizer``. It exists so that

    weightprep build sample_data/raw.jsonl --out /tmp/shards
    weightprep train /tmp/shards --model sample_data/tiny-llama --output-dir /tmp/run

runs on a laptop CPU in about a minute. It learns, but it is not a useful language model.

    python sample_data/make_model.py            # rewrite sample_data/tiny-llama
"""

from __future__ import annotations

import argparse
from pathlib import Path

HERE = Path(__file__).resolve().parent


def build(out: Path, *, seed: int = 0) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(HERE / "tokenizer"))
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        use_cache=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=HERE / "tiny-llama")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = build(args.out, seed=args.seed)
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"wrote {out} ({size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
