"""Chat templates from a model file, rendered as untrusted code: jinja2's sandbox, its work bounded.

:func:`compile_chat_template` gives a :class:`ChatEnvironment` (it holds each thread's counters) and
the template, rewritten so that its loops, outputs and concatenations are counted;
:meth:`decoding.Tokenizer.apply_chat_template` compiles it once and renders it at each call. A
template that goes past a bound raises :class:`TemplateLimit`, a ``ValueError`` naming
``tokenizer.chat_template``.

Examples
--------
>>> env, tpl = compile_chat_template("{% for m in messages %}{{ m }};{% endfor %}")
>>> tpl.render(messages=["a", "b"])
'a;b;'
>>> env, tpl = compile_chat_template("{% for i in range(300000) %}x{% endfor %}")
>>> try:
...     tpl.render()
... except TemplateLimit as e:
...     print(e)  # doctest: +ELLIPSIS
tokenizer.chat_template takes more than 200,000 steps (loop iterations, range items, ...) to render
"""

from __future__ import annotations

import functools
import re
import threading

from jinja2 import nodes, pass_context
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

__all__ = [
    "TEMPLATE_SOURCE_CHARS",
    "TEMPLATE_CHARS",
    "TEMPLATE_STEPS",
    "ChatEnvironment",
    "TemplateLimit",
    "compile_chat_template",
    "over",
]

# Bounds on rendering a chat template. The template is data from the model file: jinja2's sandbox
# keeps it away from Python's internals, not from looping or multiplying for hours, so each rendering
# counts its work (loop iterations, range items, calls and filters) and refuses a value, or text
# written, larger than a prompt could need (the messages' own text is allowed four times over).
TEMPLATE_STEPS = 200_000  # a second or two at most; the SmolLM2 template takes one per message
TEMPLATE_CHARS = 1 << 20  # characters (or items) of any value, beyond 4x the messages' text
#: Longest template source compiled (characters). Real chat templates are a few KB (SmolLM2's is 368
#: characters); 700 KB of template had taken 9 s and 1.2 GB to compile, at every chat prompt.
TEMPLATE_SOURCE_CHARS = 1 << 16


class TemplateLimit(ValueError):
    """A chat template went past a bound of its environment (raised as is, never re-worded)."""


def over(what: str, n: int, limit: int) -> TemplateLimit:
    """The error of a template that ``what`` ``n`` (characters, items, ...), over ``limit``.

    Examples
    --------
    >>> print(over("builds a str of length", 5_000_000, 1_048_576))  # doctest: +ELLIPSIS
    tokenizer.chat_template builds a str of length 5,000,000, over the 1,048,576 a chat prompt's ...
    """
    shown = f"{n:,}" if n < 10**18 else f"about 2**{n.bit_length() - 1}"  # str() of a huge int fails
    return TemplateLimit(
        f"tokenizer.chat_template {what} {shown}, over the {limit:,} a chat prompt's rendering allows"
    )


def _number_over(text: str, limit: int) -> int | None:
    """The first number spelt in ``text`` above ``limit`` (a format width such as ``%999999999s``)."""
    for d in re.findall(r"\d+", text):
        if len(d) > 18 or int(d) > limit:
            return int(d) if len(d) <= 4000 else limit + 1
    return None


# a replacement field inside a str.format spec ("{0:>{1}}"), whose width then comes from an argument
_NESTED_FIELD = re.compile(r"\{[^{}]*:[^{}]*\{")


