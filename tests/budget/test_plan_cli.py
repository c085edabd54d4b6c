"""`failsoft plan` and `failsoft config` as a user runs them: the installed script, as a subprocess."""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

GIB = 1024**3
MIB = 1024**2
REQUIRED_KEYS = {
    "weights_bytes", "kv_bytes", "compute_bytes", "reserve_bytes", "other_bytes", "free_bytes", "total_bytes",
    "n_gpu_layers", "n_layers", "n_ctx", "n_parallel", "verdict", "reason", "simulated",
}  # fmt: skip
FAILSOFT = Path(sys.executable).parent / "failsoft"


@pytest.fixture(scope="module")
def model_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One data dir for this module's runs, so the model is inspected once, not once per command.
    return tmp_path_factory.mktemp("data")


def failsoft(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FAILSOFT_DATA_DIR": str(data_dir)}
    return subprocess.run(
        [str(FAILSOFT), *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def plan_json(*args: str, data_dir: Path) -> dict[str, object]:
    result = failsoft("plan", *args, "--json", data_dir=data_dir)
    assert result.returncode == 0, result.stderr
    data: dict[str, object] = json.loads(result.stdout)
    return data


def test_plan_json_on_a_simulated_gpu(model_cache_dir: Path) -> None:
    data = plan_json("--simulate-vram", "4GiB", data_dir=model_cache_dir)
    assert set(data) >= REQUIRED_KEYS
    assert data["simulated"] is True and data["total_bytes"] == 4 * GIB
    assert (data["verdict"], data["n_gpu_layers"], data["n_layers"], data["n_ctx"]) == ("gpu", 31, 31, 8192)
    parts = ("weights_bytes", "kv_bytes", "compute_bytes", "reserve_bytes", "other_bytes", "free_bytes")
    assert sum(int(data[key]) for key in parts) == 4 * GIB  # type: ignore[call-overload]
    assert data["kv_bytes"] == 180 * MIB  # 8192 tokens of f16 K and V
    device = data["device"]
    assert isinstance(device, dict) and device["simulated"] is True and device["kind"] == "simulated"


def test_plan_table_says_simulated_and_shows_the_split(model_cache_dir: Path) -> None:
    result = failsoft("plan", "--simulate-vram", "4GiB", data_dir=model_cache_dir)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "[SIMULATED]" in out and "4.00 GiB" in out
    for row in ("weights", "KV cache", "compute", "reserve", "other", "free", "total"):
        assert f"  {row} " in out
    assert "180.00 MiB" in out
    assert "verdict: GPU - all 31 layers fit" in out
    # Four slots by default (budget.n_parallel), sharing the 8192-token context.
    assert "caps: n_ctx 8192, parallel 4 (n_ctx per sequence 2048)" in out


def test_plan_options_reach_the_plan(model_cache_dir: Path) -> None:
    data = plan_json(
        "--vram", "1GiB", "--ctx", "4096", "--parallel", "2", "--reserve", "20", "--cache-type", "q8_0",
        data_dir=model_cache_dir,
    )  # fmt: skip
    assert (data["n_ctx"], data["n_parallel"], data["n_ctx_per_seq"]) == (4096, 2, 2048)
    assert data["reserve_bytes"] == 256 * MIB  # 20 % of 1 GiB is below the 256 MiB floor
    assert (data["cache_type_k"], data["cache_type_v"], data["flash_attn"]) == ("q8_0", "q8_0", True)
    assert data["notes"] == []  # flash attention is on by default
    assert data["kv_bytes"] == 4096 * 30 * 2 * (192 // 32) * 34


def test_a_quantised_cache_turns_flash_attention_on_where_the_config_has_it_off(
    model_cache_dir: Path, tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[budget]\nflash_attn = false\n", encoding="utf-8")

    def planned(*args: str) -> dict[str, object]:
        command = ("--config", str(config), "plan", "--vram", "1GiB", *args, "--json")
        result = failsoft(*command, data_dir=model_cache_dir)
        assert result.returncode == 0, result.stderr
        data: dict[str, object] = json.loads(result.stdout)
        return data

    assert planned()["flash_attn"] is False
    data = planned("--cache-type", "q8_0")
    assert data["flash_attn"] is True
    assert data["notes"] == ["flash attention turned on: a q8_0 V cache needs it"]
    off = plan_json("--vram", "1GiB", "--no-flash-attn", data_dir=model_cache_dir)
    assert off["flash_attn"] is False and off["notes"] == []


def test_plan_without_a_gpu_or_simulation(model_cache_dir: Path) -> None:
    data = plan_json(data_dir=model_cache_dir)
    if ctypes.util.find_library("nvidia-ml") is None:
        assert (data["verdict"], data["n_gpu_layers"], data["total_bytes"], data["simulated"]) == (
            "cpu",
            0,
            0,
            False,
        )
        reason = str(data["reason"])
        assert "no NVIDIA GPU" in reason and "--simulate-vram" in reason
    else:
        assert data["verdict"] in ("gpu", "split", "cpu") and data["simulated"] is False


def test_plan_small_gpu_splits(model_cache_dir: Path) -> None:
    data = plan_json("--vram", "400MiB", "--ctx", "8192", "--reserve", "0", data_dir=model_cache_dir)
    # 400 MiB less the 256 MiB floor leaves 144 MiB: less than weights, cache and compute at n_ctx 8192
    # (288 MiB)
    assert data["verdict"] == "split"
    assert 0 < int(data["n_gpu_layers"]) < 31  # type: ignore[call-overload]
    assert "layers fit on the GPU" in str(data["reason"])
    assert int(data["host_kv_bytes"]) > 0  # type: ignore[call-overload]


def test_plan_tiny_gpu_runs_on_the_cpu(model_cache_dir: Path) -> None:
    # 24 MiB usable: less than the compute buffer and one layer with its cache
    data = plan_json("--vram", "280MiB", "--ctx", "8192", data_dir=model_cache_dir)
    assert (data["verdict"], data["n_gpu_layers"], data["weights_bytes"]) == ("cpu", 0, 0)
    assert "not even one layer fits" in str(data["reason"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "missing-model.gguf"], "missing-model.gguf: model file not found"),
        (["--vram", "lots"], "not a size: 'lots'"),
        (["--ctx", "-1"], "--ctx -1: use 0 (the largest that fits) or a number of tokens"),
        (["--parallel", "0"], "--parallel 0: at least 1 sequence"),
        (["--reserve", "100"], "--reserve 100.0: a percentage"),
    ],
)
def test_plan_bad_input_exits_2_with_a_clear_message(
    model_cache_dir: Path, args: list[str], message: str
) -> None:
    result = failsoft("plan", *args, data_dir=model_cache_dir)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_plan_with_a_bad_config_names_file_key_and_choices(model_cache_dir: Path) -> None:
    config_file = Path(os.environ["FAILSOFT_CONFIG"])
    config_file.write_text('[budget]\ncache_type = "q5_k"\n')
    result = failsoft("plan", data_dir=model_cache_dir)
    assert result.returncode == 2
    assert (
        f"{config_file}: budget.cache_type = 'q5_k' is not allowed; use one of f16, q8_0, q4_0"
        in result.stderr
    )


def test_config_command_prints_the_effective_config(model_cache_dir: Path) -> None:
    config_file = Path(os.environ["FAILSOFT_CONFIG"])
    config_file.write_text('[device]\nsimulate_vram = "6GiB"\n[budget]\nreserve_percent = 15\n')
    result = failsoft("config", data_dir=model_cache_dir)
    assert result.returncode == 0, result.stderr
    assert f"file: {config_file}" in result.stdout
    assert 'simulate_vram = "6GiB"' in result.stdout and "reserve_percent = 15.0" in result.stdout
    assert "[cpu]" in result.stdout and "max_ctx = 8192" in result.stdout  # defaults are shown too
    as_json = json.loads(failsoft("config", "--json", data_dir=model_cache_dir).stdout)
    assert as_json["device"]["simulate_vram"] == "6GiB" and as_json["source"] == str(config_file)
    # and plan uses it
    assert plan_json(data_dir=model_cache_dir)["total_bytes"] == 6 * GIB
