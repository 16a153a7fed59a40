"""save_state_dict: the files are what save_pretrained / dcp.save write of the eager model.

Every check builds the model eagerly from the same seed and compares: the
safetensors directory byte for byte with ``save_pretrained``'s, the loaded
tensors tensor by tensor, the DCP directory through ``dcp.load``.
"""

from __future__ import annotations

import filecmp
import json
import os
import threading

import pytest
import torch
from torch import nn

import torchdefer
from torchdefer.checkpoint import (
    CheckpointExistsError,
    CheckpointUsageError,
    CheckpointWriteError,
)

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
safetensors_torch = pytest.importorskip("safetensors.torch")
transformers = pytest.importorskip("transformers")


def _config(tied: bool = True, **kw):
    return transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, tie_word_embeddings=tied, **kw)


def _both(config, seed: int = 0):
    torch.manual_seed(seed)
    eager = transformers.LlamaForCausalLM(config)
    torch.manual_seed(seed)
    lazy = torchdefer.deferred_init(transformers.LlamaForCausalLM, config)
    return eager, lazy


def _header(path) -> dict:
    data = path.read_bytes()
    return json.loads(data[8:8 + int.from_bytes(data[:8], "little")])


def _data(path) -> bytes:
    data = path.read_bytes()
    return data[8 + int.from_bytes(data[:8], "little"):]


def _same_files(a, b) -> None:
    names = sorted(os.listdir(a))
    assert names == sorted(os.listdir(b))
    for name in names:
        assert filecmp.cmp(a / name, b / name, shallow=False), name


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("dtype,shard", [(torch.bfloat16, 20_000), (None, "50GB")])
def test_safetensors_directory_is_byte_for_byte_what_save_pretrained_writes(
        tmp_path, tied, dtype, shard):
    eager, lazy = _both(_config(tied))
    out = torchdefer.save_state_dict(lazy, tmp_path / "ours", dtype=dtype, max_shard_size=shard)
    if dtype is not None:
        eager.to(dtype)
    eager.save_pretrained(tmp_path / "hf", max_shard_size=shard)
    _same_files(out, tmp_path / "hf")
    assert torchdefer.is_deferred(lazy)  # nothing installed in the model


def test_from_pretrained_loads_the_files_as_eager_construction_then_to_bfloat16(tmp_path):
    eager, lazy = _both(_config(tied=True))
    out = torchdefer.save_state_dict(lazy, tmp_path / "init", dtype=torch.bfloat16,
                                     max_shard_size="100KB")
    assert (out / "model.safetensors.index.json").exists()
    loaded = transformers.LlamaForCausalLM.from_pretrained(out)
    expected = eager.to(torch.bfloat16).state_dict()
    got = loaded.state_dict()
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype, name
        assert torch.equal(got[name], tensor), name
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight  # re-tied from the config


def test_torchdefer_load_state_dict_reads_the_directory_back_into_a_deferred_model(tmp_path):
    eager, lazy = _both(_config(tied=True))
    out = torchdefer.save_state_dict(lazy, tmp_path / "init", max_shard_size=30_000)
    _, target = _both(_config(tied=True), seed=7)
    torchdefer.load_state_dict(target, out, strict=True)
    for name, tensor in eager.state_dict().items():
        assert torch.equal(target.state_dict()[name], tensor), name
    assert target.lm_head.weight is target.model.embed_tokens.weight


@pytest.mark.parametrize("tied", [True, False])
def test_dcp_directory_loads_with_dcp_load_into_an_eager_model_and_equals_it(tmp_path, tied):
    import torch.distributed.checkpoint as dcp

    eager, lazy = _both(_config(tied))
    out = torchdefer.save_state_dict(lazy, tmp_path / "seed", format="dcp", dtype=torch.bfloat16)
    torch.manual_seed(3)
    other = transformers.LlamaForCausalLM(_config(tied)).to(torch.bfloat16)
    state = other.state_dict()
    dcp.load(state, checkpoint_id=str(out), no_dist=True)  # strict: every key must be there
    for name, tensor in eager.to(torch.bfloat16).state_dict().items():
        assert torch.equal(state[name], tensor), name


