"""The writer pipeline: bytes in flight bounded, order kept, an error on either side stops both."""

from __future__ import annotations

import threading

import pytest
import torch

from torchdefer.checkpoint._pipeline import Pipeline
from torchdefer.checkpoint._write_plan import Entry
from torchdefer.materialize.progress import Progress

SIZES = [50, 10, 90, 10, 10, 100, 30, 30, 5, 100, 1]


def _entries():
    return [Entry((f"t{i}",), torch.empty(n, dtype=torch.uint8), torch.uint8)
            for i, n in enumerate(SIZES)]


def _run(budget, make, write_one, progress=False):
    entries = _entries()
    written = []
    with Progress("save", len(entries), sum(SIZES), progress) as bar:
        pipeline = Pipeline(budget, bar)

        def writer():
            for _ in entries:
                entry, tensor = pipeline.take()
                write_one(entry, tensor)
                written.append(entry.name)
                pipeline.done(entry)

        pipeline.run(entries, make, writer)
    return [e.name for e in entries], written


def test_a_tensor_is_made_only_when_it_fits_the_budget_with_what_the_writer_holds():
    lock, alive, seen = threading.Lock(), [0], []

    def make(entry):
        with lock:
            seen.append((alive[0], entry.source_nbytes))
            alive[0] += entry.source_nbytes
        return entry.tensor

    def write_one(entry, tensor):
        with lock:
            alive[0] -= entry.source_nbytes

    names, written = _run(120, make, write_one)
    assert written == names
    assert all(held == 0 or held + n <= 120 for held, n in seen)


def test_progress_is_reported_in_order_on_the_calling_thread():
    events, threads = [], set()

    def progress(event):
        events.append(event.name)
        threads.add(threading.get_ident())

    names, _ = _run(100, lambda e: e.tensor, lambda e, t: None, progress)
    assert events == names
    assert threads == {threading.get_ident()}


def test_an_error_while_writing_stops_the_making_and_is_raised():
    made = []

    def make(entry):
        made.append(entry.name)
        return entry.tensor

    def write_one(entry, tensor):
        if entry.name == "t2":
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        _run(1, make, write_one)  # budget 1: one tensor in flight at a time
    assert made == ["t0", "t1", "t2"]  # t3 waited for t2's bytes, which never came back


def test_an_error_while_making_stops_the_writer_and_is_raised():
    written = []

    def make(entry):
        if entry.name == "t3":
            raise ValueError("replay failed")
        return entry.tensor

    with pytest.raises(ValueError, match="replay failed"):
        _run(1000, make, lambda e, t: written.append(e.name))
    assert written == ["t0", "t1", "t2"]


@pytest.mark.parametrize("takes", [len(SIZES) - 1, len(SIZES) + 1])
def test_a_writer_that_takes_fewer_or_more_tensors_than_made_is_an_error_not_a_short_file(takes):
    entries = _entries()
    with Progress("save", len(entries), sum(SIZES), False) as bar:
        pipeline = Pipeline(10**6, bar)

        def writer():
            for _ in range(takes):
                entry, _ = pipeline.take()
                pipeline.done(entry)

        with pytest.raises(RuntimeError, match="bug"):
            pipeline.run(entries, lambda e: e.tensor, writer)
