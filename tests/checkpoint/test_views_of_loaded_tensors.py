"""Deferred views of a parameter, materialized after torchdefer.load_state_dict.

Eager ``Module.load_state_dict`` copies into the parameters, so a view taken
at construction and held outside the module (``row = m.weight[0]``) shows the
loaded values; a tensor *computed* at construction (``m.weight * 2``) keeps
what construction gave. ``torchdefer.load_state_dict`` puts the loaded tensor
in place instead; the replay cache keeps its storage so that such views are
rebuilt over it.
"""

import pytest
import torch
from torch import nn

import torchdefer
from parity import assert_same_tensor


def _build():
    m = nn.Linear(3, 4)
    return m, {"row": m.weight[1], "t": m.weight.t(), "set_onto": torch.empty(0).set_(m.weight),
               "data": m.weight.data, "bias_view": m.bias[:2], "double": m.weight * 2}


def _state():
    torch.manual_seed(7)
    return nn.Linear(3, 4).state_dict()


@pytest.mark.parametrize("how", ["dict", "file", "device"])
def test_views_of_a_loaded_parameter_show_the_loaded_values_as_in_eager(how, tmp_path):
    state = _state()
    torch.manual_seed(0)
    m_eager, eager = _build()
    m_eager.load_state_dict(state)
    torch.manual_seed(0)
    m_lazy, lazy = torchdefer.deferred_init(_build)
    if how == "file":
        torch.save(state, tmp_path / "model.pt")
        torchdefer.load_state_dict(m_lazy, tmp_path / "model.pt")
    else:
        torchdefer.load_state_dict(m_lazy, state, **({"device": "cpu"} if how == "device" else {}))
    for name, want in eager.items():
        got = torchdefer.materialize_tensor(lazy[name])
        assert_same_tensor(got, want, name)
        param = m_lazy.bias if name == "bias_view" else m_lazy.weight
        shares = got.untyped_storage().data_ptr() == param.untyped_storage().data_ptr()
        assert shares == (name != "double"), name


def test_a_view_of_a_parameter_loaded_in_another_dtype_is_refused_not_replayed():
    # Eager: load_state_dict, then .to(dtype): the view keeps the old storage with
    # the loaded values. The loaded tensor torchdefer keeps is the converted one,
    # so the view cannot be placed over it: refused, not replayed from the init.
    torch.manual_seed(0)
    m, lazy = torchdefer.deferred_init(_build)
    torchdefer.load_state_dict(m, _state(), dtype=torch.bfloat16)
    with pytest.raises(torchdefer.TorchdeferError, match="checkpoint load replaced"):
        torchdefer.materialize_tensor(lazy["row"])
    torch.manual_seed(0)
    m_eager, eager = _build()
    assert_same_tensor(torchdefer.materialize_tensor(lazy["double"]), eager["double"], "double")


def test_a_view_of_a_storage_a_loaded_parameter_is_only_part_of_is_refused():
    def build():
        flat = torch.randn(24)
        m = nn.Linear(3, 4, bias=False)
        m.weight = nn.Parameter(flat[:12].view(4, 3))
        return m, flat[12:]

    torch.manual_seed(0)
    m, rest = torchdefer.deferred_init(build)
    torchdefer.load_state_dict(m, {"weight": torch.ones(4, 3)})
    assert torch.equal(m.weight, torch.ones(4, 3))
    with pytest.raises(torchdefer.TorchdeferError, match="checkpoint load replaced"):
        torchdefer.materialize_tensor(rest)
