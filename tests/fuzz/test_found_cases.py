"""Minimal programs the fuzzer found, kept as regression tests (issue 9).

Each case is a shrunk fuzz program, checked exactly as the fuzzer checks one
(eager vs deferred, four materialization orders, generators afterwards).
"""

import pytest

from differential import check
from program import Program

CASES: dict[str, Program] = {
    # list-of-views aliasing
    "init_through_chunks_writes_the_base": Program(0, ((
        "t1 = torch.zeros(6)",
        "for i, p in enumerate(t1.chunk(3)): p.fill_(i + 1.0)",
    ),)),
    "unbind_outputs_share_the_base_storage": Program(0, ((
        "t1 = torch.ones((4, 4))",
        "t2, t3 = t1.chunk(3, 1)",
    ),)),
    "zeroing_a_split_with_sizes_view_writes_the_base": Program(0, ((
        "t4 = torch.tensor([1.25, 1.5, 2.0, 1.75, 1.0, -2.25])",
        "t5, t6 = t4.split_with_sizes([1, 5], 0)",
        "with torch.no_grad(): t6.zero_()",
    ),)),
    # set_
    "set_to_a_tensor_shares_its_storage": Program(0, ((
        "t1 = torch.arange(35, dtype=torch.float32).reshape((5, 7)) * 3.0",
        "t5 = torch.empty(0, dtype=t1.dtype).set_(t1)",
    ),)),
    "writes_after_set_are_seen_through_both": Program(0, ((
        "t1 = torch.empty((4, 4)).fill_(0.1)",
        "t9 = torch.empty(0).set_(t1)",
        "t1.zero_()",
    ),)),
    "set_to_a_storage_offset_size_and_stride_replays": Program(0, ((
        "t1 = torch.eye(5)",
        "t5 = torch.empty(0, dtype=t1.dtype).set_(t1.untyped_storage(), 12, (11,))",
    ),)),
    # storage growth under live views (issue 24, class 0)
    "a_random_init_through_a_transposed_view_after_resize_as_keeps_the_grown_fill": Program(1, ((
        "t1 = torch.eye(4)",
        "t2 = t1.t(); o_ = t1.untyped_storage().nbytes() // t1.element_size(); "
        "s_ = t1.storage_offset(); t1.resize_as_(torch.empty(o_ + 17 - s_, dtype=t1.dtype)); "
        "t1[o_ - s_:].fill_(0.5); torch.nn.init.xavier_normal_(t2)",
    ),)),
    "an_out_argument_grows_the_storage_a_later_full_write_of_a_view_keeps": Program(2, ((
        "t1 = torch.ones((17,))",
        "t2 = t1.view(-1); o_ = t1.untyped_storage().nbytes() // t1.element_size(); "
        "t3 = torch.empty(0, dtype=t1.dtype).set_(t1.untyped_storage(), o_, (0,)); "
        "torch.full((1,), 3.0, dtype=t1.dtype, out=t3); t2.normal_()",
    ),)),
    "set_to_a_tensor_with_a_size_grows_the_storage_under_an_expanded_view": Program(7, ((
        "t1 = torch.zeros((4, 6))",
        "t2 = t1.flip(0)",
        "t8 = t2.unsqueeze(0).expand(2, *t2.shape)[1]; "
        "o_ = t2.untyped_storage().nbytes() // t2.element_size(); s_ = t2.storage_offset(); "
        "a_ = min(10, o_ - s_); t9 = torch.zeros(1, dtype=t2.dtype); "
        "t9.set_(t2, a_, (o_ + 16 - s_ - a_,), (1,)); t9[o_ - s_ - a_:].fill_(0.5); t8.fill_(1.5)",
    ),)),
    "a_view_of_a_resized_base_used_after_requires_grad_is_refused_not_crashed": Program(0, ((
        "t1 = torch.full((1, 5), -1.25, dtype=torch.float16)",
        "t4 = t1.diagonal(); t1.resize_(10); t1[5:].fill_(0.1); t4.fill_(1.5)",
        "t1.requires_grad_()",
        "t15 = t4.reshape(-1)",
    ),)),
    # seed 20261202 (storage_growth): set_'s binding takes no __torch_function__,
    # so autograd's assert on the source view's history escaped as a raw
    # "new_fn INTERNAL ASSERT FAILED" (issue 24)
    "set_to_a_view_whose_history_autograd_cannot_rebuild_is_refused_not_crashed": Program(
        20261673, ((
            "t1 = torch.arange(16.0).sin().reshape((4, 4))",
            "t1.requires_grad_()",
            "t3 = t1.as_strided((2,), (2,), 1)",
            "t6 = t3[1:]",
            "with torch.no_grad(): t6.add_(1)",
            "t13 = torch.empty(0, dtype=t3.dtype).set_(t3)",
        ),)),
    # the replay cache: a view rebuilt through its base (the layout replay gave
    # differs from the meta kernel's) still aliases the base materialized before
    "data_of_a_zeros_like_with_eager_strides_shares_its_storage": Program(86028489, ((
        "t1 = torch.linspace(-2, 3, 35).reshape((5, 7))",
        "t2 = t1.unflatten(0, (1, -1))",
        "t4 = t2.diagonal()",
        "t6 = t4.flip(0)",
        "t7 = torch.zeros_like(t6)",
        "t11 = t7.data",
    ),)),
    "data_of_a_product_of_a_transposed_view_shares_its_storage": Program(86028553, ((
        "t2 = torch.zeros((1, 5))",
        "t4 = t2.mT",
        "t6 = t4 * 3",
        "t7 = t6.data",
    ),)),
    # default dtype
    "log_of_int_arange_under_float64_default_is_float64": Program(0, ((
        "torch.set_default_dtype(torch.float64)",
        "t3 = torch.log(torch.arange(1, 7))",
    ),)),
    "int_division_under_bfloat16_default_is_bfloat16": Program(0, ((
        "torch.set_default_dtype(torch.bfloat16)",
        "t1 = torch.arange(0, 8, 2) / 8",
        "t2 = torch.exp(torch.arange(8) * -0.6)",
    ),)),
    # questions
    "is_pinned_answers_as_eager": Program(0, ((
        "t5 = torch.ones((2, 3))",
        "v8 = t5.is_pinned()",
    ),)),
    "is_same_size_answers_as_eager": Program(0, ((
        "t1 = torch.ones((17,))",
        "t7 = torch.ones((2, 16))",
        "v10 = t1.is_same_size(t7)",
    ),)),
    "promote_types_answers_as_eager": Program(0, ((
        "t1 = torch.full((3, 11), 3.0)",
        "v3 = torch.promote_types(t1.dtype, torch.float16)",
    ),)),
    # batch norm in train mode
    "batch_norm_forward_updates_running_stats_as_eager": Program(0, ((
        "t2 = torch.arange(15, dtype=torch.float32).reshape((3, 5)) * 3.0",
        "m3 = nn.BatchNorm1d(5, affine=False)",
        "t16 = m3(t2); t16 = m3(t2 * 2)",
    ),)),
    "functional_batch_norm_updates_the_stats_tensors": Program(0, ((
        "t8 = torch.full((2, 3, 4), 0.1)",
        "t16 = torch.ones((3,))",
        "t25 = F.batch_norm(t8, t16, t16.abs() + 1, training=True, momentum=0.3)",
    ),)),
    # external tensors changed without a version bump
    "external_changed_through_data_is_not_replayed_stale": Program(0, (("t13 = ext * 2",),),
                                                                   mutation="ext.data.add_(1)"),
    "numpy_array_changed_after_from_numpy_is_not_replayed_stale": Program(
        0, (("t11 = torch.from_numpy(arr).float()",),), mutation="arr += 1"),
    # numpy arrays read while recording keep eager's strides (numpy sums in stride order)
    "numpy_sum_of_an_expanded_view_is_eagers": Program(0, ((
        "t1 = torch.arange(24.0).sin().reshape((2, 3, 4))",
        "t2 = t1.expand(2, *t1.shape)",
        "v3 = t2.numpy().sum().item()",
        "t12 = torch.full((3,), 0.1, dtype=torch.float64)",
        "t12.add_(v3)",
    ),)),
    "numpy_sum_of_a_permuted_slice_is_eagers": Program(0, ((
        "t1 = torch.arange(60.0).cos().reshape((3, 4, 5))",
        "v2 = float(t1.permute(2, 0, 1)[:, 1:].numpy().sum())",
        "v3 = float(t1[:, ::2].__array__().sum())",
        "t4 = torch.zeros(2, dtype=torch.float64).add_(v2).add_(v3)",
    ),)),
    "write_after_a_numpy_read_is_kept": Program(0, ((
        "t1 = torch.tensor([4, 8, 2, 4, 7])",
        "t2 = t1.detach()",
        "v10 = t2.numpy().sum().item()",
        "with torch.no_grad(): t1[0] = 1.5",
    ),)),
    # strides of storages rebuilt from the cache (fake strides differ for size-1 dims)
    "like_of_a_transposed_row_keeps_eager_strides_after_caching": Program(0, ((
        "t1 = torch.zeros((1, 5))",
        "t4 = torch.ones_like(t1.t())",
        "t19 = t4.to(torch.float64)",
    ),)),
    "data_of_randn_like_keeps_eager_strides": Program(0, ((
        "t1 = torch.zeros((1, 5), dtype=torch.float32)",
        "t12 = torch.randn_like(t1.t(), memory_format=torch.preserve_format)",
        "t13 = t12.data",
    ),)),
    # references held before materialize_module (a live view blocks swap_tensors)
    "buffer_registered_from_a_tensor_with_a_view_stays_that_tensor": Program(0, ((
        "t6 = torch.empty((37,)).fill_(3.0)",
        "t17 = t6.unsqueeze(0)",
        "m1 = nn.LayerNorm(4)",
        "m1.register_buffer('buf', t6)",
    ),)),
    # random custom ops without the nondeterministic_seeded tag (class 11)
    "an_untagged_random_custom_op_is_recorded_as_random_or_refused": Program(0, ((
        "t1 = torch.zeros(5)",
        "t2 = noise_untagged(t1)",
    ),)),
    # RNG: reseeds, restores, generators, consecutive deferred_init calls
    "reseeding_to_the_seed_in_force_repeats_the_draws": Program(0, ((
        "t4 = torch.randperm(16)",
        "torch.manual_seed(torch.initial_seed())",
        "t24 = torch.randn((3,))",
    ),)),
    "fork_rng_restores_the_state_around_recorded_draws": Program(0, ((
        "with torch.random.fork_rng(devices=[]): t14 = torch.randn((17,))",
        "t17 = torch.randn(3)",
    ),)),
    "generator_manual_seed_repeats_the_draws": Program(0, ((
        "t1 = torch.multinomial(torch.linspace(0.1, 1, 3), 5, replacement=True, generator=g0)",
        "g0.manual_seed(g0.initial_seed())",
        "t5 = torch.bernoulli(torch.full((2, 16), 0.4), generator=g0)",
    ),)),
    "set_rng_state_restores_a_state_taken_before_recorded_draws": Program(0, ((
        "s1 = ('cpu', torch.get_rng_state())",
        "t2 = torch.rand(4)",
        "torch.set_rng_state(s1[1])",
        "t3 = torch.rand(4)",
    ),)),
    "the_global_generator_ends_where_eager_leaves_it": Program(0, (("m1 = nn.Linear(5, 5)",),)),
    "an_explicit_generator_ends_where_eager_leaves_it": Program(0, ((
        "t1 = torch.randn(17, generator=g0)",
    ),)),
    "exponential_geometric_cauchy_log_normal_take_a_generator": Program(0, ((
        "t1 = torch.empty(17).exponential_(1.5, generator=g1)",
        "t2 = torch.empty(17).geometric_(0.3, generator=g1)",
        "t3 = torch.empty(17).cauchy_(generator=g0)",
        "t4 = torch.empty(17).log_normal_(generator=g0)",
    ),)),
    "three_deferred_init_calls_in_a_row_draw_as_eager": Program(
        0, (("t1 = torch.randn(3)",), ("t1 = torch.randn(3)",), ("t1 = torch.rand(20)",)),
        eager_draw_between=(False, True)),
    # ambient settings and threads (issue 24, classes 1, 2 and 4)
    "draws_after_an_inference_block_inside_one_recording": Program(24226, ((
        "t2 = torch.arange(16, dtype=torch.float32).reshape((4, 4)) * 0.5",
        "with torch.enable_grad(): t3 = t2[:, 1::2]",
        "with torch.inference_mode(): t13 = torch.empty((37,)).log_normal_()",
        "with torch.device('meta'): nn.init.trunc_normal_(t3, std=0.02)",
    ),)),
    "a_parameter_of_a_parameter_under_a_default_device": Program(24622, ((
        "torch.set_default_device('cpu')",
        "with torch.enable_grad(): t3 = torch.arange(33, dtype=torch.float32).reshape((3, 11)) * -1.25",
        "t6 = nn.Parameter(t3.clone(), requires_grad=False)",
        "t7 = nn.Parameter(t6)",
    ),), materialize_under="settings(dtype=torch.float64)"),
    "an_expanded_tensor_copied_into_itself_is_accepted": Program(24304, ((
        "t3 = torch.arange(5, dtype=torch.float32).reshape((1, 5)) * 0.1",
        "t6 = t3.expand(2, *t3.shape)",
        "with torch.no_grad(): t6.copy_(t6)",
    ),)),
    "an_expanded_meta_tensor_written_in_place_is_accepted": Program(24385, ((
        "torch.set_default_device('meta')",
        "t3 = torch.eye(3)",
        "t6 = t3.expand(2, *t3.shape)",
        "t6.clamp_(-0.5, 0.5)",
    ),)),
    "a_view_of_a_parameter_under_inference_mode_requires_grad": Program(7164, ((
        "t2 = torch.ones((1, 5), dtype=torch.float16)",
        "t3 = nn.Parameter(t2)",
        "with torch.inference_mode(): t6 = t3.mT",
    ),)),
    "a_write_to_an_inference_tensor_outside_inference_mode": Program(7069, ((
        "with torch.inference_mode(): t6 = torch.ones((1, 5), dtype=torch.float64)",
        "__import__('ambient_families').attempt(lambda: t6.log_normal_())",
        "t7 = t6 * 1",
    ),)),
    "a_worker_thread_draws_between_recorded_draws": Program(3, ((
        "t1 = __import__('ambient_families').worker().run(lambda: torch.rand(5)).clone()",
    ), (
        "t2 = torch.randn(17)",
        "t3 = __import__('ambient_families').worker().run(lambda: torch.rand(5)).clone()",
        "t4 = torch.randn(4, 4)",
    )), eager_draw_between=(False,)),
    # issue 24, seed 20261125: storage sharing where the kernel's strides differ
    # from the meta kernel's in a size-1 dimension, and a .data swap under a view
    "a_view_of_abs_of_a_permuted_size_1_view_shares_after_a_write": Program(20261537, ((
        "t1 = torch.full((2, 3, 4), 2)",
        "t2 = t1.unsqueeze(0)",
        "t4 = t2.permute(1, 0, *range(2, 4))",
        "t5 = t4.abs()",
        "t10 = t5.permute(1, 0, *range(2, 4))",
        "t5.copy_(t5)",
    ),)),
    "an_expanded_view_of_a_flipped_strided_view_shares_after_a_write": Program(20261295, ((
        "t1 = torch.ones((2, 16))",
        "t2 = t1[::2]",
        "t6 = t2.flip(0)",
        "t12 = t6.expand(2, *t6.shape)",
        "t6[0] = 1.5",
    ),)),
    "an_int_view_of_a_base_given_float_data_that_requires_grad": Program(20261159, ((
        "t1 = torch.ones((4, 4))",
        "t3 = torch.multinomial(torch.ones(3, 100), 2)",
        "t4 = t3.flatten()",
        "t3.data = t1.clone()",
        "t3.requires_grad_()",
    ),)),
    # issue 24, seed 20261126: elementwise outputs' strides in size-1 and size-0
    # dimensions, which the meta kernels lay out otherwise than eager
    "a_normal_through_data_of_hardtanh_of_a_movedim_view": Program(20261244, ((
        "t1 = torch.linspace(-2, 3, 24).reshape((2, 3, 4))",
        "t5 = torch.nn.functional.hardtanh(t1.unsqueeze(-1).movedim(-1, 0)); t6 = t5.data",
        "t6.normal_()",
        "nn.init.ones_(t5)",
    ),)),
    "a_normal_of_a_part_of_clamp_of_a_permuted_column": Program(20261399, ((
        "t15 = torch.zeros((37,))",
        "t16 = torch.nn.functional.hardtanh(t15.unsqueeze(0).movedim(0, 1))",
        "t21 = t16.unsqueeze(1).unsqueeze(0).permute(2, 1, 0, 3).clamp(-1, 1)",
        "t22 = t21[..., 1:]; t22.normal_()",
    ),)),
    "a_normal_of_a_part_of_softplus_of_a_movedim_view": Program(20261521, ((
        "t1 = torch.ones((24,))",
        "t3 = t1.unsqueeze(1).unsqueeze(0).permute(2, 1, 0) * 2; t4 = t3.transpose(0, 1)",
        "t20 = torch.nn.functional.softplus(t4.unsqueeze(-1).movedim(-1, 0))",
        "t21 = t20[..., 1:]; t21.normal_()",
    ),)),
    "a_normal_of_an_empty_part_of_a_column_times_2": Program(20261532, ((
        "t1 = torch.ones((37,))",
        "t3 = t1.unsqueeze(0).movedim(0, 1) * 2; t4 = t3[..., 1:]; t4.normal_()",
    ),)),
    "a_zeroed_relu_of_a_permuted_column_and_its_empty_part": Program(20261250, ((
        "t5 = torch.linspace(0, 1, 5)",
        "t14 = t5.unsqueeze(1).unsqueeze(0).permute(2, 1, 0).relu(); t15 = t14[..., 1:]",
        "t14.zero_()",
        "nn.init.normal_(t15, 0, 0.02)",
    ),)),
    "a_split_part_of_a_clamped_column_viewed_as_bytes": Program(20261300, ((
        "t3 = torch.linspace(-2, 3, 6)",
        "t7 = t3.unsqueeze(0).movedim(0, 1).clamp(-1, 1)",
        "t9, t10, t11 = t7.split(2, 0)",
        "with torch.no_grad(): t13 = t10.view(torch.uint8)",
    ),)),
    # seed 20261205 (ambient): composite views under inference mode, a meta default device
    "a_reshaped_parameter_under_inference_mode_requires_grad": Program(20261205000404, ((
        "with torch.device('cpu'): t1 = torch.empty((24,)).fill_(3.0)",
        "t2 = nn.Parameter(t1 * 2)",
        "with torch.inference_mode(): t4 = t2.reshape(-1)",
    ),)),
    "data_assigned_under_a_meta_default_device_has_the_meta_kernels_strides": Program(
        20261205000005, ((
            "torch.set_default_device('meta')",
            "t1 = torch.randint(3, (1, 5), dtype=torch.float32)",
            "t3 = t1.cumsum(0)",
            "t4 = t3.transpose(0, -1)",
            "t4.data = t4 * 1",
        ),)),
    # seed 20261207 (eager_refusals): .data of a real meta tensor set to a deferred one
    "data_of_a_real_meta_tensor_set_to_a_deferred_one": Program(20261207000339, ((
        "torch.set_default_device('meta')",
        "t5 = torch.arange(7, dtype=torch.int32)",
        "t6 = torch.tensor([-0.75, 1.0, 0.25, 0.0, 0.0, -1.5])",
        "t10 = t5.select(0, -1)",
        "t6.data = t10 * 1",
    ),)),
    # seed 20261208 (ambient): a view of a leaf view under inference mode
    "a_flattened_leaf_view_under_inference_mode_does_not_require_grad": Program(
        20261208000000, ((
            "t10 = torch.arange(15.0).sin().reshape((3, 5))",
            "t10.requires_grad_()",
            "with torch.inference_mode(): t23 = t10.flatten()",
        ),)),
}

# torchdefer's own refusal inside a program's attempt(): it must reach the harness
# as a refusal, not be swallowed into a silent difference (seed 20261205, everything).
REFUSED: dict[str, Program] = {
    "a_kaiming_init_into_a_from_numpy_tensor_inside_attempt": Program(20261205000318, ((
        "t1 = torch.from_numpy(arr).float()",
        "t5 = t1.unflatten(0, (1, -1))",
        "__import__('ambient_families').attempt(lambda: nn.init.kaiming_uniform_(t5))",
    ),)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_found_case_matches_eager(case):
    outcome = check(CASES[case])
    assert outcome.status in ("ok", "refused"), f"{outcome.order}: {outcome.detail}"


@pytest.mark.parametrize("case", list(REFUSED))
def test_found_case_is_refused_loudly(case):
    outcome = check(REFUSED[case])
    assert outcome.status == "refused", f"{outcome.status} {outcome.order}: {outcome.detail}"
