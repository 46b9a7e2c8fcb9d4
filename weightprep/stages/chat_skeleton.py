"""A conversation's whole render as its shape's skeleton with its strings put in, where the template only writes them.

Most conversations of a dataset share a few shapes: the same roles in the same order, the same keys. Where the
template does nothing with a message's strings but write them (``'<|im_start|>' + message.role + '\\n' +
message.content + '<|im_end|>'``), the render of a conversation is the render of its shape with each string put
where the template wrote it, and the prefix cuts (``chat_prefixes``) are where they were, moved by the strings'
lengths. ``Skeletons.fill`` makes that render once per shape and fills it for every conversation of the shape:
~4 us against a Jinja render's ~20 us for a 5-message conversation.

The shape (``shape_keys``) is everything of the messages but their non-empty strings: how many messages, each one's
keys in order, its ``role``, which strings are empty, and every other value (numbers, booleans, None) by type and
text. A message holding a list or a dict (content parts, tool calls) has no shape: it is rendered. So are
conversations with tools or ``chat_template_kwargs``.

The skeleton is proven per shape, while it is rendered, not assumed: each non-empty string other than a role is a
``Sym`` (a placeholder ``str``, its slot: where its string comes from), and the render runs in an overlay of the
template's own environment where

- writing a ``Sym`` (``{{ x }}``, ``{% set %}`` blocks, macros' output), joining it (``+``, ``~``) to strings, and
  reading it from a message, a namespace or a variable keep it whole: the skeleton notes where it went;
- its truth is its string's (non-empty: true); the tests ``string``, ``defined``, ``none`` and the like, the
  filters ``string`` and ``default``, and ``==`` with a number or None answer it as they answer any string;
- stripping one string (``| trim``, ``.strip()``, ``.lstrip()``, ``.rstrip()``, with or without the characters to
  strip) makes a slot of the string stripped: whitespace only is part of the shape (it strips to nothing), and a
  string stripped of other characters guards the skeleton by its not being empty;
- testing one string against literal strings (``in``, ``startswith``, ``endswith``, ``==``, ``!=``: ``"</think>"
  in content``) is answered as its placeholder answers, and the answer guards the skeleton: a conversation whose
  string answers otherwise takes the other branch, so it is rendered. A read of the clock (``strftime_now``, the
  date in Llama 3's system prompt) guards it likewise: the skeleton serves while the clock reads the same;
- anything else done with it (any other ``str`` method or operator: ``len``, ``split``, ``tojson``, ``| length``,
  slicing, hashing, ``%``; a filter, test or call given it; a Jinja ``in`` with it on the left, which Python
  answers without asking it: the template's tree is rewritten so that a probe sees that operand first) marks the
  render as one that looked at a string, and the shape is rendered, conversation by conversation, as before. So do
  ``lipsum`` (chance), a filter, test or call given a value it cannot see into (a generator: ``messages |
  map(attribute='content') | join``), a render that raises, and a render whose text holds a placeholder's mark
  outside the places the skeleton noted (a way out of the probes that was missed would show there).

What such a render writes depends on the strings only through the places they are written and the guards' answers,
so every conversation of the shape whose strings answer the guards alike renders to the skeleton with its strings
(stripped where the slot says) in those places. ``tests/test_chat_skeleton.py`` compares the filled renders with the
template's own renders for every template of the tests and of TRL (100 of the 143 without ``{% generation %}`` fill
theirs), over conversations whose strings hold spaces at their ends, markers, newlines, template text and nothing,
and shows each way of looking at a string seen.
"""

from __future__ import annotations

import builtins
import functools
import threading
from collections.abc import Callable
from itertools import accumulate
from typing import Any, NamedTuple

from jinja2 import nodes
from jinja2.runtime import Macro, Undefined
from jinja2.utils import Namespace

from weightprep.stages import chat_prefixes

__all__ = [
    "Skeleton", "Skeletons", "Sym", "compile_skeleton", "compiled_fill", "plain_shape", "scan_messages", "shape_keys",
]

