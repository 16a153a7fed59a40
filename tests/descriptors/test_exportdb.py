"""Sweep over PyTorch's own export example database (``torch._export.db.examples``).

Each example is described as a new user would: every tensor dim symbolic.
Dims the code turns out to fix (a ``DescriptorConflict`` names them) are
made static and the example is scripted again; what cannot be scripted must
be refused with an error naming the model. A program must then match eager
on the example and, for the dims that stayed symbolic, on other lengths
(0/1 included); where eager raises for those inputs, the program must too.
A graph export cannot build for some other length (it fails for
``assume_constant_result`` at zero rows) must be refused naming the model.
"""

import copy
import inspect
import random

import pytest
import torch
import torch.utils._pytree as pytree
from torch._export.db.examples import all_examples

import torchdefer
from torchdefer.descriptors import DescriptorConflict, MetaTensorType

EXAMPLES = all_examples()


def symbolic(value, prefix):
    def leaf(path, v):
        if isinstance(v, torch.Tensor):
            name = prefix + "".join(c for c in pytree.keystr(path) if c.isalnum())
            return MetaTensorType([f"{name}_{i}" for i in range(v.dim())], v.dtype)
        return v

    return pytree.tree_map_with_path(leaf, value)


def is_desc(x):
    return isinstance(x, MetaTensorType)


def fix(descriptors, arguments, dims):
    """``descriptors`` with ``dims`` (or every dim, for ``None``) made static."""

    def leaf(d, v):
        if not is_desc(d):
            return d
        shape = [v.shape[i] if dims is None or s in dims else s for i, s in enumerate(d.shape)]
        return MetaTensorType(shape, d.dtype)

    return {k: pytree.tree_map(leaf, d, arguments[k], is_leaf=is_desc) for k, d in descriptors.items()}


def script_like_a_user(case):
    """A program, or the error that refused the example (after fixing what conflicts)."""
    arguments = inspect.signature(case.model.forward).bind(*case.example_args, **case.example_kwargs).arguments
    descriptors = {k: symbolic(v, k) for k, v in arguments.items()}
    for _ in range(6):
        try:
            return torchdefer.script(case.model, descriptors), descriptors, arguments
        except DescriptorConflict as e:
            static = fix(descriptors, arguments, None)
            if descriptors == static:
                return e, descriptors, arguments
            descriptors = fix(descriptors, arguments, set(e.dims) or None)
        except TypeError as e:
            return e, descriptors, arguments
    raise AssertionError("still conflicting after making every dim static")


def example_inputs(descriptors, arguments, sizes, rng):
    def leaf(d, v):
        if not is_desc(d):
            return copy.deepcopy(v)
        shape = [sizes[s] if isinstance(s, str) else s for s in d.shape]
        if d.dtype.is_floating_point:
            return torch.randn(shape, dtype=d.dtype)
        if d.dtype is torch.bool:
            return torch.randint(0, 2, shape).bool()
        return torch.randint(0, 6, shape, dtype=d.dtype)

    return {k: pytree.tree_map(leaf, d, arguments[k], is_leaf=is_desc) for k, d in descriptors.items()}


def run(fn, case, kwargs):
    bound = inspect.signature(case.model.forward).bind(**copy.deepcopy(kwargs))
    try:
        return fn(*bound.args, **bound.kwargs), None
    except Exception as e:
        return None, e


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_export_db_example_matches_eager_on_the_example_and_other_lengths(name):
    case = EXAMPLES[name]
    program, descriptors, arguments = script_like_a_user(case)
    if isinstance(program, Exception):
        assert type(case.model).__name__ in str(program)  # a refusal that names the model
        return
    torch.manual_seed(0)
    got, error = run(program, case, arguments)
    want, _ = run(copy.deepcopy(case.model), case, arguments)
    assert error is None, error
    torch.testing.assert_close(got, want)
    names = sorted({s for d in pytree.tree_leaves(descriptors, is_leaf=is_desc) if is_desc(d)
                    for s in d.shape if isinstance(s, str)})  # fmt: skip
    rng = random.Random(name)
    trials = [dict.fromkeys(names, n) for n in (0, 1, 2, 5)] + [{s: rng.randint(1, 7) for s in names}]
    for sizes in trials if names else []:
        inputs = example_inputs(descriptors, arguments, sizes, rng)
        want, eager_error = run(copy.deepcopy(case.model), case, inputs)
        got, error = run(program, case, inputs)
        if eager_error is not None:
            assert error is not None, f"eager raised {eager_error!r} for {sizes}, the program did not"
        elif isinstance(error, DescriptorConflict):
            assert type(case.model).__name__ in str(error)
        else:
            assert error is None, f"{sizes}: {error!r}"
            torch.testing.assert_close(got, want)
