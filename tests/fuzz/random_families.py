"""Instruction makers for random ops and generator state (see ``families.py``)."""

from __future__ import annotations

import torch

from context import Ctx, with_no_grad

__all__ = ["custom_random", "random_on", "random_op", "rng_state"]


# --- random ops ------------------------------------------------------------------------

def random_op(ctx: Ctx) -> str | None:
    s, t, g, dt = ctx.shape(), ctx.new(), ctx.gen(), ctx.dtype_arg()
    n = ctx.rng.choice([3, 7, 15, 16, 17, 33, 100])
    fresh = f"torch.empty({s}{dt})"
    return ctx.rng.choice([
        f"{t} = torch.randn({s}{dt}{g})", f"{t} = torch.rand({s}{dt}{g})",
        f"{t} = torch.randint(0, 9, {s}{g})", f"{t} = torch.randint(-5, 5, {s}, dtype=torch.int32{g})",
        f"{t} = torch.randint(3, {s}, dtype=torch.float32{g})",
        f"{t} = torch.randperm({n}{g})", f"{t} = torch.randn({n}{dt}{g})",
        f"{t} = {fresh}.normal_(0.5, 2.0{g})", f"{t} = {fresh}.uniform_(-1, 1{g})",
        f"{t} = {fresh}.bernoulli_(0.3{g})",
        f"{t} = {fresh}.bernoulli_(torch.linspace(0, 1, torch.Size({s}).numel()).reshape({s}){g})",
        f"{t} = {fresh}.exponential_(1.5{g})", f"{t} = {fresh}.geometric_(0.3{g})",
        f"{t} = {fresh}.cauchy_({g[2:]})", f"{t} = {fresh}.log_normal_({g[2:]})",
        f"{t} = {fresh}.random_({g[2:]})", f"{t} = {fresh}.random_(10{g})",
        f"{t} = {fresh}.random_(-3, 10{g})",
        f"{t} = torch.empty({s}, dtype=torch.int64).random_({g[2:]})",
        f"{t} = torch.empty({s}, dtype=torch.int16).random_(100{g})",
        f"{t} = torch.multinomial(torch.linspace(0.1, 1, {n}), 3{g})",
        f"{t} = torch.multinomial(torch.linspace(0.1, 1, {n}), {n + 2}, replacement=True{g})",
        f"{t} = torch.multinomial(torch.ones(3, {n}), 2{g})",
        f"{t} = torch.normal(0.0, 1.0, {s}{g})",
        f"{t} = torch.normal(torch.zeros({s}), 2.0{g})",
        f"{t} = torch.bernoulli(torch.full({s}, 0.4){g})",
        f"{t} = torch.poisson(torch.full({s}, 3.0){g})",
    ])


def random_on(ctx: Ctx) -> str | None:
    """Random ops applied to tensors of the program: in-place inits, *_like, dropout."""
    x = ctx.pick_float()
    if x is None:
        return None
    e, t, g = ctx.env[x], ctx.new(), ctx.gen()
    options = [
        f"{x}.normal_({g[2:]})", f"{x}.uniform_(-0.1, 0.1{g})", f"{x}.bernoulli_(0.5{g})",
        f"{x}.exponential_({g[2:]})", f"{x}.cauchy_(0, 0.5{g})",
        f"{t} = torch.randn_like({x})", f"{t} = torch.rand_like({x})",
        f"{t} = torch.randint_like({x}, 5)", f"{t} = torch.randn_like({x}, dtype=torch.float64)",
        f"{t} = F.dropout({x}, 0.3, training=True)", f"{t} = F.dropout({x}, 0.5)",
        f"{t} = torch.dropout({x}, 0.2, True)", f"{t} = nn.Dropout(0.4)({x})",
        f"{t} = torch.bernoulli({x}.sigmoid(){g})", f"nn.init.normal_({x}, 0, 0.02{g})",
        f"nn.init.uniform_({x}{g})", f"nn.init.trunc_normal_({x}, std=0.02{g})",
    ]
    if e.dim() >= 2:
        options += [f"{t} = torch.randn_like({x}.t())", f"{t} = torch.rand_like({x}[:, ::2])",
                    f"{t} = torch.randn_like({x}.t(), memory_format=torch.preserve_format)",
                    f"nn.init.xavier_uniform_({x}{g})", f"nn.init.kaiming_uniform_({x}, a=5 ** 0.5{g})",
                    f"nn.init.kaiming_normal_({x}{g})", f"nn.init.orthogonal_({x}{g})",
                    f"nn.init.sparse_({x}, 0.5{g})" if e.dim() == 2 else f"{x}.normal_()"]
    return with_no_grad(ctx, ctx.rng.choice(options))


# --- generator state: reseeds, restores, fork_rng ------------------------------------

def rng_state(ctx: Ctx) -> str | None:
    states = ctx.names("s")  # ("cpu" | "g0" | "g1", state) pairs taken earlier
    gstates = [s for s in states if ctx.env[s][0] != "cpu"]
    cpu_states = [s for s in states if ctx.env[s][0] == "cpu"]
    s, t = ctx.new("s"), ctx.new()
    options = [
        "torch.manual_seed(torch.initial_seed())", f"torch.manual_seed({ctx.rng.randint(0, 99)})",
        "g0.manual_seed(g0.initial_seed())", f"g1.manual_seed({ctx.rng.randint(0, 99)})",
        f"{s} = ('cpu', torch.get_rng_state())", f"{s} = ('g0', g0.get_state())",
        f"{s} = ('g1', g1.get_state())",
        f"with torch.random.fork_rng(devices=[]): {t} = torch.randn({ctx.shape()})",
        f"with torch.random.fork_rng(devices=[]): torch.manual_seed(3); {t} = torch.rand(5)",
    ]
    if cpu_states:
        options.append(f"torch.set_rng_state({ctx.rng.choice(cpu_states)}[1])")
    if gstates:
        st = ctx.rng.choice(gstates)
        options.append(f"{ctx.env[st][0]}.set_state({st}[1])")
    return ctx.rng.choice(options)


# --- random custom ops (custom_ops.py): with and without the seeded tag ----------------

def custom_random(ctx: Ctx) -> str | None:
    x = ctx.pick(lambda t: t.dtype in (torch.float32, torch.float64))
    if x is None:
        return None
    op = ctx.rng.choice(["noise_tagged", "noise_untagged"])
    return with_no_grad(ctx, f"{ctx.new()} = {op}({x})")