#: a placeholder's mark: a private-use character no template writes
MARK = "\U0010fffd"
#: the tests that answer a ``Sym`` as they answer its string (a type, not its characters)
_SAFE_TESTS = frozenset({
    "string", "defined", "undefined", "none", "mapping", "number", "integer", "float", "boolean", "true", "false",
    "callable",
})  # fmt: skip
#: the filters that may be given a value holding ``Sym``s (not one itself): they read what they are given through
#: the environment (``getattr``, the tests and filters, all probed) or count or pick its items, never their text
_SAFE_FILTERS = frozenset({
    "length", "count", "first", "last", "list", "reverse", "batch", "slice", "select", "reject", "selectattr",
    "rejectattr", "map", "default", "d",
})  # fmt: skip
#: the global of transformers' environment that reads the clock (its answer guards the skeleton), and Jinja's that
#: draws by chance (noted)
_CLOCK, _CHANCE = "strftime_now", "lipsum"
#: the most shapes a renderer keeps (a skeleton is a few hundred bytes); past it new shapes are rendered
MAX_SHAPES = 4096
#: shapes tried before a renderer asks that its skeletons serve two renders each on average (else new shapes are
#: rendered: each costs one render more to make)
_TRIAL = 256
_PROBE = "__weightprep_probe__"
_LOCAL = threading.local()
_PLAIN = (int, float, bool, type(None))


def _looked() -> None:
    """The render in progress looked at a string: its skeleton is not kept."""
    render = getattr(_LOCAL, "render", None)
    if render is not None:
        render.looked = True


class Sym(str):
    """A placeholder ``str``: a message's string, or strings and placeholders joined (``parts``: literal strings and
    slots, the indices of the conversation's strings as the skeleton fills them in). Anything but writing, joining
    and stripping it is noted (``_looked``)."""

    parts: tuple[str | int, ...]

    @staticmethod
    def make(text: str, parts: tuple[str | int, ...]) -> Sym:
        sym = Sym(text)
        sym.parts = parts
        return sym

    def _stripped(self, how: str, chars: str | None = None) -> Any:
        """The placeholder of this string stripped (``how``: ``strip``, ``lstrip`` or ``rstrip``; ``chars``: of
        those characters, else of whitespace, as the ``trim`` filter strips); None for joined strings. Stripped of
        whitespace, a string that is not whitespace only (the shape says which) is never empty; stripped of other
        characters it may be: the skeleton is then guarded by its not being empty (it stands for a true value)."""
        render = getattr(_LOCAL, "render", None)
        if render is None or len(self.parts) != 1 or type(self.parts[0]) is not int:
            return None
        slot = self.parts[0]
        i, k, ops = render.slots[slot]
        whitespace = chars is None and not ops  # a message's string stripped of whitespace: the shape says how
        if whitespace and render.blank[slot]:
            return ""  # whitespace only: stripped, nothing
        stripped = render.slot(i, k, (*ops, (how, chars)))
        if not whitespace:  # it may strip to nothing: the skeleton serves the strings it does not
            render.guards.append((stripped.parts[0], "__bool__", None, True))
        return stripped

    def __bool__(self) -> bool:
        return True  # a placeholder stands for a non-empty string (empty ones are part of the shape)

    def __add__(self, other: Any) -> Any:
        if type(other) is Sym:
            return Sym.make(str.__add__(self, other), self.parts + other.parts)
        if type(other) is str:
            return Sym.make(str.__add__(self, other), (*self.parts, other))
        _looked()
        return str.__add__(self, other)

    def __radd__(self, other: Any) -> Any:
        if type(other) is str:
            return Sym.make(str.__add__(other, self), (other, *self.parts))
        _looked()
        return NotImplemented


def _noted(name: str) -> Any:
    base = getattr(str, name)

    @functools.wraps(base)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        _looked()
        return base(self, *args, **kwargs)

    return method


#: the tests of a string against a literal that a placeholder answers as a guard of its skeleton (``_guarded``)
GUARDS = ("__contains__", "startswith", "endswith", "__eq__", "__ne__")


