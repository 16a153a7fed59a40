"""Errors raised by descriptor checks, scripting and program files (defined in
:mod:`torchdefer.errors`, re-exported here)."""

from __future__ import annotations

from torchdefer.errors import DescriptorConflict, DescriptorMismatch, MissingGraph, ProgramFileError

__all__ = ["DescriptorConflict", "DescriptorMismatch", "MissingGraph", "ProgramFileError"]
