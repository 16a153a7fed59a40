"""Input descriptors and descriptor-specialized scripting.

Describe a model's inputs once, get a program specialized to them that checks
every call::

    import torch, torchdefer
    from torchdefer import MetaTensorType
    program = torchdefer.script(model, {
        "x": MetaTensorType(["b", 10], torch.float32, dim_ranges={"b": (1, 64)}),
        "flag": True,                                   # value specialization
    })
    program(torch.randn(7, 10), True)                   # checked, then run
    program.output_descriptors                          # e.g. MetaTensorType(['b', 3], ...)
    torchdefer.save_program(program, "model.tdp"); torchdefer.load_program("model.tdp")

Each module's docstring says how its part works and why. Modules import only
those before them in this order: ``_call``, ``_expr``, ``_meta_tensor_type``,
``_object_of``, ``_tree``, ``_checker``, ``_weights``, ``_outputs``, ``_conflict``,
the backends, ``_program``, ``_archive``, ``_describe`` (the error classes are
in :mod:`torchdefer.errors`). The
private torch APIs they use (export's serializer, ShapeEnv, dynamo) come
from the project's compat package, ``torchdefer._compat.export``.
"""

from torchdefer.descriptors._archive import load, load_program, save, save_program
from torchdefer.descriptors._describe import describe
from torchdefer.descriptors._meta_tensor_type import MetaTensorType
from torchdefer.descriptors._object_of import ObjectOf
from torchdefer.descriptors._program import Program, script
from torchdefer.descriptors._tree import Descriptor
from torchdefer.errors import (
    DescriptorConflict,
    DescriptorMismatch,
    MissingGraph,
    ProgramFileError,
)

__all__ = ["Descriptor", "DescriptorConflict", "DescriptorMismatch", "MetaTensorType",
           "MissingGraph", "ObjectOf", "Program", "ProgramFileError", "describe", "load",
           "load_program", "save", "save_program", "script"]