def _guarded(name: str) -> Any:
    """``str.<name>`` for a placeholder of one string tested against literal strings (``"</think>" in content``,
    ``content.startswith("<tool_call>")``): answered as the placeholder answers it, and noted as a guard of the
    skeleton (the skeleton then serves the conversations whose string answers it alike); anything else noted as a
    look (``_noted``)."""
    base = getattr(str, name)

    @functools.wraps(base)
    def method(self: Any, *args: Any) -> Any:
        result = base(self, *args)
        if name in ("__eq__", "__ne__") and len(args) == 1 and (type(args[0]) in _PLAIN or isinstance(args[0], Undefined)):
            return result  # a string is never equal to a number, None or undefined: nothing of it was read
        render = getattr(_LOCAL, "render", None)
        literal = len(args) == 1 and (
            type(args[0]) is str or (type(args[0]) is tuple and all(type(a) is str for a in args[0]))
        )  # fmt: skip
        if render is not None and literal and len(self.parts) == 1 and type(self.parts[0]) is int and type(result) is bool:
            render.guards.append((self.parts[0], name, args[0], result))
        else:
            _looked()
        return result

    return method


for _name in dir(str):  # every other method and operator of str notes that it was used
    if _name not in {
        "__new__", "__init__", "__getattribute__", "__setattr__", "__delattr__", "__class__", "__init_subclass__",
        "__subclasshook__", "__doc__", "__add__", "__radd__", "__getnewargs__", "__reduce__", "__reduce_ex__",
        "__sizeof__", "__dir__",
    } and callable(getattr(str, _name)):  # fmt: skip
        # (``__rmod__`` too: Python asks a subclass's first for ``"%s" % x``)
        setattr(Sym, _name, _guarded(_name) if _name in GUARDS else _noted(_name))


def _clean(value: Any) -> bool:
    """Whether ``value`` holds no ``Sym`` and nothing that could hide one (a generator, an object)."""
    if type(value) in (str, *_PLAIN) or isinstance(value, Undefined):
        return True
    if type(value) in (list, tuple):
        return all(_clean(v) for v in value)
    if type(value) is dict:
        return all(_clean(k) and _clean(v) for k, v in value.items())
    if isinstance(value, Namespace):
        return _clean(dict(value._Namespace__attrs))  # type: ignore[attr-defined]
    return False


def _str(value: Any = "") -> Any:
    """The template's ``str`` (what ``{{ x }}`` and a block's output call): a ``Sym`` kept whole."""
    return value if type(value) is Sym else builtins.str(value)


def _joined(items: Any) -> Any:
    """``"".join(items)``, a ``Sym`` where any is one."""
    items = list(items)
    if not any(type(x) is Sym for x in items):
        return "".join(items)
    parts: list[str | int] = []
    for x in items:
        if type(x) is Sym:
            parts.extend(x.parts)
        else:
            parts.append(x)
    return Sym.make("".join(items), tuple(parts))


def _str_join(seq: Any) -> Any:
    """Jinja's ``str_join`` (``~``): each item as ``str`` makes it, a ``Sym`` kept whole."""
    return _joined([_str(x) for x in seq])


def _checked(function: Any, safe: bool, nested: bool) -> Any:
    """``function`` (a filter, test or call), noting a use of a ``Sym`` unless ``safe``: with ``nested`` (the
    filters that read their values through the environment), only a ``Sym`` given as it is."""

    @functools.wraps(function)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if not safe:
            values = [*args, *kwargs.values()]
            if any(type(v) is Sym for v in values) if nested else not all(_clean(v) for v in values):
                _looked()
        return function(*args, **kwargs)

    return checked


#: the ``str`` methods that a placeholder answers when called without arguments (``_Strip``)
_STRIPS = frozenset({"strip", "lstrip", "rstrip"})


class _Strip:
    """``x.strip``, ``x.lstrip`` or ``x.rstrip`` of a placeholder: called without arguments or with the characters
    to strip, the placeholder of its string stripped (``Sym._stripped``); otherwise noted, and the string's own
    method called."""

    def __init__(self, sym: Sym, how: str) -> None:
        self.sym, self.how = sym, how

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        chars = args[0] if args else None
        plain = not kwargs and len(args) <= 1 and (chars is None or type(chars) is str)
        stripped = self.sym._stripped(self.how, chars) if plain else None
        if stripped is None:
            _looked()
            return getattr(str, self.how)(self.sym, *args, **kwargs)
        return stripped


