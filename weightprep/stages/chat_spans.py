"""Stage 2a, step 3 — where an assistant turn's weight starts, from the template's own renders.

For assistant message ``i`` of a conversation whose whole render is ``S``: ``P_k`` is the render of its first
``k`` messages, ``G_i`` the render of ``messages[:i]`` with ``add_generation_prompt=True``. The turn's weight
ends at ``|P_{i+1}|`` (``P_{i+1}`` a prefix of ``S``: a template that rewrites a *weighted* turn is refused or
built per turn, never guessed). It starts (``answer_start``):

1. where the generation prompt ends, ``|G_i|``, where ``G_i`` is a prefix of ``P_{i+1}``: what an inference server
   supplies has weight 0;
2. else, comparing the renders (as LLaMA-Factory v1 does), where ``G_i`` and ``P_{i+1}`` first differ,
   ``d = lcp(G_i, P_{i+1})``:

   - within the generation prompt's own text (``d >= |P_i|``): the prompt prefills what the template does not
     render before an answer (GLM-4.7's ``<think>`` before an answer rendered ``</think>...``, MiniMax-M2's and
     QwQ's ``<think>\\n``, DeepSeek-R1 distills'): the weight starts at the first token of ``P_{i+1}`` that
     differs from ``G_i``'s token at the same place (``<`` is shared by ``<think>`` and ``</think>``);
   - before it (``d < |P_i|``): an earlier message of weight 0 is rendered differently once another follows
     (Hermes 3 ends a last tool result without its ``\\n``; Mistral Nemo moves the system prompt): the weight
     starts after the longest end of ``G_i`` past ``d`` (its own text ``G_i[|P_i|:]``, the assistant's header,
     at least; all of it where that is empty) that ``P_{i+1}`` writes after ``d`` and before the content;

   - refused where the render ends with the generation prompt's text that the turn is not rendered with (an
     opener written after every render that ``trailer`` did not find): the turn's end would hold that opener;

3. then, where the answer's content starts with what the generation prompt ends with, that holds an added
   token, and the render goes on with the rest of the content (MiniMax-M2's prompt ends ``<think>\\n``, an
   answer's content opens with ``<think>\\n`` and the render continues with its reasoning), the weight starts
   that much earlier: reasoning and tool-call markers the content holds carry the answer's weight, whatever the
   template prefills.

A template that writes the same text after every render, ``add_generation_prompt`` or not (Command R7B's
tool_use template ends each with ``<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>``,
the opener of a next answer), drops it once another message follows: not every ``P_k`` is a prefix of the next.
``trailer`` finds that text from probe renders; the renders are then compared without it (``P_k`` ends
before it, the whole render's trailer has weight 0 like every generation prompt), and the generation prompt is
the render as it is (it ends with the opener). Phi-3's EOS after the last message only is no such trailer: its
generation prompt does not end with it. Where the generation prompt follows the trailer instead of ending with
it (Command R+ tool_use ends every render with an instruction turn), the prompt is compared without it.

Cost: string comparisons of renders already made; no render of its own (``trailer``: three, once per template).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = ["answer_start", "common_prefix", "plain_answer", "trailer"]

#: The most characters of a generation prompt's end that an answer's content can start with (a prefilled
#: ``<think>\n``, ``[THINK]``): bounds rule 3's search.
_OVERLAP = 256


def common_prefix(a: str, b: str) -> int:
    """``len`` of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def trailer(renders: list[str], prompt: str, cuts: list[int]) -> str:
    """The text a template writes after every render and drops once another message follows (module docstring),
    or "": ``renders`` are ``P_1, P_2, ...`` of a probe conversation, ``prompt`` is ``G_1``, ``cuts`` the places of
    ``P_1`` where its last turn may end, in order (after its content's first end-of-turn token, then after each
    further control token: the turn keeps its own end of turn, which nothing tells from an opener that starts with
    the same token but this order). The first ``T = P_1[cut:]`` that every render ends with, and the prompt too
    or the prompt follows (Command R+ tool_use: an instruction turn after every render, the generation prompt
    after it), such that each render less ``T`` is a prefix of the next; none where each render is a prefix of the next (the
    template keeps what it wrote: ChatML's ``\n`` after ``<|im_end|>``; a ``<|assistant|>`` written after every
    render is dropped once a user message follows an answer)."""
    one = renders[0]
    if all(b.startswith(a) for a, b in zip(renders, renders[1:], strict=False)):
        return ""
    for cut in cuts:
        end = one[cut:]
        if (end and (prompt.endswith(end) or prompt.startswith(one)) and all(r.endswith(end) for r in renders)
                and all(b.startswith(a[: len(a) - len(end)]) for a, b in zip(renders, renders[1:], strict=False))):  # fmt: skip
            return end
    return ""


def plain_answer(content: Any, start: int, markers: re.Pattern[str]) -> bool:
    """Whether rule 3 (module docstring) leaves an answer's weight where it starts (``start``): its content is no
    string, or its first characters hold no added token (most answers)."""
    if not isinstance(content, str) or not content:
        return True
    head = content[: min(len(content) - 1, start, _OVERLAP)]
    return not head or not markers.search(head)


def answer_start(
    before: str | None, prompt: str, upto: str, content: Any, markers: re.Pattern[str],
    first_difference: Callable[[str, str], int] | None = None,
) -> int | None:  # fmt: skip
    """The character of ``upto`` (``P_{i+1}``) where assistant turn ``i``'s weight starts (module docstring):
    ``before`` is ``P_i`` (None where the template cannot render it), ``prompt`` ``G_i``, ``content`` the message's
    content, ``markers`` the tokenizer's added tokens, ``first_difference(prompt, upto)`` the first character of
    the first token of ``upto`` that is not ``prompt``'s token at the same place (both tokenized). Without it
    only rule 1 (and 3): None where that does not hold; with it, None where the renders cannot be compared
    either."""
    if upto.startswith(prompt):
        start = len(prompt)
    elif first_difference is None or before is None or not prompt.startswith(before):
        return None
    else:
        d = common_prefix(prompt, upto)
        if upto.endswith(prompt[d:]):  # the prompt's end, which the turn is not rendered with, ends the render:
            return None  # an opener written after every render that ``trailer`` missed: where the turn ends is unknown
        if d >= len(before):
            start = first_difference(prompt, upto)
        else:  # the longest end of the prompt past ``d`` that ``upto`` holds (its own text at least) before the
            start = -1  # content (not an opener the template appends after every render)
            limit = upto.find(content, d) if isinstance(content, str) and content else len(upto)
            for n in range(len(prompt) - d, max(len(prompt) - len(before), 1) - 1, -1):
                at = upto.find(prompt[len(prompt) - n :], d)
                if at >= 0 and at + n <= limit:
                    start = at + n
                    break
            if start < 0:
                return None
    if start >= len(upto):
        return None
    if start <= len(prompt) and not plain_answer(content, start, markers):
        # the longest end of the generation prompt that the content starts with and that holds an added token
        head = content[: min(len(content) - 1, start, _OVERLAP)]
        if not upto.startswith(prompt[:start]):
            return start
        tail, last = prompt[:start], prompt[start - 1]
        for j in range(len(head), 0, -1):
            if (head[j - 1] == last and tail.endswith(head[:j]) and upto[start : start + 1] == content[j]
                    and markers.search(head[:j])):  # fmt: skip
                return start - j
    return start
