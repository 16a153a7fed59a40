"""Every entry point under every ambient setting the user may have in force.

torchdefer's own tensors (the generator bookkeeping when a recording ends,
scratch memory, probes) name their device and dtype, so a user's
``with torch.device(...)``, ``set_default_device``, ``set_default_dtype``,
``no_grad``, ``inference_mode`` or deterministic mode changes only what it
changes in eager code. Each case builds the same thing eagerly and deferred
under the setting (or materializes under it) and compares everything,
including where the CPU generator is left. The host has no CUDA: a CUDA
context makes eager construction fail, so there the deferred model is
compared with one recorded with ``device="cuda"`` spelled out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

import torchdefer
from parity import assert_same_module
from torchdefer._compat import restore_default_device


class Model(nn.Module):
    """kaiming_uniform_, trunc_normal_, randn, arange and an uninitialized buffer."""

    def __init__(self, device=None):
        super().__init__()
        self.lin = nn.Linear(4, 3, device=device)
        self.emb = nn.Parameter(torch.empty(5, 4, device=device))
        nn.init.trunc_normal_(self.emb, std=0.02)
        freq = 1.0 / (10000 ** (torch.arange(0, 4, 2, device=device) / 4))
        self.register_buffer("freq", freq)
        self.noise = nn.Parameter(torch.randn(3, device=device) * 0.5)
        self.register_buffer("scratch", torch.empty(2, 3, device=device).t())  # NaN if deterministic


@contextlib.contextmanager
def default_device(device: str) -> Iterator[None]:
    torch.set_default_device(device)
    try:
        yield
    finally:
        restore_default_device(None)  # torch 2.8's set_default_device(None) breaks it


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@contextlib.contextmanager
def deterministic() -> Iterator[None]:
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)
        torch.utils.deterministic.fill_uninitialized_memory = fill


SETTINGS: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "with_cuda": lambda: torch.device("cuda"),
    "with_meta": lambda: torch.device("meta"),
    "default_cuda": lambda: default_device("cuda"),
    "default_meta": lambda: default_device("meta"),
    "float64": lambda: default_dtype(torch.float64),
    "bfloat16": lambda: default_dtype(torch.bfloat16),
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
    "deterministic": deterministic,
}
CUDA = ("with_cuda", "default_cuda")
META = ("with_meta", "default_meta")


def _assert_same(real: nn.Module, ref: nn.Module, *, nan_filled: bool = False) -> None:
    if ref.lin.weight.is_meta:
        for (name, a), (_, b) in zip(real.state_dict(keep_vars=True).items(),
                                     ref.state_dict(keep_vars=True).items()):
            assert a.is_meta, name
            assert (a.shape, a.stride(), a.dtype, a.requires_grad, type(a)) == (
                b.shape, b.stride(), b.dtype, b.requires_grad, type(b)), name
        return
    # torch.empty: uninitialized (reused memory may hold anything, NaN included),
    # but NaN in both when built in deterministic mode.
    if nan_filled:
        assert bool(ref.scratch.isnan().all()) and bool(real.scratch.isnan().all())
    assert (real.scratch.stride(), real.scratch.dtype) == (ref.scratch.stride(), ref.scratch.dtype)
    real.scratch = ref.scratch = torch.zeros_like(ref.scratch)
    assert_same_module(real, ref)
    for a, b in zip(real.state_dict().values(), ref.state_dict().values()):
        assert a.is_inference() == b.is_inference()


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("entry", ["deferred_init", "deferred_block"])
def test_recording_under_a_setting_gives_what_eager_gives_there(setting, entry):
    device = "cpu" if setting in CUDA else None  # eager cannot build on CUDA here
    torch.manual_seed(0)
    with SETTINGS[setting]():
        eager = Model(device)
    eager_next = torch.rand(4, device="cpu")
    torch.manual_seed(0)
    with SETTINGS[setting]():
        if entry == "deferred_init":
            model = torchdefer.deferred_init(Model, device)
        else:
            with torchdefer.deferred():
                model = Model(device)
    assert torch.equal(torch.rand(4, device="cpu"), eager_next)  # the generator, as eager
    torchdefer.materialize_module(model)
    _assert_same(model, eager, nan_filled=setting == "deterministic")


@pytest.mark.parametrize("setting", CUDA)
def test_recording_under_a_cuda_context_is_recording_with_device_cuda(setting):
    torch.manual_seed(0)
    spelled = torchdefer.deferred_init(Model, "cuda")
    spelled_next = torch.rand(4)
    torch.manual_seed(0)
    with SETTINGS[setting]():
        model = torchdefer.deferred_init(Model)
    assert model.lin.weight.device == torch.device("cuda", 0)
    assert torch.equal(torch.rand(4, device="cpu"), spelled_next)
    torchdefer.materialize_module(model, device="cpu")
    torchdefer.materialize_module(spelled, device="cpu")
    _assert_same(model, spelled)


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("entry", ["materialize_module", "materialize_tensor", "load_state_dict"])
def test_materializing_under_a_setting_gives_what_was_recorded(setting, entry):
    torch.manual_seed(0)
    eager = Model()
    eager_next = torch.rand(4)
    torch.manual_seed(0)
    model = torchdefer.deferred_init(Model)
    with SETTINGS[setting]():
        if entry == "materialize_module":
            torchdefer.materialize_module(model)
        elif entry == "materialize_tensor":
            weight = torchdefer.materialize_tensor(model.lin.weight)
        else:
            state = {k: v for k, v in eager.state_dict().items() if k != "noise"}
            torchdefer.load_state_dict(model, state, strict=False)
    if entry == "materialize_tensor":
        assert not weight.is_inference()
        assert (weight.requires_grad, type(weight), weight.device) == (True, nn.Parameter,
                                                                      torch.device("cpu"))
        assert torch.equal(weight, eager.lin.weight)
    torchdefer.materialize_module(model)
    assert torch.equal(torch.rand(4, device="cpu"), eager_next)
    _assert_same(model, eager)


def test_a_block_raising_after_set_default_device_cuda_surfaces_the_users_error():
    class Mine(Exception):
        pass

    def build():
        nn.Linear(4, 4)  # leaves the generator to be synced when the block ends
        torch.set_default_device("cuda")
        raise Mine("the user's own error")

    torch.manual_seed(0)
    with pytest.raises(Mine, match="the user's own error"):
        torchdefer.deferred_init(build)
    assert torch.empty(1).device.type == "cpu"
    after = torch.rand(3)
    torch.manual_seed(0)
    nn.Linear(4, 4)
    assert torch.equal(torch.rand(3), after)


@pytest.mark.parametrize("setting", META)
def test_the_generator_ends_where_eager_leaves_it_under_a_meta_context(setting):
    def build():
        a = nn.Linear(4, 4)  # on meta: draws nothing
        b = nn.Linear(4, 4, device="cpu")  # draws
        nn.init.trunc_normal_(a.weight)
        return a, b

    torch.manual_seed(0)
    with SETTINGS[setting]():
        eager = build()
    eager_next = torch.rand(3, device="cpu")
    torch.manual_seed(0)
    with SETTINGS[setting]():
        lazy = torchdefer.deferred_init(build)
    assert torch.equal(torch.rand(3, device="cpu"), eager_next)
    for module in lazy:
        torchdefer.materialize_module(module)
    assert lazy[0].weight.is_meta
    assert_same_module(lazy[1], eager[1])


def test_materializing_to_meta_gives_what_to_meta_gives():
    torch.manual_seed(0)
    eager = Model()
    after = torch.rand(3)
    torch.manual_seed(0)
    model = torchdefer.deferred_init(Model)
    torchdefer.materialize_module(model, device="meta")
    assert torch.equal(torch.rand(3), after)  # nothing drawn, nothing moved
    eager.to("meta")
    _assert_same(model, eager)
    # a strided view: to("meta")'s layout rule, as for a real tensor
    t = torchdefer.deferred_init(lambda: torch.randn(4, 6)[:, ::2])
    real = torchdefer.materialize_tensor(t, "meta")
    reference = torch.randn(4, 6)[:, ::2].to("meta")
    assert (real.device, real.shape, real.stride()) == (reference.device, reference.shape,
                                                        reference.stride())


def test_a_conjugate_view_on_meta_has_its_bit_as_eager_has_it():
    build = lambda: torch.randn(3, dtype=torch.complex64).conj()  # noqa: E731
    with torch.device("meta"):
        eager, lazy = build(), torchdefer.deferred_init(build)
    real = torchdefer.materialize_tensor(lazy)
    assert real.is_meta and real.is_conj() == eager.is_conj()
    # to("meta") resolves the bit
    real = torchdefer.materialize_tensor(torchdefer.deferred_init(build), "meta")
    assert real.is_meta and real.is_conj() == build().to("meta").is_conj()


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("kind", ["safetensors", "torch.save", "dcp"])
def test_loading_a_checkpoint_file_under_a_setting_gives_eagers_tensors(setting, kind, tmp_path):
    torch.manual_seed(0)
    eager = nn.Linear(4, 3)
    path = tmp_path / {"safetensors": "m.safetensors", "torch.save": "m.pt", "dcp": "dcp"}[kind]
    if kind == "safetensors":
        from safetensors.torch import save_file

        save_file(eager.state_dict(), str(path))
    elif kind == "dcp":
        import torch.distributed.checkpoint as dcp

        dcp.save(eager.state_dict(), checkpoint_id=str(path), no_dist=True)
    else:
        torch.save(eager.state_dict(), path)
    model = torchdefer.deferred_init(nn.Linear, 4, 3)
    with SETTINGS[setting]():
        torchdefer.load_state_dict(model, path)
    for name, ref in eager.named_parameters():
        real = getattr(model, name)
        assert (type(real), real.device, real.dtype, real.requires_grad, real.is_inference()) == (
            nn.Parameter, ref.device, ref.dtype, True, False), name
        assert torch.equal(real, ref), name


def test_a_model_recorded_on_cuda_materializes_to_meta_on_a_host_without_cuda():
    model = torchdefer.deferred_init(Model, "cuda")
    torchdefer.materialize_module(model, device="meta")
    for name, t in model.state_dict(keep_vars=True).items():
        assert t.is_meta and not torchdefer.is_fake(t), name
    assert isinstance(model.lin.weight, nn.Parameter) and model.lin.weight.requires_grad


@pytest.mark.parametrize("setting", ["with_meta", "default_meta", "with_cuda", "default_cuda"])
def test_a_parameter_of_a_parameter_under_a_device_context_is_a_parameter(setting):
    def build():
        p = nn.Parameter(torch.ones(3, device="cpu"), requires_grad=False)
        with SETTINGS[setting]():
            return nn.Parameter(p)

    eager = build()
    lazy = torchdefer.deferred_init(build)
    assert type(lazy) is not torch.Tensor and isinstance(lazy, nn.Parameter)
    real = torchdefer.materialize_tensor(lazy)
    assert (type(real), real.requires_grad) == (type(eager), eager.requires_grad)
    assert torch.equal(real, eager)


def test_draws_inside_and_after_an_inference_block_of_one_recording():
    def build():
        w = torch.empty(4, 2)
        with torch.inference_mode():
            a = torch.empty(37).log_normal_()  # the generator's marker is made here
        nn.init.trunc_normal_(w, std=0.02)  # and updated here, outside inference mode
        b = torch.randn(5)
        return a, w, b

    torch.manual_seed(0)
    eager = build()
    eager_next = torch.rand(3)
    torch.manual_seed(0)
    lazy = torchdefer.deferred_init(build)
    assert torch.equal(torch.rand(3), eager_next)
    for a, b in zip(lazy, eager):
        real = torchdefer.materialize_tensor(a)
        assert torch.equal(real, b) and real.is_inference() == b.is_inference()


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_data_reads_while_recording_under_a_setting_give_eagers_values(setting):
    def build():
        t = torch.randn(5, device="cpu")
        n = int((t > 0).sum().item())  # replays a slice while recording
        xs = t.tolist()
        w = nn.init.trunc_normal_(torch.empty(4, 4, device="cpu"))  # reads what it draws
        return t * n, w, torch.tensor(xs, device="cpu")

    torch.manual_seed(0)
    with SETTINGS[setting]():
        eager = build()
    eager_next = torch.rand(2, device="cpu")
    torch.manual_seed(0)
    with SETTINGS[setting]():
        lazy = torchdefer.deferred_init(build)
    assert torch.equal(torch.rand(2, device="cpu"), eager_next)
    for a, b in zip(lazy, eager):
        real = torchdefer.materialize_tensor(a)
        assert torch.equal(real, b) and real.dtype == b.dtype
        assert real.is_inference() == b.is_inference()


def _inference_kinds():
    with torch.inference_mode():
        made_inside = torch.ones((4, 4))
    set_to_it = torch.empty(0, dtype=made_inside.dtype).set_(made_inside)  # stays normal
    set_to_a_view = torch.empty(0).set_(made_inside[1:])
    view_of_it = made_inside[1:]
    normal = torch.ones(3)
    with torch.inference_mode():
        view_inside = normal.view(3)  # a view of a normal tensor stays normal
    return made_inside, set_to_it, set_to_a_view, view_of_it, normal, view_inside


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_inference_kind_is_the_tensors_own_not_its_storages(order):
    # Found by the fuzzer (seed 20261125): t.set_(inference tensor) outside
    # inference mode is a normal tensor in eager, and came back an inference one.
    eager = _inference_kinds()
    lazy = torchdefer.deferred_init(_inference_kinds)
    pairs = list(zip(lazy, eager))
    for fake, want in pairs if order == "forward" else reversed(pairs):
        got = torchdefer.materialize_tensor(fake)
        assert got.is_inference() == want.is_inference()
        assert torch.equal(got, want)
