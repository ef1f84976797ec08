"""One-variable functions of the cost model, traced once and replayed as plain Python arithmetic.

The engine costs millions of decode ticks that differ only in the keys they attend (the batch is
fixed between joins and completions), one or a few at a time. A call into the cost model spends
microseconds in function calls, records and type checks per tick, while the arithmetic that
depends on the keys is a few dozen float operations. :func:`trace_scalar` runs a function of one
number once on a *symbol*, records the operations that involve it, and compiles them into a
straight-line Python function of that number.

No formula is written twice: the trace is the cost model's own code run on the symbol. The symbol
is a 0-d numpy array subclass, so the cost model takes its array branches (elementwise ufuncs,
``np.where``), each recorded as one operation; the compiled function applies the same IEEE double
operations to the same operands in the same order, so its results equal the traced function's,
bit for bit. Anything the tracer does not know (a reduction, a conversion to a Python number, a
branch on the symbol's value) stops the trace and :func:`trace_scalar` returns None (callers keep
the untraced path). It also checks the compiled function against the original on sample inputs
and returns None on any difference.

A function of plain numbers that the tracer cannot follow (a measured table's lookup: logarithms,
a search among its rows) joins a trace through :func:`scalar_call`: one recorded call, which the
compiled function makes with the same plain numbers as the untraced path, so the results stay
equal bit for bit.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from types import CodeType
from typing import Any

import numpy as np

# ufunc name -> Python expression over its operand names (NaN propagates as numpy's does).
_UFUNCS: dict[str, str] = {
    "add": "({0} + {1})",
    "subtract": "({0} - {1})",
    "multiply": "({0} * {1})",
    "true_divide": "({0} / {1})",
    "divide": "({0} / {1})",
    "negative": "(-{0})",
    "positive": "(+{0})",
    "maximum": "({0} if {0} >= {1} or {0} != {0} else {1})",
    "minimum": "({0} if {0} <= {1} or {0} != {0} else {1})",
    "greater": "({0} > {1})",
    "greater_equal": "({0} >= {1})",
    "less": "({0} < {1})",
    "less_equal": "({0} <= {1})",
    "equal": "({0} == {1})",
    "not_equal": "({0} != {1})",
    "logical_and": "(bool({0}) and bool({1}))",
    "logical_or": "(bool({0}) or bool({1}))",
}


class Untraceable(Exception):
    """The traced code did something with the symbol that has no one-to-one scalar form."""


class _Recorder:
    """The operations recorded so far: lines of Python source and the constants they read."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.constants: list[Any] = []

    def operand(self, value: Any) -> str:
        if isinstance(value, Symbol):
            if value.recorder is not self:
                raise Untraceable("a symbol of another trace")
            return value.name
        if isinstance(value, np.ndarray):
            if value.ndim:
                raise Untraceable("an array operand")
            value = value[()]
        if isinstance(value, (bool, np.bool_)):
            constant: Any = bool(value)
        elif isinstance(value, (int, np.integer)):
            constant = int(value)
        elif isinstance(value, (float, np.floating)):
            constant = float(value)
        else:
            raise Untraceable(f"an operand of type {type(value).__name__}")
        self.constants.append(constant)
        return f"c{len(self.constants) - 1}"

    def call(self, func: Callable[..., float], operands: Sequence[Any]) -> Symbol:
        self.constants.append(func)
        return self.record(f"c{len(self.constants) - 1}({', '.join('{%d}' % k for k in range(len(operands)))})",
                           operands)

    def record(self, template: str, operands: Sequence[Any]) -> Symbol:
        expression = template.format(*(self.operand(value) for value in operands))
        name = f"v{len(self.lines)}"
        self.lines.append(f"    {name} = {expression}")
        return Symbol(self, name)