def _amplified_size(name: str, value, args: tuple, kwargs: dict, method: bool) -> int:
    """Characters a ``replace``, ``join``, ``indent``, ``expandtabs``, ``translate`` (filter or
    ``str`` method), ``tojson`` with an indent or ``wordwrap`` would produce (at least), computed
    before it runs: they multiply one string by another's length, by a line count or by a depth, so
    checking their result afterwards would come after the allocation (``expandtabs(1000000)`` of
    300 tabs had built 300 MB first); for a ``sum`` filter of lists, the
    items it would copy (:func:`_sum_size`). ``value`` is the filtered value, or the string whose
    method (``method``) is called. 0 for anything else."""
    try:
        if name == "replace":
            old, new = (list(args) + [kwargs.get("old"), kwargs.get("new")])[:2]
            if isinstance(value, str) and isinstance(old, str) and isinstance(new, str):
                return len(value) + value.count(old) * max(len(new) - len(old), 0)
        elif name == "join":
            if method:  # separator.join(items)
                items, sep = (list(args) + [None])[0], value
            else:  # items|join(separator)
                items, sep = value, (list(args) + [kwargs.get("d", "")])[0]
            if isinstance(items, (list, tuple)) and isinstance(sep, str):
                text = sum(len(x) for x in items if isinstance(x, str))
                return text + len(sep) * max(len(items) - 1, 0)
        elif name == "indent" and isinstance(value, str):
            width = (list(args) + [kwargs.get("width", 4)])[0]
            w = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
            return len(value) + (value.count("\n") + 1) * w
        elif name == "expandtabs" and isinstance(value, str):  # each tab up to tabsize spaces
            size = (list(args) + [kwargs.get("tabsize", 8)])[0]
            return len(value) + value.count("\t") * max(size, 0) if isinstance(size, int) else 0
        elif name == "translate" and isinstance(value, str) and args:  # each character to a string
            table = args[0]
            if isinstance(table, (dict, str, list, tuple)):  # not a generator: it would be used up
                texts = table.values() if isinstance(table, dict) else table
                return len(value) * max([len(x) for x in texts if isinstance(x, str)] + [1])
        elif name == "sum" and not method:
            return _sum_size(value, args, kwargs)
        elif name == "tojson" and not method:
            indent = (list(args) + [kwargs.get("indent")])[0]
            w = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
            return _json_size(value, max(w, 0)) if w else 0
        elif name == "wordwrap" and not method and isinstance(value, str):
            wrap = args[2] if len(args) > 2 else kwargs.get("wrapstring")  # after width, break_long_words
            # at most one line per character of the text, each but the first after a wrapstring
            return len(value) * (1 + len(wrap)) if isinstance(wrap, str) else 0
    except TypeError:
        pass
    return 0


def _json_size(value, indent: int) -> int:
    """At least the extra characters ``tojson(indent=indent)`` writes for ``value``: each item of a
    list or dict, at depth ``d``, on a line of its own after ``indent * d`` spaces. A nested value
    multiplies the indent by its depth (``[[[...1...]]]|tojson(indent=1000000)`` at depth 12 had
    built 144 MB before its size was checked); walked without recursion, and no further than
    :data:`TEMPLATE_CHARS` items."""
    total, stack, seen = 0, [(value, 1)], 0
    while stack and seen < TEMPLATE_CHARS:
        v, depth = stack.pop()
        items = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else ()
        for item in items:
            seen += 1
            total += 1 + indent * depth
            stack.append((item, depth + 1))
    return total


def _sum_size(items, args: tuple, kwargs: dict) -> int:
    """Items a ``sum`` filter of lists would copy: each addition copies the sum so far, so ``40``
    lists of a million items took 5 s and 40M items, and a million one-item lists would take hours
    at a final length of a million. 0 for a sum of numbers or with ``attribute``."""
    attribute, start = (list(args) + [kwargs.get("attribute"), kwargs.get("start", 0)])[:2]
    if attribute is not None or not isinstance(start, (list, tuple)) or not isinstance(items, (list, tuple)):
        return 0
    copied = length = len(start)
    for x in items:
        length += len(x) if isinstance(x, (list, tuple)) else 0
        copied += length
    return copied


def _internal(node, name):
    """``node`` through the environment's filter ``name`` (one of the counting filters)."""
    return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)


class _Bounded(NodeTransformer):
    """Routes loops, outputs and concatenations through the environment's counting filters
    (filters that take the context: jinja2 never evaluates those at compile time)."""

    def visit_For(self, node):
        node = self.generic_visit(node)
        node.iter = _internal(node.iter, "_chat_counted")
        return node

    def visit_Output(self, node):
        node = self.generic_visit(node)
        node.nodes = [_internal(n, "_chat_emit") for n in node.nodes]
        return node

    def visit_Concat(self, node):
        return _internal(self.generic_visit(node), "_chat_sized")


