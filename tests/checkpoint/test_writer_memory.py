"""save_state_dict's memory: a written tensor is gone before the next one is made.

The storage of every tensor the writer makes (replayed, then converted for
DCP) is tracked with a weak reference: a storage lives while any tensor holds
it, aliases (``.detach()``) included. At each replay the storages still
alive, plus the tensor about to be made, must fit the pipeline's budget (the
largest tensor, with the slack set to 0 here). For tensors of one size that
means: never two alive at once. Before, DCP's own file loop kept (a detached
alias of) the tensor it had written while it asked for the next one, so two
were alive.
"""

from __future__ import annotations

import weakref

import pytest
import torch
from torch import nn

import torchdefer
from torchdefer.checkpoint import _write as write

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class _Equal(nn.Module):
    """Six tensors of one size, and a tie: the pipeline can hold one at a time."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(32, 32, bias=False) for _ in range(5))
        self.head = nn.Linear(32, 32, bias=False)
        self.register_buffer("table", torch.randn(32, 32))
        self.layers[4].weight = self.head.weight


class _Tracker:
    """Weak references to the storage of every tensor made, and the most alive at a replay."""

    def __init__(self) -> None:
        self.made: list[weakref.ref] = []
        self.most_alive = 0
        self.over_budget: list[str] = []

    def track(self, tensor: torch.Tensor) -> None:
        self.made.append(weakref.ref(tensor.untyped_storage()))

    def alive(self) -> list[torch.UntypedStorage]:
        # torch 2.8 can keep a storage's Python object after its memory is freed
        # (use count 0), so the C++ use count decides.
        storages = {id(s): s for s in (r() for r in self.made)
                    if s is not None and torch._C._storage_Use_Count(s._cdata) > 0}
        return list(storages.values())

    def install(self, monkeypatch, budget: int) -> None:
        replay, make = write.replay_value, write._make

        def tracked_replay(tensor, name):
            alive = self.alive()
            self.most_alive = max(self.most_alive, len(alive))
            held = sum(s.nbytes() for s in alive) + tensor.nbytes
            if held > budget:
                self.over_budget.append(f"{name}: {held} bytes alive > {budget}")
            out = replay(tensor, name)
            self.track(out)
            return out

        def tracked_make(entry, cast, replay=None):
            out = make(entry, cast, replay)
            self.track(out)
            return out

        monkeypatch.setattr(write, "replay_value", tracked_replay)
        monkeypatch.setattr(write, "_make", tracked_make)
        monkeypatch.setattr(write, "_SLACK_BYTES", 0)


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
@pytest.mark.parametrize("fmt", ["dcp", "safetensors"])
def test_a_written_tensor_is_released_before_the_next_one_is_made(tmp_path, monkeypatch,
                                                                  fmt, dtype):
    tracker = _Tracker()
    tracker.install(monkeypatch, budget=32 * 32 * 4)
    torch.manual_seed(0)
    model = torchdefer.deferred_init(_Equal)
    torchdefer.save_state_dict(model, tmp_path / "out", format=fmt, dtype=dtype)
    assert len(tracker.made) >= 6
    assert tracker.most_alive == 0, "a written tensor was still alive when the next was made"
    assert tracker.over_budget == []


@pytest.mark.parametrize("fmt", ["dcp", "safetensors"])
def test_tensors_alive_at_once_never_exceed_the_largest_with_mixed_sizes(tmp_path,
                                                                          monkeypatch, fmt):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = torchdefer.deferred_init(transformers.LlamaForCausalLM, config)
    largest = max(t.nbytes for t in model.state_dict().values())
    tracker = _Tracker()
    tracker.install(monkeypatch, budget=largest)
    torchdefer.save_state_dict(model, tmp_path / "out", format=fmt, dtype=torch.bfloat16)
    assert tracker.over_budget == []


def test_the_dcp_directory_has_dcp_saves_layout_and_loads_as_the_eager_model(tmp_path):
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    eager = _Equal()
    torch.manual_seed(0)
    out = torchdefer.save_state_dict(torchdefer.deferred_init(_Equal), tmp_path / "mine",
                                     format="dcp")
    dcp.save(eager.state_dict(), checkpoint_id=str(tmp_path / "eager"), no_dist=True)
    assert sorted(p.name for p in out.iterdir()) == \
        sorted(p.name for p in (tmp_path / "eager").iterdir())
    mine = dcp.FileSystemReader(str(out)).read_metadata()
    theirs = dcp.FileSystemReader(str(tmp_path / "eager")).read_metadata()
    assert mine.state_dict_metadata == theirs.state_dict_metadata
    torch.manual_seed(5)
    state = _Equal().state_dict()
    dcp.load(state, checkpoint_id=str(out), no_dist=True)
    for name, tensor in eager.state_dict().items():
        assert torch.equal(state[name], tensor), name