class Symbol(np.ndarray):
    """A traced number: a 0-d float array whose every ufunc and ``np.where`` becomes a recorded operation."""

    recorder: _Recorder
    name: str

    def __new__(cls, recorder: _Recorder, name: str) -> Symbol:  # noqa: PYI034 - a fresh instance, not self
        symbol = np.ndarray.__new__(cls, ())
        symbol.recorder = recorder
        symbol.name = name
        return symbol

    def __array_finalize__(self, obj: Any) -> None:
        if obj is not None and not hasattr(self, "name"):
            raise Untraceable("a view or copy of a symbol")

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Symbol:
        template = _UFUNCS.get(ufunc.__name__)
        if method != "__call__" or kwargs or template is None:
            raise Untraceable(f"numpy {ufunc.__name__}.{method}")
        return self.recorder.record(template, inputs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Symbol:
        if func is np.where and len(args) == 3 and not kwargs:
            return self.recorder.record("({1} if {0} else {2})", args)
        raise Untraceable(f"numpy {getattr(func, '__name__', func)}")

    def __bool__(self) -> bool:
        raise Untraceable("a branch on a traced value")

    def __float__(self) -> float:
        raise Untraceable("a traced value converted to a number")

    def __int__(self) -> int:
        raise Untraceable("a traced value converted to a number")

    def __index__(self) -> int:
        raise Untraceable("a traced value used as an index")

    def __len__(self) -> int:
        raise Untraceable("the length of a traced value")

    def __iter__(self):
        raise Untraceable("iteration over a traced value")

    def __reduce__(self):
        raise Untraceable("a traced value pickled")


def is_traced(*values: Any) -> bool:
    """Is any of ``values`` a traced number?"""
    return any(isinstance(value, Symbol) for value in values)


def scalar_call(func: Callable[..., float], *args: Any) -> Any:
    """``func(*args)``, where ``func`` is a pure function of plain numbers returning a float; with a traced argument,
    one recorded call of ``func`` (module docstring), which the compiled function makes with plain numbers."""
    traced = next((value for value in args if isinstance(value, Symbol)), None)
    if traced is None:
        return func(*args)
    return traced.recorder.call(func, args)


def _live(lines: list[str], results: list[str]) -> list[str]:
    """The recorded lines the results depend on (a trace also records work whose result nobody reads)."""
    needed = {name for name in results if name.startswith("v")}
    kept = []
    for line in reversed(lines):
        name, expression = line.strip().split(" = ", 1)
        if name in needed:
            kept.append(line)
            needed.update(re.findall(r"\bv\d+\b", expression))
    return kept[::-1]


COMPILED_KEPT = 1024
"""Traced sources whose compiled code is kept (the most recently used)."""


@functools.lru_cache(maxsize=COMPILED_KEPT)
def _compiled(lines: tuple[str, ...], results: tuple[str, ...]) -> CodeType:
    """The code of ``def traced(x)``: the ``lines`` that ``results`` depend on, returning them.

    Kept by the recorded lines, which name their constants but do not hold them (the constants are the
    namespace the code runs in): the same cost model traced for another System (other efficiencies, other
    rates) records the same lines, and compiling them again would cost more than the trace.
    """
    source = "\n".join(["def traced(x):", *_live(list(lines), list(results)), f"    return ({', '.join(results)},)"])
    return compile(source, "<traced cost>", "exec")


def trace_scalar(func: Callable[[Any], Sequence[Any]], samples: Sequence[float]) -> Callable[[float], tuple[float, ...]] | None:
    """``func`` (one number in, a tuple of numbers out) as straight-line Python, or None if it cannot be traced.

    The compiled function returns a tuple of Python floats equal, bit for bit, to ``func``'s results
    at every one of ``samples`` (checked here; None otherwise).
    """
    recorder = _Recorder()
    try:
        with np.errstate(all="ignore"):
            outputs = tuple(func(Symbol(recorder, "x")))
        results = [recorder.operand(float(value) if not isinstance(value, np.ndarray) else value) for value in outputs]
    except (Untraceable, TypeError, ValueError):
        return None
    namespace: dict[str, Any] = {f"c{k}": value for k, value in enumerate(recorder.constants)}
    namespace["bool"] = bool
    exec(_compiled(tuple(recorder.lines), tuple(results)), namespace)  # noqa: S102 - source built from ufunc names
    compiled: Callable[[float], tuple[float, ...]] = namespace["traced"]
    for sample in samples:
        want = tuple(func(sample))
        got = compiled(float(sample))
        if len(got) != len(want) or not all(type(a) is float and (a == b or (math.isnan(a) and math.isnan(b)))
                                            for a, b in zip(got, want)):
            return None
    return compiled
