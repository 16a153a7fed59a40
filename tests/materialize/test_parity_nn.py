"""Every common torch.nn layer, built eagerly and deferred, is bitwise identical."""

import pytest
import torch
from torch import nn

import torchdefer
from parity import build_both, check_module_parity

LAYERS = {
    "linear": lambda: nn.Linear(8, 4),
    "linear_no_bias": lambda: nn.Linear(8, 4, bias=False),
    "conv1d": lambda: nn.Conv1d(3, 4, 3),
    "conv2d": lambda: nn.Conv2d(3, 4, 3, groups=1),
    "conv3d": lambda: nn.Conv3d(2, 2, 2),
    "conv_transpose2d": lambda: nn.ConvTranspose2d(3, 4, 3),
    "batchnorm": lambda: nn.BatchNorm2d(4),
    "layernorm": lambda: nn.LayerNorm(6),
    "groupnorm": lambda: nn.GroupNorm(2, 4),
    "embedding_padding_idx": lambda: nn.Embedding(10, 4, padding_idx=2),
    "embedding_bag": lambda: nn.EmbeddingBag(10, 4),
    "lstm": lambda: nn.LSTM(4, 8, num_layers=2),
    "gru_bidirectional": lambda: nn.GRU(4, 8, bidirectional=True),
    "multihead_attention": lambda: nn.MultiheadAttention(8, 2),
    "multihead_attention_kdim": lambda: nn.MultiheadAttention(8, 2, kdim=4, vdim=4),
    "transformer": lambda: nn.Transformer(
        d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
        dim_feedforward=32, batch_first=True,
    ),
    "bilinear": lambda: nn.Bilinear(3, 4, 5),
    "prelu": lambda: nn.PReLU(3),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_matches_eager_bitwise(name):
    check_module_parity(LAYERS[name])


@pytest.mark.parametrize("seed", [0, 1, 1234])
def test_parity_holds_for_any_seed(seed):
    eager, deferred = build_both(lambda: nn.Sequential(nn.Linear(5, 5), nn.LayerNorm(5)), seed=seed)
    torchdefer.materialize_module(deferred)
    for a, b in zip(eager.parameters(), deferred.parameters(), strict=True):
        assert torch.equal(a, b)


def test_materialized_lstm_runs_and_matches_eager():
    eager, deferred = build_both(lambda: nn.LSTM(4, 6, num_layers=2))
    torchdefer.materialize_module(deferred)
    x = torch.randn(3, 2, 4)
    out_eager, _ = eager(x)
    out_deferred, _ = deferred(x)
    assert torch.equal(out_eager, out_deferred)
    assert all(w is p for w, p in zip(deferred._flat_weights, deferred.parameters(), strict=True))
