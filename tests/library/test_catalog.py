"""The model library from the config: names and aliases, stand-ins, the models folder, keep-alives."""

from __future__ import annotations

from pathlib import Path

import pytest

from tray_app import config
from tray_app.config import ConfigError
from tray_app.library.catalog import catalog_from_config
from tray_app.library.keep_alive import FOREVER, parse_keep_alive


def gguf(folder: Path, name: str) -> Path:
    path = folder / name
    path.write_bytes(b"GGUF")  # the catalog only checks the file is there
    return path


def test_the_main_model_comes_first_and_keeps_its_names(tmp_path: Path) -> None:
    main = gguf(tmp_path, "main.gguf")
    big = gguf(tmp_path, "big.gguf")
    cfg = config.from_dict(
        {
            "model": {"path": str(main), "stand_in": ""},
            "models": [{"name": "big", "path": str(big), "aliases": ["large"], "stand_in": "main.gguf"}],
        }
    )
    catalog = catalog_from_config(cfg)
    assert [entry.name for entry in catalog.entries] == ["main.gguf", "big"]
    assert catalog.find(None) is catalog.main and catalog.find("default") is catalog.main
    assert catalog.find("main") is catalog.main  # the file name without .gguf, as before
    assert catalog.find("large") is catalog.find("big")
    assert catalog.find("nope") is None
    big_entry = catalog.find("big")
    assert big_entry is not None
    assert catalog.stand_in_for(big_entry) is catalog.main
    assert (catalog.main.role("gpu"), big_entry.role("gpu"), big_entry.role("cpu")) == (
        "gpu",
        "gpu@big",
        "cpu@big",
    )
    assert big_entry.keep_alive == 300.0 and catalog.main.keep_alive == FOREVER  # library.keep_alive: 5m


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ([{"name": "a", "path": "A"}, {"name": "b", "path": "B", "aliases": ["a"]}], "used by a and b"),
        ([{"name": "a", "path": "A", "stand_in": "ghost"}], "'ghost' is not a model here"),
        ([{"name": "a", "path": "A", "stand_in": "a"}], "cannot stand in for itself"),
        (
            [{"name": "a", "path": "A", "stand_in": "b"}, {"name": "b", "path": "B", "devices": ["cpu"]}],
            "may not use the GPU",
        ),
        ([{"name": "a", "path": "missing.gguf"}], "no file"),
    ],
)
def test_a_library_that_cannot_work_is_refused_with_the_name(
    tmp_path: Path, models: list[dict[str, object]], message: str
) -> None:
    for entry in models:
        if entry["path"] != "missing.gguf":
            entry["path"] = str(gguf(tmp_path, f"{entry['path']}.gguf"))
        else:
            entry["path"] = str(tmp_path / "missing.gguf")
    cfg = config.from_dict({"model": {"path": str(gguf(tmp_path, "main.gguf"))}, "models": models})
    with pytest.raises(ConfigError, match=message):
        catalog_from_config(cfg)


@pytest.mark.parametrize(
    "entry",
    [{"path": "x.gguf"}, {"name": "x"}, {"name": "x", "path": "x.gguf", "devices": ["tpu"]}, {"name": 3}],
)
def test_a_models_entry_is_checked_as_a_section_is(entry: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match=r"models\[1\]"):
        config.from_dict({"models": [entry]})


def test_the_models_folder_adds_each_gguf_by_its_name(tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    configured = gguf(folder, "configured.gguf")
    gguf(folder, "coder-7b.gguf")
    gguf(folder, "mmproj-coder.gguf")  # a vision projector, not a model to chat with
    (folder / "notes.txt").write_text("not a model")
    cfg = config.from_dict(
        {
            "model": {"path": str(gguf(tmp_path, "main.gguf"))},
            "library": {"folder": str(folder), "keep_alive": "-1"},
            "models": [{"name": "mine", "path": str(configured)}],
        }
    )
    catalog = catalog_from_config(cfg)
    assert catalog.names() == ["main.gguf", "mine", "coder-7b"]
    coder = catalog.find("coder-7b.gguf")
    assert coder is not None and coder.keep_alive == FOREVER


def test_the_library_round_trips_through_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    cfg = config.from_dict({"models": [{"name": "a", "path": "/a.gguf", "keep_alive": "10m"}]})
    config.save(cfg, path)
    again = config.load(path)
    assert again.models == cfg.models and again.to_dict() == cfg.to_dict()
    # A changed model list is a change that needs the service restarted, never a live one.
    changed = config.from_dict({"models": [{"name": "b", "path": "/b.gguf"}]})
    _, applied, needs_restart = config.with_live_changes(cfg, changed)
    assert applied == [] and needs_restart == ["models"]


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("300", 300.0),
        ("90s", 90.0),
        (0, 0.0),
        (2.5, 2.5),
        (-1, FOREVER),
        ("-1", FOREVER),
        ("-5m", FOREVER),
        ("250ms", 0.25),
    ],
)
def test_keep_alive_takes_ollamas_spellings(value: object, seconds: float) -> None:
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5 minutes", "", True, None, [], float("nan")])
def test_a_keep_alive_that_is_not_a_duration_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_keep_alive(value)
