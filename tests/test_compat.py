"""The version shims in torchdefer._compat, checked against what torch itself does."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest
import torch
from torch import nn

import torchdefer
from torchdefer import _compat


class SetsDefaultDevice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.set_default_device("cpu")
        self.linear = nn.Linear(3, 3)


def test_default_device_set_by_a_constructor_is_undone_and_torch_still_answers():
    # torch <= 2.8 crashed here: set_default_device(None) left a None that
    # get_default_device() read `.device` from.
    torchdefer.deferred_init(SetsDefaultDevice)
    assert _compat.default_device_context() is None
    assert torch.get_default_device() == torch.device("cpu")
    torch.manual_seed(0)
    eager = nn.Linear(3, 3)
    torch.manual_seed(0)
    assert torch.equal(nn.Linear(3, 3).weight, eager.weight)


def test_default_device_set_before_deferred_init_is_put_back():
    torch.set_default_device("meta")
    try:
        before = _compat.default_device_context()
        torchdefer.deferred_init(SetsDefaultDevice)
        assert _compat.default_device_context().device == before.device
        assert torch.get_default_device() == torch.device("meta")
    finally:
        _compat.restore_default_device(None)
    assert torch.get_default_device() == torch.device("cpu")


@pytest.mark.parametrize(
    "t",
    [
        torch.randn(7),
        torch.randn(4, 5).half(),
        torch.randn(6).double(),
        torch.randint(-(2**31), 2**31 - 1, (9,), dtype=torch.int32),
        torch.randint(-(2**15), 2**15 - 1, (8,), dtype=torch.int16),
        torch.randint(-(2**62), 2**62, (5,), dtype=torch.int64),
        torch.tensor([True, False, True]),
        torch.tensor([3.5]),
    ],
    ids=lambda t: f"{t.dtype}x{t.numel()}",
)
def test_hash_tensor_fallback_has_the_bits_of_torch_hash_tensor(t):
    # torch.hash_tensor where this torch has it (2.10+); everywhere, the xor of
    # the elements' 64-bit patterns folded one by one in Python.
    wide = torch.float64 if t.is_floating_point() else torch.int64
    words = t.reshape(-1).to(wide).view(torch.int64).tolist()
    folded = 0
    for w in words:
        folded ^= w
    assert _compat._xor_fold(t).item() == folded
    if hasattr(torch, "hash_tensor"):
        assert torch.equal(_compat._xor_fold(t), torch.hash_tensor(t).view(torch.int64))


# ---- the boundary: private torch APIs only in torchdefer._compat ---------------

PACKAGE = Path(torchdefer.__file__).parent
ALLOWED_PRIVATE_MODULES = ("torch.utils._pytree",)  # documented for registering containers
ALLOWED_PRIVATE_NAMES = {("torch.utils._python_dispatch", "TorchDispatchMode")}  # documented


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _private_module_attribute(dotted: str) -> str | None:
    """The first ``module._name`` in ``dotted`` (a chain rooted at ``torch``), or None."""
    obj = torch
    parts = dotted.split(".")
    for i, name in enumerate(parts[1:], start=1):
        if name.startswith("_") and not name.startswith("__") and isinstance(obj, types.ModuleType):
            return ".".join(parts[: i + 1])
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return None


def _private_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            if node.module.startswith(ALLOWED_PRIVATE_MODULES):
                continue
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                if (node.module, alias.name) in ALLOWED_PRIVATE_NAMES:
                    continue
                if any(p.startswith("_") and not p.startswith("__") for p in name.split(".")):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch" and not alias.name.startswith(ALLOWED_PRIVATE_MODULES) \
                        and any(p.startswith("_") for p in alias.name.split(".")):
                    found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.Attribute):  # inner links of a chain give the same prefix
            dotted = _dotted(node)
            if dotted and dotted.startswith("torch.") and not dotted.startswith("torch.ops."):
                private = _private_module_attribute(dotted)
                if private and not private.startswith(ALLOWED_PRIVATE_MODULES):
                    found.append(f"line {node.lineno}: {private}")
    return sorted(set(found))


def test_private_torch_apis_are_used_only_in_the_compat_package():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "_compat" in path.relative_to(PACKAGE).parts:
            continue
        uses = _private_uses(path)
        if uses:
            offenders[str(path.relative_to(PACKAGE))] = uses
    assert not offenders, (
        "private torch APIs outside torchdefer._compat (add a binding there and use it): "
        f"{offenders}"
    )


def test_the_boundary_check_sees_each_form_of_private_use(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import torch\n"
        "import torch._dynamo\n"
        "from torch._subclasses.fake_tensor import FakeTensor\n"
        "from torch import _meta_registrations\n"
        "from torch.utils._python_dispatch import _disable_current_modes\n"
        "from torch.utils._python_dispatch import TorchDispatchMode\n"
        "from torch.utils._pytree import tree_map\n"
        "x = torch._C._storage_id\n"
        "y = torch.ops.aten._to_copy.default\n"
        "z = torch.Tensor._make_subclass\n"
    )
    assert _private_uses(sample) == [
        "line 2: import torch._dynamo",
        "line 3: from torch._subclasses.fake_tensor import FakeTensor",
        "line 4: from torch import _meta_registrations",
        "line 5: from torch.utils._python_dispatch import _disable_current_modes",
        "line 8: torch._C",
    ]
