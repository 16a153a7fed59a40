"""The public API's types as a user's type checker sees them.

Checked by mypy in ``make test`` (``[tool.mypy] files``), never run: each
function is a scenario, ``assert_type`` states what a call gives, and a line
marked ``# type: ignore[code]`` must be refused (``warn_unused_ignores`` makes
mypy report the marker if the call were accepted). The names resolved lazily
at run time (``torchdefer.script``, ``torchdefer.explain``, ...) are checked
here through the top level, as users reach them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

import torchdefer
import torchdefer.distributed
from torchdefer.checkpoint import LoadResult
from torchdefer.descriptors import Descriptor, MetaTensorType, Program

if TYPE_CHECKING:
    from typing_extensions import assert_type


def deferred_init_gives_what_fn_returns() -> None:
    linear = torchdefer.deferred_init(torch.nn.Linear, 4, 2, bias=False)
    assert_type(linear, torch.nn.Linear)
    assert_type(torchdefer.deferred_init(torch.randn, 3), torch.Tensor)
    assert_type(torchdefer.materialize_module(linear), torch.nn.Linear)
    assert_type(torchdefer.materialize_tensor(linear.weight), torch.Tensor)


def deferred_init_checks_fn_arguments() -> None:
    torchdefer.deferred_init(torch.nn.Linear, "four", 2)  # type: ignore[arg-type]
    torchdefer.deferred_init(torch.nn.Linear, 4, 2, bias_=False)  # type: ignore[call-arg]


def composite_keeps_the_function_type() -> None:
    @torchdefer.composite
    def clipped_normal_(t: torch.Tensor, limit: float = 2.0) -> torch.Tensor:
        return t

    @torchdefer.composite(writes=(0, 1), random=False)
    def swap_(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a

    x = torch.empty(3)
    assert_type(clipped_normal_(x), torch.Tensor)
    assert_type(swap_(x, x), torch.Tensor)
    clipped_normal_(x, "2")  # type: ignore[arg-type]


def checkpoints() -> None:
    model = torch.nn.Linear(2, 2)
    assert_type(torchdefer.load_state_dict(model, "model.safetensors"), LoadResult)
    assert_type(torchdefer.load_state_dict(model, {"weight": torch.ones(2, 2)}), LoadResult)
    assert_type(torchdefer.save_state_dict(model, "out"), Path)
    assert_type(torchdefer.distributed.load_state_dict(model, Path("ckpt")), LoadResult)
    torchdefer.load_state_dict(model, 3)  # type: ignore[arg-type]


def lazily_resolved_names() -> None:
    def f(x: torch.Tensor, flag: bool) -> torch.Tensor:
        return x

    described = torchdefer.describe(f, (torch.zeros(2, 4), True), {"x": torch.ones(3, 4)})
    assert_type(described, dict[str, Descriptor])
    x = MetaTensorType(["b", 4], torch.float32, dim_ranges={"b": (1, 64)})
    program = torchdefer.script(f, {"x": x, "flag": True})
    assert_type(program, Program)
    assert_type(torchdefer.save_program(program, "f.pt2"), None)
    assert_type(torchdefer.load_program("f.pt2"), Program)
    assert_type(torchdefer.explain(torch.empty(2)), str)
    MetaTensorType(["b"], dim_ranges=[("b", 1, None)])
    MetaTensorType(["b"], rank="1")  # type: ignore[arg-type]