def _trim(checked: Any) -> Any:
    """Jinja's ``trim`` filter (``checked``: with its probe): a placeholder, without characters, stripped as
    ``str.strip()`` strips it (``Sym._stripped``)."""

    @functools.wraps(checked)
    def trim(value: Any, chars: Any = None) -> Any:
        if type(value) is Sym and (chars is None or type(chars) is str):
            stripped = value._stripped("strip", chars)
            if stripped is not None:
                return stripped
        return checked(value, chars)

    return trim


def _passed(checked: Any) -> Any:
    """A filter that returns a defined, true string as it is (``string``, ``default``): a placeholder passed
    through, anything else to ``checked``."""

    @functools.wraps(checked)
    def passed(value: Any, *args: Any, **kwargs: Any) -> Any:
        return value if type(value) is Sym and all(map(_clean, (*args, *kwargs.values()))) else checked(value, *args, **kwargs)

    return passed


def _probe(value: Any) -> Any:
    """The left operand of a Jinja ``in``, seen before Python reads it."""
    if type(value) is Sym:
        _looked()
    return value


def _rewrite_in(tree: Any) -> Any:
    """``a in b`` and ``a not in b`` with ``a`` passed through ``_probe`` first (Python reads a string's characters
    for ``"ab" in "abc"`` without asking it)."""
    for compare in list(tree.find_all(nodes.Compare)):
        for i, operand in enumerate(compare.ops):
            if operand.op in ("in", "notin"):
                target = compare.ops[i - 1] if i else compare
                expr = target.expr
                target.expr = nodes.Filter(expr, _PROBE, [], [], None, None).set_lineno(expr.lineno)
    return tree


