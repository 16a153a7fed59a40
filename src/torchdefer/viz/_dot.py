"""to_dot and write_graph: the recorded graph as a graphviz picture."""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from collections.abc import Sized
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from torchdefer.errors import GraphvizNotFoundError, MissingDependencyError, UsageError
from torchdefer.viz._picture import Picture, build_picture
from torchdefer.viz._style import EDGE_STYLES, NODE_STYLES, cluster_style, legend

if TYPE_CHECKING:
    import graphviz

__all__ = ["GraphvizNotFoundError", "to_dot", "write_graph"]

_INSTALL_DOT = (
    "Install Graphviz's `dot` program: `apt-get install graphviz` (Debian/Ubuntu), "
    "`brew install graphviz` (macOS), `conda install -c conda-forge graphviz`, or see "
    "https://graphviz.org/download/. Without it, write a .dot file instead."
)
_TEXT_FORMATS = (".dot", ".gv")


def _graphviz() -> Any:
    try:
        import graphviz
    except ImportError as e:
        raise MissingDependencyError(
            "torchdefer.viz needs the `graphviz` Python package: "
            "pip install 'torchdefer[viz]' (or pip install graphviz)."
        ) from e
    return graphviz


def to_dot(
    obj: object, *, collapse_repeats: bool = True, max_nodes: int | None = None
) -> graphviz.Digraph:
    """A graphviz picture of what was recorded for ``obj``.

    Every op needed to replay the shown tensors, styled by kind (see the
    legend in the picture), in clusters by module path. Data edges join an op
    to the ops that read its output; dashed red *mutation* edges join an
    in-place op to the later readers of the storage version it wrote, so a
    write through one view into a storage other tensors view is plain to see.

    Args:
        obj: a deferred tensor, a list of tensors, or a module (all its
            parameters and buffers; those already materialized are drawn as
            real tensors). A module's data-dependent reads (``.item()``) are
            drawn too.
        collapse_repeats: draw runs of identical numbered submodules (80
            decoder layers) once, as one cluster marked with the count (``x80``).
        max_nodes: keep at most this many nodes, those nearest the tensors;
            one node says how many were left out.

    Returns:
        A ``graphviz.Digraph``; ``.source`` is its text, and it renders
        without further work only where Graphviz's ``dot`` is installed (see
        :func:`write_graph`).

    Raises:
        ValueError: ``obj`` holds no deferred tensor (nothing was recorded).

    >>> import torch, torchdefer
    >>> from torchdefer.viz import to_dot
    >>> m = torchdefer.deferred_init(torch.nn.Linear, 4, 2)
    >>> "uniform_" in to_dot(m).source
    True
    """
    picture = build_picture(obj, collapse_repeats=collapse_repeats, max_nodes=max_nodes)
    return picture_to_dot(picture, name=subject_name(obj))


def subject_name(obj: object) -> str:
    """What the caption calls ``obj``: the module's class, or the tensors."""
    if isinstance(obj, torch.Tensor):
        return "a tensor"
    if isinstance(obj, nn.Module):
        return type(obj).__name__
    n = len(obj) if isinstance(obj, Sized) else 0
    return f"{n} tensors" if n != 1 else "a tensor"


def picture_to_dot(picture: Picture, name: str = "recording") -> graphviz.Digraph:
    """Draw a :class:`~torchdefer.viz._picture.Picture` with graphviz."""
    graphviz = _graphviz()
    dot = graphviz.Digraph(re.sub(r"\W+", "_", name).strip("_") or "recording")
    dot.attr(rankdir="LR", fontname="Helvetica", newrank="true", compound="true",
             label=_caption(picture, name), labelloc="t", fontsize="14")
    dot.attr("node", fontname="Helvetica", fontsize="10")
    dot.attr("edge", fontname="Helvetica", arrowsize="0.7")
    by_module: dict[str, list[str]] = defaultdict(list)
    tree: dict[str, set[str]] = defaultdict(set)
    for item in picture.items.values():
        by_module[item.module].append(item.id)
        parts = item.module.split(".") if item.module else []
        for depth in range(len(parts)):
            tree[".".join(parts[:depth])].add(".".join(parts[: depth + 1]))
    _emit(dot, "", picture, by_module, tree, itertools.count())
    for link in picture.links:
        attrs, _ = EDGE_STYLES[link.kind]
        dot.edge(link.tail, link.head, label=link.label, **attrs)
    legend(dot, {item.kind for item in picture.items.values()},
           {link.kind for link in picture.links})
    return dot


