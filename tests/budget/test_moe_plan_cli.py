"""`failsoft plan` on a tiny MoE model, as a user runs it: the expert split, both splits with their estimated
speeds, and the RAM both workers take."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.tiny_moe import write_tiny_moe

FAILSOFT = Path(sys.executable).parent / "failsoft"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("moe-cli")
    config = folder / "config.toml"
    # No reserve: the tiny model's whole budget is a few MiB.
    config.write_text(
        '[budget]\nreserve_percent = 0.0\nreserve_min = "0"\nn_parallel = 1\n', encoding="utf-8"
    )
    return write_tiny_moe(folder / "tiny-moe.gguf"), config


def plan(setup: tuple[Path, Path], *args: str) -> str:
    model, config = setup
    env = {**os.environ, "FAILSOFT_DATA_DIR": str(model.parent / "data")}
    command = [str(FAILSOFT), "--config", str(config), "plan", "--model", str(model), "--ctx", "1024", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_table_shows_the_expert_split_and_both_candidates(setup: tuple[Path, Path]) -> None:
    out = plan(setup, "--vram", "6MiB")
    assert "verdict: SPLIT - dense-first" in out
    # Three blocks' experts and one tensor of the fourth: a block's three tensors are placed one by one.
    assert (
        "expert split: experts of 3/8 layers and block 3's gate experts on the CPU: 1.25 MiB in RAM "
        r"(llama-server --n-cpu-moe 3 --override-tensor 'blk\.3\.ffn_gate_exps=CPU')" in out
    )
    assert "9/9 layers, experts of 3/8 + 1 tensor in RAM" in out
    lines = out.splitlines()
    heading = (
        "splits weighed (tokens/s from memory traffic at GPU 400 GB/s, RAM 50 GB/s; "
        "each with the KV cache of n_ctx 1024):"
    )
    weighed = lines[lines.index(heading) + 1 :]
    assert weighed[0].startswith("    layer split  6/9 layers on the GPU, n_ctx 1024: ")
    expert = (
        "  * expert split all 9 layers, experts of 3/8 layers and block 3's gate on the CPU, n_ctx 1024: "
    )
    assert weighed[1].startswith(expert)
    assert all("tokens/s" in line for line in weighed[:2])
    assert "RAM for both workers:" in out and "(fits)" in out


def test_the_json_carries_the_split_and_the_ram_check(setup: tuple[Path, Path]) -> None:
    data = json.loads(plan(setup, "--vram", "6MiB", "--json"))
    assert (data["verdict"], data["n_gpu_layers"], data["n_cpu_moe"]) == ("split", 9, 3)
    assert data["cpu_expert_tensors"] == ["ffn_gate_exps"]
    assert [candidate["kind"] for candidate in data["candidates"]] == ["layers", "experts"]
    assert data["candidates"][1]["chosen"] and data["ram_check"]["fits"]
    assert data["model"]["n_expert"] == 8 and data["cpu_plan"]["tokens_per_second"] > 0


def test_a_gpu_that_holds_it_all_gets_no_split(setup: tuple[Path, Path]) -> None:
    out = plan(setup, "--vram", "64MiB")
    assert "verdict: GPU - all 9 layers fit" in out and "splits weighed" not in out
