"""Property: random programs of tensor ops give the same tensors eagerly and deferred.

A program is a list of instructions over a growing pool of tensors: factories,
random draws (default and explicit generators), views, in-place updates through
any alias, ``.data`` get and set, and out-of-place ops. It runs once eagerly and
once under ``deferred_init`` from the same seed; every tensor of the pool is then
materialized in an order hypothesis picks and compared with its eager twin.
"""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchdefer

SHAPE = (4, 6)

FACTORIES = ["zeros", "ones", "arange", "full", "empty_fill", "tensor"]
RANDOMS = ["randn", "rand", "normal_", "uniform_", "bernoulli_", "randperm", "randint"]
VIEWS = ["slice", "t", "flatten_view", "narrow", "diagonal", "data", "unsqueeze", "select"]
INPLACE = ["add_", "mul_", "normal_", "uniform_", "fill_", "clamp_", "zero_", "copy_", "add_t", "t_"]
BINARY = ["add", "mul_scalar", "sum0", "clone", "matmul_t"]

instruction = st.one_of(
    st.tuples(st.just("factory"), st.sampled_from(FACTORIES), st.integers(0, 50)),
    st.tuples(st.just("random"), st.sampled_from(RANDOMS), st.booleans()),
    st.tuples(st.just("view"), st.sampled_from(VIEWS), st.integers(0, 50)),
    st.tuples(st.just("inplace"), st.sampled_from(INPLACE), st.integers(0, 50), st.integers(0, 50)),
    st.tuples(st.just("binary"), st.sampled_from(BINARY), st.integers(0, 50), st.integers(0, 50)),
    st.tuples(st.just("data_set"), st.integers(0, 50), st.integers(0, 50)),
)


def run(program):
    """Interpret ``program``; the same code runs eagerly and under deferred_init."""
    generator = torch.Generator().manual_seed(1234)
    pool = [torch.zeros(SHAPE)]
    for step in program:
        kind = step[0]
        pick = lambda i: pool[i % len(pool)]  # noqa: E731
        if kind == "factory":
            name, n = step[1], step[2]
            pool.append(
                {
                    "zeros": lambda: torch.zeros(SHAPE),
                    "ones": lambda: torch.ones(SHAPE, dtype=torch.float64).float(),
                    "arange": lambda: torch.arange(24.0).reshape(SHAPE) * n,
                    "full": lambda: torch.full(SHAPE, float(n)),
                    "empty_fill": lambda: torch.empty(SHAPE).fill_(n / 7),
                    "tensor": lambda: torch.tensor([[float(n + i + j) for j in range(6)] for i in range(4)]),
                }[name]()
            )
        elif kind == "random":
            name, explicit = step[1], step[2]
            g = generator if explicit else None
            pool.append(
                {
                    "randn": lambda: torch.randn(SHAPE, generator=g),
                    "rand": lambda: torch.rand(SHAPE, generator=g),
                    "normal_": lambda: torch.empty(SHAPE).normal_(0.5, 2.0, generator=g),
                    "uniform_": lambda: torch.empty(SHAPE).uniform_(-1, 1, generator=g),
                    "bernoulli_": lambda: torch.empty(SHAPE).bernoulli_(0.3, generator=g),
                    "randperm": lambda: torch.randperm(24, generator=g).float().reshape(SHAPE),
                    "randint": lambda: torch.randint(0, 9, SHAPE, generator=g).float(),
                }[name]()
            )
        elif kind == "view":
            name, t = step[1], pick(step[2])
            if t.dim() < 2 and name in ("t", "diagonal", "narrow", "select"):
                continue
            if name == "t" and t.dim() > 2:  # eager refuses too
                continue
            if name == "slice" and t.dim() == 0:  # eager refuses too
                continue
            if name == "flatten_view" and not t.is_contiguous():
                continue
            pool.append(
                {
                    "slice": lambda: t[1:],
                    "t": lambda: t.t(),
                    "flatten_view": lambda: t.view(-1),
                    "narrow": lambda: t.narrow(1, 0, max(1, t.shape[1] // 2)),
                    "diagonal": lambda: t.diagonal(),
                    "data": lambda: t.data,
                    "unsqueeze": lambda: t.unsqueeze(0),
                    "select": lambda: t.select(0, 0),
                }[name]()
            )
        elif kind == "inplace":
            name, t, u = step[1], pick(step[2]), pick(step[3])
            if name in ("copy_", "add_t") and u.shape != t.shape:
                continue
            if name == "t_" and t.dim() != 2:
                continue
            {
                "add_": lambda: t.add_(1.5),
                "mul_": lambda: t.mul_(-2),
                "normal_": lambda: t.normal_(),
                "uniform_": lambda: t.uniform_(generator=generator),
                "fill_": lambda: t.fill_(3.25),
                "clamp_": lambda: t.clamp_(-0.5, 0.5),
                "zero_": lambda: t.zero_(),
                "copy_": lambda: t.copy_(u),
                "add_t": lambda: t.add_(u, alpha=0.5),
                "t_": lambda: t.t_(),
            }[name]()
        elif kind == "binary":
            name, t, u = step[1], pick(step[2]), pick(step[3])
            if name == "add" and u.shape != t.shape:
                continue
            if name in ("sum0", "matmul_t") and t.dim() == 0:
                continue
            pool.append(
                {
                    "add": lambda: t + u,
                    "mul_scalar": lambda: t * 3,
                    "sum0": lambda: t.sum(0),
                    "clone": lambda: t.clone(),
                    "matmul_t": lambda: t.reshape(t.shape[0], -1) @ t.reshape(t.shape[0], -1).T,
                }[name]()
            )
        elif kind == "data_set":
            t, u = pick(step[1]), pick(step[2])
            if t is not u:
                t.data = u * 1
    return pool


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.lists(instruction, min_size=1, max_size=14), order=st.randoms(use_true_random=False))
def test_random_programs_match_eager(program, order):
    torch.manual_seed(0)
    eager = run(program)
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(run, program)
    indices = list(range(len(eager)))
    order.shuffle(indices)
    reals = {i: torchdefer.materialize_tensor(deferred[i]) for i in indices}
    for i in range(len(eager)):
        real, ref = reals[i], eager[i]
        assert real.shape == ref.shape and real.dtype == ref.dtype, f"tensor {i}"
        assert real.stride() == ref.stride(), f"tensor {i}: strides"
        assert torch.equal(real, ref), f"tensor {i} differs:\n{real}\n{ref}"
