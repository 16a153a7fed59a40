"""What deferred_init records, checked against eager construction."""

import gc
import weakref

import numpy as np
import psutil
import pytest
import torch
from torch import nn

import torchdefer
from parity import assert_same_tensor, build_both
from torchdefer.errors import ExternalTensorModifiedError
from torchdefer.recorder import RecordingError


def materialized(objs):
    return [torchdefer.materialize_tensor(t) for t in objs]


def check_program(fn, seed=0):
    eager, deferred = build_both(fn, seed=seed)
    for i, (ref, t) in enumerate(zip(eager, deferred, strict=True)):
        assert torchdefer.is_fake(t)
        assert_same_tensor(torchdefer.materialize_tensor(t), ref, f"output {i}")


def test_deferring_a_40_gib_model_allocates_nothing():
    rss = psutil.Process().memory_info().rss
    m = torchdefer.deferred_init(
        lambda: nn.Sequential(nn.Linear(100_000, 50_000), nn.Linear(50_000, 50_000))
    )
    m.to(torch.float64)
    assert psutil.Process().memory_info().rss - rss < 256 * 2**20
    assert sum(p.numel() for p in m.parameters()) > 7_500_000_000


def test_deferred_tensor_prints_as_fake():
    t = torchdefer.deferred_init(torch.zeros, 2, 3, device="cuda")
    assert repr(t) == "tensor(..., size=(2, 3), device='cuda:0', fake=True)"


def test_fake_cuda_tensors_behave_as_eager_on_a_host_without_gpu():
    def build():
        a = torch.ones(3, device="cuda")
        b = torch.zeros_like(a)
        with torch.device("cuda"):
            c = torch.empty(2)
        return a, b, c, a.is_cuda

    a, b, c, is_cuda = torchdefer.deferred_init(build)
    assert is_cuda and a.is_cuda and b.device == torch.device("cuda", 0)
    assert c.device.type == "cuda"


def test_device_specific_branches_see_the_requested_device():
    def build():
        a = torch.ones(2, device="cuda")
        return a if a.is_cuda else a + 1

    out = torchdefer.deferred_init(build)
    assert torch.equal(torchdefer.materialize_tensor(out, device="cpu"), torch.ones(2))


def test_random_ops_with_an_explicit_generator_match_eager():
    def build():
        g = torch.Generator().manual_seed(7)
        a = torch.randn(4, generator=g)
        b = torch.empty(3).uniform_(generator=g)
        c = torch.randn(2)
        return a, b, c

    check_program(build)


def test_inplace_on_a_base_after_a_view_was_taken_reaches_the_view():
    def build():
        a = torch.ones(2, 2)
        b = a.view(-1)
        a.add_(2)
        c = a[0]
        c.mul_(3)
        return a, b, c

    check_program(build)


def test_data_get_and_set_are_recorded():
    def build():
        p = nn.Parameter(torch.empty(3, 3))
        p.data.normal_()
        d = p.data
        p.data = torch.randn(3, 3) * 2
        d.add_(1)
        return p, d

    check_program(build)


def test_no_grad_blocks_and_nn_init_functions_match_eager():
    def build():
        ts = [torch.empty(6, 4) for _ in range(9)]
        with torch.no_grad():
            nn.init.orthogonal_(ts[0])
            nn.init.trunc_normal_(ts[1], std=0.02)
            nn.init.sparse_(ts[2], sparsity=0.5)
            nn.init.xavier_uniform_(ts[3])
            nn.init.xavier_normal_(ts[4])
            nn.init.kaiming_uniform_(ts[5], a=5**0.5)
            nn.init.kaiming_normal_(ts[6])
            nn.init.eye_(ts[7])
            nn.init.dirac_(ts[8].view(6, 4, 1)) if False else nn.init.constant_(ts[8], 0.3)
        return ts

    check_program(build)


def test_linear_algebra_in_init_code_matches_eager():
    def build():
        a = torch.randn(5, 5)
        q, r = torch.linalg.qr(a)
        return q, r, torch.linalg.cholesky(a @ a.T + torch.eye(5)), torch.linalg.svd(a)[1]

    check_program(build)


def test_constants_from_python_data_are_captured_by_value():
    data = [1.0, 2.0, 3.0]

    def build():
        return torch.tensor(data)

    eager, deferred = build_both(build)
    data[:] = [7.0, 7.0, 7.0]  # the list is copied by torch.tensor, in eager code too
    assert torch.equal(torchdefer.materialize_tensor(deferred), eager)


def test_tensors_on_numpy_memory_alias_it_as_in_eager_and_changes_are_refused():
    array = np.arange(6, dtype=np.float32)

    def build():
        t = torch.from_numpy(array)
        return t, t * 2

    eager, deferred = build_both(build)
    assert torch.equal(torchdefer.materialize_tensor(deferred[1]), eager[1])
    array[:] = 100  # eager's t sees this; its product does not
    with pytest.raises(ExternalTensorModifiedError, match="numpy array behind torch.from_numpy"):
        torchdefer.materialize_tensor(deferred[0])


