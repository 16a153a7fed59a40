"""Progress reporting of materialize_module and load_state_dict."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdefer
from torchdefer.materialize.progress import ProgressEvent


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))


def test_a_callback_gets_one_event_per_tensor_with_names_and_bytes():
    model = torchdefer.deferred_init(_model)
    events: list[ProgressEvent] = []
    torchdefer.materialize_module(model, progress=events.append)
    assert [e.name for e in events] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert [e.done for e in events] == [1, 2, 3, 4]
    assert {e.total for e in events} == {4}
    assert events[-1].done_bytes == events[-1].total_bytes == sum(
        p.numel() * p.element_size() for p in model.parameters())
    assert {e.task for e in events} == {"materialize"}


def test_load_state_dict_reports_loading_then_materializing():
    model = torchdefer.deferred_init(_model)
    state = {"0.weight": torch.zeros(8, 4), "0.bias": torch.zeros(8)}
    events: list[ProgressEvent] = []
    torchdefer.load_state_dict(model, state, progress=events.append)
    assert [(e.task, e.name) for e in events] == [
        ("load", "0.weight"), ("load", "0.bias"),
        ("materialize", "1.weight"), ("materialize", "1.bias")]


def test_load_progress_counts_the_bytes_of_the_requested_dtype():
    model = torchdefer.deferred_init(_model)
    state = {"0.weight": torch.zeros(8, 4), "0.bias": torch.zeros(8)}
    events: list[ProgressEvent] = []
    torchdefer.load_state_dict(model, state, dtype=torch.bfloat16, progress=events.append)
    loads = [e for e in events if e.task == "load"]
    assert loads[-1].done_bytes == loads[-1].total_bytes == (8 * 4 + 8) * 2


def test_progress_true_draws_a_bar_on_stderr(capsys):
    model = torchdefer.deferred_init(_model)
    torchdefer.materialize_module(model, progress=True)
    assert "materialize" in capsys.readouterr().err


def test_no_bar_when_stderr_is_not_a_terminal(capsys):
    model = torchdefer.deferred_init(_model)
    torchdefer.materialize_module(model)
    assert capsys.readouterr().err == ""


def test_a_wrong_progress_value_is_refused():
    model = torchdefer.deferred_init(_model)
    with pytest.raises(TypeError, match="progress= must be"):
        torchdefer.materialize_module(model, progress="yes")