def _caption(picture: Picture, name: str) -> str:
    ops = sum(1 for item in picture.items.values() if item.attrs.get("seq") is not None)
    text = f"torchdefer: what was recorded for {name} ({ops} ops drawn"
    if picture.folded:
        text += f", {picture.folded} more folded into repeats"
    if picture.elided:
        text += f", {picture.elided} left out by max_nodes"
    return text + ")"


def _emit(graph, path, picture, by_module, tree, counter) -> None:
    for item_id in by_module.get(path, ()):
        item = picture.items[item_id]
        attrs, _ = NODE_STYLES[item.kind]
        graph.node(item_id, _label(item.lines), **attrs)
    # Definition order (picture.modules follows named_modules), as print(model) lists them.
    order = {module: i for i, module in enumerate(picture.modules)}
    for child in sorted(tree.get(path, ()), key=lambda c: (order.get(c, len(order)), _natural(c))):
        with graph.subgraph(name=f"cluster_{next(counter)}") as sub:
            repeat = picture.repeats.get(child)
            name = child.rpartition(".")[2] if path else child
            if repeat is not None:
                name = repeat.label.rpartition(".")[2] if path else repeat.label
            kind = picture.modules.get(child)
            sub.attr(label=f"{name} ({kind})" if kind else name, labeljust="l",
                     fontsize="11", **cluster_style(repeat is not None))
            _emit(sub, child, picture, by_module, tree, counter)


def _natural(path: str) -> tuple:
    last = path.rpartition(".")[2]
    return (0, int(last), "") if last.isdigit() else (1, 0, last)


def _label(lines: tuple[str, ...]) -> str:
    # The graphviz package quotes the string but keeps backslash escapes: "\\n"
    # is dot's own line break, so a backslash in user text must be doubled.
    return "\\n".join(line.replace("\\", "\\\\") for line in lines)


def write_graph(
    obj: object,
    path: str | Path,
    *,
    collapse_repeats: bool = True,
    max_nodes: int | None = None,
) -> Path:
    """Write the picture of ``obj`` to ``path``; the format follows the extension.

    ``.dot``/``.gv`` write the graphviz source (no Graphviz program needed);
    any other extension Graphviz knows (``.svg``, ``.png``, ``.pdf``) is
    rendered with the ``dot`` program.

    Args:
        obj: what :func:`to_dot` accepts, or a ``graphviz.Digraph`` it made.
        path: the file to write (missing parent folders are created).
        collapse_repeats, max_nodes: as for :func:`to_dot`.

    Returns:
        The path written.

    Raises:
        GraphvizNotFoundError: rendering needs ``dot`` and it is not installed.

    >>> import torch, torchdefer
    >>> from torchdefer.viz import write_graph
    >>> m = torchdefer.deferred_init(torch.nn.Linear, 4, 2)
    >>> write_graph(m, "/tmp/linear.dot").name
    'linear.dot'
    """
    graphviz = _graphviz()
    path = Path(path)
    if isinstance(obj, graphviz.Digraph):
        dot = obj
    else:
        dot = to_dot(obj, collapse_repeats=collapse_repeats, max_nodes=max_nodes)
    suffix = path.suffix.lower()
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix in _TEXT_FORMATS:
        path.write_text(dot.source, encoding="utf-8")
        return path
    fmt = suffix.lstrip(".")
    if not fmt:
        raise UsageError(
            f"Cannot tell the format of {str(path)!r}: give it an extension such as .svg, "
            ".png, .pdf or .dot."
        )
    if fmt not in graphviz.FORMATS:
        raise UsageError(
            f"Graphviz cannot write {suffix!r} files ({str(path)!r}); use .svg, .png, "
            ".pdf or .dot."
        )
    path.write_bytes(render(dot, fmt))
    return path


def render(dot: graphviz.Digraph, fmt: str = "svg") -> bytes:
    """The picture rendered by Graphviz's ``dot`` as ``fmt`` bytes (``svg``, ``png``)."""
    graphviz = _graphviz()
    try:
        return dot.pipe(format=fmt)
    except graphviz.ExecutableNotFound as e:
        raise GraphvizNotFoundError(
            f"Rendering the graph as {fmt} needs Graphviz's `dot` program, which is not "
            f"on PATH. {_INSTALL_DOT}"
        ) from e
