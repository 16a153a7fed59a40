"""Shape expressions and pytree specs read from files, without ever running their text.

torch.export stores symbolic sizes as text (``Eq(Mod(s0, 4), 0)``, or the
spelled-out ``Mul(Integer(3), Symbol('s0', integer=True))``) and rebuilds them
with ``sympy.sympify``, which runs the text as Python: a crafted archive's
``__import__('os').system(...)`` would run on load. Every such string passes
:func:`parse` first: Python's ``ast`` parser, then a walk that admits only
numbers, symbol names of the expected form, arithmetic, comparisons and a
fixed table of sympy and ``torch.utils._sympy`` functions, building the
sympy object itself. No name the file chose is looked up outside that table,
no attribute is read, and length, depth and powers are bounded
(``2**2**2**99`` would otherwise hang the loader).

Pytree specs (a program's output structure, a descriptor's containers,
export's ``in_spec``/``out_spec``) are read by ``pytree.treespec_loads``,
which only builds types registered in this process, but two of torch's own
readers import what the text names: a ``collections.defaultdict`` context
names its ``default_factory`` (module and attribute), and a dict key written
as an enum names the enum's module. :func:`checked_treespec` decodes the
JSON, refuses both on the decoded structure (a JSON escape such as
``"\\u005f_enum__"`` spells ``__enum__`` too) and hands torch the text written
back from what it checked.
"""

from __future__ import annotations

import ast
import collections
import json
import operator
import re
from typing import Any

import sympy
import torch.utils._pytree as pytree

from torchdefer._compat.export import int_oo, prefix_str
from torchdefer._compat.export import sympy_functions as _fns
from torchdefer.errors import UnsafeExpression, UsageError

__all__ = ["TORCH_SYMBOL", "UnsafeExpression", "checked_treespec", "parse", "treespec"]

TORCH_SYMBOL = re.compile("(?:" + "|".join(map(re.escape, prefix_str.values())) + r")\d+")
"""Names torch gives symbols (``s0``, ``u3``, ``zf1``)."""

_MAX_LENGTH, _MAX_DEPTH, _MAX_EXPONENT = 4096, 64, 64
_S = sympy
_FUNCTIONS: dict[str, Any] = {n: f for n, f in vars(_fns).items() if not n.startswith("_")
                              and isinstance(f, type) and issubclass(f, _S.Basic)}
_FUNCTIONS.update({n: getattr(_S, n) for n in (  # fixed names: nothing the file chose
    "Eq Ne Lt Le Gt Ge And Or Not Abs floor ceiling Add Mul Pow Equality Unequality "
    "StrictLessThan LessThan StrictGreaterThan GreaterThan").split()})
_CONSTANTS = {"oo": _S.oo, "int_oo": int_oo, "zoo": _S.zoo, "nan": _S.nan, "True": _S.true,
              "False": _S.false, "true": _S.true, "false": _S.false}
_ASSUMPTIONS = frozenset(("integer", "positive", "negative", "nonnegative", "nonpositive", "real",
                          "finite", "zero", "nonzero", "rational", "even", "odd", "extended_real"))
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: _fns.FloorDiv, ast.Mod: _fns.Mod,
           ast.BitAnd: _S.And, ast.BitOr: _S.Or}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: _S.Not}
_COMPARE = {ast.Eq: _S.Eq, ast.NotEq: _S.Ne, ast.Lt: _S.Lt, ast.LtE: _S.Le, ast.Gt: _S.Gt,
            ast.GtE: _S.Ge}
_LITERALS = {"Integer": ((int,), _S.Integer), "Rational": ((int, int), _S.Rational),
             "Float": ((str,), lambda text: _S.Float(text, precision=53))}
