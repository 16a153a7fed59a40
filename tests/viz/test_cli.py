"""``python -m torchdefer inspect`` end to end, on small models and a 70B Llama shape."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import torch
from viz_models import Stack

from torchdefer._cli import main
from torchdefer.viz._format import fmt_bytes

needs_graphviz = pytest.mark.skipif(importlib.util.find_spec("graphviz") is None,
                                    reason="needs the graphviz Python package (torchdefer[viz])")
needs_dot = pytest.mark.skipif(shutil.which("dot") is None or not importlib.util.find_spec("graphviz"),
                               reason="Graphviz's dot program or Python package is not installed")
TIMES, DASH = "\u00d7", "\u2013"
LLAMA_70B = {
    "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
    "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
}


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


def tree_line(output: str, start: str) -> str:
    return next(ln for ln in output.splitlines() if ln.lstrip("│├└─ ").startswith(start))


def test_inspect_prints_tree_with_parameter_counts_of_the_eager_model():
    eager = Stack()
    status, out = run("inspect", "viz_models:Stack")
    assert status == 0
    assert out.startswith("Built Stack with deferred_init")
    total = sum(p.numel() for p in eager.parameters())
    assert tree_line(out, "Stack").split()[-1] == f"{total:,}"
    layer = sum(p.numel() for p in eager.layers[0].parameters())
    n = len(eager.layers)
    assert tree_line(out, f"0{DASH}{n - 1} (Block) {TIMES}{n}").endswith(f"{layer:,} each")
    expert = sum(p.numel() for p in eager.layers[0].experts[0].parameters())
    assert tree_line(out, f"0{DASH}2 (Expert) {TIMES}3").endswith(f"{expert:,} each")


def test_inspect_prints_bytes_per_device_and_dtype_counting_tied_storage_once():
    eager = Stack()
    status, out = run("inspect", "viz_models:Stack", "--kwargs", '{"widths": [8, 8, 8]}',
                      "--dtype", "bfloat16", "--device", "cuda")
    assert status == 0
    assert torch.get_default_dtype() == torch.float32  # restored
    eager = Stack((8, 8, 8)).to(torch.bfloat16)
    unique = {id(t): t for t in [*eager.parameters(), *eager.buffers()]}.values()
    nbytes = sum(t.numel() * t.element_size() for t in unique)
    row = next(ln for ln in out.splitlines() if ln.startswith("cuda:0"))
    assert row.split()[:3] == ["cuda:0", "bfloat16", str(len(unique))]
    assert fmt_bytes(nbytes) in row


@needs_graphviz
def test_inspect_writes_the_dot_source_and_explains_a_parameter(tmp_path):
    path = tmp_path / "stack.dot"
    status, out = run("inspect", "viz_models:Stack", "--dot", str(path),
                      "--explain", "layers.1.proj.weight", "--explain", "head.weight")
    assert status == 0
    assert path.read_text().startswith("digraph Stack {")
    assert f"Graph written to {path}" in out
    assert "module path: layers.1.proj.weight" in out
    assert "module path: embed.weight, head.weight" in out


def test_inspect_passes_a_config_object_built_from_json(tmp_path):
    status, out = run("inspect", "torch.nn:TransformerEncoder",
                      "--config-class", "torch.nn:TransformerEncoderLayer",
                      "--config", '{"d_model": 16, "nhead": 2, "dim_feedforward": 32}',
                      "--kwargs", '{"num_layers": 3, "enable_nested_tensor": false}')
    assert status == 0, out
    eager = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(16, 2, 32), 3,
                                        enable_nested_tensor=False)
    layer = sum(p.numel() for p in eager.layers[0].parameters())
    assert tree_line(out, f"0{DASH}2 (TransformerEncoderLayer) {TIMES}3").endswith(
        f"{layer:,} each")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["inspect", "torch.nn.Linear"], "must look like PACKAGE.MODULE:NAME"),
        (["inspect", "no_such_pkg:Model"], "cannot import 'no_such_pkg'"),
        (["inspect", "torch.nn:Nope"], "has no attribute 'Nope'"),
        (["inspect", "torch.nn:Linear", "--kwargs", "{in: 2}"], "--kwargs is not valid JSON"),
        (["inspect", "torch.nn:Linear", "--kwargs", "[2, 2]"], "must be a JSON object"),
        (["inspect", "torch.nn:Linear", "--config", "{}"], "--config needs --config-class"),
        (["inspect", "viz_models:Stack", "--explain", "layers.0.proj.wieght"],
         "Did you mean layers.0.proj.weight"),
        (["inspect", "viz_models:Stack", "--dtype", "int8"], "not a floating torch dtype"),
        (["inspect", "torch:randn", "--kwargs", '{"size": [2]}'], "not an nn.Module"),
    ],
)
def test_inspect_mistakes_exit_2_with_a_message_that_says_what_to_change(argv, message, capsys):
    assert main(argv, out=io.StringIO()) == 2
    assert message in capsys.readouterr().err


@needs_graphviz
def test_rendering_without_dot_fails_with_the_install_hint(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    status, _ = run("inspect", "viz_models:Stack", "--dot", str(tmp_path / "g.svg"))
    assert status == 1
    err = capsys.readouterr().err
    assert "apt-get install graphviz" in err and f"--dot {tmp_path / 'g'}.dot" in err


def llama_70b_parameter_count() -> int:
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        eager = LlamaForCausalLM(LlamaConfig(**LLAMA_70B))
    return sum(p.numel() for p in eager.parameters())


@needs_dot
def test_inspect_a_70b_llama_end_to_end(tmp_path):
    svg = tmp_path / "llama.svg"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-m", "torchdefer", "inspect", "transformers:LlamaForCausalLM",
         "--config-class", "transformers:LlamaConfig", "--config", json.dumps(LLAMA_70B),
         "--dtype", "bfloat16", "--dot", str(svg),
         "--explain", "model.layers.3.mlp.down_proj.weight"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    total = llama_70b_parameter_count()
    assert tree_line(out, "LlamaForCausalLM").split()[-1] == f"{total:,}"
    assert f"0{DASH}79 (LlamaDecoderLayer) {TIMES}80" in out
    bf16 = next(ln for ln in out.splitlines() if ln.startswith("cpu     bfloat16"))
    assert fmt_bytes(2 * total) in bf16
    lines = out.splitlines()
    assert lines[-1] == "module path: model.layers.3.mlp.down_proj.weight"
    assert "random   normal_(" in out and "draw" in out
    text = "".join(ET.parse(svg).getroot().itertext())
    assert f"0{DASH}79 {TIMES}80 (LlamaDecoderLayer)" in text
    assert "down_proj (Linear)" in text and "Legend" in text


@needs_graphviz
def test_no_collapse_and_max_nodes_reach_the_picture(tmp_path):
    path = tmp_path / "stack.dot"
    status, out = run("inspect", "viz_models:Stack", "--dot", str(path), "--no-collapse")
    assert status == 0
    source = path.read_text()
    assert all(f'label="{i} (Block)"' in source for i in range(len(Stack().layers)))
    status, out = run("inspect", "viz_models:Stack", "--dot", str(path), "--max-nodes", "5")
    assert status == 0 and "left out by --max-nodes" in out
    assert "more recorded ops not shown (max_nodes=5)" in path.read_text()


def test_max_nodes_below_one_is_a_usage_error(tmp_path, capsys):
    status, _ = run("inspect", "viz_models:Stack", "--dot", str(tmp_path / "g.dot"),
                    "--max-nodes", "0")
    assert status == 2
    assert "max_nodes must be at least 1" in capsys.readouterr().err


def test_inspect_help_is_plain_text_with_its_examples(capsys):
    with pytest.raises(SystemExit):
        main(["inspect", "--help"])
    text = capsys.readouterr().out
    for markup in ("``", ":func:", "::"):
        assert markup not in text, markup
    assert "examples:\n  python -m torchdefer inspect torch.nn:Linear" in text
    assert "--config-class transformers:LlamaConfig \\\n" in text


def _graph_counts(line: str) -> dict[str, int]:
    import re

    found = dict((what, int(n)) for n, what in re.findall(
        r"(\d+) (?:more )?(ops drawn|folded|left out|recorded ops no)", line))
    return found


@needs_graphviz
@pytest.mark.parametrize("extra", [[], ["--no-collapse"], ["--max-nodes", "20"]])
def test_graph_counts_add_up_to_the_recorded_ops_of_the_build_line(tmp_path, extra):
    config = json.dumps({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
                         "num_attention_heads": 4, "num_key_value_heads": 2,
                         "vocab_size": 256})
    status, out = run("inspect", "transformers:LlamaForCausalLM", "--config-class",
                      "transformers:LlamaConfig", "--config", config,
                      "--dot", str(tmp_path / "g.dot"), *extra)
    assert status == 0
    recorded = int(out.split(" ops recorded")[0].rsplit(" ", 1)[1])
    counts = _graph_counts(next(ln for ln in out.splitlines() if ln.startswith("Graph written")))
    assert sum(counts.values()) == recorded, (counts, recorded)


@needs_graphviz
def test_clusters_are_drawn_in_definition_order(tmp_path):
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.zeta = torch.nn.Linear(2, 2)
            self.alpha = torch.nn.Linear(2, 2)

    import torchdefer
    from torchdefer.viz import to_dot

    source = to_dot(torchdefer.deferred_init(Model)).source
    assert source.index("zeta (Linear)") < source.index("alpha (Linear)")


def test_inspect_materialize_shows_progress_and_the_time(capsys):
    status, out = run("inspect", "torch.nn:Linear", "--kwargs",
                      '{"in_features": 64, "out_features": 32}', "--materialize", "cpu",
                      "--progress")
    assert status == 0
    assert "Materialized on cpu in" in out
    assert "materialize" in capsys.readouterr().err