def test_torchdefer_load_state_dict_reads_the_dcp_directory_back(tmp_path):
    eager, lazy = _both(_config(tied=True))
    out = torchdefer.save_state_dict(lazy, tmp_path / "seed", format="dcp", dtype=torch.bfloat16)
    _, target = _both(_config(tied=True), seed=7)
    torchdefer.load_state_dict(target, out, strict=True, dtype=torch.bfloat16)
    for name, tensor in eager.to(torch.bfloat16).state_dict().items():
        assert torch.equal(target.state_dict()[name], tensor), name


def test_the_model_stays_deferred_and_later_materializes_as_eager(tmp_path):
    eager, lazy = _both(_config(tied=False))
    torchdefer.save_state_dict(lazy, tmp_path / "a")
    torchdefer.save_state_dict(lazy, tmp_path / "b", format="dcp")
    assert torchdefer.is_deferred(lazy)
    torchdefer.materialize_module(lazy)
    for name, tensor in eager.state_dict().items():
        assert torch.equal(lazy.state_dict()[name], tensor), name


@pytest.mark.parametrize("limit", [1, 5_000, 40_000, "1MB", 10**12])
def test_shards_follow_huggingface_hubs_split_of_the_eager_state_dict(tmp_path, limit):
    from huggingface_hub import split_torch_state_dict_into_shards

    eager, lazy = _both(_config(tied=False))
    out = torchdefer.save_state_dict(lazy, tmp_path / "x", max_shard_size=limit)
    split = split_torch_state_dict_into_shards(eager.state_dict(), max_shard_size=limit,
                                               filename_pattern="model{suffix}.safetensors")
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert files == sorted(split.filename_to_tensors)
    if split.is_sharded:
        index = json.loads((out / "model.safetensors.index.json").read_text())
        assert index["weight_map"] == split.tensor_to_filename
        assert index["metadata"]["total_size"] == split.metadata["total_size"]
    for file, names in split.filename_to_tensors.items():
        assert sorted(safetensors_torch.load_file(out / file)) == sorted(names)


def test_a_partly_materialized_model_writes_its_current_values(tmp_path):
    eager, lazy = _both(_config(tied=False))
    torchdefer.materialize_module(lazy.model.layers[0])
    with torch.no_grad():
        lazy.model.layers[0].mlp.up_proj.weight.mul_(2)
        eager.model.layers[0].mlp.up_proj.weight.mul_(2)
    out = torchdefer.save_state_dict(lazy, tmp_path / "p")
    loaded = safetensors_torch.load_file(out / "model.safetensors")
    for name, tensor in eager.state_dict().items():
        if name in loaded:
            assert torch.equal(loaded[name], tensor), name
    assert torchdefer.is_deferred(lazy.lm_head.weight)


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.b = nn.Linear(3, 4)
        self.a = nn.Linear(3, 4)
        self.a.weight = self.b.weight
        self.register_buffer("steps", torch.arange(5))
        self.register_buffer("scratch", torch.ones(2), persistent=False)


def test_a_plain_module_tie_is_written_once_as_safetensors_save_model_does(tmp_path):
    torch.manual_seed(0)
    eager = _Tied()
    torch.manual_seed(0)
    out = torchdefer.save_state_dict(torchdefer.deferred_init(_Tied), tmp_path / "t")
    safetensors_torch.save_model(eager, tmp_path / "ref.safetensors", metadata={"format": "pt"})
    # The same header (as JSON: the metadata's key order is a Rust HashMap's) and data.
    assert _header(out / "model.safetensors") == _header(tmp_path / "ref.safetensors")
    assert _data(out / "model.safetensors") == _data(tmp_path / "ref.safetensors")
    assert _header(out / "model.safetensors")["__metadata__"]["b.weight"] == "a.weight"
    target = _Tied()
    safetensors_torch.load_model(target, out / "model.safetensors")
    assert torch.equal(target.b.weight, eager.b.weight)
    torch.manual_seed(5)
    target = torchdefer.deferred_init(_Tied)
    torchdefer.load_state_dict(target, out, strict=True)
    assert target.a.weight is target.b.weight
    assert torch.equal(target.b.weight, eager.b.weight)