class ChatEnvironment(ImmutableSandboxedEnvironment):
    """jinja2's :class:`~jinja2.sandbox.ImmutableSandboxedEnvironment` (the template can neither reach
    Python's internals nor change the messages) that bounds one rendering's work: the template is
    rewritten (:class:`_Bounded`) so that every ``for`` loop counts its iterations, every output
    counts its characters and every ``~`` concatenation is checked for size; ``range`` items, calls
    and filters count too, up to :data:`TEMPLATE_STEPS` in all. Products (``*``, ``**``, ``+``,
    ``%``), ``replace``, ``join``, ``indent``, ``expandtabs``, ``translate``, ``tojson``,
    ``wordwrap`` and a ``sum`` of lists are sized before they run, integer arguments of calls and
    filters above ``max_chars`` (and numbers in the string arguments of a ``format`` whose widths
    are fields) are refused, and every
    value a call or filter returns is sized after. The counters belong to the calling thread and
    :meth:`start` resets them before each rendering, so one instance (a tokenizer's) may render in
    several threads at once.
    """

    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self, max_chars: int = TEMPLATE_CHARS):
        super().__init__(trim_blocks=True, lstrip_blocks=True)
        self._counters = _Counters(int(max_chars))  # each thread its own (a tokenizer compiles once)
        self.globals["range"] = self._range  # its items count as steps
        self.globals.pop("lipsum", None)  # lipsum(n) writes n paragraphs: of no use to a prompt
        self.filters = {name: self._bounded_filter(name, f) for name, f in self.filters.items()}
        env = self

        @pass_context
        def counted(context, items):
            return _Counted(env, items)

        @pass_context
        def emit(context, value):
            text = value if isinstance(value, str) else str(value)
            env.emitted += len(text)
            if env.emitted > 4 * env.max_chars:
                raise over("writes characters:", env.emitted, 4 * env.max_chars)
            return text

        @pass_context
        def sized(context, value):
            return env.sized(value)

        self.filters.update(_chat_counted=counted, _chat_emit=emit, _chat_sized=sized)

    def start(self, max_chars: int | None = None) -> None:
        """Reset this thread's counters before a rendering; ``max_chars``: its size bound (default
        the environment's)."""
        c = self._counters
        c.steps, c.emitted = TEMPLATE_STEPS, 0
        c.max_chars = c.default if max_chars is None else int(max_chars)

    # the counters, read and written as attributes, are the calling thread's
    steps = property(lambda self: self._counters.steps, lambda self, n: setattr(self._counters, "steps", n))
    emitted = property(
        lambda self: self._counters.emitted, lambda self, n: setattr(self._counters, "emitted", n)
    )
    max_chars = property(lambda self: self._counters.max_chars)

    def charge(self, n: int) -> None:
        self.steps -= n
        if self.steps < 0:
            raise TemplateLimit(
                f"tokenizer.chat_template takes more than {TEMPLATE_STEPS:,} steps (loop iterations, "
                "range items, calls and filters) to render"
            )

    def sized(self, value):
        if isinstance(value, (str, list, tuple, dict)) and len(value) > self.max_chars:
            raise over(f"builds a {type(value).__name__} of length", len(value), self.max_chars)
        return value

    def check_args(self, args, kwargs) -> None:
        for a in (*args, *kwargs.values()):
            if isinstance(a, int) and abs(a) > self.max_chars:
                raise over("passes the integer", abs(a), self.max_chars)

    def check_format(self, fmt, args=(), kwargs=None) -> None:
        if not isinstance(fmt, str):
            return
        texts = [fmt]
        if _NESTED_FIELD.search(fmt):  # '{0:>{1}}'.format('a', '300000000'): the width is an argument
            texts += [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, str)]
        for text in texts:
            n = _number_over(text, self.max_chars)
            if n is not None:
                raise over("formats with a width or precision of", n, self.max_chars)

    def check_amplified(self, name, value, args, kwargs, method=False) -> None:
        n = _amplified_size(name, value, args, kwargs, method)
        if n > self.max_chars:
            what = f"would build by {name} a string of length"
            raise over("would copy by sum list items:" if name == "sum" else what, n, self.max_chars)

    def _range(self, *args):
        r = range(*args)
        try:
            n = len(r)
        except OverflowError:  # more items than an index can count
            n = self.steps + 1
        self.charge(n)
        return r

    def _bounded_filter(self, name, f):
        lead = 1 if hasattr(f, "jinja_pass_arg") else 0  # the context or environment jinja2 passes

        @functools.wraps(f)  # keeps jinja_pass_arg
        def bounded(*args, **kwargs):
            self.charge(1)
            value, rest = (args[lead], args[lead + 1 :]) if len(args) > lead else (None, ())
            self.check_args(rest, kwargs)
            if name == "format":
                self.check_format(value)
            self.check_amplified(name, value, rest, kwargs)
            return self.sized(f(*args, **kwargs))

        return bounded

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (the sandbox's own names)
        __self.charge(1)
        __self.check_args(args, kwargs)
        fn = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
        owner, name = getattr(fn, "__self__", None), getattr(fn, "__name__", "")
        if isinstance(owner, str):
            if name in ("format", "format_map"):
                __self.check_format(owner, args, kwargs)
            __self.check_amplified(name, owner, args, kwargs, method=True)
        return __self.sized(super().call(__context, __obj, *args, **kwargs))

    def call_binop(self, context, operator, left, right):
        seqs = (str, list, tuple)
        if operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
            bits = abs(left).bit_length() * right if abs(left) > 1 else 0
            if bits > 8 * self.max_chars:
                raise over("raises an integer to a power of bits about", bits, 8 * self.max_chars)
        elif operator == "*":
            if isinstance(left, int) and isinstance(right, int):  # 2**4000000, squared three times
                bits = abs(left).bit_length() + abs(right).bit_length()
                if bits > 8 * self.max_chars:
                    raise over("multiplies integers to bits about", bits, 8 * self.max_chars)
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, seqs) and isinstance(n, int) and len(seq) * n > self.max_chars:
                    raise over(f"repeats a {type(seq).__name__} to length", len(seq) * n, self.max_chars)
        elif operator == "+" and isinstance(left, seqs) and isinstance(right, seqs):
            if len(left) + len(right) > self.max_chars:
                raise over("joins sequences to length", len(left) + len(right), self.max_chars)
        elif operator == "%" and isinstance(left, str):
            self.check_format(left)
            self.check_args(right if isinstance(right, tuple) else (right,), {})
        return self.sized(super().call_binop(context, operator, left, right))

    def compile_chat_template(self, source: str):
        """The template of ``source``, its loops, outputs and concatenations counted."""
        tree = _Bounded().visit(self.parse(source))
        tree.set_environment(self)
        return self.from_string(tree)


