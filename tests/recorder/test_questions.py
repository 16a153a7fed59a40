"""Ops that answer a question about tensors answer as eager code would.

Bool/int/dtype results (``is_same_size``, ``can_cast``, ``result_type``,
``is_set_to``, ``is_pinned``, ``data_ptr`` relations ...) are plain values, not
recorded: they must be eager's answer, never a constant or a placeholder.
"""

import re

import pytest
import torch

import torchdefer
from torchdefer.fake._questions import ANSWERS, is_question

aten = torch.ops.aten

QUESTIONS = {
    "is_same_size": lambda x, y: x.is_same_size(y),
    "is_same_size_other_shape": lambda x, y: x.is_same_size(y[:2]),
    "aten_is_same_size": lambda x, y: aten.is_same_size.default(x, y.t()),
    "can_cast": lambda x, y: torch.can_cast(x.dtype, torch.int32),
    "can_cast_up": lambda x, y: torch.can_cast(torch.int32, x.dtype),
    "aten_can_cast": lambda x, y: aten.can_cast.default(torch.float32, torch.int32),
    "promote_types": lambda x, y: torch.promote_types(x.dtype, torch.int64),
    "aten_promote_types": lambda x, y: aten.promote_types.default(torch.float16, torch.int32),
    "result_type_scalar": lambda x, y: torch.result_type(x, 2),
    "result_type_tensors": lambda x, y: torch.result_type(x.long(), y.double()),
    "result_type_zero_dim": lambda x, y: torch.result_type(torch.tensor(1.5, dtype=torch.float64), y.long()),
    "aten_result_type": lambda x, y: aten.result_type.Scalar(x.long(), 2.0),
    "is_pinned": lambda x, y: x.is_pinned(),
    "aten_is_pinned": lambda x, y: aten.is_pinned.default(x),
    "is_set_to_other": lambda x, y: x.is_set_to(y),
    "is_set_to_self": lambda x, y: x.is_set_to(x),
    "is_set_to_full_view": lambda x, y: x.is_set_to(x[:]),
    "is_set_to_transpose": lambda x, y: x.is_set_to(x.t()),
    "is_set_to_after_set_": lambda x, y: torch.empty(0, device=y.device).set_(y).is_set_to(y),
    "is_nonzero": lambda x, y: x[1, 1].is_nonzero(),
    "has_same_storage_numel": lambda x, y: aten._has_same_storage_numel.default(x, x[1:]),
    "is_contiguous": lambda x, y: x.t().is_contiguous(),
    "is_channels_last": lambda x, y: x.view(1, 1, 3, 3).is_contiguous(memory_format=torch.channels_last),
    "is_non_overlapping_and_dense": lambda x, y: aten.is_non_overlapping_and_dense.default(x.t()),
    "debug_has_internal_overlap": lambda x, y: torch._debug_has_internal_overlap(x.expand(2, 3, 3)),
    "dense_and_sparse_dim": lambda x, y: (x.dense_dim(), x.sparse_dim()),
    "is_floating_point_complex_signed": lambda x, y: (x.is_floating_point(), x.is_complex(), x.is_signed()),
    "is_conj_neg": lambda x, y: (x.is_conj(), x.is_neg(), torch._neg_view(x).is_neg()),
    "is_inference_leaf": lambda x, y: (x.is_inference(), x.is_leaf, x.requires_grad),
    "sizes_and_strides": lambda x, y: (x.numel(), x.dim(), x.t().stride(1), x[1:].storage_offset(), x.nbytes),
    "sym_queries": lambda x, y: (aten.sym_size.int(x, 0), aten.sym_stride.int(x, 0), aten.sym_numel.default(x)),
    "equal": lambda x, y: torch.equal(x, y),
    "allclose": lambda x, y: torch.allclose(x, x + 1e-9),
    "is_shared": lambda x, y: x.is_shared(),
    "zerotensor": lambda x, y: x._is_zerotensor(),
    "version": lambda x, y: (x.add_(1), x._version)[1],
    "data_ptr_same_tensor": lambda x, y: x.data_ptr() == x.data_ptr(),
    "data_ptr_other_tensor": lambda x, y: x.data_ptr() == y.data_ptr(),
    "data_ptr_full_view": lambda x, y: x.data_ptr() == x.view(-1).data_ptr(),
    "data_ptr_offset": lambda x, y: x[1].data_ptr() - x.data_ptr(),
    "data_ptr_of_empty": lambda x, y: torch.empty(0).data_ptr(),
    "storage_ptr_of_views": lambda x, y: x[2].untyped_storage().data_ptr() == x.untyped_storage().data_ptr(),
    "storage_ptr_other": lambda x, y: x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr(),
    "typed_storage_ptr": lambda x, y: x.storage().data_ptr() == x[1:].storage().data_ptr(),
    "storage_ptr_after_set_": lambda x, y: torch.zeros(1, device=y.device).set_(y).data_ptr() == y.data_ptr(),
}


