"""``python -m torchdefer save-init``: the written directory equals eager construction."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchdefer._cli import main

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

CONFIG = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300}


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


def test_save_init_writes_what_from_pretrained_loads_as_eager_then_bfloat16(tmp_path):
    config_file = tmp_path / "cfg.json"
    config_file.write_text(json.dumps(CONFIG))
    status, out = run("save-init", "transformers:LlamaForCausalLM", "--config",
                      str(config_file), "--out", str(tmp_path / "init"), "--dtype", "bfloat16",
                      "--format", "safetensors", "--seed", "0", "--max-shard-size", "100KB")
    assert status == 0
    assert out.startswith("Built LlamaForCausalLM with deferred_init")
    assert "(seed 0)" in out and str(tmp_path / "init") in out
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "init")
    torch.manual_seed(0)
    eager = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).to(torch.bfloat16)
    for name, tensor in eager.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert json.loads((tmp_path / "init" / "config.json").read_text())["dtype"] == "bfloat16"


def test_python_m_torchdefer_save_init_writes_a_dcp_seed_checkpoint(tmp_path):
    import torch.distributed.checkpoint as dcp

    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [sys.executable, "-m", "torchdefer", "save-init", "torch.nn:Linear", "--kwargs",
         '{"in_features": 5, "out_features": 3}', "--out", str(tmp_path / "seed"),
         "--format", "dcp", "--seed", "4"],
        capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    torch.manual_seed(4)
    eager = torch.nn.Linear(5, 3)
    state = torch.nn.Linear(5, 3).state_dict()
    dcp.load(state, checkpoint_id=str(tmp_path / "seed"), no_dist=True)
    for name, tensor in eager.state_dict().items():
        assert torch.equal(state[name], tensor), name


@pytest.mark.parametrize("extra,status,message", [
    (["--dtype", "bfloat17"], 2, "--dtype 'bfloat17' is not a torch dtype"),
    (["--dtype", "int8"], 1, "not a floating point"),
    (["--config", "{}"], 2, "--config needs --config-class"),
    (["--max-shard-size", "lots"], 1, "not a size"),
])
def test_save_init_errors_say_what_to_change(tmp_path, capsys, extra, status, message):
    got, _ = run("save-init", "torch.nn:Linear", "--kwargs",
                 '{"in_features": 2, "out_features": 2}', "--out", str(tmp_path / "x"), *extra)
    assert got == status
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_save_init_never_writes_into_a_non_empty_directory(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "old.safetensors").write_bytes(b"")
    status, _ = run("save-init", "torch.nn:Linear", "--kwargs",
                    '{"in_features": 2, "out_features": 2}', "--out", str(tmp_path / "x"))
    assert status == 1
    assert "not empty" in capsys.readouterr().err
    assert os.listdir(tmp_path / "x") == ["old.safetensors"]
