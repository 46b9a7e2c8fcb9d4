"""A conversation's prefix renders read off one render of the whole, where that is what the template writes.

The chat stage needs ``P_k = render(messages[:k])`` for every boundary and ``G_k`` (the same with
``add_generation_prompt``) for every weighted assistant turn: seven renders for a 5-message conversation, most of
its cost. For a template of the shape most chat templates have,

    PRE  {% for message in messages %} BODY {% endfor %}  [{% if add_generation_prompt %} OUT {% endif %}]

the render of ``messages[:k]`` is the render of the whole conversation cut where iteration ``k`` of the loop
starts, provided PRE reads no message but ``messages[0]`` and what BODY writes at iteration ``j`` depends on no
later message. ``compile_tracked`` proves the static half once per template (``PrefixShape``), from its syntax tree:

- the loop over ``messages`` is a statement of the template itself (no filter, ``else`` or recursion), and
  ``add_generation_prompt`` is read only by the one ``if`` after it, which is all there is after the loop;
- ``messages`` is read nowhere else but as ``messages[0]`` before the loop and as ``messages[...]`` after it;
  ``loop`` only as ``loop.NAME`` or ``loop[...]``; no ``extends``, ``include``, ``import`` or ``block``.

``Tracker`` proves the dynamic half for each conversation, while its whole render runs: the loop's iterations
start at the recorded output positions, every message is iterated, and the render read no ``messages[...]`` once
the loop had started and no attribute of a loop but ``index``, ``index0`` and ``first`` (``loop.last``,
``loop.nextitem``, ... look ahead). Then ``P_k`` is the whole render's first characters up to iteration ``k``
(``1 <= k <= n``; the render of no message is PRE alone, where ``messages[0]`` is undefined, so it is rendered),
exactly: its render runs the same statements on the same values and stops at the end of iteration ``k - 1``,
where the loop ends and the ``if`` writes nothing. Where the ``if`` writes constant text only, ``G_k = P_k +``
that text. Wherever a condition fails, the renders are made as before.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

from jinja2 import nodes
from jinja2.runtime import LoopContext

__all__ = ["PrefixShape", "Tracker", "TrackedLoop", "compile_tracked", "tracked_getattr", "tracked_getitem"]

#: the loop attributes that tell nothing about later iterations
_PAST_ONLY = frozenset({"index", "index0", "first"})
_LOCAL = threading.local()


class PrefixShape(NamedTuple):
    """What ``prefix_shape`` proved: prefixes are cuts of the whole render; ``generation``: the text that
    ``add_generation_prompt`` appends to any render (None: not proven constant, render it)."""

    generation: str | None


def compile_tracked(env: Any, template: str, transform: Any = None) -> tuple[Any, PrefixShape | None]:
    """``template`` compiled by ``env`` with its loops tracked (``TrackedLoop``), and the static half of the proof
    (module docstring), or None. Where it holds, the loop over the messages reads ``loop.first`` (an ``if`` with
    no body: nothing written, nothing changed), so that Jinja gives it a loop object to track even where the
    template itself never reads ``loop``. ``transform(tree)``: changes the parsed tree before it is compiled."""
    tree = env.parse(template)
    if transform is not None:
        tree = transform(tree)
    found = _prefix_shape(env, tree)
    if found is not None:
        loop = found[1]
        probe = nodes.If(nodes.Getattr(nodes.Name("loop", "load"), "first", "load"), [], [], [])
        loop.body.insert(0, probe.set_lineno(loop.lineno))
    compiled = env.from_string(tree)
    compiled.root_render_func.__globals__["LoopContext"] = TrackedLoop
    return compiled, None if found is None else found[0]


def _prefix_shape(env: Any, tree: Any) -> tuple[PrefixShape, Any] | None:
    """The static half of the proof for the parsed template ``tree``, and its loop over the messages; or None."""
    if env.is_async or env.finalize is not None or env.autoescape is not False:
        return None
    if any(True for _ in tree.find_all((nodes.Extends, nodes.Include, nodes.Import, nodes.FromImport, nodes.Block))):
        return None
    loops = [i for i, node in enumerate(tree.body) if isinstance(node, nodes.For) and _is_name(node.iter, "messages")]
    if len(loops) != 1:
        return None
    at = loops[0]
    loop, before, after = tree.body[at], tree.body[:at], tree.body[at + 1 :]
    if loop.else_ or loop.test is not None or loop.recursive:
        return None
    generation: str | None = ""
    if after:
        if len(after) != 1 or not isinstance(after[0], nodes.If) or not _is_name(after[0].test, "add_generation_prompt"):
            return None
        gen = after[0]
        if gen.elif_ or gen.else_:
            return None
        generation = _constant_output(gen.body)
    agp = [n for n in tree.find_all(nodes.Name) if n.name == "add_generation_prompt"]
    if len(agp) != (1 if after else 0):
        return None
    if not _names_ok(tree, loop, before):
        return None
    return PrefixShape(generation), loop


def _is_name(node: Any, name: str) -> bool:
    return isinstance(node, nodes.Name) and node.name == name and node.ctx == "load"


def _constant_output(body: list[Any]) -> str | None:
    """The text of statements that write constants only, or None."""
    text = []
    for stmt in body:
        if not isinstance(stmt, nodes.Output):
            return None
        for part in stmt.nodes:
            if isinstance(part, nodes.TemplateData) or (isinstance(part, nodes.Const) and isinstance(part.value, str)):
                text.append(part.data if isinstance(part, nodes.TemplateData) else part.value)
            else:
                return None
    return "".join(text)


def _names_ok(tree: Any, loop: Any, before: list[Any]) -> bool:
    """Every ``messages`` and ``loop`` read as the module docstring allows."""
    in_before = {id(n) for stmt in before for n in stmt.find_all(nodes.Name)}
    parents: dict[int, Any] = {}
    for parent in [tree, *tree.find_all(nodes.Node)]:
        for child in parent.iter_child_nodes():
            parents[id(child)] = parent
    for name in tree.find_all(nodes.Name):
        if name.name not in ("messages", "loop"):
            continue
        if name.ctx != "load":
            return False
        parent = parents.get(id(name))
        if name.name == "loop":
            if not (isinstance(parent, (nodes.Getattr, nodes.Getitem)) and parent.node is name):
                return False
            continue
        if name is loop.iter:
            continue
        if not (isinstance(parent, nodes.Getitem) and parent.node is name):
            return False
        if id(name) in in_before and not (isinstance(parent.arg, nodes.Const) and parent.arg.value == 0):
            return False
    return True


class Tracker:
    """The dynamic half of the proof, for one render of a whole conversation (module docstring)."""

    def __init__(self, messages: list[Any], length: Any = len) -> None:
        self.messages = messages
        self.length = length  # a chunk's characters (``chat_skeleton``'s placeholders are not asked)
        self.chunks: list[str] = []  # what the render wrote, chunk by chunk
        self.position = 0  # characters written so far (by ``Tracker.render``)
        self.starts: list[int] = []  # where each iteration of the loop over ``messages`` started
        self.end: int | None = None  # where that loop ended
        self.safe = True

    def render(self, chunks: Any) -> str:
        """Consume the template's output (its generator), tracked; the text."""
        out = self.chunks
        length = self.length
        previous = getattr(_LOCAL, "tracker", None)
        _LOCAL.tracker = self
        try:
            for chunk in chunks:
                out.append(chunk)
                self.position += length(chunk)
        finally:
            _LOCAL.tracker = previous
        return "".join(out)

    def cuts(self, text: str) -> list[int] | None:
        """``len(P_k)`` for ``k = 1 .. n`` (index ``k - 1``), where proven; else None."""
        n = len(self.messages)
        if not self.safe or n == 0 or len(self.starts) != n or self.end != len(text):
            return None
        return [*self.starts[1:], self.end]


