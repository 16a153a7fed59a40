"""Run a fuzz program eagerly and deferred from the same seed; compare bit for bit.

The eager world runs each segment plainly; the deferred world runs each in its
own ``deferred_init`` call, then materializes the tensors in one of four
orders (recording order, reverse, shuffled, a shuffled subset). Compared for
every tensor: bits, dtype, shape, strides, device, ``requires_grad``,
Parameter-ness; for every pair: being the same object and sharing storage;
the Python values read mid-program; and draws from the global generator and
from ``g0``/``g1`` after the program and again after materialization (the
generators must stand where eager leaves them, and materializing must not move
them).

Outcomes: ``skipped`` (eager raised), ``refused`` (torchdefer raised one of its
own errors: a clear refusal, counted in the stats), ``failed`` (a difference,
or any other exception in the deferred world), ``ok``.
"""

from __future__ import annotations

import contextlib
import random
import re
import traceback
from dataclasses import dataclass, field, replace

import torch
from torch import nn

import torchdefer
from ambient_families import reset_ambient, settings, stop_worker
from program import Program, fresh_namespace, make_externals, make_generators

__all__ = ["ORDERS", "Outcome", "check", "shrink", "suspected_classes"]

ORDERS = ("forward", "reverse", "shuffled", "partial")
_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(slots=True)
class Outcome:
    status: str  # ok | skipped | refused | failed
    detail: str = ""
    order: str = ""
    sequence: list[str] = field(default_factory=list)  # what was materialized, in order

    @property
    def kind(self) -> str:
        """What failed, coarsely: shrinking keeps a candidate only if this stays the same."""
        return self.detail.split(":", 1)[0]


def _run_segment(code, namespace: dict) -> dict:
    exec(code, namespace)
    return namespace


def _world(program: Program, defer: bool) -> tuple[list[dict], tuple, tuple]:
    """Namespaces of the segments, the generators, and the draws right after the program."""
    torch.manual_seed(program.seed)
    generators = make_generators(program.seed)
    ext, arr = make_externals()
    namespaces = []
    try:
        for k, segment in enumerate(program.segments):
            if k and program.eager_draw_between[k - 1]:
                torch.randn(3)
            code = compile("\n".join(segment), "<fuzz program>", "exec")
            namespace = fresh_namespace(generators, ext, arr)
            if defer:
                namespaces.append(torchdefer.deferred_init(_run_segment, code, namespace))
            else:
                namespaces.append(_run_segment(code, namespace))
            # deferred_init leaves the default dtype as it found it; so does the eager world.
            torch.set_default_dtype(torch.float32)
            reset_ambient()  # settings a line turned on (deterministic mode, default device)
    finally:
        torch.set_default_dtype(torch.float32)
        reset_ambient()
        stop_worker()
    if program.mutation:
        exec(program.mutation, {"ext": ext, "arr": arr})
    return namespaces, generators, _draws(generators)


def _draws(generators) -> tuple[torch.Tensor, ...]:
    return (torch.randn(5), torch.rand(3), *(torch.randn(5, generator=g) for g in generators))


def _entries(namespaces: list[dict]) -> dict[str, object]:
    """Every tensor and value a program made, keyed ``"<segment>:<name>"`` in making order."""
    out: dict[str, object] = {}
    for k, ns in enumerate(namespaces):
        for name, obj in ns.items():
            if not re.fullmatch(r"[tvm]\d+", name):
                continue
            if isinstance(obj, nn.Module):
                for sub, t in (*obj.named_parameters(), *obj.named_buffers()):
                    out[f"{k}:{name}.{sub}"] = t
            elif isinstance(obj, (tuple, list)) and any(isinstance(x, torch.Tensor) for x in obj):
                for i, t in enumerate(obj):  # e.g. a GRU's (output, hidden)
                    out[f"{k}:{name}.{i}"] = t
            else:
                out[f"{k}:{name}"] = obj
    return out


def check(program: Program, orders=ORDERS) -> Outcome:
    """The outcome of ``program``: the first failing order, or ok/refused/skipped."""
    try:
        eager_ns, eager_gens, eager_after = _world(program, defer=False)
        eager_after_materialize = _draws(eager_gens)
    except Exception as e:
        return Outcome("skipped", f"{type(e).__name__}: {e}")
    eager = _entries(eager_ns)
    refused = None
    for order in orders:
        outcome = _check_order(program, order, eager, eager_after, eager_after_materialize)
        if outcome.status == "failed":
            return outcome
        if outcome.status == "refused":
            refused = outcome
    return refused or Outcome("ok")


