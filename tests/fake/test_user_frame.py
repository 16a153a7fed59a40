"""Which frame is "the user's line" in messages: torch, torchdefer, the standard
library and generated code are not; code compiled from strings is."""

import dataclasses
import os
import sys

import pytest
import torch

import torchdefer
from torchdefer.fake import _source


@pytest.fixture
def stdlib_holding_site_packages(monkeypatch):
    # conda, the Docker python images, pyenv without a venv: site-packages
    # (torch included) lives inside the standard library's directory.
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    monkeypatch.setattr(_source, "_STDLIB", os.path.dirname(os.path.dirname(torch_dir)) + os.sep)
    _source.is_library_file.cache_clear()
    yield torch_dir
    _source.is_library_file.cache_clear()


def test_torch_and_torchdefer_frames_are_library_code_in_any_layout(stdlib_holding_site_packages):
    torch_dir = stdlib_holding_site_packages
    assert _source.is_library_file(os.path.join(torch_dir, "nn", "modules", "module.py"))
    assert _source.is_library_file(os.path.abspath(torchdefer.__file__))
    user_package = os.path.join(os.path.dirname(torch_dir), "mymodels", "model.py")
    assert not _source.is_library_file(user_package)  # an installed model library is the user's


def test_strings_compiled_by_the_user_are_theirs_generated_methods_are_not():
    assert not _source.is_library_file("<string>") and not _source.is_library_file("<stdin>")
    assert _source.is_library_file("<frozen importlib._bootstrap>")
    assert _source.is_library_file("<eval_with_key>.3")

    @dataclasses.dataclass
    class Box:
        t: object

    # Code objects know their qualified name from 3.11; on 3.10 a generated
    # method looks like code compiled from a string, the user's.
    assert _source.is_library_code(Box.__eq__.__code__) == (sys.version_info >= (3, 11))
    namespace = {}
    exec(compile("def f():\n    return 1\n", "<string>", "exec"), namespace)
    assert not _source.is_library_code(namespace["f"].__code__)