def test_dcp_writes_a_tie_under_every_name_as_dcp_save_does(tmp_path):
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    eager = _Tied()
    torch.manual_seed(0)
    out = torchdefer.save_state_dict(torchdefer.deferred_init(_Tied), tmp_path / "t",
                                     format="dcp")
    torch.manual_seed(1)
    state = _Tied().state_dict()
    dcp.load(state, checkpoint_id=str(out), no_dist=True)
    assert set(state) == {"a.weight", "a.bias", "b.weight", "b.bias", "steps"}
    for name, tensor in eager.state_dict().items():
        assert torch.equal(state[name], tensor), name


class _Dtypes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        for i, dtype in enumerate([torch.float64, torch.float32, torch.float16, torch.bfloat16,
                                   torch.int64, torch.int32, torch.int16, torch.int8,
                                   torch.uint8, torch.bool, torch.complex64,
                                   torch.float8_e4m3fn, torch.float8_e5m2]):
            shape = (3, 5) if i % 2 else (7,)
            value = torch.randn(shape).mul(4).to(dtype) if dtype != torch.bool else \
                torch.randn(shape) > 0
            self.register_buffer(f"t{i}", value)
        self.register_buffer("transposed", torch.randn(4, 6).t())
        self.register_buffer("empty", torch.zeros(0, 3))
        self.register_buffer("scalar", torch.tensor(2.5))


def test_every_dtype_and_layout_is_written_as_safetensors_save_file_writes_it(tmp_path):
    torch.manual_seed(0)
    eager = _Dtypes()
    torch.manual_seed(0)
    out = torchdefer.save_state_dict(torchdefer.deferred_init(_Dtypes), tmp_path / "d")
    reference = {k: v.contiguous() for k, v in eager.state_dict().items()}
    safetensors_torch.save_file(reference, tmp_path / "ref.safetensors", metadata={"format": "pt"})
    assert filecmp.cmp(out / "model.safetensors", tmp_path / "ref.safetensors", shallow=False)


def test_dtype_converts_floating_tensors_only_as_module_to_does(tmp_path):
    torch.manual_seed(0)
    eager = _Dtypes()
    del eager.t10  # complex: refused below
    torch.manual_seed(0)
    lazy = torchdefer.deferred_init(_Dtypes)
    del lazy.t10
    out = torchdefer.save_state_dict(lazy, tmp_path / "h", dtype=torch.float16)
    loaded = safetensors_torch.load_file(out / "model.safetensors")
    for name, tensor in eager.to(torch.float16).state_dict().items():
        assert loaded[name].dtype == tensor.dtype, name
        assert torch.equal(loaded[name], tensor), name


def test_a_complex_tensor_to_a_real_dtype_is_refused_before_anything_is_written(tmp_path):
    lazy = torchdefer.deferred_init(_Dtypes)
    with pytest.raises(CheckpointWriteError, match="'t10'.*imaginary"):
        torchdefer.save_state_dict(lazy, tmp_path / "c", dtype=torch.bfloat16)
    assert list(tmp_path.iterdir()) == []


