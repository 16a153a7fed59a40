"""Folding repeated identical submodules (80 decoder layers) into one drawn cluster.

Siblings named by consecutive integers (``layers.0``, ``layers.1``, ...) whose
recordings have the same *form* (the same ops, arguments, shapes, source
lines, generators and edges, up to node numbers and storage ids) form a run.
The first member of a run is drawn and marked with the count; the ops of the others are
folded onto it. Runs are found from the top down, so repeats inside a folded
layer (experts of a mixture) fold too.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from torchdefer.viz._picture import Item, Link, Picture, Repeat

__all__ = ["collapse"]


def collapse(picture: Picture) -> Picture:
    """``picture`` with each run of identical numbered sibling modules drawn once."""
    subtree: dict[str, list[str]] = defaultdict(list)  # module -> items in it or below
    children: dict[str, set[str]] = defaultdict(set)
    for item in picture.items.values():
        parts = item.module.split(".") if item.module else []
        for depth in range(len(parts) + 1):
            path = ".".join(parts[:depth])
            subtree[path].append(item.id)
            if depth < len(parts):
                children[path].add(".".join(parts[: depth + 1]))
    into_by_head: dict[str, list[Link]] = defaultdict(list)
    out_by_tail: dict[str, list[Link]] = defaultdict(list)
    for link in picture.links:
        into_by_head[link.head].append(link)
        out_by_tail[link.tail].append(link)
    folder = _Folder(picture, subtree, into_by_head, out_by_tail)
    queue = [""]
    while queue:
        path = queue.pop()
        drawn = folder.fold_children(sorted(children.get(path, ())))
        queue.extend(drawn)
    return folder.result()


class _Folder:
    def __init__(self, picture: Picture, subtree, into_by_head, out_by_tail) -> None:
        self.picture = picture
        self.subtree = subtree
        self.into = into_by_head
        self.out = out_by_tail
        self.onto: dict[str, str] = {}  # folded item -> the drawn item it stands for
        self.repeats: dict[str, Repeat] = {}

    def fold_children(self, kids: list[str]) -> list[str]:
        """Fold runs among ``kids``; returns the children still drawn."""
        numbered = sorted((k for k in kids if k.rpartition(".")[2].isdigit()),
                          key=lambda k: int(k.rpartition(".")[2]))
        drawn = [k for k in kids if not k.rpartition(".")[2].isdigit()]
        run: list[str] = []
        run_form: Any = None
        for kid in numbered:
            form = self._form(kid)
            if run and form == run_form and _next(run[-1], kid):
                run.append(kid)
                continue
            self._fold(run)
            drawn.append(kid)
            run, run_form = [kid], form
        self._fold(run)
        return drawn

    def _fold(self, run: list[str]) -> None:
        if len(run) < 2:
            return
        first = self.subtree[run[0]]
        for member in run[1:]:
            for mine, theirs in zip(self.subtree[member], first):
                self.onto[mine] = theirs
        self.repeats[run[0]] = Repeat(tuple(run))

    def _form(self, path: str) -> tuple[Any, ...]:
        ids = self.subtree[path]
        local = {item_id: i for i, item_id in enumerate(ids)}
        cut = len(path) + 1
        items = tuple(
            (self.picture.items[i].module[cut:], self.picture.items[i].kind,
             self.picture.items[i].form)
            for i in ids
        )
        edges = []
        for i in ids:
            for link in self.into.get(i, ()):
                tail = local.get(link.tail, ("outside", link.tail))
                edges.append((local[i], tail, link.kind, link.attrs.get("version")))
            for link in self.out.get(i, ()):
                if link.head not in local:
                    edges.append((local[i], ("outside", link.head), link.kind,
                                  link.attrs.get("version")))
        return items, tuple(sorted(edges, key=repr))

    def _resolve(self) -> None:
        # A member folded onto the first layer, whose own experts then fold onto
        # its first expert: follow the chain to the item actually drawn.
        for item_id, target in self.onto.items():
            while target in self.onto:
                target = self.onto[target]
            self.onto[item_id] = target

    def result(self) -> Picture:
        self._resolve()
        items = {i: item for i, item in self.picture.items.items() if i not in self.onto}
        for path, repeat in self.repeats.items():
            for item_id in self.subtree[path]:
                item = items.get(item_id)
                if item is None:  # folded by a repeat nested inside this one
                    continue
                attrs = {**item.attrs, "repeat": len(repeat.members),
                         "repeat_of": list(repeat.members)}
                items[item_id] = Item(item.id, item.kind, item.module, item.lines, attrs,
                                      item.form)
        links: dict[tuple[str, str, str], Link] = {}
        for link in self.picture.links:
            tail = self.onto.get(link.tail, link.tail)
            head = self.onto.get(link.head, link.head)
            if (tail, head) != (link.tail, link.head):
                if link.tail in self.onto and link.head in self.onto:
                    continue  # inside a folded member: the drawn member has it
                label = link.label if link.kind == "data" else f"v{link.attrs.get('version')}"
                link = Link(tail, head, link.kind, label, link.attrs)
            links.setdefault((tail, head, link.kind), link)
        # Count folded ops only (not the parameter boxes), so drawn + folded is
        # what --no-collapse draws.
        folded = sum(1 for i in self.onto if self.picture.items[i].attrs.get("seq") is not None)
        return Picture(items, list(links.values()), self.picture.modules, self.repeats,
                       folded, self.picture.elided)


def _next(a: str, b: str) -> bool:
    return int(b.rpartition(".")[2]) == int(a.rpartition(".")[2]) + 1
