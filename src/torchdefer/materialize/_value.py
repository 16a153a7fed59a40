"""A deferred tensor's value handed over, not installed: for writers that stream a model.

:func:`~torchdefer.materialize_tensor` keeps its result (the deferred tensor
memoizes it) and :func:`~torchdefer.materialize_module` swaps each result into
the module, so either way the model ends up holding every tensor. A checkpoint
writer wants the opposite: each value computed once, written, and dropped, the
model left deferred. :func:`replay_value` is that door. The replay cache holds
storages only weakly, so a value the caller drops is freed.

What this module deliberately does not do: mark the tensor materialized,
convert dtypes, or move anything into the module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch

from torchdefer.errors import ReplayError
from torchdefer.materialize import _parallel as parallel
from torchdefer.materialize._cache import cache_for
from torchdefer.materialize._replay import Replay
from torchdefer.materialize._swap import recorded_inference
from torchdefer.recorder._target import target_of
from torchdefer.recorder._tensor import DeferredTensor

__all__ = ["one_call", "replay_value", "replays_on_meta"]


def replays_on_meta(tensor: DeferredTensor) -> bool:
    """Whether ``tensor`` was recorded on the meta device (it has no values to give)."""
    return target_of(tensor).meta.device.type == "meta"


def replay_value(tensor: DeferredTensor, name: str, *, threads: int | None = None) -> torch.Tensor:
    """The real value ``tensor`` stands for, on its recorded device; the caller owns it.

    The same bits :func:`~torchdefer.materialize_tensor` gives, but nothing keeps
    the result: the deferred tensor stays deferred (and later materializes as
    usual). ``name`` is the tensor's path, for error messages. ``threads``
    draw each large CPU random fill in chunks (see
    :mod:`torchdefer.materialize._parallel`); None: ``torch.get_num_threads()``.
    """
    threads = parallel.check_threads(threads, "replay_value")
    if replays_on_meta(tensor):
        raise ReplayError(
            f"'{name}' was recorded on the meta device, so it has no values to write. "
            "Build the model without torch.device('meta') (deferred_init allocates "
            "nothing anyway), or load real weights into it first."
        )
    target = target_of(tensor)
    with parallel.threads_used(threads), torch.inference_mode(recorded_inference(tensor)):
        return Replay(target.graph, None).run([target.key], [name])[0]


@contextlib.contextmanager
def one_call(tensors: Iterable[torch.Tensor]) -> Iterator[None]:
    """One materialization call over the graphs of ``tensors`` (the deferred ones).

    Within it, a value replayed earlier and still alive answers the reads of a
    later replay (nothing is computed twice while the writer still holds it),
    as within one :func:`~torchdefer.materialize_module` call. No user code may
    change a tensor of these graphs inside the block.
    """
    graphs = {}
    for t in tensors:
        if isinstance(t, DeferredTensor):
            graph = target_of(t).graph
            graphs[id(graph)] = graph
    with contextlib.ExitStack() as stack:
        for graph in graphs.values():
            stack.enter_context(cache_for(graph).call())
        yield
