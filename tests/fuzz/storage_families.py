"""Storages under live views: ``grow`` (issue 24, class 0) and ``relaid``.

A line takes a view of a tensor of the program (of some kind: transposed,
strided, expanded, ``as_strided``, another dtype ...), grows the storage under
it (``resize_``, shrink then grow, ``resize_as_``, ``set_`` with a size, an
``out=`` argument), writes the grown region, then writes through the view
taken before (a fill, a random init, arithmetic). Eager has one storage
object: the view sees the growth and the tensor sees the view's write.

The grown region is always written before anything can read it: eager
leaves it uninitialized, so a program reading it would compare garbage.

``relaid``: a kernel whose output strides differ from its meta kernel's (an
elementwise op on a tensor with a size-1 dimension strided oddly, a
convolution of a channels_last input), a view of its output, a write after
the view. Materialized apart, the output and the view must share storage
and have eager's strides (the fuzz seed 20261125 found `abs` of a permuted
size-1 view materialized apart from its view as two storages).
"""

from __future__ import annotations

import torch

from context import Ctx

__all__ = ["grow", "relaid"]

# A view of `x` and the dimensions `x` needs for it.
_VIEWS = [
    ("{x}.view(-1)", 1), ("{x}[1:]", 1), ("{x}.unsqueeze(0).expand(2, *{x}.shape)[1]", 1),
    ("{x}.as_strided((2, 2), (1, 2), 1)", 1), ("{x}.view(torch.uint8)", 1),
    ("{x}.t()", 2), ("{x}.transpose(0, 1)[:, ::2]", 2), ("{x}[:, 1:]", 2),
    ("{x}.diagonal()", 2), ("{x}.unfold(0, 2, 1)", 2), ("{x}.permute(2, 0, 1)", 3),
]

_WRITES = [
    "{v}.fill_(1.5)", "{v}.zero_()", "{v}.add_(1)", "{v}.mul_(-2)", "{v}.normal_()",
    "{v}.uniform_(-1, 1)", "{v}.bernoulli_(0.5)", "{v}.copy_(torch.ones_like({v}))",
]
_WRITES_2D = ["torch.nn.init.xavier_normal_({v})", "torch.nn.init.kaiming_uniform_({v})",
              "torch.nn.init.orthogonal_({v})"]


def grow(ctx: Ctx) -> str | None:
    x = ctx.pick(lambda t: t.is_floating_point() and t.dim() >= 1 and not t.requires_grad
                 and t.numel() > 0)
    if x is None:
        return None
    e, v = ctx.env[x], ctx.new()
    view = ctx.rng.choice([f for f, dims in _VIEWS if e.dim() >= dims]).format(x=x)
    write = _write(ctx, v, view)
    return f"{v} = {view}; {_growth(ctx, x, e)}; {write}"


def _write(ctx: Ctx, v: str, view: str) -> str:
    options = _WRITES if "uint8" not in view else ["{v}.fill_(7)", "{v}.zero_()", "{v}.add_(1)"]
    if view.endswith(".t()") or "transpose" in view:
        options = options + _WRITES_2D
    return ctx.rng.choice(options).format(v=v)


