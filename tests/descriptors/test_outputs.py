"""Output descriptors never run the model's classes on descriptor objects:
outputs of pytree-registered classes whose unflatten (or ``__new__``) rejects
what is not a tensor script, call and save like eager, and are described by
``ObjectOf`` with the keys their registration gives."""

import collections
import dataclasses
import re
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.utils._pytree as pytree

import torchdefer
from torchdefer.descriptors import DescriptorMismatch, MetaTensorType, ObjectOf

F32 = torch.float32
ROWS = MetaTensorType(["b", 4], F32)
PARTIAL = MetaTensorType(["b", 4])  # dtype left open: the first call builds the graph

UNFLATTENED = []  # what the registered unflatten was given, call by call


class P:
    """A container that holds tensors only, as many user classes do."""

    def __init__(self, value, total):
        if not (isinstance(value, torch.Tensor) and isinstance(total, torch.Tensor)):
            raise TypeError("P holds tensors")
        self.value, self.total = value, total


def _unflatten_p(children, context):
    UNFLATTENED.append(list(children))
    return P(*children)


pytree.register_pytree_node(P, lambda p: ([p.value, p.total], None), _unflatten_p,
                            serialized_type_name="test_outputs.P")


@dataclasses.dataclass
class Named:
    logits: torch.Tensor
    extra: P


pytree.register_dataclass(Named, serialized_type_name="test_outputs.Named")
# How torch's pytree names a dataclass field: ".logits" (GetAttrKey) since
# torch 2.9, "['logits']" (MappingKey) before; descriptors follow torch's keys.
_T = torch.ones(1)
LOGITS, EXTRA = (pytree.keystr(path) for path, _ in
                 pytree.tree_flatten_with_path(Named(_T, _T))[0])


class Strict(collections.namedtuple("Strict", ["value", "total"])):
    def __new__(cls, value, total):
        if not isinstance(value, torch.Tensor):
            raise TypeError("Strict holds tensors")
        return super().__new__(cls, value, total)


def returns_p(x):
    return P(x * 2, x.sum(0))


@pytest.mark.parametrize("descriptor", [ROWS, PARTIAL], ids=["full", "partial"])
def test_output_of_a_class_whose_unflatten_rejects_descriptors_scripts_and_matches_eager(
        descriptor):
    UNFLATTENED.clear()
    p = torchdefer.script(returns_p, {"x": descriptor})
    for b in (0, 1, 3):
        x = torch.randn(b, 4)
        got, want = p(x), returns_p(x)
        assert type(got) is P
        torch.testing.assert_close((got.value, got.total), (want.value, want.total))
    assert all(isinstance(c, torch.Tensor) for call in UNFLATTENED for c in call)
    d = p.output_descriptors
    assert isinstance(d, ObjectOf) and d.type is P
    assert d.keys == (pytree.SequenceKey(0), pytree.SequenceKey(1))  # no flatten_with_keys
    assert d[0] == MetaTensorType(["b", 4], F32, device="cpu", layout=torch.strided)
    assert d[1] == MetaTensorType([4], F32, device="cpu", layout=torch.strided)


def test_output_descriptors_of_registered_classes_are_named_by_their_pytree_keys():
    def f(x):
        return {"out": Named(x + 1, P(x, x.sum(0))), "n": 3}

    p = torchdefer.script(f, {"x": ROWS})
    d = p.output_descriptors
    assert d["n"] == 3
    assert d["out"].logits.shape == ("b", 4)
    assert d["out"]["logits"] is d["out"].logits
    assert d["out"].extra.type is P and d["out"].extra[1].shape == (4,)
    assert "'out'" in repr(d) and LOGITS in repr(d)
    with pytest.raises(AttributeError,
                       match=re.escape(f"Named has no 'logit'; it has {LOGITS}, {EXTRA}")):
        getattr(d["out"], "logit")  # noqa: B009 (the attribute read is the test)
    with pytest.raises(KeyError, match=r"has no 2; it has \[0\], \[1\]"):
        d["out"].extra[2]
    x = torch.randn(2, 4)
    got, want = p(x), f(x)
    assert type(got["out"]) is Named and type(got["out"].extra) is P
    torch.testing.assert_close(got["out"].logits, want["out"].logits)


def test_namedtuple_outputs_are_described_without_their_own_new():
    p = torchdefer.script(lambda x: Strict(x * 2, x.sum(0)), {"x": ROWS})
    d = p.output_descriptors
    assert type(d) is Strict and d.value.shape == ("b", 4) and d.total.shape == (4,)
    x = torch.randn(3, 4)
    got = p(x)
    assert type(got) is Strict
    torch.testing.assert_close(tuple(got), (x * 2, x.sum(0)))


def test_torch_return_types_are_described_as_themselves():
    p = torchdefer.script(lambda x: x.max(1), {"x": ROWS})
    d = p.output_descriptors
    assert type(d) is torch.return_types.max
    assert d.values.shape == ("b",) and d.indices.dtype == torch.long
    x = torch.randn(3, 4)
    torch.testing.assert_close(tuple(p(x)), tuple(x.max(1)))


class Unregistered:
    def __init__(self, value, label):
        if not isinstance(value, torch.Tensor):
            raise TypeError("Unregistered holds a tensor")
        self.value, self.label = value, label


