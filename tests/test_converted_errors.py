"""A sample of each package's errors that were bare built-ins: raised where they
were, with the built-in type they had, and now also ``TorchdeferError``\\ s."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch import nn

import torchdefer
from torchdefer import errors


def _raises(kind: type[BaseException], builtin: type[BaseException], match: str):
    """``pytest.raises`` for an error that must be ``kind``, ``builtin`` and ours."""
    assert issubclass(kind, builtin) and issubclass(kind, errors.TorchdeferError)
    return pytest.raises(kind, match=match)


# --- fake -------------------------------------------------------------------


def test_meta_like_of_a_real_tensor_is_a_usage_error_and_a_value_error():
    from torchdefer.fake import meta_like

    with _raises(errors.UsageError, ValueError, "meta_like expects a fake tensor"):
        meta_like(torch.zeros(2))


def test_fake_tensor_of_a_real_tensor_is_a_usage_type_error():
    from torchdefer.fake import FakeTensor

    with _raises(errors.UsageTypeError, TypeError, "needs a meta tensor as elem, got one on cpu"):
        FakeTensor(torch.zeros(2), torch.device("cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the host has the device")
def test_a_missing_device_without_fake_cuda_is_a_fake_tensor_error():
    with torchdefer.fake_mode(fake_cuda=False):
        with _raises(errors.FakeTensorError, RuntimeError, "fake_cuda=True"):
            torch.empty(2, device="cuda")


# --- materialize ------------------------------------------------------------


@pytest.mark.parametrize("kwargs, match", [
    ({"device": True}, "the second argument is the device"),
    ({"dtype": torch.int64}, "not a floating point or complex dtype"),
    ({"dtype": "float16"}, "must be a torch.dtype"),
    ({"progress": 3}, "progress= must be None"),
])
def test_materialize_module_argument_errors_are_usage_type_errors(kwargs, match):
    m = torchdefer.deferred_init(nn.Linear, 2, 2)
    with _raises(errors.UsageTypeError, TypeError, match):
        torchdefer.materialize_module(m, **kwargs)


def test_a_random_op_without_a_default_generator_is_a_device_unavailable_error(monkeypatch):
    import torchdefer.materialize._rng_replay as replay_rng

    def dropped() -> torch.Tensor:  # native_dropout takes no generator=
        return torch.ops.aten.native_dropout.default(torch.ones(8), 0.5, True)[0]

    t = torchdefer.deferred_init(dropped)
    monkeypatch.setattr(replay_rng, "default_generator", lambda device: None)
    with _raises(errors.DeviceUnavailableError, RuntimeError,
                 r"native_dropout.*recorded at .*draws from the default generator of cpu"):
        torchdefer.materialize_tensor(t)


# --- recorder ---------------------------------------------------------------


def test_reading_a_value_without_materialize_installed_is_a_state_error():
    from torchdefer._hooks import VALUE_READER

    with VALUE_READER.replaced(None), \
            _raises(errors.StateError, RuntimeError, "needs torchdefer.materialize"):
        VALUE_READER.get()(torch.zeros(1))


def test_graph_of_without_a_deferred_tensor_is_an_internal_error():
    from torchdefer.recorder._tensor import graph_of

    with _raises(errors.InternalError, RuntimeError, "please report it"):
        graph_of((torch.zeros(1),), {})


# --- rng --------------------------------------------------------------------


def test_rng_argument_errors_are_usage_errors():
    from torchdefer.rng import _gf2 as gf2
    from torchdefer.rng import mt19937, philox

    with _raises(errors.UsageError, ValueError, "cannot move a generator back"):
        mt19937.advance(torch.default_generator.get_state(), -1)
    with _raises(errors.UsageError, ValueError, "must be >= 0"):
        gf2.x_power_mod(-1)
    with _raises(errors.UsageError, ValueError, "empty grid"):
        philox.counter_increment(10, 4, philox.DeviceShape(0, 2048))


def test_a_missing_schema_argument_is_a_lookup_key_error_naming_the_arguments():
    from torchdefer.rng.draws import schema_value

    with _raises(errors.LookupKeyError, KeyError, r"no argument named 'nope'.*'mean'"):
        schema_value(torch.ops.aten.normal_.default, (), {}, "nope")


def test_placing_without_a_call_runner_is_a_state_error():
    from torchdefer._hooks import CALL_RUNNER
    from torchdefer.rng import _states as states

    with CALL_RUNNER.replaced(None), \
            _raises(errors.StateError, RuntimeError, "needs torchdefer.materialize"):
        states._run_call(None, torch.default_generator.get_state(), "cpu")


def test_a_generator_the_ledger_cannot_position_is_an_unsupported_error():
    from torchdefer.rng._ledger import RngLedger

    error = RngLedger.unknown_generator(None, torch.device("mps"))  # type: ignore[arg-type]
    assert isinstance(error, errors.UnsupportedError) and isinstance(error, RuntimeError)


# --- checkpoint -------------------------------------------------------------


def test_a_dcp_plan_of_a_partial_tensor_is_an_unsupported_error():
    pytest.importorskip("torch.distributed.checkpoint")
    from torchdefer.checkpoint._dcp_writer import _check_whole

    chunk = types.SimpleNamespace(sizes=(2,))
    item = types.SimpleNamespace(tensor_data=types.SimpleNamespace(chunk=chunk),
                                 index=types.SimpleNamespace(fqn="w"))
    with _raises(errors.UnsupportedError, RuntimeError, "format='safetensors'"):
        _check_whole(item, torch.zeros(3))


def test_loading_safetensors_without_the_package_is_a_missing_dependency_error(monkeypatch):
    from torchdefer.checkpoint._safetensors_files import _safe_open

    monkeypatch.setitem(sys.modules, "safetensors", None)
    with _raises(errors.MissingDependencyError, ImportError, "pip install"):
        _safe_open()


# --- _compat ----------------------------------------------------------------


def test_a_method_table_redirect_of_a_python_method_is_an_unsupported_error():
    from torchdefer._compat import method_table

    class Plain:
        def get_state(self) -> None: ...

    with _raises(errors.UnsupportedError, RuntimeError, "layout|not a C method"):
        method_table.Redirect(Plain, "get_state", method_table.SLOT_DUNDERS[0])


def test_a_torch_without_the_dcp_writer_pieces_is_a_missing_dependency_error(monkeypatch):
    pytest.importorskip("torch.distributed.checkpoint")
    from torch.distributed.checkpoint import filesystem

    from torchdefer._compat import serialization as compat
    from torchdefer.checkpoint._dcp_writer import check_available

    monkeypatch.delattr(filesystem, "_write_item")
    with _raises(errors.MissingDependencyError, ImportError, "_write_item"):
        compat.check_dcp_writer()
    with _raises(errors.CheckpointWriteError, ValueError, "format='safetensors'"):
        check_available()


# --- distributed ------------------------------------------------------------


def test_materialize_dtensor_placement_errors_are_usage_errors():
    pytest.importorskip("torch.distributed.tensor")
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.placement_types import Partial

    from torchdefer.distributed import materialize_dtensor

    t = torchdefer.deferred_init(torch.randn, 4, 4)
    with _raises(errors.UsageError, ValueError, "Partial placement"):
        materialize_dtensor(t, types.SimpleNamespace(ndim=1), [Partial()])
    with _raises(errors.UsageError, ValueError, "one placement per mesh dimension"):
        materialize_dtensor(t, types.SimpleNamespace(ndim=2), [Replicate()])


def test_fsdp1_without_its_hook_is_an_unsupported_error(monkeypatch):
    pytest.importorskip("torch.distributed.fsdp")
    from torchdefer import _compat
    from torchdefer.distributed import fsdp1_deferred_init

    monkeypatch.delattr(_compat.fsdp1_init_utils(), "_need_to_materialize_module")
    with _raises(errors.UnsupportedError, RuntimeError, "Use FSDP2"):
        with fsdp1_deferred_init():
            pass


# --- viz and descriptors ----------------------------------------------------


def test_viz_without_graphviz_is_a_missing_dependency_error(monkeypatch):
    from torchdefer.viz._dot import _graphviz

    monkeypatch.setitem(sys.modules, "graphviz", None)
    with _raises(errors.MissingDependencyError, ImportError, r"torchdefer\[viz\]"):
        _graphviz()


def test_an_unsafe_expression_is_a_usage_error():
    from torchdefer.descriptors._expr import parse

    with _raises(errors.UnsafeExpression, ValueError, "not an allowed function"):
        parse("__import__('os')")