def _growth(ctx: Ctx, x: str, e: torch.Tensor) -> str:
    """Grow the storage of ``x`` (eager tensor ``e``), then write what grew.

    Sizes are computed when the line runs (``o_``: the whole elements of the
    storage before), not when it is made: a shrunk program drops lines that
    changed them, and must still write exactly the grown region.
    """
    old = f"o_ = {x}.untyped_storage().nbytes() // {x}.element_size(); s_ = {x}.storage_offset()"
    k = ctx.rng.choice([1, 5, 16, 17, 40])
    fill = ctx.num()
    kind = ctx.rng.randrange(6)
    if kind == 0:
        return f"{old}; {x}.resize_(o_ + {k} - s_); {x}[o_ - s_:].fill_({fill})"
    if kind == 1:  # shrinking keeps the storage; growing again keeps what it held
        return f"{old}; {x}.resize_(1); {x}.resize_(o_ + {k} - s_); {x}[o_ - s_:].fill_({fill})"
    if kind == 2:
        return (f"{old}; {x}.resize_as_(torch.empty(o_ + {k} - s_, dtype={x}.dtype)); "
                f"{x}[o_ - s_:].fill_({fill})")
    start = ctx.rng.randint(0, e.untyped_storage().nbytes() // e.element_size())
    t = ctx.new()
    if kind == 3:  # a new tensor over the storage, bigger than it
        return (f"{old}; a_ = min({start}, o_); {t} = torch.empty(0, dtype={x}.dtype).set_("
                f"{x}.untyped_storage(), a_, (o_ + {k} - a_,)); {t}[o_ - a_:].fill_({fill})")
    if kind == 4:  # set_ to the tensor with a size (an offset from the tensor's own)
        return (f"{old}; a_ = min({start}, o_ - s_); {t} = torch.zeros(1, dtype={x}.dtype); "
                f"{t}.set_({x}, a_, (o_ + {k} - s_ - a_,), (1,)); {t}[o_ - s_ - a_:].fill_({fill})")
    # An out= argument resized from nothing: every element written.
    return (f"{old}; {t} = torch.empty(0, dtype={x}.dtype).set_({x}.untyped_storage(), o_, (0,)); "
            f"torch.full(({k},), {fill}, dtype={x}.dtype, out={t})")


# Layouts of `x` whose elementwise outputs the meta kernels lay out otherwise
# than TensorIterator in some size-1 dimension.
_ODD_LAYOUTS = [
    "{x}.unsqueeze(0).movedim(0, 1)", "{x}.unsqueeze(-1).movedim(-1, 0)",
    "{x}.unsqueeze(1).unsqueeze(0).permute(2, 1, 0, *range(3, {x}.dim() + 2))",
]
_ELEMENTWISE = [
    "{a}.abs()", "{a}.neg()", "{a}.sigmoid()", "torch.nn.functional.hardtanh({a})",
    "{a}.relu()", "{a}.exp()", "{a} * 2", "{a} + 1", "torch.where({a} > 0, {a}, 0.0)",
    "torch.nn.functional.silu({a})", "{a}.clamp(-1, 1)", "torch.nn.functional.gelu({a})",
    "{a}.to(torch.float64)", "{a}.clone()", "torch.nn.functional.softplus({a})",
]
_CONVS = [
    "torch.nn.functional.conv2d({a}, torch.ones(4, 3, 3, 3))",
    "torch.nn.functional.conv2d({a}, torch.ones(4, 3, 2, 2), stride=2)",
    "torch.nn.functional.conv_transpose2d({a}, torch.ones(3, 2, 3, 3))",
    "torch.nn.functional.max_pool2d({a}, 2)", "torch.nn.functional.avg_pool2d({a}, 2)",
]
_RELAID_VIEWS = [
    "{y}.transpose(0, 1)", "{y}[0]", "{y}.unsqueeze(0)", "{y}.reshape(-1)", "{y}.flatten(1)",
    "{y}.data", "{y}[..., 1:]", "{y}.squeeze()", "{y}.permute(*range({y}.dim() - 1, -1, -1))",
]
_RELAID_WRITES = ["{y}.mul_(2)", "{v}.fill_(1.5)", "{y}.copy_({y})", "{v}.add_(1)",
                  "{y}.zero_()", "{v}.normal_()"]


def relaid(ctx: Ctx) -> str | None:
    x = ctx.pick(lambda t: t.dtype == torch.float32 and t.dim() >= 1 and not t.requires_grad
                 and t.numel() > 0)
    if x is None:
        return None
    e, y, v = ctx.env[x], ctx.new(), ctx.new()
    if e.dim() == 2 and min(e.shape) >= 4 and ctx.rng.random() < 0.4:
        a = (f"{x}.reshape(1, 1, *{x}.shape).expand(2, 3, *{x}.shape)"
             ".to(memory_format=torch.channels_last)")
        op = ctx.rng.choice(_CONVS)
    else:
        a = ctx.rng.choice(_ODD_LAYOUTS).format(x=x)
        op = ctx.rng.choice(_ELEMENTWISE)
    view = ctx.rng.choice(_RELAID_VIEWS).format(y=y)
    write = ctx.rng.choice(_RELAID_WRITES).format(y=y, v=v)
    return f"{y} = {op.format(a=a)}; {v} = {view}; {write}"
