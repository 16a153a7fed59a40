"""to_networkx: the recorded graph as a networkx MultiDiGraph, for analysis."""

from __future__ import annotations

import networkx as nx

from torchdefer.viz._picture import build_picture

__all__ = ["to_networkx"]


def to_networkx(
    obj: object, *, collapse_repeats: bool = False, max_nodes: int | None = None
) -> nx.MultiDiGraph:
    """The nodes and edges :func:`~torchdefer.viz.to_dot` draws, as a networkx graph.

    Node ids are ``"n<seq>"`` for recorded ops (``seq`` is the op's number in
    recording order) and ``"t<i>"`` for the tensors asked about.

    Node attributes: ``kind`` (a ``NodeKind`` string, or ``"tensor"`` /
    ``"real"``), ``op``, ``args``, ``seq``, ``shape`` / ``shapes``, ``dtype``,
    ``device``, ``storage`` (id) and ``version`` (the storage version the
    output holds), ``writes`` (``(storage, version)`` pairs an in-place op
    produced), ``rng``, ``source`` (``file:line``), ``function``, ``module``
    (the module path it is clustered in), ``label``; tensors add ``name``,
    ``names``, ``parameter`` and ``requires_grad``; with
    ``collapse_repeats=True`` the nodes of a folded run carry ``repeat`` (its
    length) and ``repeat_of`` (its module paths).

    Edge attributes: ``kind`` (``"data"`` or ``"mutation"``), ``storage``,
    ``version`` (read), ``input`` (argument position), ``label``.

    Graph attributes: ``modules`` (path -> class name) and ``repeats``
    (drawn module path -> the module paths folded into it).

    Args:
        obj: a deferred tensor, a list of tensors, or a module.
        collapse_repeats: fold repeated submodules as :func:`to_dot` does
            (off by default: analysis usually wants every op).
        max_nodes: as for :func:`to_dot`.

    Returns:
        A ``networkx.MultiDiGraph``.

    >>> import torch, torchdefer
    >>> from torchdefer.viz import to_networkx
    >>> g = to_networkx(torchdefer.deferred_init(torch.nn.Linear, 4, 2))
    >>> sorted({k for _, k in g.nodes(data="kind")})
    ['factory', 'random', 'tensor', 'view']
    """
    picture = build_picture(obj, collapse_repeats=collapse_repeats, max_nodes=max_nodes)
    graph = nx.MultiDiGraph(
        modules=dict(picture.modules),
        repeats={path: list(r.members) for path, r in picture.repeats.items()},
    )
    keys = {key for item in picture.items.values() for key in item.attrs}
    for item in picture.items.values():
        attrs = dict.fromkeys(keys) | item.attrs  # every node has every attribute
        graph.add_node(item.id, **attrs, kind=item.kind, module=item.module,
                       label="\n".join(item.lines))
    for link in picture.links:
        graph.add_edge(link.tail, link.head, **link.attrs, kind=link.kind, label=link.label)
    return graph
