"""Differential fuzzing: random construction programs, eager vs deferred, bit for bit.

Each focus mixes one class of issue 9 into ordinary tensor code (see
``program.FOCUS``); every program is run eagerly and under ``deferred_init``
from the same seed and materialized in four orders (``differential.py``). A
failure prints a shrunk, standalone reproduction. The long profile:

    TORCHDEFER_FUZZ_PROGRAMS=10000 .venv/bin/python -m pytest tests/fuzz -q
"""

import pytest

from program import FOCUS
from runner import run_focus


@pytest.mark.parametrize("focus", list(FOCUS))
def test_fuzzed_programs_match_eager_bit_for_bit(focus):
    report = run_focus(focus)
    failures = report.outcomes["failed"]
    assert not failures, (
        f"{failures} fuzz program(s) differ from eager.\n{report.summary()}\n\n"
        + "\n\n".join(report.repros)
    )


def test_a_program_that_raises_in_eager_is_skipped_not_counted():
    from differential import check
    from program import Program

    program = Program(seed=0, segments=(("t1 = torch.ones(2) + torch.ones(3)",),))
    assert check(program).status == "skipped"


def test_a_refusal_by_torchdefer_is_reported_not_failed():
    from differential import check
    from program import Program

    # Writing in place to a real tensor from outside cannot be deferred: refused.
    program = Program(seed=0, segments=(("ext.add_(1)", "t1 = ext * 1"),))
    outcome = check(program)
    assert outcome.status == "refused", outcome.detail
    assert "RecordingError" in outcome.detail


def test_a_shrunk_failure_prints_a_standalone_reproduction():
    from program import Program, render

    program = Program(seed=3, segments=(("t1 = torch.ones(3)",), ("t2 = torch.randn(2)",)),
                      eager_draw_between=(True,))
    script = render(program, "reverse", ["1:t2", "0:t1"], "tensor 1:t2: values differ")
    compile(script, "<repro>", "exec")
    assert "torch.randn(3)  # an eager draw" in script and "['1:t2', '0:t1']" in script


def test_the_comparison_is_bitwise_and_covers_layout_grad_and_parameter_ness():
    import torch
    from torch import nn

    from differential import _differs

    x = torch.tensor([0.0, float("nan")])
    assert _differs(x.clone(), x) is None  # NaN equals NaN bit for bit
    assert "values" in _differs(torch.tensor([-0.0, float("nan")]), x)
    assert "strides" in _differs(torch.zeros(2, 3).t().contiguous(), torch.zeros(2, 3).t())
    assert "requires_grad" in _differs(torch.zeros(2).requires_grad_(), torch.zeros(2))
    assert "Parameter" in _differs(nn.Parameter(torch.zeros(2)), torch.zeros(2).requires_grad_())