def _check_order(program, order, eager, eager_after, eager_after_materialize) -> Outcome:
    sequence: list[str] = []
    try:
        lazy_ns, gens, after = _world(program, defer=True)
        with _under(program):
            if order == "forward":  # modules as users do it: swapped in place, in recording order
                for k, ns in enumerate(lazy_ns):
                    for name, obj in ns.items():
                        if re.fullmatch(r"m\d+", name) and isinstance(obj, nn.Module):
                            sequence.append(f"module {k}:{name}")
                            torchdefer.materialize_module(obj)
            lazy = _entries(lazy_ns)
            tensors = [k for k, v in eager.items() if isinstance(v, torch.Tensor)]
            sequence += _order(tensors, order, program.seed)
            reals = {}
            for key in sequence:
                if key in lazy:
                    reals[key] = torchdefer.materialize_tensor(lazy[key])
        after_materialize = _draws(gens)
        # Tensors first: a wrong value says more than a generator left elsewhere.
        mismatch = (_compare_tensors(reals, eager, list(reals))
                    or _compare_values(lazy, eager)
                    or _compare_draws(after, eager_after, "after the program")
                    or _compare_draws(after_materialize, eager_after_materialize,
                                      "after materializing"))
    except Exception as e:
        if _is_refusal(e):
            return Outcome("refused", f"{type(e).__name__}: {_first_line(e)}", order, sequence)
        tb = traceback.format_exception(type(e), e, e.__traceback__)[-3:]
        return Outcome("failed", f"crash: {type(e).__name__}: {e}\n{''.join(tb)}", order, sequence)
    return Outcome("failed", mismatch, order, sequence) if mismatch else Outcome("ok")


def _under(program: Program):
    """The setting materialization runs in (``Program.materialize_under``)."""
    if not program.materialize_under:
        return contextlib.nullcontext()
    return eval(program.materialize_under, {"torch": torch, "settings": settings})


