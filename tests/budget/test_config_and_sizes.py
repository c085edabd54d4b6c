"""Config validation names the file, the key and what is allowed; sizes parse and print as llama.cpp does."""

from __future__ import annotations

from pathlib import Path

import pytest

from tray_app import config, paths
from tray_app.contract.sizes import format_size, parse_size


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[budget]\ncache_type = "q5_k"\n',
            "budget.cache_type = 'q5_k' is not allowed; use one of f16, q8_0, q4_0",
        ),
        ("[budget]\nflash_attn = 1\n", "budget.flash_attn = 1 must be true or false"),
        ("[budget]\nn_parallel = 0\n", "budget.n_parallel must be at least 1"),
        ("[budget]\nreserve_percent = 120\n", "budget.reserve_percent = 120.0 must be in [0, 100)"),
        ('[budget]\nreserve_min = "lots"\n', "budget.reserve_min: not a size: 'lots'"),
        (
            '[budget]\ncache_type = "q8_0"\nflash_attn = false\n',
            "budget.cache_type = 'q8_0' needs budget.flash_attn = true",
        ),
        ('[device]\nsimulate_vram = "4 bananas"\n', "device.simulate_vram: not a size"),
        ("[budget]\nmax_context = 4096\n", "unknown key budget.max_context; keys are"),
        ("[gpus]\nlayers = 3\n", "unknown section [gpus]; sections are model, engine, device, gpu, budget"),
        ("[gpu]\nlayers = 3\n", "unknown key gpu.layers; keys are drain_timeout, max_returns, min_ctx"),
        ("[device]\npoll_seconds = 0\n", "device.poll_seconds must be above 0"),
        ('[gpu]\nyield_to = "steam"\n', "gpu.yield_to = 'steam' must be a list of strings"),
        ("[cpu]\nmirror_slots = 0\n", "cpu.mirror_slots must be at least 1"),
        ("[budget\n", "not valid TOML"),
    ],
)
def test_bad_config_names_file_key_and_choices(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "failsoft.toml"
    path.write_text(text)
    with pytest.raises(config.ConfigError) as caught:
        config.load(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert message in str(caught.value)


def test_config_file_location_follows_the_environment(tmp_path: Path) -> None:
    assert paths.config_file() == tmp_path / "config.toml"  # set by the test fixture, as a user could
    defaults = config.load()
    assert defaults.budget.cache_type == "f16" and defaults.source == str(tmp_path / "config.toml")


def test_a_valid_config_round_trips(tmp_path: Path) -> None:
    cfg = config.Config()
    cfg.device.simulate_vram = "4GiB"
    cfg.budget.cache_type = "q8_0"
    cfg.budget.flash_attn = True
    written = config.save(cfg, tmp_path / "saved.toml")
    loaded = config.load(written)
    assert (loaded.device.simulate_vram, loaded.budget.cache_type, loaded.budget.flash_attn) == (
        "4GiB",
        "q8_0",
        True,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4GiB", 4 * 1024**3),
        ("4 GB", 4 * 1000**3),
        ("512M", 512 * 1024**2),
        ("1.5GiB", 3 * 512 * 1024**2),
        (7, 7),
    ],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "GiB", "4 XB", "-1GiB"])
def test_parse_size_refuses_what_is_not_a_size(bad: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(bad)


def test_format_size_prints_like_llama_cpp() -> None:
    assert format_size(47185920) == "45.00 MiB"
    assert format_size(4 * 1024**3) == "4.00 GiB"
    assert format_size(512) == "512 B"


def test_live_changes_make_a_new_snapshot_and_name_what_waits_for_a_restart() -> None:
    """Issue 15: the control API changed the running config in place with setattr. The owner now builds a
    new snapshot; the old one, which others may still hold, stays as it was."""
    current = config.from_dict({"failover": {"deadline": 60.0}, "budget": {"n_parallel": 4}})
    fresh = config.from_dict(
        {"failover": {"deadline": 5.0}, "budget": {"n_parallel": 2}, "server": {"queue_max": 7}}
    )
    merged, applied, needs_restart = config.with_live_changes(current, fresh)
    assert sorted(applied) == ["failover.deadline", "server.queue_max"]
    assert needs_restart == ["budget.n_parallel"]
    assert (merged.failover.deadline, merged.server.queue_max, merged.budget.n_parallel) == (5.0, 7, 4)
    assert (current.failover.deadline, current.server.queue_max) == (60.0, 32)  # untouched
    assert config.is_live("server", "allowed_hosts") and not config.is_live("server", "port")
    # The CPU mirror is the router's: switched without restarting the CPU worker.
    assert config.is_live("cpu", "mirror") and not config.is_live("cpu", "threads")
