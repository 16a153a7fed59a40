"""Python's own message for a call that does not fit a signature.

``inspect.Signature.bind`` says only "too many positional arguments"; the
interpreter says ``f() takes 1 positional argument but 2 were given``. A
program answers a call as the model would, so it words a refusal as CPython
does (``Python/ceval.c``), checking in the same order: keywords (unexpected,
positional-only, given twice), then the positional count, then missing
positional, then missing keyword-only arguments. ``method``: the callable is
a bound method (a module's ``forward``), whose ``self`` Python counts.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

__all__ = ["call_error"]


def call_error(qualname: str, signature: inspect.Signature, args: tuple[Any, ...],
               kwargs: Mapping[str, Any], method: bool = False) -> str | None:
    """What Python says of ``qualname(*args, **kwargs)`` against ``signature``
    (no ``*args``/``**kwargs`` in it), or ``None`` if the call fits.

    Example:
        >>> def f(x): ...
        >>> call_error("f", inspect.signature(f), (1, 2), {})
        'f() takes 1 positional argument but 2 were given'
    """
    params = list(signature.parameters.values())
    positional = [p for p in params if p.kind is not p.KEYWORD_ONLY]
    return (_keyword_error(qualname, params, positional[:len(args)], kwargs)
            or _count_error(qualname, params, positional, len(args), kwargs, method)
            or _missing(qualname, positional[len(args):], kwargs, "positional")
            or _missing(qualname, [p for p in params if p.kind is p.KEYWORD_ONLY], kwargs,
                        "keyword-only"))


def _keyword_error(qualname: str, params: list[inspect.Parameter],
                   taken: list[inspect.Parameter], kwargs: Mapping[str, Any]) -> str | None:
    by_name = {p.name: p for p in params}
    for name in kwargs:
        p = by_name.get(name)
        if p is None or p.kind is p.POSITIONAL_ONLY:
            only = [k for k in kwargs
                    if k in by_name and by_name[k].kind is inspect.Parameter.POSITIONAL_ONLY]
            if only:
                return (f"{qualname}() got some positional-only arguments passed as keyword "
                        f"arguments: '{', '.join(only)}'")
            return f"{qualname}() got an unexpected keyword argument '{name}'"
        if p in taken:
            return f"{qualname}() got multiple values for argument '{name}'"
    return None


def _count_error(qualname: str, params: list[inspect.Parameter],
                 positional: list[inspect.Parameter], given: int, kwargs: Mapping[str, Any],
                 method: bool) -> str | None:
    if given <= len(positional):
        return None
    total, given = len(positional) + method, given + method
    defaults = sum(p.default is not p.empty for p in positional)
    takes = f"from {total - defaults} to {total}" if defaults else str(total)
    plural = "s" if defaults or total != 1 else ""
    keyword_only = sum(p.kind is p.KEYWORD_ONLY and p.name in kwargs for p in params)
    extra = (f" positional argument{'s' if given != 1 else ''} (and {keyword_only} keyword-only "
             f"argument{'s' if keyword_only != 1 else ''})") if keyword_only else ""
    verb = "was" if given == 1 and not keyword_only else "were"
    return f"{qualname}() takes {takes} positional argument{plural} but {given}{extra} {verb} given"


def _missing(qualname: str, params: list[inspect.Parameter], kwargs: Mapping[str, Any],
             kind: str) -> str | None:
    names = [f"'{p.name}'" for p in params if p.default is p.empty and p.name not in kwargs]
    if not names:
        return None
    listed = (names[0] if len(names) == 1 else f"{names[0]} and {names[1]}" if len(names) == 2
              else f"{', '.join(names[:-1])}, and {names[-1]}")
    s = "s" if len(names) != 1 else ""
    return f"{qualname}() missing {len(names)} required {kind} argument{s}: {listed}"