def test_existing_files_and_non_empty_directories_are_never_overwritten(tmp_path):
    lazy = torchdefer.deferred_init(nn.Linear, 2, 2)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(CheckpointExistsError, match="not empty") as info:
        torchdefer.save_state_dict(lazy, tmp_path / "full")
    assert isinstance(info.value, FileExistsError)
    assert os.listdir(tmp_path / "full") == ["keep.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointExistsError, match="is a file"):
        torchdefer.save_state_dict(lazy, tmp_path / "file")
    (tmp_path / "empty").mkdir()
    torchdefer.save_state_dict(lazy, tmp_path / "empty")
    assert os.listdir(tmp_path / "empty") == ["model.safetensors"]


@pytest.mark.parametrize("kwargs,error,match", [
    ({"format": "pickle"}, CheckpointWriteError, "format='pickle'"),
    ({"dtype": torch.int8}, CheckpointUsageError, "not a floating point"),
    ({"dtype": "bfloat16"}, CheckpointUsageError, "must be a torch.dtype"),
    ({"max_shard_size": "5 parsecs"}, CheckpointWriteError, "not a size"),
    ({"max_shard_size": 0}, CheckpointWriteError, "not a size"),
])
def test_bad_arguments_are_refused_with_what_to_pass(tmp_path, kwargs, error, match):
    lazy = torchdefer.deferred_init(nn.Linear, 2, 2)
    with pytest.raises(error, match=match) as info:
        torchdefer.save_state_dict(lazy, tmp_path / "x", **kwargs)
    assert isinstance(info.value, torchdefer.TorchdeferError)
    assert list(tmp_path.iterdir()) == []


def test_meta_tensors_have_no_values_to_write(tmp_path):
    with torch.device("meta"):
        model = nn.Linear(2, 2)
    with pytest.raises(CheckpointWriteError, match="'weight' is a meta tensor"):
        torchdefer.save_state_dict(model, tmp_path / "m")
    lazy = torchdefer.deferred_init(lambda: nn.Linear(2, 2, device="meta"))
    with pytest.raises(CheckpointWriteError, match="'weight' was recorded on the meta"):
        torchdefer.save_state_dict(lazy, tmp_path / "m")


def test_an_undeclared_tie_in_a_transformers_model_is_refused_as_save_pretrained_does(tmp_path):
    _, lazy = _both(_config(tied=False))
    lazy.model.layers[1].mlp.up_proj.weight = lazy.model.layers[0].mlp.up_proj.weight
    with pytest.raises(CheckpointWriteError, match="_tied_weights_keys"):
        torchdefer.save_state_dict(lazy, tmp_path / "u")
    out = torchdefer.save_state_dict(lazy, tmp_path / "u", format="dcp")  # DCP holds ties
    assert (out / ".metadata").exists()


def test_a_failed_replay_leaves_nothing_behind(tmp_path):
    outside = torch.ones(3)
    model = torchdefer.deferred_init(_UsesOutside, outside)
    outside.add_(1)  # changed after recording: replay refuses
    with pytest.raises(torchdefer.materialize.ExternalTensorModifiedError):
        torchdefer.save_state_dict(model, tmp_path / "f", max_shard_size=1)
    assert list(tmp_path.iterdir()) == []


class _UsesOutside(nn.Module):
    def __init__(self, outside: torch.Tensor) -> None:
        super().__init__()
        self.first = nn.Linear(3, 3)
        self.register_buffer("shifted", outside * 2)


def test_a_failed_write_stops_the_replays_and_leaves_nothing_behind(tmp_path, monkeypatch):
    from torchdefer.checkpoint import _safetensors_writer

    made = []

    def broken(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_safetensors_writer, "_write_tensor", broken)
    _, lazy = _both(_config(tied=False))
    with pytest.raises(OSError, match="No space left"):
        torchdefer.save_state_dict(lazy, tmp_path / "f", progress=lambda e: made.append(e))
    assert list(tmp_path.iterdir()) == []
    assert made == []


def test_progress_reports_each_tensor_on_the_calling_thread(tmp_path):
    events, threads = [], set()

    def seen(event):
        events.append(event)
        threads.add(threading.get_ident())

    _, lazy = _both(_config(tied=True))
    torchdefer.save_state_dict(lazy, tmp_path / "p", progress=seen, max_shard_size=20_000)
    assert threads == {threading.get_ident()}
    assert [e.done for e in events] == list(range(1, len(events) + 1))
    assert events[-1].done == events[-1].total == len(lazy.state_dict()) - 1  # tie once
    assert events[-1].done_bytes == events[-1].total_bytes
    assert {e.task for e in events} == {"save"}


class _WithExtraState(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def get_extra_state(self):
        return {"version": 3}

    def set_extra_state(self, state):
        self.loaded_extra = state


def test_extra_state_goes_to_dcp_and_is_refused_by_safetensors(tmp_path):
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    eager = _WithExtraState()
    torch.manual_seed(0)
    lazy = torchdefer.deferred_init(_WithExtraState)
    with pytest.raises(CheckpointWriteError, match="_extra_state"):
        torchdefer.save_state_dict(lazy, tmp_path / "s")
    out = torchdefer.save_state_dict(lazy, tmp_path / "d", format="dcp")
    state = _WithExtraState().state_dict()
    dcp.load(state, checkpoint_id=str(out), no_dist=True)
    assert state["_extra_state"] == {"version": 3}
    assert torch.equal(state["lin.weight"], eager.lin.weight)


class _Views(nn.Module):
    def __init__(self, overlap: bool) -> None:
        super().__init__()
        base = torch.randn(4, 3)
        self.register_buffer("top", base[:2])
        self.register_buffer("bottom", base[1:] if overlap else base[2:])
        self.register_buffer("again", base[:2])  # the same view as top: one tensor


def test_views_of_one_storage_are_written_as_save_pretrained_treats_them(tmp_path):
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    eager = _Views(overlap=False)
    torch.manual_seed(0)
    out = torchdefer.save_state_dict(torchdefer.deferred_init(_Views, False), tmp_path / "v")
    loaded = safetensors_torch.load_file(out / "model.safetensors")
    # 'again' is 'top' (the same view), written once under the first name in sorted order
    assert sorted(loaded) == ["again", "bottom"]
    assert torch.equal(loaded["again"], eager.top)
    assert torch.equal(loaded["bottom"], eager.bottom)

    torch.manual_seed(0)
    eager = _Views(overlap=True)
    torch.manual_seed(0)
    lazy = torchdefer.deferred_init(_Views, True)
    with pytest.raises(CheckpointWriteError, match="'top' and 'bottom' share part"):
        torchdefer.save_state_dict(lazy, tmp_path / "o")
    out = torchdefer.save_state_dict(lazy, tmp_path / "o", format="dcp")
    state = {k: torch.zeros_like(v) for k, v in eager.state_dict().items()}
    dcp.load(state, checkpoint_id=str(out), no_dist=True)
    for name, tensor in eager.state_dict().items():
        assert torch.equal(state[name], tensor), name


def test_an_eager_model_is_written_as_it_is(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    out = torchdefer.save_state_dict(model, tmp_path / "e", format="safetensors")
    loaded = safetensors_torch.load_file(out / "model.safetensors")
    assert loaded.keys() == model.state_dict().keys()
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded[name], tensor), name


def test_a_model_recorded_on_a_device_this_host_lacks_is_refused_and_nothing_written(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("the host has CUDA")
    lazy = torchdefer.deferred_init(nn.Linear, 2, 2, device="cuda")
    with pytest.raises(torchdefer.materialize.DeviceUnavailableError, match="cuda"):
        torchdefer.save_state_dict(lazy, tmp_path / "c")
    assert list(tmp_path.iterdir()) == []


def test_tensors_built_under_inference_mode_are_written(tmp_path):
    def build():
        with torch.inference_mode():
            return nn.Linear(3, 2)

    torch.manual_seed(0)
    eager = build()
    torch.manual_seed(0)
    out = torchdefer.save_state_dict(torchdefer.deferred_init(build), tmp_path / "i",
                                     dtype=torch.float16)
    loaded = safetensors_torch.load_file(out / "model.safetensors")
    assert torch.equal(loaded["weight"], eager.weight.to(torch.float16))


@pytest.mark.parametrize("fmt", ["safetensors", "dcp"])
def test_sparse_tensors_are_refused_before_anything_is_written(tmp_path, fmt):
    model = nn.Module()
    model.register_buffer("sparse", torch.eye(3).to_sparse())
    with pytest.raises(CheckpointWriteError, match="'sparse' .*plain dense"):
        torchdefer.save_state_dict(model, tmp_path / "s", format=fmt)
    assert list(tmp_path.iterdir()) == []


def test_pieces_of_every_size_convert_as_one_whole_to(tmp_path, monkeypatch):
    from torchdefer.checkpoint import _safetensors_writer

    monkeypatch.setattr(_safetensors_writer, "_CHUNK_BYTES", 48)  # many pieces, odd tails
    model = nn.Module()
    model.register_buffer("a64", torch.randn(7, 5, dtype=torch.float64))
    model.register_buffer("b32", torch.randn(29))
    model.register_buffer("c16", torch.randn(3, 11).half())
    out = torchdefer.save_state_dict(model, tmp_path / "p", dtype=torch.bfloat16)
    loaded = safetensors_torch.load_file(out / "model.safetensors")
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded[name], tensor.to(torch.bfloat16)), name