def compile_skeleton(env: Any, template: str, lookups: Any) -> Any:
    """``template`` compiled for skeleton renders in an overlay of ``env`` (the module docstring), its loops tracked
    as ``chat_prefixes.compile_tracked`` tracks them; None for a template that escapes (``{% autoescape %}``).
    ``lookups(overlay)``: the renders' own ``getattr`` and ``getitem`` for an overlay, probed first here."""
    tree = env.parse(template)
    if env.autoescape is not False or any(True for _ in tree.find_all((nodes.EvalContextModifier,))):
        return None  # escaping copies a string's text where no probe sees it (``Markup``): every render is made
    overlay = env.overlay()
    getattr_, getitem = lookups(overlay)
    globals_ = env.globals
    clock, chance = globals_.get(_CLOCK), globals_.get(_CHANCE)
    allowed = tuple(globals_[name] for name in ("namespace", "dict") if name in globals_)
    sandboxed_call = type(overlay).call

    def lookup(function: Any) -> Any:
        def probed(obj: Any, argument: Any) -> Any:
            if type(obj) is Sym and argument in _STRIPS:
                return _Strip(obj, argument)
            if type(obj) is Sym and argument in GUARDS:  # its own method: the call is its guard (``_guarded``)
                return function(obj, argument)
            if type(obj) is Sym or type(argument) is Sym:
                _looked()
            return function(obj, argument)

        return probed

    def call(context: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
        # (what Jinja passes in a loop or block for the context's own use: the call never sees it)
        given = {k: v for k, v in kwargs.items() if k not in ("_loop_vars", "_block_vars")}
        if type(obj) is _Strip:
            return obj(*args, **given)
        if obj is clock and clock is not None and not given and all(type(a) is str for a in args):
            result = sandboxed_call(overlay, context, obj, *args, **kwargs)
            render = getattr(_LOCAL, "render", None)
            if render is not None:  # the date as it is now: the skeleton serves while the clock reads the same
                render.guards.append((-1, "call", (obj, args), result))
            return result
        if obj is clock or (obj is chance and chance is not None):
            _looked()
        elif isinstance(obj, Macro) or any(obj is f for f in allowed):
            pass  # template code, or a namespace or dict that stores what it is given
        elif not all(_clean(v) for v in (*args, *given.values())):
            _looked()
        return sandboxed_call(overlay, context, obj, *args, **kwargs)

    overlay.getattr = lookup(getattr_)
    overlay.getitem = lookup(getitem)
    overlay.call = call
    overlay.concat = _joined
    overlay.filters = {name: _checked(f, False, name in _SAFE_FILTERS) for name, f in env.filters.items()}
    if "trim" in env.filters:
        overlay.filters["trim"] = _trim(overlay.filters["trim"])
    for name in ("string", "default", "d"):  # a string as it is (``soft_str``; a defined, true value's default)
        if name in env.filters:
            overlay.filters[name] = _passed(overlay.filters[name])
    overlay.filters[_PROBE] = _probe
    overlay.tests = {name: _checked(f, name in _SAFE_TESTS, False) for name, f in env.tests.items()}
    compiled, _ = chat_prefixes.compile_tracked(overlay, template, transform=_rewrite_in)
    scope = compiled.root_render_func.__globals__
    scope["str"], scope["str_join"] = _str, _str_join
    return compiled


class Skeleton(NamedTuple):
    """A shape's render: ``segments`` (literal text, or a slot: the index of a conversation's string in ``slots``),
    the segment each prefix cut falls before (``cut_at``; None: the render has no cuts, ``chat_prefixes``), and
    where each slot's string comes from (``slots``: message index, key, the strips applied to it in order)."""

    segments: tuple[str | int, ...]
    cut_at: tuple[int, ...] | None
    slots: tuple[tuple[int, str, tuple[tuple[str, str | None], ...]], ...]
    #: the tests the render made of its strings (``_guarded``): (slot, ``str`` method or ``__bool__``, literal,
    #: answer), and its reads of the clock: (-1, ``call``, (function, arguments), answer)
    guards: tuple[tuple[int, str, Any, Any], ...] = ()

    def fill(self, messages: list[dict[str, Any]]) -> tuple[str, list[int] | None] | None:
        """The render of ``messages`` (of this shape) and its prefix cuts; None where a string of theirs answers a
        guard otherwise than the placeholder did (the template would take another branch: the caller renders)."""
        values = [_strip(messages[i][k], ops) if ops else messages[i][k] for i, k, ops in self.slots]
        for slot, how, literal, answer in self.guards:
            if how == "call":  # the clock (``strftime_now``): called again, it must read the same
                if literal[0](*literal[1]) != answer:
                    return None
            elif (bool(values[slot]) if how == "__bool__" else getattr(str, how)(values[slot], literal)) is not answer:
                return None
        parts = [s if type(s) is str else values[s] for s in self.segments]
        if self.cut_at is None:
            return "".join(parts), None
        ends = list(accumulate(map(len, parts), initial=0))
        return "".join(parts), [ends[c] for c in self.cut_at]


def compiled_fill(skeleton: Skeleton) -> Callable[[list[dict[str, Any]]], tuple[str, list[int]]] | None:
    """``skeleton.fill`` as a Python function of its own, made once per shape: its strings read into locals, stripped
    where their slots say, joined with the literal text by one f-string and the cuts summed from their lengths (~1.3
    us against ~4 for a 5-message conversation). None where the skeleton has guards (their answers are ``fill``'s to
    check) or no cuts. The keys, the literal text and the strips are the function's free variables, never its source:
    the source holds only indices and names made here."""
    if skeleton.guards or skeleton.cut_at is None:
        return None
    free: dict[str, Any] = {}

    def name(value: Any) -> str:
        free[f"_{len(free)}"] = value
        return f"_{len(free) - 1}"

    lines, pieces = [], []
    for n, (i, key, ops) in enumerate(skeleton.slots):
        read = f"messages[{int(i)}][{name(key)}]"
        for how, chars in ops:
            read = f"{name(getattr(str, how))}({read}, {name(chars)})"
        lines.append(f"v{n} = {read}")
    cut_before = set(skeleton.cut_at)
    length, fixed, ends = "0", 0, {}  # the length of the text so far: the last sum made, plus literal characters
    for at, segment in enumerate([*skeleton.segments, None]):
        if at in cut_before:
            lines.append(f"p{at} = {length} + {fixed}")
            length, fixed, ends[at] = f"p{at}", 0, f"p{at}"
        if segment is None:
            break
        if type(segment) is str:
            pieces.append("{" + name(segment) + "}")
            fixed += len(segment)
        else:
            pieces.append(f"{{v{int(segment)}}}")
            length = f"{length} + len(v{int(segment)})"
    cuts = ", ".join(ends[c] for c in skeleton.cut_at)
    source = "\n".join([
        f"def make({', '.join(free)}):",
        "  def fill(messages):",
        *("    " + line for line in lines),
        f"    return f'{''.join(pieces)}', [{cuts}]",
        "  return fill",
    ])  # fmt: skip
    scope: dict[str, Any] = {}
    exec(compile(source, "<weightprep skeleton>", "exec"), scope)  # noqa: S102 (the source above: no user text)
    return scope["make"](**free)  # type: ignore[no-any-return]


def plain_shape(messages: Any) -> tuple[tuple[Any, ...], list[str]] | None:
    """Where every message is ``{"role", "content"}`` of two strings, or those and a ``weight`` (the usual
    conversation): a key of its shape, and its strings (roles and contents, in the messages' order); else None. The key is one to one with
    the messages' ``scan_messages(template=True)`` keys (each message's role, its content empty, whitespace only or
    other, and which of the two comes first; a weight is not the template's), made without them."""
    if type(messages) is not list:
        return None
    key: list[Any] = []
    strings: list[str] = []
    for m in messages:
        if type(m) is not dict:
            return None
        role, content = m.get("role"), m.get("content")
        if type(role) is not str or type(content) is not str:
            return None
        n = len(m)
        if n != 2 and (n != 3 or "weight" not in m):
            return None
        keys = iter(m)
        first = next(keys)
        if first == "weight":
            first = next(keys)
        key += (role, (0 if not content else 1 if content.isspace() else 2) + (3 if first == "content" else 0))
        strings += (role, content) if first == "role" else (content, role)
    return tuple(key), strings


def _strip(value: str, ops: tuple[tuple[str, str | None], ...]) -> str:
    for how, chars in ops:
        value = getattr(str, how)(value, chars)
    return value


def shape_keys(messages: list[Any]) -> list[tuple[Any, ...]] | None:
    """Each message's part of a conversation's shape: what its renders depend on besides its non-empty strings
    (module docstring); None: the conversation has no shape."""
    scanned = scan_messages(messages)
    return None if scanned is None else scanned[2]


def scan_messages(
    messages: list[Any], *, template: bool = False, reasoning: frozenset[str] = frozenset()
) -> tuple[list[dict[str, Any]], list[str], list[tuple[Any, ...]]] | None:
    """The messages as dicts, their strings in order and their shape keys (``shape_keys``), in one pass; None where
    a message is not a dict of exact JSON scalars under string keys (no shape). ``template``: the messages are a
    record's, made the template's as ``chat_common.template_messages`` makes them (keys whose value is None, and
    ``weight``, left out); then a key of ``reasoning`` is refused too (one that ``_alias_reasoning_fields`` would
    rewrite), so that what is returned is what the template reads, as transformers makes it plain."""
    out: list[dict[str, Any]] = []
    strings: list[str] = []
    keys: list[tuple[Any, ...]] = []
    for m in messages:
        if not isinstance(m, dict):
            return None
        message: dict[str, Any] = {}
        key: list[tuple[Any, ...]] = []
        for k, v in m.items():
            if template and (v is None or k == "weight"):
                continue
            if type(k) is not str or k in reasoning:
                return None
            t = type(v)
            if t is str:  # a string other than a role: empty, whitespace only (nothing once stripped), or other
                strings.append(v)
                key.append((k, v) if k == "role" else (k, 0 if not v else 1 if v.isspace() else 2))
            elif t in _PLAIN:
                key.append((k, t, repr(v)))
            else:
                return None
            message[k] = v
        out.append(message)
        keys.append(tuple(key))
    return out, strings, keys


class _Render:
    """One skeleton render in progress: whether it looked at a string, and its slots (where each placeholder's string
    comes from: message index, key, the strips applied to it; ``blank``: whitespace only)."""

    def __init__(self) -> None:
        self.looked = False
        self.slots: list[tuple[int, str, tuple[tuple[str, str | None], ...]]] = []
        self.blank: list[bool] = []
        self.guards: list[tuple[int, str, Any, Any]] = []  # what the skeleton serves only where it holds (``Skeleton``)

    def slot(self, i: int, k: str, ops: tuple[tuple[str, str | None], ...], blank: bool = False) -> Sym:
        """A new slot's placeholder."""
        n = len(self.slots)
        self.slots.append((i, k, ops))
        self.blank.append(blank)
        return Sym.make(f"{MARK}{n}{MARK}", (n,))


class Skeletons:
    """The skeletons of one template's shapes (``fill``), rendered by ``render(args, tracker)`` of the template
    compiled by ``compile_skeleton``."""

    def __init__(self, render: Any) -> None:
        self._render = render
        self._shapes: dict[tuple[Any, ...], Skeleton | None] = {}
        self._filled = 0  # renders asked of a skeleton

    def fill(
        self, messages: list[dict[str, Any]], keys: list[tuple[Any, ...]], args: dict[str, Any], *, tracked: bool
    ) -> tuple[str, list[int] | None] | None:
        """The render of ``messages`` (``keys``: their ``shape_keys``) with the other arguments ``args``, from its
        shape's skeleton; with ``tracked``, and its prefix cuts (``chat_prefixes.Tracker.cuts``, the whole render of
        a template that ``chat_prefixes`` cuts). None where the shape has no skeleton: the caller renders it."""
        key = (tracked, args["add_generation_prompt"], *keys)
        skeleton = self._shapes.get(key, False)
        if skeleton is False:
            if len(self._shapes) >= MAX_SHAPES or (len(self._shapes) >= _TRIAL and self._filled < 2 * len(self._shapes)):
                return None  # shapes that do not recur: a skeleton would cost a render more each, and serve none
            skeleton = self._shapes[key] = self._make(messages, args, tracked)
        if skeleton is None:
            return None
        self._filled += 1
        return skeleton.fill(messages)  # type: ignore[union-attr]

    def made(self, keys: list[tuple[Any, ...]], *, tracked: bool) -> Skeleton | None:
        """The skeleton ``fill`` made for the shape of ``keys`` without the generation prompt, if it made one."""
        found = self._shapes.get((tracked, False, *keys))
        return found if isinstance(found, Skeleton) else None

    def served(self) -> None:
        """Count a render filled from a skeleton elsewhere (``compiled_fill``), as ``fill`` counts its own."""
        self._filled += 1

    def _make(self, messages: list[dict[str, Any]], args: dict[str, Any], tracked: bool) -> Skeleton | None:
        """The skeleton of ``messages``' shape, or None where its render is not proven to be one."""
        render = _Render()
        placed = []
        for i, m in enumerate(messages):
            copy = {}
            for k, v in m.items():
                if type(v) is str and k != "role" and v:
                    copy[k] = render.slot(i, k, (), v.isspace())
                else:
                    copy[k] = v
            placed.append(copy)
        tracker = chat_prefixes.Tracker(placed, length=str.__len__)
        previous = getattr(_LOCAL, "render", None)
        _LOCAL.render = render
        try:
            text = self._render({**args, "messages": placed}, tracker)
            cuts = tracker.cuts(text) if tracked else None
        except Exception:
            return None
        finally:
            _LOCAL.render = previous
        if render.looked:
            return None
        segments: list[str | int] = []
        at, boundaries = 0, {0: 0}
        for chunk in tracker.chunks:
            for part in chunk.parts if type(chunk) is Sym else (chunk,):
                if type(part) is int:
                    at += len(f"{MARK}{part}{MARK}")
                    segments.append(part)
                    continue
                if not isinstance(part, str):
                    return None
                text = str.__str__(part)
                if MARK in text:
                    return None  # a placeholder's text outside its places: something read it unseen
                at += len(text)
                segments.append(text)
            boundaries[at] = len(segments)
        if cuts is not None and any(c not in boundaries for c in cuts):
            return None
        cut_at = None if cuts is None else tuple(boundaries[c] for c in cuts)
        return Skeleton(tuple(segments), cut_at, tuple(render.slots), tuple(render.guards))
