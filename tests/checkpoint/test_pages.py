"""The thread that maps a safetensors checkpoint's pages (checkpoint/_pages.py)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
import torch
from safetensors import torch as safetensors_torch

from torchdefer.checkpoint import _pages
from torchdefer.checkpoint._pages import _STEP, map_pages


def _rss_file() -> int | None:
    """Bytes of file pages mapped into this process (Linux), or None."""
    status = Path("/proc/self/status")
    if not status.exists():
        return None
    for line in status.read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    return None


def _no_thread() -> bool:
    return not [t for t in threading.enumerate() if t.name == "torchdefer-map-pages"]


def test_cancel_stops_the_thread_and_wait_leaves_the_values(tmp_path):
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file({f"t{i}": torch.randn(256, 1024) for i in range(8)}, path)
    for stop in (False, True):
        loaded = safetensors_torch.load_file(path)
        mapper = map_pages(loaded.values())
        mapper.cancel() if stop else mapper.wait()
        assert _no_thread()
        assert torch.equal(loaded["t3"], safetensors_torch.load_file(path)["t3"])


@pytest.mark.skipif(not sys.platform.startswith("linux") or _rss_file() is None,
                    reason="reads Linux's count of mapped file pages")
def test_wait_returns_with_the_file_pages_mapped(tmp_path):
    # 16 MiB written just now: in the page cache, so each read maps the
    # fault-around window with it (64 KiB by default), not one page
    path = tmp_path / "model.safetensors"
    state = {f"t{i}": torch.randn(1024, 1024) for i in range(4)}
    safetensors_torch.save_file(state, path)
    loaded = safetensors_torch.load_file(path)
    before = _rss_file()
    map_pages(loaded.values()).wait()
    grown = _rss_file() - before
    assert grown >= 0.9 * sum(t.nbytes for t in state.values())


def test_pieces_end_at_the_piece_size_and_every_tensor_is_read(monkeypatch):
    monkeypatch.setattr(_pages, "_PIECE", 3 * _STEP)
    tensors = [torch.zeros(_STEP // 4) for _ in range(5)] + [torch.zeros(4 * _STEP, dtype=torch.uint8)]
    mapper = map_pages(tensors)
    mapper.wait()
    pieces = mapper.pieces
    assert [len(p) for p in pieces] == [3, 2, 1]  # one read per tensor; the big one alone
    last = pieces[-1][0]  # one byte per step, ending with the tensor's last byte
    assert last.stride() == (_STEP,) and last.numel() == 4
    assert last.storage_offset() + (last.numel() - 1) * _STEP == tensors[-1].nbytes - 1


def test_tensors_not_on_the_cpu_or_empty_start_no_thread():
    mapper = map_pages([torch.ones(0), torch.ones(8, device="meta")])
    assert mapper._thread is None
    mapper.wait()
    mapper.cancel()
