"""torchdefer quickstart: a 70B-parameter Llama, deferred, inspected, partly materialized.

Run with `make demo`. Nothing is downloaded: the model is built from a config.

1. Defer a Llama-shaped model with 70B parameters (~280 GB in fp32): no tensor
   storage is allocated, so it takes well under a second and a few MiB.
2. Print its structure, parameter count and the bytes it would need.
3. Write the recorded graph to a file (80 identical layers drawn as one).
4. Materialize one 70B-shaped decoder layer on the CPU and check it is bit for
   bit what eager construction of that layer gives (a standalone layer: eager
   construction of the whole model, the reference, needs 280 GB).
5. Materialize layer 40 *inside* the 70B model: the CPU generator jumps to
   where that layer's draws start, so it costs about what step 4 cost, not
   the draws of the 40 layers before it.
"""

from __future__ import annotations

import time
from collections import Counter

import psutil
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

import torchdefer

CONFIG = LlamaConfig(
    hidden_size=8192,
    intermediate_size=28672,
    num_hidden_layers=80,
    num_attention_heads=64,
    num_key_value_heads=8,
    vocab_size=128256,
)


def gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def main() -> None:
    process = psutil.Process()
    rss = process.memory_info().rss

    # 1. Defer the whole model.
    start = time.perf_counter()
    torch.manual_seed(0)
    model = torchdefer.deferred_init(LlamaForCausalLM, CONFIG)
    elapsed = time.perf_counter() - start
    grown = process.memory_info().rss - rss
    print(f"Deferred LlamaForCausalLM in {elapsed:.2f} s; "
          f"process memory grew by {grown / 2**20:.0f} MiB")

    # 2. Structure, parameters, bytes.
    print(model)
    unique = {id(t): t for t in (*model.parameters(), *model.buffers())}.values()
    params = sum(p.numel() for p in model.parameters())
    need = Counter()
    for t in unique:
        need[(str(t.device), str(t.dtype))] += t.numel() * t.element_size()
    print(f"\nParameters: {params / 1e9:.2f} B")
    for (device, dtype), nbytes in sorted(need.items()):
        print(f"  would need {gib(nbytes)} of {dtype} on {device}")
    print(f"  e.g. {model.model.layers[0].mlp.down_proj.weight!r}")

    # 3. The recorded graph, as a picture when Graphviz is installed.
    from torchdefer.viz import GraphvizNotFoundError, write_graph

    try:
        graph = write_graph(model, "out/llama70b_graph.svg")
    except GraphvizNotFoundError:  # no `dot` program: write the source instead
        graph = write_graph(model, "out/llama70b_graph.dot")
    print(f"\nRecorded graph (80 decoder layers drawn as one x80 cluster): {graph.resolve()}")

    # 4. One 70B-shaped decoder layer, deferred then materialized, against eager.
    print("\nBuilding one 70B-shaped decoder layer eagerly and deferred (about a minute)...")
    torch.manual_seed(0)
    eager = LlamaDecoderLayer(CONFIG, layer_idx=0)
    torch.manual_seed(0)
    layer = torchdefer.deferred_init(LlamaDecoderLayer, CONFIG, layer_idx=0)
    start = time.perf_counter()
    torchdefer.materialize_module(layer, device="cpu")
    print(f"Materialized {sum(p.numel() for p in layer.parameters()) / 1e6:,.0f} M parameters "
          f"in {time.perf_counter() - start:.1f} s")
    reference = dict(eager.named_parameters())
    for name, param in layer.named_parameters():
        same = torch.equal(param, reference[name]) and param.dtype == reference[name].dtype
        print(f"  {name:32s} {tuple(param.shape)!s:16s} {'identical' if same else 'DIFFERENT'}")
        if not same:
            raise SystemExit(f"{name} differs from eager construction")
    print("Every parameter is bit for bit what eager construction gave.")
    del eager, reference, layer

    # 5. A layer deep inside the 70B model costs only its own draws.
    start = time.perf_counter()
    torchdefer.materialize_module(model.model.layers[40], device="cpu")
    elapsed = time.perf_counter() - start
    print(f"\nMaterialized model.layers[40] of the 70B model in {elapsed:.1f} s "
          "(the generator jumped over the 40 layers before it).")


if __name__ == "__main__":
    main()