class _Counters(threading.local):
    """One thread's counters of a :class:`ChatEnvironment`: steps left, characters written, the
    size bound. A thread starts with fresh ones (``threading.local`` runs ``__init__`` per thread)."""

    def __init__(self, max_chars: int):
        self.default = self.max_chars = max_chars
        self.steps, self.emitted = TEMPLATE_STEPS, 0


class _Counted:
    """A ``for`` loop's items, each charged as one step of the template's environment."""

    __slots__ = ("_env", "_items")

    def __init__(self, env, items):
        self._env, self._items = env, items

    def __len__(self):  # loop.length and loop.last, as jinja2 computes them
        return len(self._items)

    def __iter__(self):
        for x in self._items:
            self._env.charge(1)
            yield x


def compile_chat_template(source: str, max_chars: int = TEMPLATE_CHARS):
    """``(environment, template)`` of a chat template; ``ValueError`` naming the GGUF key when it is
    longer than :data:`TEMPLATE_SOURCE_CHARS` or not valid jinja2 (a syntax error, an unknown filter
    or test). Both can be kept and rendered again, from any thread: :meth:`ChatEnvironment.start`
    resets the calling thread's counters before each rendering.

    Examples
    --------
    >>> compile_chat_template("{{ x }}" * 10_000)
    Traceback (most recent call last):
    ...
    decoding._chat_template.TemplateLimit: tokenizer.chat_template has 70,000 characters, over the 65,536 ...
    """
    if len(source) > TEMPLATE_SOURCE_CHARS:
        raise TemplateLimit(
            f"tokenizer.chat_template has {len(source):,} characters, over the {TEMPLATE_SOURCE_CHARS:,} "
            "a chat template may have (real ones have a few thousand): not compiled"
        )
    env = ChatEnvironment(max_chars)
    try:
        return env, env.compile_chat_template(source)
    except TemplateLimit:
        raise
    except Exception as e:  # jinja2's TemplateSyntaxError, or RecursionError for absurd nesting
        where = f"line {e.lineno}: " if getattr(e, "lineno", None) else ""
        msg = getattr(e, "message", None) or str(e)
        raise ValueError(
            f"tokenizer.chat_template is not a valid jinja2 template ({where}{type(e).__name__}: {msg})"
        ) from e
