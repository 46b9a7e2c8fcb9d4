"""Device policy of ``weightprep train``: which GPU this process uses, precision, attention, checkpointing.

Decided by the GPU's compute capability, never by ``torch.cuda.is_bf16_supported()`` (which counts emulation and
says yes on T4 and V100, and allocates a test tensor on the current device to find out):

| GPU (compute capability)            | precision (auto)       | attention (auto)                                |
|-------------------------------------|------------------------|-------------------------------------------------|
| V100 (7.0), T4 / RTX 20xx (7.5)      | fp16 + loss scaler     | sdpa (flash-attention 2 needs sm80)             |
| A100 / A10 / RTX 30xx (8.x)          | bf16                   | flash_attention_2 if flash_attn is installed    |
| H100 / H200 (9.0)                   | bf16                   | flash_attention_2 if installed (3: ask for it)  |
| CPU                                 | fp32                   | sdpa                                            |

Each process first binds to its own GPU (``LOCAL_RANK`` under torchrun/accelerate) before anything else touches
CUDA, so eight ranks do not all open a context on ``cuda:0``. All choices are checked: an explicit choice that
this GPU cannot run (bf16 or flash-attention below sm80, fp16 on CPU, ...) is refused with the alternative.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any

from weightprep.errors import UsageError

__all__ = [
    "DevicePolicy",
    "bind_local_gpu",
    "choose_attention",
    "choose_precision",
    "load_model",
    "preflight_memory_check",
    "resolve_device_policy",
]

#: Minimum compute capability of native bf16 and of flash-attention 2 (Ampere); flash-attention 3 needs Hopper.
AMPERE = (8, 0)
HOPPER = (9, 0)
_FLASH_PACKAGES = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}
_FLASH_MIN = {"flash_attention_2": AMPERE, "flash_attention_3": HOPPER}
_FLASH_INSTALL = {
    "flash_attention_2": "pip install flash-attn --no-build-isolation",
    "flash_attention_3": "install flash-attention 3 (the hopper/ build of the flash-attention repository)",
}


@dataclass(frozen=True)
class DevicePolicy:
    """What this process trains on and how."""

    device: str  # "cuda:N" or "cpu"
    gpu_name: str | None
    capability: tuple[int, int] | None
    total_memory: int | None  # bytes, GPU only
    precision: str  # "bf16", "fp16" (with a loss scaler) or "fp32"
    attn_implementation: str
    gradient_checkpointing: bool
    #: dtype the weights are loaded in: a frozen LoRA base in the half precision of training, else fp32 masters
    load_dtype: str

    @property
    def use_cuda(self) -> bool:
        return self.device.startswith("cuda")


def bind_local_gpu() -> int | None:
    """Bind this process to its GPU (``LOCAL_RANK``, default 0) and return the index; ``None`` without CUDA.

    Must run before any other CUDA call of the process: a query on the current device before it would open a
    context on ``cuda:0`` from every rank.
    """
    import torch

    if not torch.cuda.is_available():  # no context is created by this
        return None
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise UsageError(
            f"LOCAL_RANK={local_rank} but this machine shows {count} GPU(s); start at most {count} processes per "
            "node (torchrun --nproc-per-node), or check CUDA_VISIBLE_DEVICES"
        )
    torch.cuda.set_device(local_rank)
    return local_rank


def choose_precision(choice: str, capability: tuple[int, int] | None) -> str:
    """``auto``: bf16 on sm80+, fp16 (with a loss scaler) on older GPUs, fp32 on CPU; explicit choices checked."""
    if capability is None:
        if choice in ("bf16", "fp16"):
            raise UsageError(f"--precision {choice} needs a GPU; on CPU training runs in fp32 (--precision fp32)")
        return "fp32"
    if choice == "auto":
        return "bf16" if capability >= AMPERE else "fp16"
    if choice == "bf16" and capability < AMPERE:
        raise UsageError(
            f"--precision bf16 needs a GPU of compute capability 8.0 or newer (Ampere); this one is "
            f"{capability[0]}.{capability[1]} and would only emulate bf16, slowly. Use --precision fp16 (with a loss "
            "scaler) or auto"
        )
    return choice


def package_installed(package: str) -> bool:
    """Whether ``package`` can be imported (an import-spec lookup: nothing is imported)."""
    return importlib.util.find_spec(package) is not None


def choose_attention(choice: str, capability: tuple[int, int] | None, *, installed: Any = None) -> str:
    """``auto``: flash_attention_2 on sm80+ when flash_attn is installed, else sdpa; explicit choices checked.

    ``installed(package) -> bool`` defaults to :func:`package_installed`.
    """
    installed = installed or package_installed
    if choice == "auto":
        if capability is not None and capability >= AMPERE and installed(_FLASH_PACKAGES["flash_attention_2"]):
            return "flash_attention_2"
        return "sdpa"
    if choice in _FLASH_PACKAGES:
        need = _FLASH_MIN[choice]
        if capability is None or capability < need:
            found = "no GPU" if capability is None else f"compute capability {capability[0]}.{capability[1]}"
            raise UsageError(
                f"--attn-implementation {choice} needs a GPU of compute capability {need[0]}.{need[1]} or newer; "
                f"found {found}. Use --attn-implementation sdpa (or auto)"
            )
        if not installed(_FLASH_PACKAGES[choice]):
            raise UsageError(f"--attn-implementation {choice} needs the {_FLASH_PACKAGES[choice]} package: "
                             f"{_FLASH_INSTALL[choice]}")  # fmt: skip
    return choice


def resolve_device_policy(
    precision: str = "auto",
    attn_implementation: str = "auto",
    gradient_checkpointing: bool | None = None,
    *,
    lora: bool = False,
) -> DevicePolicy:
    """Bind the local GPU, read its properties and decide precision, attention, checkpointing and load dtype."""
    index = bind_local_gpu()
    name = capability = total = None
    if index is not None:
        import torch

        props = torch.cuda.get_device_properties(index)
        name, capability, total = props.name, (int(props.major), int(props.minor)), int(props.total_memory)
    chosen = choose_precision(precision, capability)
    return DevicePolicy(
        device="cpu" if index is None else f"cuda:{index}",
        gpu_name=name,
        capability=capability,
        total_memory=total,
        precision=chosen,
        attn_implementation=choose_attention(attn_implementation, capability),
        gradient_checkpointing=(index is not None) if gradient_checkpointing is None else bool(gradient_checkpointing),
        # LoRA freezes the base: keep it in the training half precision (peft keeps the adapters in fp32, so the
        # fp16 loss scaler only ever unscales fp32 gradients); full fine-tuning keeps fp32 master weights
        load_dtype={"bf16": "bfloat16", "fp16": "float16"}.get(chosen, "float32") if lora else "float32",
    )


def preflight_memory_check(policy: DevicePolicy, shards: Any, model_config: Any, opts: dict[str, Any]) -> Any:
    """Refuse, with the plan's advice, a setup that ``weightprep plan`` predicts will not fit this GPU; the plan
    (``weightprep.plan.advice.PlanResult``) of one that fits, None where the planner does not know the model."""
    from weightprep.plan import check_fits, format_advice
    from weightprep.plan.advice import shards_settings

    try:
        settings = shards_settings(shards.path)
        result = check_fits(
            model_config,
            shards.seq_len,
            int(opts["micro_batch_size"]),
            gpus=int(os.environ.get("WORLD_SIZE", "1")),
            gpu_memory=policy.total_memory,
            strategy=opts["strategy"],
            dtype=policy.precision,
            precision="pure" if policy.load_dtype != "float32" else "mixed",
            gradient_checkpointing=policy.gradient_checkpointing,
            lora_r=int(opts["lora_r"] or 0) or None,
            grad_accum=int(opts["grad_accum"]),
            packed=shards.packed,
            supervised_fraction=settings.get("supervised_fraction", 1.0),
        )
    except UsageError:
        raise
    except Exception as exc:  # a model family the planner does not know: say so, do not block training
        import click

        click.echo(f"note: memory plan unavailable for this model ({exc}); starting anyway", err=True)
        return None
    if not result.fits:
        raise UsageError(
            format_advice(result) + "\nChange the settings above, or pass --skip-memory-check to try anyway."
        )
    return result


def load_model(model_id: str, model_config: Any, policy: DevicePolicy, *, fsdp: bool = False) -> Any:
    """The causal LM in the policy's dtype and attention implementation.

    Under FSDP only global rank 0 reads the weights (into host RAM, in ``load_dtype``); every other rank builds
    the same model with its parameters on the meta device (buffers such as rotary frequencies stay real), and
    accelerate's ``cpu_ram_efficient_loading`` broadcasts rank 0's weights while it shards them. Host RAM is then
    one copy of the model per node 0, not one per rank (an 8B model in fp32 is 32 GB: 256 GB for 8 ranks).
    """
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, policy.load_dtype)
    try:
        if fsdp and int(os.environ.get("RANK", "0") or 0) != 0:
            from accelerate import init_empty_weights

            with init_empty_weights(include_buffers=False):
                model = AutoModelForCausalLM.from_config(
                    model_config, dtype=dtype, attn_implementation=policy.attn_implementation
                )
            model.tie_weights()  # as from_pretrained does: tied heads must be one parameter before sharding
            return model
        return AutoModelForCausalLM.from_pretrained(
            model_id, dtype=dtype, attn_implementation=policy.attn_implementation
        )
    except Exception as exc:
        raise UsageError(
            f"could not load model {model_id!r} (attn_implementation={policy.attn_implementation}): {exc}"
        ) from exc
