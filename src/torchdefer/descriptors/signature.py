"""``Signature``: the scripted callable's parameters, kept as data.

A program must bind calls the way Python binds them to the original
``forward`` (positional or keyword), also after :func:`load` when the model's
class is not around; so the parameter list is stored, not the function.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Parameter", "Signature"]


@dataclass(frozen=True, slots=True)
class Parameter:
    """One parameter: its name and whether it may be passed by position."""

    name: str
    positional: bool


@dataclass(frozen=True, slots=True)
class Signature:
    """The described and defaulted parameters of a scripted callable, in order.

    Args:
        qualname: the callable's name, for messages.
        parameters: parameters in declaration order (``*args``/``**kwargs`` left out).
    """

    qualname: str
    parameters: tuple[Parameter, ...]

    @classmethod
    def of(cls, fn: Callable[..., Any]) -> tuple[Signature, dict[str, Any]]:
        """The signature of ``fn`` and the defaults of its parameters."""
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError) as e:
            raise TypeError(f"cannot read the signature of {fn!r}: {e}") from e
        params, defaults = [], {}
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            params.append(Parameter(p.name, p.kind is not p.KEYWORD_ONLY))
            if p.default is not p.empty:
                defaults[p.name] = p.default
        name = getattr(fn, "__qualname__", type(fn).__name__)
        return cls(name, tuple(params)), defaults

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Map a call's arguments to parameter names, as Python would.

        Raises:
            TypeError: too many positional arguments, an unknown or repeated keyword.
        """
        positional = [p.name for p in self.parameters if p.positional]
        if len(args) > len(positional):
            raise TypeError(
                f"{self.qualname}() takes {len(positional)} positional arguments "
                f"({', '.join(positional)}) but {len(args)} were given"
            )
        bound = dict(zip(positional, args, strict=False))
        names = {p.name for p in self.parameters}
        for key, value in kwargs.items():
            if key not in names:
                raise TypeError(f"{self.qualname}() got an unexpected keyword argument {key!r}")
            if key in bound:
                raise TypeError(f"{self.qualname}() got multiple values for argument {key!r}")
            bound[key] = value
        return bound

    def to_json(self) -> dict[str, Any]:
        return {
            "qualname": self.qualname,
            "parameters": [[p.name, p.positional] for p in self.parameters],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Signature:
        return cls(
            data["qualname"], tuple(Parameter(n, bool(pos)) for n, pos in data["parameters"])
        )