_FLOAT = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


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
        torchdefer.errors.UnsafeExpression: '__import__' is not an allowed function
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

    if isinstance(node, ast.Constant) and type(node.value) in (int, float, bool):
        return _S.sympify(node.value)  # a Python number, not text: nothing is parsed
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        if symbols.fullmatch(node.id):
            return _S.Symbol(node.id, integer=True)
        raise UnsafeExpression(f"{node.id!r} is not a symbol name")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _power(sub(node.left), sub(node.right))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](sub(node.left), sub(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](sub(node.operand))
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
        return _COMPARE[type(node.ops[0])](sub(node.left), sub(node.comparators[0]))
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        raise UnsafeExpression(f"{type(node).__name__} is not allowed in a shape expression")
    name, args, keywords = node.func.id, node.args, node.keywords
    literals = [_literal(a) for a in args]
    if name in _LITERALS:  # Integer(3), Rational(1, 2), Float('1.5', precision=53)
        kinds, make = _LITERALS[name]
        ok = [type(v) for v in literals] == list(kinds) and all(
            k.arg == "precision" and type(_literal(k.value)) is int for k in keywords)
        if not ok or (name == "Float" and not _FLOAT.fullmatch(literals[0])):
            raise UnsafeExpression(f"{name}(...) takes literal numbers only")
        return make(*literals)
    if name == "Symbol":  # Symbol('s0', positive=True, integer=True)
        facts = {k.arg: _literal(k.value) for k in keywords}
        if len(args) != 1 or not isinstance(literals[0], str) or not symbols.fullmatch(
                literals[0]) or any(k not in _ASSUMPTIONS or type(v) is not bool
                                    for k, v in facts.items()):
            raise UnsafeExpression(f"Symbol{tuple(literals)} is not a symbol with plain facts")
        return _S.Symbol(literals[0], **facts)  # type: ignore[arg-type]  # keys checked above
    if name not in _FUNCTIONS:
        raise UnsafeExpression(f"{name!r} is not an allowed function")
    if keywords or any(isinstance(a, ast.Starred) for a in args):
        raise UnsafeExpression(f"{name}() takes plain positional arguments only")
    built = [sub(a) for a in args]
    return _power(*built) if name == "Pow" and len(built) == 2 else _FUNCTIONS[name](*built)


def _power(base: Any, exponent: Any) -> Any:
    """``base ** exponent``, refusing numbers sympy would spend forever computing."""
    if exponent.is_Number and abs(exponent) > _MAX_EXPONENT:
        raise UnsafeExpression(f"numeric exponents are at most {_MAX_EXPONENT}")
    if base.is_Number and exponent.is_Number and abs(base) > 2**64:
        raise UnsafeExpression("powers of numbers above 2**64 are not allowed")
    return _S.Pow(base, exponent)


def _literal(node: ast.AST) -> Any:
    """A literal's Python value (``-1`` included), else ``None``."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _literal(node.operand)
        return -value if type(value) in (int, float) else None
    return node.value if isinstance(node, ast.Constant) else None


def treespec(text: str) -> pytree.TreeSpec:
    """The pytree spec ``text`` writes, read only if no reader would import anything.

    Raises:
        UnsafeExpression: a node whose context reader would import a module
            (``defaultdict``, an enum-valued key, a type with its own reader).
        ValueError: not a pytree spec, or a container type not registered here.

    Example:
        >>> treespec('[1, {"type": "builtins.tuple", "context": "null", "children_spec": []}]')
        TreeSpec(tuple, None, [])
    """
    return pytree.treespec_loads(checked_treespec(text))


def checked_treespec(text: str) -> str:
    """``text`` decoded, checked node by node and written again: what torch reads next.

    Every check is on the decoded JSON (``"\\u005f_enum__"`` is ``"__enum__"``
    here, as it is to torch's reader), and torch is handed the text written
    back from what was checked, never the file's own spelling of it.
    """
    try:
        protocol, root = json.loads(text)
    except (TypeError, ValueError) as e:
        raise UsageError(f"not a pytree spec ({e})") from None
    if protocol != 1:
        raise UsageError(f"pytree spec protocol {protocol!r}; torchdefer reads protocol 1")
    return json.dumps([protocol, _checked_node(root)])


def _checked_node(node: Any) -> dict[str, Any]:
    """A copy of one spec node with its children, each context decoded and re-encoded."""
    if not isinstance(node, dict) or node.keys() != {"type", "context", "children_spec"} or (
            not isinstance(node["children_spec"], list)):
        raise UsageError(f"not a pytree spec node: {str(node)[:80]}")
    children = [_checked_node(child) for child in node["children_spec"]]
    kind, context = node["type"], node["context"]
    if kind is None and context is None and not children:
        return {"type": None, "context": None, "children_spec": []}
    typ = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE.get(kind) if isinstance(kind, str) else None
    if typ is None:
        raise UsageError(f"pytree type {str(kind)[:80]!r} is not registered in this process; "
                         "register it with torch.utils._pytree before loading")
    reader = pytree.SUPPORTED_SERIALIZED_TYPES[typ].from_dumpable_context
    if reader is None:  # torch decodes the context as JSON, enum keys importing their module
        if not isinstance(context, str):
            raise UsageError(f"the context of a {kind} node is not JSON text")
        context = json.dumps(json.loads(context, object_hook=_refuse_enum))
    elif reader is not _NAMEDTUPLE_READER or not isinstance(context, str):
        raise UnsafeExpression(f"a pytree spec naming something to import ({kind} has its own "
                               "context reader, which may import what the file names)")
    return {"type": kind, "context": context, "children_spec": children}


# A namedtuple's context is its registered name, looked up among registered types.
_NAMEDTUPLE_READER = pytree.SUPPORTED_SERIALIZED_TYPES[
    collections.namedtuple].from_dumpable_context  # type: ignore[index]


def _refuse_enum(obj: dict[str, Any]) -> dict[str, Any]:
    if "__enum__" in obj:
        raise UnsafeExpression(f"a pytree spec naming something to import (an enum key naming "
                               f"{str(obj.get('fqn'))[:80]!r})")
    return obj