def test_data_dependent_reads_during_construction_work():
    def build():
        rates = [x.item() for x in torch.linspace(0, 0.1, 12)]
        noise = torch.rand(4)
        listed = noise.tolist()
        flag = bool(noise.sum() > 2)
        arr = noise.numpy()
        return rates, listed, flag, arr.copy(), noise

    torch.manual_seed(3)
    eager = build()
    torch.manual_seed(3)
    deferred = torchdefer.deferred_init(build)
    assert deferred[:3] == eager[:3]
    assert np.array_equal(deferred[3], eager[3])
    assert torch.equal(torchdefer.materialize_tensor(deferred[4]), eager[4])


def test_ops_after_deferred_init_returns_are_recorded():
    def post(m):
        m.to(torch.float64)
        m[1].half()
        m[2].weight = m[0].weight
        with torch.no_grad():
            m[0].bias.add_(1)
        m.apply(lambda s: nn.init.zeros_(s.bias) if isinstance(s, nn.Linear) and s.out_features == 3 else None)
        return m

    def build():
        return nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 3))

    torch.manual_seed(0)
    eager = post(build())
    torch.manual_seed(0)
    deferred = post(torchdefer.deferred_init(build))
    torchdefer.materialize_module(deferred)
    from parity import assert_same_module

    assert_same_module(deferred, eager)
    assert deferred[2].weight is deferred[0].weight


def test_ops_whose_output_depends_on_data_are_computed_and_replay_like_eager():
    def build():
        x = torch.randn(10)
        positive = torch.nonzero(x > 0)
        selected = x[x > 0]
        values = torch.unique(torch.randint(0, 5, (20,)))
        same = torch.equal(x, x.clone()) and torch.allclose(x, x * 1.0)
        repeated = torch.repeat_interleave(torch.tensor([1, 2]), torch.tensor([2, 3]))
        x[x < 0] = 0
        return positive, selected, values, repeated, x * 2, same

    torch.manual_seed(0)
    eager = build()
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(build)
    assert deferred[-1] is eager[-1] is True
    for ref, t in zip(eager[:-1], deferred[:-1], strict=True):
        assert torchdefer.is_fake(t)
        assert_same_tensor(torchdefer.materialize_tensor(t), ref)
    assert len(deferred[0]._graph.observations) >= 5


def test_unsupported_layout_argument_raises_at_recording_time():
    with pytest.raises(RecordingError, match=r"layout=torch.sparse_coo.*test_recording.py"):
        torchdefer.deferred_init(lambda: torch.empty(2, 2, layout=torch.sparse_coo))


def test_inplace_write_to_an_external_real_tensor_is_refused():
    real = torch.ones(3)
    with pytest.raises(RecordingError, match="outside deferred_init"):
        torchdefer.deferred_init(lambda: real.add_(1))


def test_failing_constructor_leaves_no_mode_patch_or_default_behind():
    def build():
        torch.set_default_dtype(torch.float64)
        torch.set_default_device("cpu")
        torch.empty(3)
        raise ValueError("boom")

    modes = torch._C._len_torch_dispatch_stack()
    from_numpy = torch.from_numpy
    with pytest.raises(ValueError, match="boom"):
        torchdefer.deferred_init(build)
    assert torch.get_default_dtype() == torch.float32
    assert torch._C._len_torch_dispatch_stack() == modes
    assert torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None
    assert torch.from_numpy is from_numpy
    assert not torchdefer.is_fake(torch.empty(1))


def test_materialized_graph_is_freed():
    m = torchdefer.deferred_init(lambda: nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)))
    graph = weakref.ref(m[0].weight._graph)
    torchdefer.materialize_module(m)
    gc.collect()
    assert graph() is None


def test_mixing_tensors_of_two_recordings_is_refused():
    a = torchdefer.deferred_init(torch.ones, 2)
    b = torchdefer.deferred_init(torch.ones, 2)
    with pytest.raises(RecordingError, match="two different deferred_init"):
        a + b


def test_indexing_and_assignment_on_fake_cuda_tensors_replay_like_eager_on_cpu():
    def build(device):
        w = torch.zeros(4, 4, device=device)
        w[[0, 2], 1] = 5.0
        w[1] = torch.arange(4.0, device=device)
        emb = nn.Embedding(10, 4, padding_idx=0, device=device)
        return w, emb.weight, w.t().contiguous(), w.new_tensor([1.0, 2.0])

    torch.manual_seed(0)
    eager = build("cpu")
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(build, "cuda")
    assert all(t.is_cuda for t in deferred)
    for ref, t in zip(eager, deferred, strict=True):
        assert torch.equal(torchdefer.materialize_tensor(t, device="cpu"), ref)


@torch.library.custom_op("torchdefer_test::cpu_only_double", mutates_args=())
def _cpu_only_double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_op_without_meta_kernel_names_itself_and_the_line():
    def build():
        return _cpu_only_double(torch.ones(3))

    with pytest.raises(RecordingError, match=r"cpu_only_double.*no meta implementation.*test_recording.py:\d+"):
        torchdefer.deferred_init(build)


