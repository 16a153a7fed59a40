"""Shape expressions read from files, parsed without ever evaluating text.

torch.export stores symbolic sizes as text (``Eq(Mod(s0, 4), 0)``) and its
deserializer rebuilds them with ``sympy.sympify``, which runs the text as
Python: ``__import__('os').system(...)`` in a crafted archive would run on
load. Every such string therefore passes :func:`parse` first: Python's own
``ast`` parser, then a walk that admits only numbers, symbol names of the
expected form, arithmetic, comparisons and a fixed table of sympy and
``torch.utils._sympy`` functions, and builds the sympy object itself.
Nothing is looked up by a name the file chose outside that table, no
attribute is read, no call has keywords, and length, depth and exponents are
bounded (``2**2**2**99`` would otherwise hang the loader).

:func:`evaluate` computes such an expression for concrete sizes without
sympy's evaluation machinery, for the coverage checks run on each call.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Mapping
from typing import Any

import sympy
import torch.utils._sympy.functions as _fns
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.symbol import prefix_str

__all__ = ["UnsafeExpression", "evaluate", "parse"]

TORCH_SYMBOL = re.compile("(?:" + "|".join(map(re.escape, prefix_str.values())) + r")\d+")
"""Names torch gives symbols (``s0``, ``u3``, ``zf1``)."""

_MAX_LENGTH = 4096
_MAX_DEPTH = 64
_MAX_EXPONENT = 64

_FUNCTIONS: dict[str, Any] = {
    name: obj
    for name, obj in vars(_fns).items()
    if isinstance(obj, type) and issubclass(obj, sympy.Basic) and not name.startswith("_")
}
_FUNCTIONS.update(
    Eq=sympy.Eq, Ne=sympy.Ne, Lt=sympy.Lt, Le=sympy.Le, Gt=sympy.Gt, Ge=sympy.Ge,
    And=sympy.And, Or=sympy.Or, Not=sympy.Not, Abs=sympy.Abs,
    floor=sympy.floor, ceiling=sympy.ceiling,
    # the spelled-out (srepr) forms torch.export writes since 2.12
    Add=sympy.Add, Mul=sympy.Mul, Pow=sympy.Pow, Equality=sympy.Eq, Unequality=sympy.Ne,
    StrictLessThan=sympy.Lt, LessThan=sympy.Le, StrictGreaterThan=sympy.Gt, GreaterThan=sympy.Ge,
)  # fmt: skip
_CONSTANTS = {
    "oo": sympy.oo, "int_oo": int_oo, "zoo": sympy.zoo, "nan": sympy.nan,
    "True": sympy.true, "False": sympy.false, "true": sympy.true, "false": sympy.false,
}  # fmt: skip
_ASSUMPTIONS = frozenset(
    ("integer", "positive", "negative", "nonnegative", "nonpositive", "real", "finite", "zero",
     "nonzero", "rational", "even", "odd", "prime", "extended_real", "commutative")
)  # fmt: skip
_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: _fns.FloorDiv, ast.Mod: _fns.Mod,
    ast.Pow: operator.pow, ast.BitAnd: sympy.And, ast.BitOr: sympy.Or,
}  # fmt: skip
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: sympy.Not}
_NUMBERS = {int: sympy.Integer, float: sympy.Float, bool: sympy.S}
_COMPARE = {
    ast.Eq: sympy.Eq, ast.NotEq: sympy.Ne, ast.Lt: sympy.Lt,
    ast.LtE: sympy.Le, ast.Gt: sympy.Gt, ast.GtE: sympy.Ge,
}  # fmt: skip


class UnsafeExpression(ValueError):
    """A text is not a plain shape expression; it is refused, never evaluated."""


def parse(text: str, symbols: re.Pattern[str] = TORCH_SYMBOL) -> Any:
    """The sympy expression ``text`` writes, built without ``eval``.

    Args:
        text: e.g. ``"Eq(Mod(10*s0, 4), 0)"``.
        symbols: the form symbol names must have (torch's ``s0``, ``u1`` by default).

    Raises:
        UnsafeExpression: anything outside the grammar above.

    Example:
        >>> parse("Max(2, s0) + 1")
        Max(2, s0) + 1
        >>> parse("__import__('os')")
        Traceback (most recent call last):
        ...
        torchdefer.descriptors._expr.UnsafeExpression: '__import__' is not an allowed function
    """
    if not isinstance(text, str) or len(text) > _MAX_LENGTH:
        raise UnsafeExpression(f"not an expression of at most {_MAX_LENGTH} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise UnsafeExpression(f"not a Python expression: {e.msg}") from None
    return _build(tree.body, symbols, 0)


def _build(node: ast.AST, symbols: re.Pattern[str], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise UnsafeExpression(f"nested deeper than {_MAX_DEPTH}")

    def sub(child: ast.AST) -> Any:
        return _build(child, symbols, depth + 1)

    if isinstance(node, ast.Constant) and type(node.value) in _NUMBERS:
        return _NUMBERS[type(node.value)](node.value)
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        if symbols.fullmatch(node.id):
            return sympy.Symbol(node.id, integer=True)
        raise UnsafeExpression(f"{node.id!r} is not a symbol name")
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = sub(node.left), sub(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](sub(node.operand))
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
        return _COMPARE[type(node.ops[0])](sub(node.left), sub(node.comparators[0]))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        name, args = node.func.id, node.args
        if name in _NUMBERS_BY_NAME:
            return _number(name, args, node.keywords)
        if name == "Symbol":
            return _symbol(args, node.keywords, symbols)
        if name not in _FUNCTIONS:
            raise UnsafeExpression(f"{name!r} is not an allowed function")
        if node.keywords or any(isinstance(a, ast.Starred) for a in args):
            raise UnsafeExpression(f"{name}() takes plain positional arguments only")
        built = [sub(a) for a in args]
        return _power(*built) if name == "Pow" and len(built) == 2 else _FUNCTIONS[name](*built)
    raise UnsafeExpression(f"{type(node).__name__} is not allowed in a shape expression")


def _power(base: Any, exponent: Any) -> Any:
    """``base ** exponent``, refusing numbers sympy would spend forever computing."""
    if exponent.is_Number and abs(exponent) > _MAX_EXPONENT:
        raise UnsafeExpression(f"numeric exponents are at most {_MAX_EXPONENT}")
    if base.is_Number and exponent.is_Number and abs(base) > 2**64:
        raise UnsafeExpression("powers of numbers above 2**64 are not allowed")
    return sympy.Pow(base, exponent)


_NUMBERS_BY_NAME = {"Integer": (int,), "Rational": (int, int), "Float": (str,)}
_FLOAT = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _literal(node: ast.AST) -> Any:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _literal(node.operand)
        return -value if type(value) in (int, float) else None
    return node.value if isinstance(node, ast.Constant) else None


def _number(name: str, args: list[ast.expr], keywords: list[ast.keyword]) -> Any:
    """``Integer(3)``, ``Rational(1, 2)``, ``Float('1.5', precision=53)``."""
    values = [_literal(a) for a in args]
    kinds = _NUMBERS_BY_NAME[name]
    ok = len(values) == len(kinds) and all(type(v) is k for v, k in zip(values, kinds))
    if name == "Float":
        ok = ok and bool(_FLOAT.fullmatch(values[0])) and all(
            k.arg == "precision" and type(_literal(k.value)) is int for k in keywords)  # fmt: skip
        return sympy.Float(values[0], precision=53) if ok else _refuse(name)
    return (sympy.Integer if name == "Integer" else sympy.Rational)(*values) if ok and not keywords else _refuse(name)


def _symbol(args: list[ast.expr], keywords: list[ast.keyword], symbols: re.Pattern[str]) -> Any:
    """``Symbol('s0', positive=True, integer=True)``: a symbol name and assumptions."""
    name = _literal(args[0]) if len(args) == 1 else None
    if not isinstance(name, str) or not symbols.fullmatch(name):
        raise UnsafeExpression(f"Symbol({name!r}) is not a symbol name")
    assumptions = {k.arg: _literal(k.value) for k in keywords}
    if not all(k in _ASSUMPTIONS and type(v) is bool for k, v in assumptions.items()):
        raise UnsafeExpression(f"Symbol({name!r}) has assumptions other than true/false facts")
    return sympy.Symbol(name, **assumptions)


def _refuse(name: str) -> Any:
    raise UnsafeExpression(f"{name}(...) takes literal numbers only")


class _Unknown(Exception):
    pass


def _floordiv(a: int, b: int) -> int:
    return a // b


_EVAL = {
    "Add": lambda *a: sum(a), "Mul": lambda *a: math.prod(a), "Pow": operator.pow,
    "Equality": operator.eq, "Unequality": operator.ne, "StrictLessThan": operator.lt,
    "LessThan": operator.le, "StrictGreaterThan": operator.gt, "GreaterThan": operator.ge,
    "And": lambda *a: all(a), "Or": lambda *a: any(a), "Not": operator.not_,
    "Max": max, "Min": min, "FloorDiv": _floordiv, "CleanDiv": _floordiv,
    "Mod": operator.mod, "PythonMod": operator.mod, "Abs": abs,
    "CeilDiv": lambda a, b: -(-a // b),
}  # fmt: skip


def evaluate(expr: Any, values: Mapping[str, int]) -> Any:
    """``expr`` computed for ``values`` (symbol name -> int), or ``None`` if it
    uses a function this evaluator does not know (callers then assume the
    worst)."""
    try:
        return _evaluate(expr, values)
    except (_Unknown, KeyError, ZeroDivisionError):
        return None


def _evaluate(expr: Any, values: Mapping[str, int]) -> Any:
    if expr.is_Symbol:
        return values[expr.name]
    if expr.is_Integer:
        return int(expr)
    if expr is sympy.true or expr is sympy.false:
        return bool(expr)
    fn = _EVAL.get(type(expr).__name__)
    if fn is None:
        raise _Unknown(type(expr).__name__)
    return fn(*[_evaluate(a, values) for a in expr.args])
