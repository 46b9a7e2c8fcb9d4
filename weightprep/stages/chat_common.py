"""Stage 2a — what the chat modules share: the reasons a conversation is refused, ``ChatError``, the messages as
``apply_chat_template`` gets them, and the first character where two renders differ."""

from __future__ import annotations

from typing import Any

import numpy as np

from weightprep.batches import Chat

__all__ = ["CHAT_REASONS", "ChatError", "diverge", "snippet", "template_messages"]

CHAT_REASONS = (
    "template_error",
    "not_prefix_preserving",
    "generation_prompt_mismatch",
    "generation_tag_mismatch",
    "control_token_in_content",
    "bad_offsets",
    "double_bos",
    "reserved_template_kwarg",
)
class ChatError(Exception):
    """A conversation that cannot be rendered and aligned: the field, what is wrong, the reason code."""

    def __init__(self, field: str, problem: str, reason: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field, self.problem, self.reason = field, problem, reason


def diverge(a: str, b: str) -> int:
    """The first character where ``a`` and ``b`` differ (the shorter's length where one is a prefix of the other)."""
    n = min(len(a), len(b))
    eq = np.frombuffer(a[:n].encode("utf-32-le"), dtype=np.uint32) == np.frombuffer(b[:n].encode("utf-32-le"), dtype=np.uint32)
    return int(np.argmin(eq)) if not eq.all() else n


def template_messages(chat: Chat) -> list[dict[str, Any]]:
    """The messages as apply_chat_template renders them: keys whose value is None dropped, and our ``weight``."""
    return [{k: v for k, v in m.items() if v is not None and k != "weight"} for m in chat.messages]


def snippet(text: str, at: int) -> str:
    """``text`` from 10 characters before ``at`` to 20 after it, quoted (for error messages)."""
    return repr(text[max(0, at - 10) : at + 20])