def _current() -> Tracker | None:
    tracker: Tracker | None = getattr(_LOCAL, "tracker", None)
    return tracker


def _looks_ahead(loop: LoopContext) -> None:
    """A read of ``loop`` that may tell of later iterations: unsafe where it is the loop over the messages (other
    loops iterate what is the same for every prefix, or the current message's own parts)."""
    tracker = _current()
    if tracker is not None and loop._iterable is tracker.messages:
        tracker.safe = False


class TrackedLoop(LoopContext):
    """Jinja's loop, noting where each iteration over the tracked conversation's messages starts."""

    def __next__(self) -> tuple[Any, LoopContext]:
        tracker = _current()
        if tracker is None or self._iterable is not tracker.messages:
            return super().__next__()
        try:
            item = super().__next__()
        except StopIteration:
            tracker.end = tracker.position
            raise
        tracker.starts.append(tracker.position)
        return item

    def __repr__(self) -> str:  # what ``{{ loop }}`` writes: Jinja's own loop's text, whatever renders it
        return f"<LoopContext {self.index}/{self.length}>"


def tracked_getattr(sandboxed: Any) -> Any:
    """``sandboxed`` (an environment's getattr), noting reads that look ahead (``loop.last``) on the tracker."""

    def getattr_(obj: Any, attribute: str) -> Any:
        if isinstance(obj, LoopContext):
            if attribute in _PAST_ONLY and type(obj) is TrackedLoop:
                return getattr(obj, attribute)  # a number or a bool, which the sandbox returns as it is
            _looks_ahead(obj)
        return sandboxed(obj, attribute)

    return getattr_


def tracked_getitem(sandboxed: Any) -> Any:
    """``sandboxed`` (an environment's getitem), noting ``messages[...]`` inside the loop and ``loop[...]``."""

    def getitem(obj: Any, argument: Any) -> Any:
        tracker = _current()
        if tracker is not None and obj is tracker.messages and tracker.starts:
            tracker.safe = False
        if isinstance(obj, LoopContext) and not (isinstance(argument, str) and argument in _PAST_ONLY):
            _looks_ahead(obj)
        return sandboxed(obj, argument)

    return getitem