def ask_all(device="cpu"):
    x = torch.arange(9.0, device=device).reshape(3, 3)
    y = torch.ones(3, 3, device=device)
    answers = {}
    for name, ask in QUESTIONS.items():
        try:
            answers[name] = ask(x, y)
        except Exception as e:  # an error is an answer too: compare its type
            answers[name] = type(e)
    return answers


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_questions_answer_as_eager_inside_deferred_init():
    eager = ask_all()
    deferred = torchdefer.deferred_init(ask_all)
    for name in QUESTIONS:
        assert deferred[name] == eager[name], name


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_questions_answer_as_eager_on_fake_cuda_tensors():
    eager = ask_all()
    deferred = torchdefer.deferred_init(ask_all, "cuda")
    for name in QUESTIONS:
        assert deferred[name] == eager[name], name


# Data reads need deferred_init; set_ onto a deferred tensor from a real one is refused.
NOT_AFTER = {"is_nonzero", "equal", "allclose", "is_set_to_after_set_", "storage_ptr_after_set_"}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", sorted(set(QUESTIONS) - NOT_AFTER))
def test_questions_answer_as_eager_under_fake_mode_and_after_deferred_init(name):
    x, y = torch.arange(9.0).reshape(3, 3), torch.ones(3, 3)
    eager = QUESTIONS[name](x, y)
    with torchdefer.fake_mode():
        fx, fy = torch.arange(9.0).reshape(3, 3), torch.ones(3, 3)
        assert QUESTIONS[name](fx, fy) == eager
    dx, dy = torchdefer.deferred_init(lambda: (torch.arange(9.0).reshape(3, 3), torch.ones(3, 3)))
    assert QUESTIONS[name](dx, dy) == eager


def test_a_question_records_nothing():
    def build():
        x = torch.zeros(3)
        before = x._graph.op_count if hasattr(x, "_graph") else None
        x.is_same_size(x), torch.result_type(x, 2), x.is_set_to(x), x.is_pinned()
        return x, before

    x, before = torchdefer.deferred_init(build)
    assert x._graph.op_count == before


def test_pinning_while_recording_fails_where_eager_fails_on_this_host():
    try:  # eager's own verdict on this host (tests/materialize/test_pinned.py covers both)
        torch.zeros(3).pin_memory()
    except RuntimeError as e:
        with pytest.raises(RuntimeError, match=rf"test_questions.py:\d+.*{re.escape(str(e))}"):
            torchdefer.deferred_init(lambda: torch.zeros(3).pin_memory())
    else:
        assert torchdefer.deferred_init(lambda: torch.zeros(3).pin_memory()).is_pinned()


def _kernel(name, key):
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, key)


def test_every_aten_question_op_has_a_meta_answer_or_a_listed_one():
    """A new torch version adding a question op without a meta kernel fails here."""
    data_dependent = {"equal", "allclose", "is_nonzero", "item", "_local_scalar_dense"}
    # Sparse, quantized, nested and cuDNN/miopen-only queries: fake tensors are
    # dense and strided, and these raise (as a recording error) instead of answering.
    not_for_dense = {
        "_nnz", "_dimI", "_dimV", "q_scale", "q_zero_point", "q_per_channel_axis", "qscheme",
        "_nested_get_ragged_idx", "_nested_tensor_from_mask_left_aligned",
        "_use_cudnn_ctc_loss", "_use_miopen_ctc_loss", "_cslt_sparse_mm_search",
    }
    missing = []
    for full in torch._C._dispatch_get_all_op_names():
        if not full.startswith("aten::"):
            continue
        base, _, overload = full[6:].partition(".")
        op = getattr(getattr(torch.ops.aten, base), overload or "default", None)
        if op is None or not is_question(op) or base in data_dependent | not_for_dense:
            continue
        answered = op in ANSWERS or any(
            _kernel(full, key)
            for key in ("Meta", "CompositeImplicitAutograd", "CompositeExplicitAutograd")
        )
        if not answered:
            missing.append(full)
    assert not missing, f"question ops without an answer for fake tensors: {missing}"