def test_unregistered_objects_are_described_by_their_attributes():
    p = torchdefer.script(lambda x: Unregistered(x + 1, "plus"), {"x": ROWS})
    d = p.output_descriptors
    assert isinstance(d, ObjectOf) and d.type is Unregistered
    assert d.value.shape == ("b", 4) and d.label == "plus"
    got = p(torch.ones(2, 4))
    assert type(got) is Unregistered and got.label == "plus"


def test_output_keys_survive_save_and_load(tmp_path):
    def f(x):
        return Named(x + 1, P(x, x.sum(0)))

    p = torchdefer.script(f, {"x": ROWS})
    torchdefer.save_program(p, tmp_path / "p.tdp")
    q = torchdefer.load_program(tmp_path / "p.tdp")
    assert q.output_descriptors == p.output_descriptors
    assert q.output_descriptors.extra.type is P
    x = torch.randn(5, 4)
    got = q(x)
    assert type(got) is Named and type(got.extra) is P
    torch.testing.assert_close(got.extra.total, x.sum(0))


LLAMA = textwrap.dedent("""
    import os, sys, tempfile, torch, torchdefer, transformers
    from transformers.integrations.executorch import register_dynamic_cache_export_support
    from torchdefer.descriptors import DescriptorMismatch, MetaTensorType, ObjectOf
    register_dynamic_cache_export_support()
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    p = torchdefer.script(model, {"input_ids": MetaTensorType(["b", "s"], torch.long)})
    d = p.output_descriptors
    assert isinstance(d, ObjectOf) and d.logits.shape == ("b", "s", 64), d
    cache = d.past_key_values
    assert cache.type is transformers.DynamicCache, cache
    assert [k.shape for k in cache.key_cache] == [("b", 2, "s", 16)] * 2, cache
    def check(program):
        for b, s in [(2, 5), (1, 1), (3, 2)]:
            ids = torch.randint(0, 64, (b, s))
            with torch.no_grad():
                got, want = program(ids), model(ids)
            assert type(got.past_key_values) is type(want.past_key_values)
            torch.testing.assert_close(got.logits, want.logits)
            for a, e in zip(got.past_key_values.layers, want.past_key_values.layers):
                torch.testing.assert_close((a.keys, a.values), (e.keys, e.values))
    check(p)  # builds the 1x1 case too, so the file holds it
    path = os.path.join(tempfile.mkdtemp(), "llama.tdp")
    torchdefer.save_program(p, path)
    q = torchdefer.load_program(path)
    assert q.output_descriptors == d
    check(q)
    print("ok")
""")


@pytest.mark.slow
def test_llama_with_transformers_cache_export_support_scripts_saves_and_matches_eager():
    """In a process of its own: the registration is global and other tests
    check the unregistered cache."""
    pytest.importorskip("transformers")
    run = subprocess.run([sys.executable, "-c", LLAMA], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]


def sum_p(p, scale: float = 1.0):
    return p.value * scale + p.total


def test_inputs_of_a_class_whose_unflatten_rejects_descriptors_are_described_and_checked():
    UNFLATTENED.clear()
    examples = [(P(torch.ones(b, 4), torch.ones(4)),) for b in (2, 3)]
    d = torchdefer.describe(sum_p, *examples)
    assert isinstance(d["p"], ObjectOf) and d["p"].type is P
    assert d["p"][0].shape == ("d0", 4) and d["p"][1].shape == (4,)
    p = torchdefer.script(sum_p, d)
    for b in (0, 1, 2, 5):
        arg = P(torch.randn(b, 4), torch.randn(4))
        torch.testing.assert_close(p(arg), sum_p(arg))
    assert all(isinstance(c, torch.Tensor) for call in UNFLATTENED for c in call)
    with pytest.raises(DescriptorMismatch, match=r"p\[1\].shape\[0\]: expected 4, got 3"):
        p(P(torch.randn(2, 4), torch.randn(3)))
    with pytest.raises(DescriptorMismatch, match=r"p \(structure\): expected a P of length 2, "
                                                 r"got a tuple"):
        p((torch.randn(2, 4), torch.randn(4)))


def test_dataclass_inputs_are_described_by_their_attribute_names():
    def f(n):
        return n.logits + n.extra.total

    d = torchdefer.describe(f, (Named(torch.ones(2, 4), P(torch.ones(4), torch.ones(4))),))
    assert d["n"].type is Named and d["n"].logits.shape == (2, 4)
    p = torchdefer.script(f, d)
    arg = Named(torch.randn(2, 4), P(torch.randn(4), torch.randn(4)))
    torch.testing.assert_close(p(arg), f(arg))
    with pytest.raises(DescriptorMismatch,
                       match=re.escape(f"n{LOGITS}.shape[1]: expected 4, got 5")):
        p(Named(torch.randn(2, 5), P(torch.randn(4), torch.randn(4))))


def test_a_program_with_object_inputs_says_a_file_cannot_hold_them(tmp_path):
    d = torchdefer.describe(sum_p, (P(torch.ones(2, 4), torch.ones(4)),))
    p = torchdefer.script(sum_p, d)
    with pytest.raises(TypeError, match=r"cannot be saved in a program file: it describes a P "
                                        r"without building one"):
        torchdefer.save_program(p, tmp_path / "p.tdp")
