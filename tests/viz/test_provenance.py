"""explain: the ops that produce a tensor's value, in words, in replay order."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn
from viz_models import Stack, ViewsMutatedAfterTaken, Zoo

import torchdefer
from parity import build_both
from torchdefer.materialize._cache import ReplayCache
from torchdefer.materialize._plan import make_plan

TIMES = "\u00d7"


def op_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.match(r"\s+#\d+ ", line)]


def planned(t: torch.Tensor) -> list:
    value = t._value
    return make_plan([(value, value.storage.version)], ReplayCache(), "recorded", None).nodes


def test_explain_lists_the_replayed_ops_in_order_ending_with_the_module_path():
    m = torchdefer.deferred_init(Stack)
    t = m.layers[3].experts[1].up.weight
    text = torchdefer.explain(t, m)
    lines = op_lines(text)
    nodes = planned(t)
    assert [int(re.match(r"\s+#(\d+)", ln).group(1)) for ln in lines] == [n.seq for n in nodes]
    for line, node in zip(lines, nodes):
        assert node.kind in line.split()[1]
        out = node.outputs[0].meta
        assert f"-> {TIMES.join(map(str, out.size))} float32 cpu" in line
        assert re.search(r"at tests/viz/viz_models\.py:\d+$", line)
    assert text.splitlines()[-1] == "module path: layers.3.experts.1.up.weight"


def test_explain_finds_the_module_path_without_being_given_the_model():
    m = torchdefer.deferred_init(Stack)
    text = torchdefer.explain(m.layers[2].proj.bias)
    assert text.splitlines()[-1] == "module path: layers.2.proj.bias"


def test_explain_names_every_name_of_a_tied_weight():
    m = torchdefer.deferred_init(Stack)
    assert torchdefer.explain(m.head.weight, m).splitlines()[-1] == (
        "module path: embed.weight, head.weight")


def test_explain_marks_writes_made_through_other_views_after_the_view_was_taken():
    eager, m = build_both(ViewsMutatedAfterTaken)
    text = torchdefer.explain(m.col, m)
    taken = m.col._value.node.seq
    lines = op_lines(text)
    marked = [ln for ln in lines if "mutates this tensor's storage" in ln]
    assert [ln.split()[2].partition("(")[0] for ln in marked] == ["add_", "mul_"]
    assert all(f"after this tensor was taken by #{taken}" in ln for ln in marked)
    storage = m.col._value.storage
    assert f"storage s#{storage.id} at version {storage.version}" in text
    assert [ln for ln in lines if "writes" in ln] == marked
    # What explain describes is what materializes: eager's values.
    torchdefer.materialize_module(m)
    assert torch.equal(m.col, eager.col) and torch.equal(m.row, eager.row)


def test_explain_shows_generator_draws_and_data_views():
    m = torchdefer.deferred_init(Zoo)
    text = torchdefer.explain(m.lin.bias, m)
    assert "generator default cpu, draw 1" in text
    assert "data_get" in text and "fill_(%" in text
    assert "[mutates this tensor's storage through" in text


def test_explain_says_plainly_that_a_real_tensor_has_no_recording():
    m = torchdefer.deferred_init(nn.Linear, 3, 2)
    torchdefer.materialize_module(m)
    text = torchdefer.explain(m.weight, m)
    assert text.startswith("weight: a real Parameter (2\u00d73 float32 on cpu), not deferred.")
    assert "Nothing was recorded for it" in text
    assert text.splitlines()[-1] == "module path: weight"


def test_explain_of_a_loose_tensor_says_it_has_no_module():
    t = torchdefer.deferred_init(lambda: torch.ones(3).mul_(2))
    text = torchdefer.explain(t)
    assert [ln.split()[1] for ln in op_lines(text)] == ["factory", "inplace"]
    assert text.splitlines()[-1] == "module path: none (not a parameter or buffer of a live module)"


def test_explain_refuses_what_is_not_a_tensor():
    with pytest.raises(TypeError, match="explain expects a tensor, got Linear"):
        torchdefer.explain(nn.Linear(2, 2))


def test_explain_is_the_lazy_top_level_export():
    from torchdefer.viz import explain

    assert torchdefer.explain is explain
