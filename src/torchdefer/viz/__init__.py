"""See what was recorded: graphviz pictures, networkx graphs and provenance text.

An extension of the core: ``torchdefer.recorder`` and ``torchdefer.materialize``
never import it. ``graphviz`` (the Python package, and Graphviz's ``dot``
program to render) is needed only for pictures.
"""

from torchdefer.viz._dot import GraphvizNotFoundError, render, to_dot, write_graph
from torchdefer.viz._nx import to_networkx
from torchdefer.viz._provenance import explain

__all__ = [
    "GraphvizNotFoundError",
    "explain",
    "render",
    "to_dot",
    "to_networkx",
    "write_graph",
]
