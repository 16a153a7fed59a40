"""A Llama 3 written to torchtitan 0.3's init scheme (``models/llama3``), for the benchmarks.

torchtitan does not import on a CPU build without triton, so its model is
written again here with the same parameters and the same ``init_weights``:
every linear ``trunc_normal_(std=0.02)`` (wq, wk, wv, w1) or the depth-scaled
std ``0.02 / sqrt(2 * (layer_id + 1))`` (wo, w2, w3), default bounds ``a=-2,
b=2`` (100 sigma); the embedding ``normal_``; RMSNorms reset; the output
``trunc_normal_(std=dim**-0.5)`` with 3-sigma bounds (``three_sigma=False``:
default bounds, so that every bound is unreachable).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["LLAMA3_8B", "TitanArgs", "TitanLlama"]


@dataclass(kw_only=True, slots=True)
class TitanArgs:
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int = 8
    hidden: int = 14336
    vocab: int = 128256
    max_seq_len: int = 8192
    rope_theta: float = 500000.0
    three_sigma: bool = True


LLAMA3_8B = TitanArgs()


class Attention(nn.Module):
    def __init__(self, a: TitanArgs) -> None:
        super().__init__()
        head = a.dim // a.n_heads
        self.wq = nn.Linear(a.dim, a.n_heads * head, bias=False)
        self.wk = nn.Linear(a.dim, a.n_kv_heads * head, bias=False)
        self.wv = nn.Linear(a.dim, a.n_kv_heads * head, bias=False)
        self.wo = nn.Linear(a.n_heads * head, a.dim, bias=False)

    def init_weights(self, init_std: float) -> None:
        for linear in (self.wq, self.wk, self.wv):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=0.02)
        nn.init.trunc_normal_(self.wo.weight, mean=0.0, std=init_std)


class FeedForward(nn.Module):
    def __init__(self, a: TitanArgs) -> None:
        super().__init__()
        self.w1 = nn.Linear(a.dim, a.hidden, bias=False)
        self.w2 = nn.Linear(a.hidden, a.dim, bias=False)
        self.w3 = nn.Linear(a.dim, a.hidden, bias=False)

    def init_weights(self, init_std: float) -> None:
        nn.init.trunc_normal_(self.w1.weight, mean=0.0, std=0.02)
        for linear in (self.w2, self.w3):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=init_std)


class Block(nn.Module):
    def __init__(self, layer_id: int, a: TitanArgs) -> None:
        super().__init__()
        self.attention = Attention(a)
        self.feed_forward = FeedForward(a)
        self.attention_norm = nn.RMSNorm(a.dim, eps=1e-5)
        self.ffn_norm = nn.RMSNorm(a.dim, eps=1e-5)
        self.weight_init_std = 0.02 / (2 * (layer_id + 1)) ** 0.5  # depth_init

    def init_weights(self) -> None:
        for norm in (self.attention_norm, self.ffn_norm):
            norm.reset_parameters()
        self.attention.init_weights(self.weight_init_std)
        self.feed_forward.init_weights(self.weight_init_std)


class TitanLlama(nn.Module):
    """Built and initialized as torchtitan does (``init_weights`` after construction)."""

    def __init__(self, a: TitanArgs) -> None:
        super().__init__()
        self.args = a
        self.tok_embeddings = nn.Embedding(a.vocab, a.dim)
        self.register_buffer("freqs_cis", self._freqs_cis(), persistent=True)
        self.layers = nn.ModuleDict({str(i): Block(i, a) for i in range(a.n_layers)})
        self.norm = nn.RMSNorm(a.dim, eps=1e-5)
        self.output = nn.Linear(a.dim, a.vocab, bias=False)
        self.init_weights()

    def _freqs_cis(self) -> torch.Tensor:
        a = self.args
        head = a.dim // a.n_heads
        freqs = 1.0 / (a.rope_theta ** (torch.arange(0, head, 2)[: head // 2].float() / head))
        t = torch.arange(a.max_seq_len * 2, dtype=torch.float32)
        return torch.outer(t, freqs).cos()  # real part: complex buffers are beside the point

    def init_weights(self) -> None:
        nn.init.normal_(self.tok_embeddings.weight)
        for layer in self.layers.values():
            layer.init_weights()
        self.norm.reset_parameters()
        std = self.args.dim**-0.5
        cutoff = 3 if self.args.three_sigma else 2 / std  # 2 / std: the default a=-2, b=2
        nn.init.trunc_normal_(self.output.weight, mean=0.0, std=std, a=-cutoff * std,
                              b=cutoff * std)  # fmt: skip