def _order(keys: list[str], order: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    if order == "reverse":
        return keys[::-1]
    if order in ("shuffled", "partial"):
        keys = keys[:]
        rng.shuffle(keys)
        if order == "partial":
            keys = keys[: max(1, len(keys) // 2)]
    return keys


def _is_refusal(e: BaseException) -> bool:
    """One of torchdefer's own errors saying it cannot do this faithfully.

    A replay that crashed inside a torch op (wrapped as "While replaying ...")
    is not a refusal: the op ran in eager code.
    """
    own = any(c.__module__.startswith("torchdefer") for c in type(e).__mro__)
    return own and not str(e).startswith(("While replaying", "While executing"))


def _first_line(e: BaseException) -> str:
    # Without line numbers, so that the stats group refusals by kind.
    line = (str(e).splitlines() or [""])[0]
    return re.sub(r"<fuzz program>:\d+", "<fuzz program>", line)[:160]


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    return t if t.dtype == torch.bool else t.view(_INTS[t.element_size()])


def _differs(real: torch.Tensor, ref: torch.Tensor) -> str | None:
    if torchdefer.is_fake(real):
        return "still fake"
    if real.is_inference() != ref.is_inference():
        return f"is_inference() {real.is_inference()} != eager {ref.is_inference()}"
    for what in ("dtype", "shape", "device", "requires_grad"):
        if getattr(real, what) != getattr(ref, what):
            return f"{what} {getattr(real, what)} != eager {getattr(ref, what)}"
    if isinstance(real, nn.Parameter) != isinstance(ref, nn.Parameter):
        return f"Parameter-ness {isinstance(real, nn.Parameter)} != eager"
    if real.stride() != ref.stride() or real.storage_offset() != ref.storage_offset():
        return f"strides {real.stride()}+{real.storage_offset()} != eager {ref.stride()}+{ref.storage_offset()}"
    if ref.is_meta:  # no values to compare
        return None
    if not torch.equal(_bits(real), _bits(ref)):
        return f"values differ:\n  deferred {real}\n  eager    {ref}"
    return None


def _compare_tensors(reals: dict, eager: dict, keys: list[str]) -> str | None:
    for key in keys:
        problem = _differs(reals[key], eager[key])
        if problem:
            return f"tensor {key}: {problem}"
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            if (reals[a] is reals[b]) != (eager[a] is eager[b]):
                return f"tensors {a}, {b}: being the same object differs from eager"
            if _shares(reals[a], reals[b]) != _shares(eager[a], eager[b]):
                return f"tensors {a}, {b}: storage sharing differs from eager ({_shares(eager[a], eager[b])})"
    return None


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    sa, sb = a.untyped_storage(), b.untyped_storage()
    return sa.nbytes() > 0 and sb.nbytes() > 0 and sa.data_ptr() == sb.data_ptr()


def _compare_values(lazy: dict, eager: dict) -> str | None:
    for key, ref in eager.items():
        if isinstance(ref, torch.Tensor):
            continue
        if repr(lazy[key]) != repr(ref):
            return f"value {key}: {lazy[key]!r} != eager {ref!r}"
    return None


def _compare_draws(got, want, when: str) -> str | None:
    names = ("torch.randn(5)", "torch.rand(3)", "g0", "g1")
    for name, a, b in zip(names, got, want):
        if not torch.equal(a, b):
            return f"generator: {name} drawn {when} differs from eager"
    return None


def shrink(program: Program, outcome: Outcome, orders=ORDERS, budget: int = 400):
    """A smaller program that fails the same way: drop lines, draws and the mutation."""
    checks = 0

    def still_fails(candidate: Program) -> Outcome | None:
        nonlocal checks
        checks += 1
        got = check(candidate, orders)
        return got if got.status == "failed" and got.kind == outcome.kind else None

    changed = True
    while changed and checks < budget:
        changed = False
        for s in reversed(range(len(program.segments))):
            for i in reversed(range(len(program.segments[s]))):
                if checks >= budget:
                    break
                got = still_fails(program.without(s, i))
                if got:
                    program, outcome, changed = program.without(s, i), got, True
        for candidate in _simpler(program):
            got = still_fails(candidate)
            if got:
                program, outcome, changed = candidate, got, True
                break
    return program, outcome


def _simpler(program: Program):
    if program.mutation:
        yield replace(program, mutation=None)
    for k, draw in enumerate(program.eager_draw_between):
        if draw:
            flags = list(program.eager_draw_between)
            flags[k] = False
            yield replace(program, eager_draw_between=tuple(flags))
    for k, segment in enumerate(program.segments):
        if not segment and len(program.segments) > 1:
            flags = list(program.eager_draw_between)
            del flags[k - 1 if k else 0]
            segments = program.segments[:k] + program.segments[k + 1:]
            yield replace(program, segments=segments, eager_draw_between=tuple(flags))


# Which issue-9 class a failing (shrunk) program most likely belongs to, from
# what its lines do. A guess for the report, not a verdict.
_CLASSES = [
    ("RNG: reseed/restore/fork_rng (lead)", r"manual_seed|set_rng_state|fork_rng|\.set_state"),
    ("batch-norm running stats (recorder-fixes)", r"BatchNorm|InstanceNorm|batch_norm|instance_norm"),
    ("storage growth under live views (i24-storage)", r"resize_|out=t"),
    ("set_ (recorder-fixes)", r"\.set_\("),
    ("list-of-views aliasing (recorder-fixes)", r"unbind|split|chunk|hsplit"),
    ("default-dtype promotion (recorder-fixes)", r"set_default_dtype"),
    ("question ops (recorder-fixes)", r"is_pinned|is_same_size|can_cast|result_type|promote_types|is_set_to|storage_offset|nbytes"),
    ("external tensor changed (recorder-fixes)", r"\bext\b|\barr\b"),
    ("random custom op without the seeded tag (class 11; RNG, lead)", r"noise_untagged"),
    ("RNG: random op positions/streams (lead)", r"rand|normal|bernoulli|exponential|geometric|cauchy|random_|multinomial|dropout|Dropout|poisson|init\.(xavier|kaiming|orthogonal|sparse|trunc|uniform)"),
]


def suspected_classes(program: Program, outcome: Outcome) -> list[str]:
    text = "\n".join(program.lines) + "\n" + (program.mutation or "")
    found = [name for name, pattern in _CLASSES if re.search(pattern, text)]
    if ": strides " in outcome.detail:
        found.append("strides of cached storages / fake strides of size-1 dims (recorder-fixes)")
    if "being the same object" in outcome.detail and "register_buffer" in text:
        found.append("references when swap_tensors is refused (module-fixes)")
    if outcome.detail.startswith("generator:") or len(program.segments) > 1:
        found.append("RNG: generators end where eager leaves them (lead, issue 14)")
    return sorted(set(found)) or ["unclassified (new?)"]
