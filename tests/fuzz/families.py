"""The instruction families of the fuzzer: each makes one line of Python.

A program is plain Python over names ``t<k>`` (tensors), ``v<k>`` (Python
values read from tensors), ``m<k>`` (modules), ``s<k>`` (RNG states) and the
generators ``g0``/``g1`` the harness passes in. Each family is one maker: it
looks at the eager namespace built so far (``Ctx.env``) and returns one line
(or None when nothing fits). The generator runs each line
eagerly and keeps it only if it ran, so the makers may propose lines that fail.

Every issue-9 class has a family here (random ops and generator state in
``random_families.py``); ``FOCUS`` in ``program.py`` mixes them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ambient_families import ambient, refused, thread
from context import FLOATS, Ctx, with_no_grad
from cover_families import cover
from random_families import custom_random, random_on, random_op, rng_state
from storage_families import grow, relaid

__all__ = ["FAMILIES"]

# --- deterministic tensors -------------------------------------------------

def _factory(ctx: Ctx) -> str:
    s, t = ctx.shape(), ctx.new()
    n = eval(f"torch.Size({s}).numel()")
    return ctx.rng.choice([
        f"{t} = torch.arange({n}, dtype=torch.float32).reshape({s}) * {ctx.num()}",
        f"{t} = torch.linspace(-2, 3, {n}).reshape({s})",
        f"{t} = torch.full({s}, {ctx.num()}{ctx.dtype_arg()})",
        f"{t} = torch.zeros({s}{ctx.dtype_arg()})",
        f"{t} = torch.ones({s}{ctx.dtype_arg()})",
        f"{t} = torch.empty({s}{ctx.dtype_arg()}).fill_({ctx.num()})",
        f"{t} = torch.arange({n}.0).sin().reshape({s})",
        f"{t} = torch.tensor([{', '.join(str(ctx.rng.randint(-9, 9) / 4) for _ in range(6))}])",
        f"{t} = torch.eye({ctx.rng.randint(2, 5)})",
    ])


def _int_factory(ctx: Ctx) -> str:
    t = ctx.new()
    n = ctx.rng.randint(2, 20)
    return ctx.rng.choice([
        f"{t} = torch.arange(1, {n})",
        f"{t} = torch.arange({n}, dtype=torch.int32)",
        f"{t} = torch.tensor([{', '.join(str(ctx.rng.randint(1, 9)) for _ in range(5))}])",
        f"{t} = torch.arange(0, {2 * n}, 2).reshape(-1, 1)",
    ])


# --- views -------------------------------------------------------------------

def _view(ctx: Ctx) -> str | None:
    x = ctx.pick()
    if x is None:
        return None
    t, d = ctx.new(), ctx.env[x].dim()
    options = [f"{t} = {x}.detach()", f"{t} = {x}.unsqueeze(0)", f"{t} = {x}[...]",
               f"{t} = {x}.view(-1)", f"{t} = {x}.reshape(-1)", f"{t} = {x}.data"]
    if d >= 1:
        options += [f"{t} = {x}[1:]", f"{t} = {x}[::2]", f"{t} = {x}.narrow(0, 0, 1)",
                    f"{t} = {x}.select(0, -1)", f"{t} = {x}.unflatten(0, (1, -1))",
                    f"{t} = {x}.as_strided((2,), (2,), 1)", f"{t} = {x}.expand(2, *{x}.shape)"]
    if d >= 2:
        options += [f"{t} = {x}.t()", f"{t} = {x}[:, 1::2]", f"{t} = {x}.diagonal()",
                    f"{t} = {x}.transpose(0, -1)", f"{t} = {x}.permute(1, 0, *range(2, {d}))",
                    f"{t} = {x}.mT", f"{t} = {x}[1].view(-1)", f"{t} = {x}.flatten()"]
    return ctx.rng.choice(options)


def _multi_view(ctx: Ctx) -> str | None:
    x = ctx.pick(lambda t: t.dim() >= 1 and 1 <= t.shape[0] <= 8)
    if x is None:
        return None
    e = ctx.env[x]
    dim = ctx.rng.randrange(e.dim())
    n = e.shape[dim]
    expr = ctx.rng.choice([
        f"{x}.unbind({dim})", f"{x}.split(2, {dim})", f"{x}.chunk(3, {dim})",
        f"{x}.tensor_split(3, {dim})", f"{x}.split_with_sizes([1, {n - 1}], {dim})",
        f"{x}.tensor_split([1], {dim})", f"torch.unbind({x})", f"{x}.hsplit(2)" if e.dim() >= 2 else f"{x}.chunk(2)",
    ])
    try:
        count = len(eval(expr, {"torch": torch}, {x: e}))
    except Exception:
        return None
    outs = [ctx.new() for _ in range(count)]
    return f"{', '.join(outs)}{',' if count == 1 else ''} = {expr}"


def _multi_view_init(ctx: Ctx) -> str | None:
    x = ctx.pick_float(min_dim=1)
    if x is None:
        return None
    e = ctx.env[x]
    parts = ctx.rng.choice([f"{x}.chunk(2)", f"{x}.unbind(0)", f"{x}.split(1)",
                            f"{x}.tensor_split(2)", f"{x}.chunk(3, -1)"])
    body = ctx.rng.choice([
        "p.fill_(i * 0.5)", "p.mul_(-3)", "p.add_(i)", "nn.init.constant_(p, 0.25 * i)",
        "p.copy_(torch.full_like(p, i + 0.5))", "nn.init.zeros_(p)",
        "nn.init.xavier_uniform_(p)" if e.dim() >= 3 else "p.uniform_(-1, 1)",
        "p.normal_(0, 0.02)",
    ])
    line = f"for i, p in enumerate({parts}): {body}"
    return with_no_grad(ctx, line) if e.requires_grad else line


# --- in-place writes through any alias ---------------------------------------------

def _inplace(ctx: Ctx) -> str | None:
    x = ctx.pick()
    if x is None:
        return None
    e = ctx.env[x]
    y = ctx.pick(lambda t, s=e.shape, d=e.dtype: t.shape == s and t.dtype == d)
    options = [f"{x}.add_(1)", f"{x}.mul_(-2)", f"{x}.fill_({ctx.num()})", f"{x}.zero_()",
               f"{x}.clamp_(-0.5, 0.5)", f"{x}.copy_({y})", f"{x}.add_({y}, alpha=0.5)",
               f"{x}[0] = 1.5" if e.dim() else f"{x}.fill_(1)", f"{x}.sin_()",
               f"{x}.div_(3)", f"nn.init.ones_({x})", f"nn.init.constant_({x}, {ctx.num()})",
               f"{x}.masked_fill_({x} > 0, 7)", f"{x}.unsqueeze_(0)", f"{x}.squeeze_()",
               f"{x}.copy_({x}.flip(0))" if e.dim() else f"{x}.neg_()"]
    if e.dim() == 2:
        options += [f"{x}.t_()", f"{x}.transpose_(0, 1)", f"nn.init.eye_({x})",
                    f"{x}[:, 0] = {x}[:, -1]"]
    if e.dim() >= 1:
        options += [f"{x}[-1:] = 2"]
    return with_no_grad(ctx, ctx.rng.choice(options))


def _compute(ctx: Ctx) -> str | None:
    x = ctx.pick()
    if x is None:
        return None
    e, t = ctx.env[x], ctx.new()
    y = ctx.pick(lambda u, s=e.shape: u.shape == s)
    options = [f"{t} = {x} * 3", f"{t} = {x} + {y}", f"{t} = {x}.clone()",
               f"{t} = {x}.contiguous()", f"{t} = {x}.float()", f"{t} = {x}.double()",
               f"{t} = {x}.half()", f"{t} = {x}.bfloat16()", f"{t} = {x}.to(torch.float64)",
               f"{t} = torch.zeros_like({x})", f"{t} = torch.ones_like({x}, dtype=torch.float16)",
               f"{t} = torch.empty_like({x}).fill_(2)", f"{t} = {x}.new_zeros(3)",
               f"{t} = {x}.new_ones((2, 2))", f"{t} = {x}.new_full((3,), 1.5)",
               f"{t} = torch.where({x} > 0, {x}, {y})", f"{t} = {x}.abs()",
               f"{t} = torch.cat([{x}, {y}])", f"{t} = torch.stack([{x}, {y}])",
               f"{t} = {x}.clone(memory_format=torch.contiguous_format)",
               f"{t} = {x}.sum()", f"{t} = {x}.to({x})"]
    if e.dim() >= 1:
        options += [f"{t} = {x}.sum(0)", f"{t} = {x}.cumsum(0)", f"{t} = {x}.softmax(-1)",
                    f"{t} = {x}.flip(0)", f"{t} = {x}.repeat(2, *[1] * ({e.dim()} - 1))"]
    if e.dim() == 2:
        options += [f"{t} = {x} @ {x}.t()", f"{t} = F.linear({x}, {x})",
                    f"{t} = {x}.t().contiguous()"]
    return ctx.rng.choice(options)


def _data(ctx: Ctx) -> str | None:
    x, y = ctx.pick(), ctx.pick()
    if x is None:
        return None
    t = ctx.new()
    return ctx.rng.choice([f"{t} = {x}.data", f"{x}.data = {y}", f"{x}.data = {y} * 1",
                           f"{x}.data = {y}.clone()", f"{x}.data.add_(1)",
                           f"{x}.data = {x}.data.t()" if ctx.env[x].dim() == 2 else f"{t} = {x}.data"])


def _param(ctx: Ctx) -> str | None:
    x = ctx.pick_float()
    if x is None:
        return None
    t = ctx.new()
    return ctx.rng.choice([
        f"{t} = nn.Parameter({x})", f"{t} = nn.Parameter({x}.clone(), requires_grad=False)",
        f"{t} = nn.Parameter({x} * 2)",
        f"{x}.requires_grad_()", f"{t} = {x}.detach().requires_grad_()",
    ])


# --- default dtype and type promotion -------------------------------------------------

def _default_dtype(ctx: Ctx) -> str:
    return f"torch.set_default_dtype({ctx.rng.choice(FLOATS)})"


def _promote(ctx: Ctx) -> str | None:
    x = ctx.pick(lambda t: not t.is_floating_point() and t.dtype != torch.bool)
    t = ctx.new()
    n = ctx.rng.randint(2, 9)
    free = [f"{t} = torch.arange({n}) * 1.5", f"{t} = torch.tensor([1, 2, 3]) / 2",
            f"{t} = torch.tensor(2.5)", f"{t} = torch.tensor([0.5, 1.5])",
            f"{t} = torch.full((3,), 1.5)", f"{t} = torch.linspace(0, 1, {n})",
            f"{t} = torch.arange(0.0, {n})", f"{t} = torch.zeros({n})",
            f"{t} = torch.exp(torch.arange({n}) * -0.6)", f"{t} = torch.log(torch.arange(1, {n}))",
            f"{t} = torch.arange(0, {2 * n}, 2) / {n}", f"{t} = 10000 ** (torch.arange(0, {2 * n}, 2) / {2 * n})",
            f"{t} = torch.empty({n}).fill_(1)", f"{t} = torch.as_tensor([1.0, 2.0])"]
    if x is None:
        return ctx.rng.choice(free)
    return ctx.rng.choice([
        *free, f"{t} = torch.log({x})", f"{t} = torch.exp({x} * -0.6)", f"{t} = {x} / 3",
        f"{t} = {x} / {x}", f"{t} = torch.sqrt({x})", f"{t} = torch.pow({x}, 0.5)",
        f"{t} = {x} * 0.5", f"{t} = 0.5 * {x}", f"{t} = torch.sigmoid({x})",
        f"{t} = torch.true_divide({x}, 2)", f"{t} = {x}.to(torch.get_default_dtype())",
        f"{t} = torch.atan2({x}, {x})", f"{t} = {x}.float() / {x}", f"{t} = torch.rsqrt({x})",
        f"{t} = {x} ** -1.0", f"{t} = torch.sin({x})",
    ])


# --- data read while building --------------------------------------------------------

def _data_read(ctx: Ctx) -> str | None:
    x = ctx.pick()
    if x is None:
        return None
    e, v, t = ctx.env[x], ctx.new("v"), ctx.new()
    y = ctx.pick_float()
    values = ctx.names("v", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))
    options = [f"{v} = {x}.sum().item()", f"{v} = {x}.tolist()", f"{v} = bool(({x} > 0).any())",
               f"{v} = float({x}.flatten()[0])" if e.numel() else f"{v} = {x}.tolist()",
               f"{v} = int({x}.argmax())" if e.numel() else f"{v} = {x}.numel()",
               f"{t} = {x}.nonzero()", f"{t} = {x}[{x} > 0]", f"{t} = {x}.masked_select({x} != 0)",
               f"{t} = torch.tensor({x}.tolist())", f"{t} = torch.unique({x})",
               f"{v} = {x}.numpy().sum().item()" if e.dtype != torch.bfloat16 else f"{v} = {x}.tolist()"]
    if y is not None:
        options += [f"if bool({x}.sum() > 0): {y}.add_(1)" if e.numel() else f"{y}.add_(2)",
                    f"{y}[{y} > 0.5] = 0.0"]
    if y is not None and values:
        options.append(with_no_grad(ctx, f"{y}.add_({ctx.rng.choice(values)})"))
    return ctx.rng.choice(options)


# --- questions ------------------------------------------------------------------------

def _question(ctx: Ctx) -> str | None:
    x, y, z = ctx.pick(), ctx.pick(), ctx.pick_float()
    if x is None:
        return None
    v = ctx.new("v")
    q = ctx.rng.choice([
        f"{x}.is_same_size({y})", f"torch.can_cast({x}.dtype, {y}.dtype)",
        f"torch.result_type({x}, {y})", f"torch.result_type({x}, 2.5)", f"{x}.is_pinned()",
        f"torch.promote_types({x}.dtype, {y}.dtype)", f"{x}.is_contiguous()",
        f"{x}.is_set_to({y})", f"torch.is_floating_point({x})", f"torch.equal({x}, {y})",
        f"{x}.is_nonzero()" if ctx.env[x].numel() == 1 else f"{x}.is_complex()",
        f"{x}.storage_offset()", f"{x}.is_leaf", f"{x}.requires_grad", f"{x}.untyped_storage().nbytes()",
    ])
    if z is not None and ctx.rng.random() < 0.5:
        # The answer steers the program, as `if x.is_pinned():` would.
        return f"{v} = {q}; {z}.add_(1.0 if {v} else -1.0)"
    return f"{v} = {q}"


# --- set_ ----------------------------------------------------------------------------

def _set(ctx: Ctx) -> str | None:
    x = ctx.pick()
    if x is None:
        return None
    e = ctx.env[x]
    y = ctx.pick(lambda t, d=e.dtype: t.dtype == d)
    t = ctx.new()
    elements = e.untyped_storage().nbytes() // e.element_size()
    off = ctx.rng.randrange(max(1, elements))
    size = ctx.rng.randint(0, elements - off) if elements else 0
    return ctx.rng.choice([
        f"{y}.set_({x})", f"{t} = torch.empty(0, dtype={x}.dtype).set_({x})",
        f"{y}.set_({x}.untyped_storage(), {off}, ({size},), (1,))",
        f"{t} = torch.empty(0, dtype={x}.dtype).set_({x}.untyped_storage(), {off}, ({size},))",
        f"{y}.set_({x}.untyped_storage())", f"{t} = {x}.new_empty(0).set_({x}[1:])",
        f"{y}.set_()" if ctx.rng.random() < 0.2 else f"{y}.set_({x}.t())",
    ])


# --- batch norm in train mode, running stats updated --------------------------------

def _batch_norm(ctx: Ctx) -> str | None:
    x = ctx.pick(lambda t: t.dtype == torch.float32 and t.dim() in (2, 3) and t.shape[0] > 1)
    if x is None:
        return None
    e, m, t = ctx.env[x], ctx.new("m"), ctx.new()
    c = e.shape[1]
    mods = ctx.names("m", lambda mod: isinstance(mod, nn.modules.batchnorm._NormBase)
                     and mod.num_features == c)
    stats = ctx.pick(lambda u, c=c: u.shape == (c,) and u.dtype == torch.float32)
    options = [f"{m} = nn.BatchNorm1d({c})", f"{m} = nn.BatchNorm1d({c}, momentum=None)",
               f"{m} = nn.BatchNorm1d({c}, affine=False)",
               f"{t} = F.batch_norm({x}, torch.zeros({c}), torch.ones({c}), training=True)"]
    if e.dim() == 3:
        options += [f"{m} = nn.InstanceNorm1d({c}, track_running_stats=True)",
                    f"{t} = F.instance_norm({x}, torch.zeros({c}), torch.ones({c}), use_input_stats=True)"]
    if stats is not None:
        options.append(f"{t} = F.batch_norm({x}, {stats}, {stats}.abs() + 1, training=True, momentum=0.3)")
        options.append(f"{t} = F.batch_norm({x}, {stats}, None, training=True)")
    if mods:
        mod = ctx.rng.choice(mods)
        options += [f"{t} = {mod}({x})", f"{t} = {mod}({x}); {t} = {mod}({x} * 2)",
                    f"{mod}.eval(); {t} = {mod}({x}); {mod}.train()"]
    return ctx.rng.choice(options)


# --- real tensors from outside (ext) ------------------------------------------------

def _external(ctx: Ctx) -> str | None:
    t = ctx.new()
    return ctx.rng.choice([f"{t} = ext * 2", f"{t} = ext + 0", f"{t} = ext.clone()",
                           f"{t} = torch.cat([ext, ext])", f"{t} = ext[1:] * 1",
                           f"{t} = torch.from_numpy(arr) * 1", f"{t} = torch.from_numpy(arr).float()",
                           f"{t} = ext.sum(0)"])


# --- less common layouts and writes: dtype views, channels_last, scatter, unfold ------

def _exotic(ctx: Ctx) -> str | None:
    x = ctx.pick_float(min_dim=1)
    if x is None:
        return None
    e, t = ctx.env[x], ctx.new()
    same = ctx.pick(lambda u, s=e.shape: u.shape == s)
    options = [
        f"{t} = {x}.view(torch.int16 if {x}.element_size() == 2 else torch.int32 if {x}.element_size() == 4 else torch.int64)",
        f"{t} = {x}.view(torch.uint8)", f"{t} = {x}.unfold(0, 1, 1)", f"{t} = {x}.unfold(-1, 2, 1)",
        f"{t} = torch.empty_strided((3, 4), (1, 3)).fill_(1.5)", f"{t} = {x}.new_empty_strided((2, 2), (1, 2)).fill_(0)",
        f"{t} = torch.empty((2, 3, 4, 5), memory_format=torch.channels_last).fill_(1)",
        f"{t} = torch.arange(120.0).reshape(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)",
        f"{t} = torch.arange(120.0).reshape(2, 3, 4, 5).to(memory_format=torch.channels_last) * 2",
        f"{x}.copy_({same}.double())" if same else f"{x}.copy_(torch.ones(()))",
        f"{x}.copy_(torch.ones({e.shape[-1]}))", f"{x}.lerp_(torch.ones_like({x}), 0.25)",
        f"{x}.addcmul_({x}, {x}, value=0.5)", f"{x}.scatter_(0, torch.zeros_like({x}, dtype=torch.long), 2.0)",
        f"{x}.index_add_(0, torch.tensor([0]), torch.ones_like({x}[:1]))",
        f"{x}.index_copy_(0, torch.tensor([0]), {x}[-1:].clone())", f"{x}[torch.tensor([0])] = 4.0",
        f"{x}.put_(torch.tensor([0]), torch.tensor([9.0], dtype={x}.dtype))",
        f"{x}.clamp_(min=torch.zeros_like({x}))", f"{x}.type(torch.float64)",
        f"{t} = {x}.type(torch.float16)", f"{t} = torch.view_as_real(torch.complex({x}.float(), {x}.float()))",
    ]
    if e.dim() == 2:
        options += [f"{x}.tril_()", f"{x}.fill_diagonal_(5)", f"{t} = {x}.as_strided((2, 2), (1, 2), 1)"]
    return with_no_grad(ctx, ctx.rng.choice(options))


# --- modules: layers, casts, tying, apply(init), deepcopy -------------------------

def _module(ctx: Ctx) -> str | None:
    m = ctx.new("m")
    mods = ctx.names("m", lambda mod: isinstance(mod, nn.Module))
    a, b = ctx.rng.choice([(4, 6), (6, 4), (5, 5), (3, 17)])
    options = [f"{m} = nn.Linear({a}, {b})", f"{m} = nn.Linear({a}, {b}, bias=False, dtype=torch.float64)",
               f"{m} = nn.Embedding({a}, {b}, padding_idx=0)", f"{m} = nn.LayerNorm({b})",
               f"{m} = nn.Conv1d({a}, {b}, 3)", f"{m} = nn.Sequential(nn.Linear({a}, {b}), nn.GELU(), nn.Linear({b}, {a}))",
               f"{m} = nn.GRU({a}, {b})", f"{m} = nn.MultiheadAttention({b - b % 2 or 2}, 2)"]
    if mods:
        x, y = ctx.rng.choice(mods), ctx.rng.choice(mods)
        t = ctx.pick_float(min_dim=1)
        options += [
            f"{x}.half()", f"{x}.to(torch.float64)", f"{x}.bfloat16()", f"{x}.requires_grad_(False)",
            f"{x}.weight = {y}.weight", f"{m} = copy.deepcopy({x})",
            f"{x}.apply(lambda mod: nn.init.zeros_(mod.bias) if getattr(mod, 'bias', None) is not None else None)",
            f"{x}.apply(lambda mod: mod.reset_parameters() if hasattr(mod, 'reset_parameters') else None)",
            f"with torch.no_grad(): {x}.weight.mul_(0.5)", f"{x}.weight.data.normal_(0, 0.02)",
            f"{x}.register_buffer('extra', torch.arange(3.0), persistent=False)",
            f"{x}.weight = nn.Parameter({x}.weight.t().contiguous().t())",
        ]
        if t is not None:
            options += [f"{x}.weight = nn.Parameter({t})", f"{x}.register_buffer('buf', {t})",
                        f"{ctx.new()} = {x}({t})"]
    return ctx.rng.choice(options)


FAMILIES: dict[str, Callable[[Ctx], str | None]] = {
    "factory": _factory,
    "int_factory": _int_factory,
    "view": _view,
    "multi_view": _multi_view,
    "multi_view_init": _multi_view_init,
    "inplace": _inplace,
    "compute": _compute,
    "data": _data,
    "param": _param,
    "default_dtype": _default_dtype,
    "promote": _promote,
    "random": random_op,
    "random_on": random_on,
    "rng_state": rng_state,
    "data_read": _data_read,
    "question": _question,
    "set_": _set,
    "batch_norm": _batch_norm,
    "external": _external,
    "module": _module,
    "exotic": _exotic,
    "custom_random": custom_random,
    "ambient": ambient,
    "thread": thread,
    "refused": refused,
    "grow": grow,
    "cover": cover,
    "relaid": relaid,
}
