"""Precision, attention and device binding per GPU generation, with faked CUDA device properties.

torch.cuda's query functions are replaced by fakes that record every call, so the tests also check the order:
each rank binds its own GPU (LOCAL_RANK) before anything else asks CUDA about a device.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from weightprep.errors import UsageError
from weightprep.train.device import choose_attention, choose_precision, load_model, resolve_device_policy

GPUS = {
    (7, 0): "Tesla V100-SXM2-16GB",
    (7, 5): "Tesla T4",
    (8, 0): "NVIDIA A100-SXM4-80GB",
    (9, 0): "NVIDIA H200",
}


@pytest.fixture
def fake_gpu(monkeypatch):
    """fake_gpu(capability, count=8, flash=True) -> the list of CUDA calls made, in order."""

    def install(capability, count=8, flash=True):
        calls: list[tuple] = []
        current = {"device": 0}

        def record(name, result=None):
            def fn(*args):
                calls.append((name, *args))
                return result(*args) if callable(result) else result

            return fn

        def props(index=None):
            index = current["device"] if index is None else index
            return SimpleNamespace(
                name=GPUS[capability], major=capability[0], minor=capability[1], total_memory=80 * 2**30
            )

        def set_device(index):
            current["device"] = index

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "set_device", record("set_device", set_device))
        monkeypatch.setattr(torch.cuda, "current_device", record("current_device", lambda: current["device"]))
        monkeypatch.setattr(torch.cuda, "get_device_properties", record("get_device_properties", props))
        monkeypatch.setattr(torch.cuda, "get_device_capability", record("get_device_capability", lambda *a: capability))
        # emulation counts as support here; a test allocation on the current device: must never be asked
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", record("is_bf16_supported", True))
        have = {"flash_attn"} if flash else set()
        monkeypatch.setattr("weightprep.train.device.package_installed", lambda name: name in have)
        return calls

    return install


@pytest.mark.parametrize(
    ("capability", "precision", "attention"),
    [((7, 0), "fp16", "sdpa"), ((7, 5), "fp16", "sdpa"), ((8, 0), "bf16", "flash_attention_2"),
     ((9, 0), "bf16", "flash_attention_2")],
)  # fmt: skip
def test_auto_policy_per_gpu_generation(fake_gpu, monkeypatch, capability, precision, attention):
    calls = fake_gpu(capability)
    monkeypatch.setenv("LOCAL_RANK", "3")
    policy = resolve_device_policy("auto", "auto", None, lora=False)
    assert (policy.precision, policy.attn_implementation) == (precision, attention)
    assert policy.device == "cuda:3" and policy.capability == capability and policy.gpu_name == GPUS[capability]
    assert policy.gradient_checkpointing is True and policy.load_dtype == "float32"
    # this rank binds cuda:3 first; every later query names that device; is_bf16_supported is never asked
    assert calls[0] == ("set_device", 3)
    assert all(call[1:] == (3,) for call in calls[1:]), calls
    assert not any(call[0] == "is_bf16_supported" for call in calls)


@pytest.mark.parametrize("capability", [(8, 0), (9, 0)])
def test_auto_attention_is_sdpa_without_flash_attn_installed(fake_gpu, capability):
    fake_gpu(capability, flash=False)
    assert resolve_device_policy().attn_implementation == "sdpa"


@pytest.mark.parametrize("capability", [(7, 0), (7, 5)])
def test_explicit_bf16_and_flash_are_refused_before_ampere(fake_gpu, capability):
    fake_gpu(capability)
    with pytest.raises(UsageError, match=f"compute capability 8.0 or newer.*{capability[0]}.{capability[1]}"):
        resolve_device_policy("bf16")
    with pytest.raises(UsageError, match="flash_attention_2 needs a GPU of compute capability 8.0"):
        resolve_device_policy("fp16", "flash_attention_2")
    assert resolve_device_policy("fp16", "sdpa").precision == "fp16"


def test_flash_attention_3_needs_hopper_and_its_package(fake_gpu):
    fake_gpu((8, 0))
    with pytest.raises(UsageError, match="compute capability 9.0"):
        resolve_device_policy("auto", "flash_attention_3")
    fake_gpu((9, 0))
    with pytest.raises(UsageError, match="flash_attn_interface"):
        resolve_device_policy("auto", "flash_attention_3")


@pytest.mark.parametrize(("capability", "dtype"), [((7, 5), "float16"), ((8, 0), "bfloat16")])
def test_lora_keeps_the_frozen_base_in_the_training_half_precision(fake_gpu, capability, dtype):
    fake_gpu(capability)
    assert resolve_device_policy(lora=True).load_dtype == dtype
    assert resolve_device_policy(lora=False).load_dtype == "float32"


def test_local_rank_beyond_the_visible_gpus_is_refused(fake_gpu, monkeypatch):
    fake_gpu((8, 0), count=2)
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(UsageError, match="LOCAL_RANK=2 but this machine shows 2 GPU"):
        resolve_device_policy()


def test_cpu_policy():
    if torch.cuda.is_available():  # pragma: no cover - the CI machine has no GPU
        pytest.skip("a real GPU is present")
    policy = resolve_device_policy()
    assert (policy.device, policy.precision, policy.attn_implementation) == ("cpu", "fp32", "sdpa")
    assert policy.gradient_checkpointing is False
    for half in ("bf16", "fp16"):
        with pytest.raises(UsageError, match="needs a GPU"):
            choose_precision(half, None)
    with pytest.raises(UsageError, match="needs a GPU"):
        choose_attention("flash_attention_2", None, installed=lambda _: True)


def test_sft_config_follows_the_policy(fake_gpu, tmp_path):
    from weightprep.train.command import _sft_config

    fake_gpu((7, 5))
    policy = resolve_device_policy()
    opts = {
        "output_dir": tmp_path, "micro_batch_size": 2, "grad_accum": 1, "lr": None, "lora_r": 0,
        "lr_scheduler": "constant", "warmup_ratio": 0.0, "weight_decay": 0.0, "max_grad_norm": 1.0,
        "max_steps": 1, "epochs": 1.0, "save_steps": 10, "save_total_limit": None, "logging_steps": 1,
        "seed": 0, "dataloader_workers": 0, "strategy": "ddp",
    }  # fmt: skip
    # SFTConfig's own checks would look for a real GPU for fp16: read the flags it was given
    captured = {}
    import trl

    class Capture:
        __dataclass_fields__ = trl.SFTConfig.__dataclass_fields__

        def __init__(self, **kwargs):
            captured.update(kwargs)

    import unittest.mock

    with unittest.mock.patch.object(trl, "SFTConfig", Capture):
        _sft_config(opts, policy, SimpleNamespace(_no_split_modules=["LlamaDecoderLayer"]))
    assert captured["fp16"] is True and captured["bf16"] is False and captured["use_cpu"] is False
    assert captured["activation_checkpointing"] is True


@pytest.mark.parametrize(("lora", "dtype"), [(False, torch.float32), (True, torch.bfloat16)], ids=["full", "lora"])
def test_fsdp_loads_weights_on_rank_0_only(fake_gpu, monkeypatch, lora, dtype):
    """Under FSDP the other ranks build the model on the meta device (no weights read, buffers real).

    FSDP runs on GPUs only, so the policy is the one ``weightprep train`` resolves there (an A100 faked, as in the
    tests above): ``load_model`` reads its dtype and attention, and the weights still land in host RAM."""
    from pathlib import Path

    from transformers import AutoConfig

    model_dir = str(Path(__file__).resolve().parent.parent / "sample_data" / "tiny-llama")
    config = AutoConfig.from_pretrained(model_dir)
    fake_gpu((8, 0), flash=False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    policy = resolve_device_policy("auto", "auto", None, lora=lora)  # as train/command.py calls it
    assert (policy.device, policy.precision, policy.attn_implementation) == ("cuda:1", "bf16", "sdpa")
    assert getattr(torch, policy.load_dtype) == dtype
    monkeypatch.setenv("RANK", "1")
    empty = load_model(model_dir, config, policy, fsdp=True)
    assert all(p.device.type == "meta" for p in empty.parameters())
    assert all(b.device.type == "cpu" for b in empty.buffers())  # rotary frequencies are re-registered from these
    assert {p.dtype for p in empty.parameters()} == {dtype}
    assert empty.config._attn_implementation == "sdpa"
    monkeypatch.setenv("RANK", "0")
    real = load_model(model_dir, config, policy, fsdp=True)
    assert all(p.device.type == "cpu" for p in real.parameters())
    assert {p.dtype for p in real.parameters()} == {dtype} and real.config._attn_implementation == "sdpa"
    assert real.lm_head.weight.abs().sum() > 0
    assert {n for n, _ in empty.named_parameters()} == {n for n, _ in real.named_parameters()}
    monkeypatch.setenv("RANK", "1")
    assert load_model(model_dir, config, policy, fsdp=False).lm_head.weight.device.type == "cpu"  # DDP: all load
