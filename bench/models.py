"""The model zoo: Llama-shaped ``transformers`` models and a synthetic 1T-parameter stack.

Llama shapes follow the published configurations (Llama 3.x: grouped-query
attention, 128256-token vocabulary; the small ones GPT-3-small/medium sized),
so op counts and tensor sizes are what a user meets. Parameter counts are
computed from the shapes here (for the parent, which decides what fits in
memory) and counted again on the built model by the child.

The 1T stack is plain ``torch.nn`` (no ``transformers``): LayerNorm, an
up-projection and a down-projection per block, as many blocks as reach 10^12
parameters. It exists to show that recording cost follows the number of ops,
not the number of elements.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ModelSpec", "build_fn", "spec_named", "specs"]

GiB = 1 << 30


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A model of the zoo: its family and shape (fp32 throughout)."""

    name: str
    family: str  # "llama" (transformers.LlamaForCausalLM) or "stack" (plain nn)
    hidden: int
    intermediate: int
    layers: int
    heads: int = 1
    kv_heads: int = 1
    vocab: int = 0
    tied: bool = False

    @property
    def params(self) -> int:
        """Parameter count from the shape (tied weights counted once)."""
        h, f = self.hidden, self.intermediate
        if self.family == "stack":
            return self.layers * (2 * h * f + f + h + 2 * h)
        head_dim = h // self.heads
        attention = 2 * h * h + 2 * h * self.kv_heads * head_dim
        layer = attention + 3 * h * f + 2 * h
        embed = self.vocab * h
        return embed * (1 if self.tied else 2) + self.layers * layer + h

    @property
    def nbytes(self) -> int:
        return 4 * self.params

    def with_layers(self, layers: int) -> ModelSpec:
        """The same shape with another depth (for the ops-vs-time sweep)."""
        fields = {k: getattr(self, k) for k in self.__slots__}
        fields.update(name=f"{self.name}-L{layers}", layers=layers)
        return ModelSpec(**fields)


def _llama(name, hidden, intermediate, layers, heads, kv_heads, vocab, tied=False):
    return ModelSpec(name=name, family="llama", hidden=hidden, intermediate=intermediate,
                     layers=layers, heads=heads, kv_heads=kv_heads, vocab=vocab, tied=tied)


def _stack_1t() -> ModelSpec:
    h, f = 16384, 65536
    per_block = 2 * h * f + f + h + 2 * h
    blocks = round(1e12 / per_block)
    return ModelSpec(name="stack-1t", family="stack", hidden=h, intermediate=f, layers=blocks)


_ZOO = (
    _llama("llama-tiny", 256, 688, 4, 4, 2, 1000),
    _llama("llama-125m", 768, 2048, 12, 12, 12, 32000),
    _llama("llama-350m", 1024, 2816, 24, 16, 16, 32000),
    _llama("llama-1b", 2048, 8192, 16, 32, 8, 128256, tied=True),  # Llama 3.2 1B
    _llama("llama-3b", 3072, 8192, 28, 24, 8, 128256, tied=True),  # Llama 3.2 3B
    _llama("llama-8b", 4096, 14336, 32, 32, 8, 128256),  # Llama 3.1 8B
    _llama("llama-70b", 8192, 28672, 80, 64, 8, 128256),  # Llama 3.1 70B
    _llama("llama-405b", 16384, 53248, 126, 128, 8, 128256),  # Llama 3.1 405B
    _stack_1t(),
    ModelSpec(name="stack-tiny", family="stack", hidden=8, intermediate=16, layers=2),
)


def specs(names: list[str]) -> list[ModelSpec]:
    return [spec_named(n) for n in names]


def spec_named(name: str) -> ModelSpec:
    for spec in _ZOO:
        if spec.name == name:
            return spec
    base, _, depth = name.rpartition("-L")
    if base and depth.isdigit():
        return spec_named(base).with_layers(int(depth))
    known = ", ".join(s.name for s in _ZOO)
    raise KeyError(f"no model named {name!r} in the bench zoo; known: {known}")


def build_fn(spec: ModelSpec) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """``(constructor, args)``: calling ``constructor(*args)`` builds the model.

    The configuration is made here, outside any timed region or mode, so each
    construction method times the same thing: the module's ``__init__``.
    """
    if spec.family == "stack":
        return _Stack, (spec.hidden, spec.intermediate, spec.layers)
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        vocab_size=spec.vocab,
        tie_word_embeddings=spec.tied,
    )
    return transformers.LlamaForCausalLM, (config,)


def llama_for_causal_lm(layers: int, hidden: int, vocab: int) -> Any:
    """A Llama-shaped ``LlamaForCausalLM`` (untied head) from three numbers, for the
    memory benches (checkpoint loading, FSDP2)."""
    import transformers

    config = transformers.LlamaConfig(
        num_hidden_layers=layers, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
        num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 128),
        vocab_size=vocab, tie_word_embeddings=False,
    )
    return transformers.LlamaForCausalLM(config)


def _Stack(hidden: int, intermediate: int, blocks: int):
    """The synthetic stack, built from ``torch.nn`` only."""
    from torch import nn

    def block() -> nn.Module:
        return nn.Sequential(
            nn.LayerNorm(hidden),
            nn.Linear(hidden, intermediate),
            nn.GELU(),
            nn.Linear(intermediate, hidden),
        )

    return nn.Sequential(*(block() for _ in range(blocks)))
