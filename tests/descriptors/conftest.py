"""Fixtures of the descriptor tests."""

import pytest
from crafting import save_filled


@pytest.fixture
def filled_file(tmp_path):
    """A program file ``torchdefer.save_program`` wrote, for tests to craft from."""
    return save_filled(tmp_path / "filled.tdp")