def test_saving_a_deferred_model_says_to_materialize_first():
    import io

    m = torchdefer.deferred_init(nn.Linear, 2, 2)
    with pytest.raises(RuntimeError, match=r"Cannot save or pickle a fake tensor \(\(2, 2\).*Materialize it first"):
        torch.save(m.state_dict(), io.BytesIO())


def test_a_default_dtype_set_while_building_is_replayed_after_it_was_restored():
    def build():
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            return nn.Linear(3, 3), torch.arange(4.0), torch.full((2,), 1.5)
        finally:
            torch.set_default_dtype(previous)

    eager, deferred = build_both(build)
    assert_same_tensor(torchdefer.materialize_module(deferred[0]).weight, eager[0].weight)
    for ref, t in zip(eager[1:], deferred[1:], strict=True):
        assert_same_tensor(torchdefer.materialize_tensor(t), ref)


def test_reseeding_inside_and_after_construction_matches_eager():
    def build():
        a = nn.Linear(4, 4)
        torch.manual_seed(123)  # a new epoch of the default generator
        b = nn.Linear(4, 4)
        g = torch.Generator().manual_seed(7)
        c = torch.randn(3, generator=g)
        return nn.ModuleDict({"a": a, "b": b}), c, torch.randn(2)

    def after(m):
        torch.manual_seed(5)
        m.apply(lambda s: nn.init.normal_(s.weight) if isinstance(s, nn.Linear) else None)
        nn.init.uniform_(m["b"].bias)
        return m

    torch.manual_seed(0)
    eager = build()
    after(eager[0])
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(build)
    after(deferred[0])
    torchdefer.materialize_module(deferred[0])
    from parity import assert_same_module

    assert_same_module(deferred[0], eager[0])
    for ref, t in zip(eager[1:], deferred[1:], strict=True):
        assert_same_tensor(torchdefer.materialize_tensor(t), ref)


def test_an_eager_draw_between_recorded_draws_matches_eager():
    def program(defer):
        torch.manual_seed(0)
        m = defer(nn.Linear, 4, 4)
        x = torch.randn(10)  # an eager draw after the recorded ones
        nn.init.uniform_(m.bias)  # recorded after deferred_init returned
        return m, x, torch.randn(3)

    eager = program(lambda f, *a: f(*a))
    deferred = program(torchdefer.deferred_init)
    torchdefer.materialize_module(deferred[0])
    from parity import assert_same_module

    assert_same_module(deferred[0], eager[0])
    assert_same_tensor(deferred[1], eager[1])
    assert_same_tensor(deferred[2], eager[2])


VIEWS_READ_BY_NUMPY = {
    "transposed": lambda x: x.transpose(0, 2),
    "strided": lambda x: x[:, ::2],
    "expanded": lambda x: x[0].expand(3, 4, 5),
    "scalar": lambda x: x[0, 0, 0],
    "empty": lambda x: x[:, :0],
    "bool": lambda x: x > 0,
    "int_slice": lambda x: (x * 10).long()[:, 1:],
    "half_permuted": lambda x: x.half().permute(1, 0, 2),
}


@pytest.mark.parametrize("read", ["numpy", "asarray", "numpy_force"])
@pytest.mark.parametrize("view", sorted(VIEWS_READ_BY_NUMPY))
def test_numpy_reads_while_building_have_eagers_strides_and_sums(view, read):
    # numpy's reductions follow the array's strides: a copy in another layout
    # (zero strides of expand() dropped) sums in another order.
    def build():
        v = VIEWS_READ_BY_NUMPY[view](torch.arange(60.0).sin().reshape(3, 4, 5))
        a = {"numpy": v.numpy, "asarray": lambda: np.asarray(v), "numpy_force": lambda: v.numpy(force=True)}[read]()
        return a.strides, a.dtype.str, repr(a.sum())

    assert torchdefer.deferred_init(build) == build()


@pytest.mark.parametrize("tensor", [
    lambda: torch.randn(3, requires_grad=True) * 1,
    lambda: torch.randn(3, dtype=torch.cfloat).conj(),
    lambda: torch.randn(3, dtype=torch.cfloat).conj().imag,
])
def test_numpy_reads_while_building_refuse_what_eager_refuses(tensor):
    with pytest.raises(RuntimeError) as eager:
        tensor().numpy()
    with pytest.raises(RuntimeError) as deferred:
        torchdefer.deferred_init(lambda: tensor().numpy())
    assert str(deferred.value) == str(eager.value)


@pytest.mark.parametrize("read", ["tolist", "item", "numpy", "asarray", "bool"])
def test_a_write_after_a_data_read_is_kept(read):
    def build():
        t = torch.tensor([4.0, 8.0])
        v = t[:1]
        {"tolist": v.tolist, "item": v.item, "numpy": lambda: v.numpy().sum(),
         "asarray": lambda: np.asarray(v).sum(), "bool": lambda: bool(v)}[read]()
        with torch.no_grad():
            t.mul_(3)
        return t

    assert_same_tensor(torchdefer.materialize_tensor(torchdefer.deferred_init(build)), build())
