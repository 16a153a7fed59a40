"""The thread that maps a safetensors checkpoint's pages (checkpoint/_pages.py)."""

from __future__ import annotations

import sys
import threading

import pytest
import torch
from safetensors import torch as safetensors_torch

from torchdefer.checkpoint._pages import _PAGE, _merged, map_pages

P = _PAGE


def test_touching_spans_are_joined_and_a_hole_is_not():
    # two tensors end to end (one sharing a page with the next), then another
    # mapping one page further on: madvise would stop at the unmapped page
    spans = [(10 * P + 100, 2 * P), (12 * P + 100, 3 * P), (17 * P, P)]
    assert _merged(spans) == [(10 * P, 16 * P), (17 * P, 18 * P)]


def test_adjacent_mappings_are_one_range_and_order_does_not_matter():
    assert _merged([(4 * P, P), (2 * P, 2 * P)]) == [(2 * P, 5 * P)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise is Linux's")
def test_cancel_stops_the_thread_and_wait_maps_every_page(tmp_path):
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file({f"t{i}": torch.randn(256, 1024) for i in range(8)}, path)
    for stop in (False, True):
        loaded = safetensors_torch.load_file(path)
        mapper = map_pages(loaded.values())
        mapper.cancel() if stop else mapper.wait()
        assert not [t for t in threading.enumerate() if t.name == "torchdefer-map-pages"]
        assert torch.equal(loaded["t3"], safetensors_torch.load_file(path)["t3"])


def test_tensors_not_on_the_cpu_or_smaller_than_a_page_start_no_thread():
    mapper = map_pages([torch.ones(4), torch.ones(8, device="meta")])
    assert mapper._thread is None
    mapper.wait()
    mapper.cancel()
