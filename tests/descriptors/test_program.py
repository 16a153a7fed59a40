"""Programs from partial descriptors: the graphs script() builds before any
call (the default dtype's and those listed), what save() refuses, and what a
loaded program answers for a case its file does not hold."""

import pytest
import torch

import torchdefer
from torchdefer.descriptors import MetaTensorType, MissingGraph

PARTIAL = MetaTensorType(["b", 4])  # dtype, device, layout open


def double(x):
    return x * 2 + x.sum(0)


class Lookup(torch.nn.Module):
    """An embedding by indexing: every torch version refuses float ids in its
    meta kernels (torch 2.8's ``embedding`` meta kernel does not check them)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(10, 3))

    def forward(self, input):
        return self.weight[input]


def embed_model():
    torch.manual_seed(0)
    return Lookup()


def test_partial_descriptor_saved_before_any_call_runs_the_default_dtype_after_load(tmp_path):
    p = torchdefer.script(double, {"x": PARTIAL})
    assert p.variants == 1
    assert p.output_descriptors.dtype == torch.get_default_dtype()
    torchdefer.save_program(p, tmp_path / "p.tdp")
    q = torchdefer.load_program(tmp_path / "p.tdp")
    for b in (2, 5):  # sizes 0 and 1 have graphs of their own, built by a call
        x = torch.randn(b, 4)
        torch.testing.assert_close(q(x), double(x))
    with pytest.raises(MissingGraph, match=r"no graph for this call \(.*torch.float16.*call the "
                                           r"scripted program with such inputs once before save"):
        q(torch.randn(2, 4, dtype=torch.float16))


def test_dtypes_lists_the_graphs_built_at_script_time(tmp_path):
    p = torchdefer.script(double, {"x": PARTIAL}, dtypes=[torch.float16, torch.bfloat16])
    assert p.variants == 3
    torchdefer.save_program(p, tmp_path / "p.tdp")
    q = torchdefer.load_program(tmp_path / "p.tdp")
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        x = torch.randn(3, 4).to(dtype)
        assert torch.equal(q(x), double(x))
    with pytest.raises(MissingGraph):
        q(torch.randn(3, 4, dtype=torch.float64))


def test_the_default_dtype_in_force_at_script_time_is_the_one_built():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        p = torchdefer.script(double, {"x": PARTIAL})
    finally:
        torch.set_default_dtype(previous)
    assert p.output_descriptors.dtype == torch.float64
    assert p.variants == 1


def test_every_dtype_described_builds_one_graph_whatever_dtypes_lists():
    p = torchdefer.script(double, {"x": MetaTensorType(["b", 4], torch.float32)},
                          dtypes=[torch.float16])
    assert p.variants == 1


def test_int_ids_with_an_open_dtype_script_and_save_refuses_with_the_reason(tmp_path):
    model = embed_model()
    p = torchdefer.script(model, {"input": MetaTensorType(["b"])})  # float ids cannot embed
    assert p.variants == 0
    with pytest.raises(MissingGraph, match=r"(?s)holds no graph yet \(building it for the "
                                           r"default dtype torch.float32 failed: .*dtypes=\["):
        torchdefer.save_program(p, tmp_path / "p.tdp")
    ids = torch.tensor([1, 4, 9, 2])
    torch.testing.assert_close(p(ids), model(ids))  # the first call builds its case
    torchdefer.save_program(p, tmp_path / "p.tdp")
    torch.testing.assert_close(torchdefer.load_program(tmp_path / "p.tdp")(ids), model(ids))


def test_int_ids_listed_in_dtypes_are_built_at_script_time(tmp_path):
    model = embed_model()
    p = torchdefer.script(model, {"input": MetaTensorType(["b"])}, dtypes=[torch.long])
    torchdefer.save_program(p, tmp_path / "p.tdp")
    ids = torch.tensor([[0, 3]]).flatten()
    torch.testing.assert_close(torchdefer.load_program(tmp_path / "p.tdp")(ids), model(ids))


def test_a_listed_dtype_the_model_refuses_raises_at_script_time():
    with pytest.raises(torchdefer.descriptors.DescriptorConflict):
        torchdefer.script(embed_model(), {"input": MetaTensorType(["b"])},
                          dtypes=[torch.float16])


def test_save_before_any_call_names_what_the_descriptors_leave_open(tmp_path):
    p = torchdefer.script(lambda x, mask: x if mask is None else x * mask, {
        "x": MetaTensorType(None, torch.float32), "mask": MetaTensorType | None})
    assert p.variants == 0
    with pytest.raises(MissingGraph, match=r"leave a rank, whether an Optional is None open\), "
                                           r"so the file could run no call"):
        torchdefer.save_program(p, tmp_path / "p.tdp")
    x = torch.randn(2, 3)
    torch.testing.assert_close(p(x, None), x)
    torchdefer.save_program(p, tmp_path / "p.tdp")  # now holds the case that call built
    torch.testing.assert_close(torchdefer.load_program(tmp_path / "p.tdp")(x, None), x)


def test_dtypes_with_another_property_open_is_refused_at_script_time():
    with pytest.raises(TypeError, match=r"dtypes=\[torch.float16\]\): the descriptors of .* also "
                                        r"leave a rank open"):
        torchdefer.script(double, {"x": MetaTensorType()}, dtypes=[torch.float16])


def test_jit_programs_are_generic_and_save_without_a_call(tmp_path):
    def f(x):
        return x * 2

    p = torchdefer.script(f, {"x": PARTIAL}, backend="jit")
    torchdefer.save_program(p, tmp_path / "p.tdp")
    q = torchdefer.load_program(tmp_path / "p.tdp", allow_torchscript=True)
    x = torch.randn(2, 4, dtype=torch.float16)
    torch.testing.assert_close(q(x), f(x))


@pytest.mark.parametrize("dtypes", [torch.float16, [float], ["float16"]])
def test_dtypes_that_are_not_a_list_of_torch_dtypes_are_refused(dtypes):
    with pytest.raises(TypeError, match=r"dtypes must be a list of torch dtypes"):
        torchdefer.script(double, {"x": PARTIAL}, dtypes=dtypes)
