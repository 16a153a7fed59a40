"""The GPU probe's own logic, on the CPU: its cases cover the table, its predictions are the model's."""

from __future__ import annotations

import gpu_cases
import gpu_probe
import torch

from torchdefer.rng import cuda_increments
from torchdefer.rng.philox import DeviceShape, counter_increment

H100 = DeviceShape(132, 2048)
SMALL = DeviceShape(14, 1024)


def test_the_cases_cover_every_row_dtype_and_size_of_the_table():
    cases = gpu_cases.all_cases(H100)
    packets = {case.op.func.overloadpacket for case in cases}
    assert cuda_increments.RUN <= packets | {torch.ops.aten.rrelu_with_noise_,
                                            torch.ops.aten.bernoulli, torch.ops.aten._sample_dirichlet}
    counted = {c.op.func.overloadpacket for c in cases if c.op.counted}
    assert counted >= {torch.ops.aten.normal_, torch.ops.aten.uniform_, torch.ops.aten.random_,
                       torch.ops.aten.bernoulli_, torch.ops.aten.exponential_}
    assert {c.dtype for c in cases} == set(gpu_cases.DTYPES)
    t = gpu_cases.threads(H100)
    sizes = {c.layout.size for c in cases if len(c.layout.size) == 1}
    assert sizes == {(0,), (1,), (t,), (t + 1,), (2 * t + 1,), (8 * t + 1,)}


def test_the_threads_of_a_grid_are_sms_times_blocks_per_sm_times_the_block():
    assert gpu_cases.threads(H100) == 132 * 8 * 256
    assert gpu_cases.threads(SMALL) == 14 * 4 * 256


def test_predictions_are_the_models_at_the_sizes_that_part_the_unrolls():
    t = gpu_cases.threads(H100)
    by_label = {(c.op.name, c.dtype, c.layout.label): c for c in gpu_cases.all_cases(H100)}
    normal = by_label[("normal_", torch.float32, "8T+1")]
    assert normal.predicted(H100) == counter_increment(8 * t + 1, 4, H100) == 12
    double = by_label[("normal_", torch.float64, "8T+1")]
    assert double.predicted(H100) == counter_increment(8 * t + 1, 2, H100) == 20
    complex64 = by_label[("normal_", torch.complex64, "8T+1")]
    assert complex64.predicted(H100) == counter_increment(2 * (8 * t + 1), 4, H100)
    assert by_label[("normal_", torch.float32, "0")].predicted(H100) == 0
    assert by_label[("dropout", torch.float32, "T")].predicted(H100) is None  # run


def test_the_wide_view_passes_two_to_the_31_bytes_and_predicts_its_sub_launches():
    for dtype in gpu_cases.DTYPES:
        (layout,) = [lay for lay in gpu_cases.layouts(H100, dtype) if lay.label.startswith("2x3")]
        extent = (layout.size[0] - 1) * layout.stride[0] * dtype.itemsize
        assert extent >= 1 << 31
        item = dtype.itemsize // 2 if dtype.is_complex else dtype.itemsize
        size, stride = layout.size, layout.stride
        if dtype.is_complex:
            size, stride = (*size, 2), (*(2 * s for s in stride), 1)
        assert len(cuda_increments.launch_numels(size, stride, item)) > 1


def test_cells_show_matches_flag_mismatches_and_show_run_ops_unjudged():
    assert gpu_probe.cell(4, 4, True) == ("4", False)
    assert gpu_probe.cell(4, 8, True) == ("**4≠8**", True)
    assert gpu_probe.cell(None, 12, False) == ("(12)", False)
    assert gpu_probe.cell(4, gpu_probe.REFUSED, True) == ("-", False)


def test_the_probe_skips_cleanly_without_cuda(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_probe.main([]) == 0
    assert "skipped, no CUDA" in capsys.readouterr().out


def test_every_case_has_a_prediction_or_is_left_to_run():
    for shape in (H100, SMALL):
        for case in gpu_cases.all_cases(shape):
            predicted = case.predicted(shape)
            assert predicted is None or predicted >= 0, case
            if predicted is None and case.op.counted and case.layout.size != (0,):
                # counted rows predict for every dtype the kernel may take
                assert case.dtype.is_complex, case
