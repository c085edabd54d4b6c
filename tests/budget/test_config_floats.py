"""Every float setting refuses NaN and the infinities (review N3 residual: `failover.deadline = nan` was taken
by `PATCH /failsoft/config` and written to the file), from a file, from a dict and through `edit_file`, the
path the control API's PATCH writes by; the message names the key."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from tray_app import config
from tray_app.config.notify import NotifyConfig


def float_settings() -> list[tuple[str, str]]:
    """(table, key) of every float field of the config's dataclasses: its sections, [[models]], [[notify]]."""
    found: list[tuple[str, str]] = []
    tables: list[tuple[str, type]] = [
        (item.name, type(getattr(config.Config(), item.name)))
        for item in dataclasses.fields(config.Config)
        if dataclasses.is_dataclass(getattr(config.Config(), item.name))
    ]
    tables += [("models", config.LibraryModelConfig), ("notify", NotifyConfig)]
    for table, kind in tables:
        hints = get_type_hints(kind)
        found += [(table, item.name) for item in dataclasses.fields(kind) if hints[item.name] is float]
    return found


FLOATS = float_settings()


def test_the_table_holds_every_float_setting() -> None:
    assert ("failover", "deadline") in FLOATS and ("notify", "coalesce_seconds") in FLOATS
    assert len(FLOATS) >= 20  # the sections' timeouts, intervals and percentages


def data_with(table: str, key: str, value: Any) -> dict[str, Any]:
    if table == "models":
        return {"models": [{"name": "m", "path": "/models/m.gguf", key: value}]}
    if table == "notify":
        return {"notify": [{"kind": "webhook", "url": "https://example.org/hook", key: value}]}
    return {table: {key: value}}


def where(table: str, key: str) -> str:
    return f"{table}[1].{key}" if table in ("models", "notify") else f"{table}.{key}"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize(("table", "key"), FLOATS, ids=[f"{t}.{k}" for t, k in FLOATS])
def test_nan_and_infinities_are_refused_naming_the_key(table: str, key: str, value: float) -> None:
    with pytest.raises(config.ConfigError) as refused:
        config.from_dict(data_with(table, key, value), source="cfg.toml")
    message = str(refused.value)
    assert message.startswith("cfg.toml: ") and f"{where(table, key)} = {value!r} must be a" in message


@pytest.mark.parametrize(("table", "key"), FLOATS, ids=[f"{t}.{k}" for t, k in FLOATS])
def test_a_file_with_nan_is_refused(tmp_path: Path, table: str, key: str) -> None:
    path = tmp_path / "failsoft.toml"
    if table == "models":
        path.write_text(f'[[models]]\nname = "m"\npath = "/models/m.gguf"\n{key} = nan\n')
    elif table == "notify":
        path.write_text(f'[[notify]]\nkind = "webhook"\nurl = "https://example.org/hook"\n{key} = nan\n')
    else:
        path.write_text(f"[{table}]\n{key} = nan\n")
    with pytest.raises(config.ConfigError) as refused:
        config.load(path)
    assert f"{where(table, key)} = nan must be a finite number" in str(refused.value)


def test_an_edit_with_nan_or_inf_writes_nothing(tmp_path: Path) -> None:
    """What PATCH /failsoft/config does with its changes: nothing reaches the file."""
    path = tmp_path / "failsoft.toml"
    path.write_text("[failover]\ndeadline = 30.0\n")
    for value in (math.nan, math.inf):
        with pytest.raises(config.ConfigError) as refused:
            config.edit_file(path, {"failover": {"deadline": value}})
        assert f"failover.deadline = {value!r} must be a finite number" in str(refused.value)
    assert path.read_text() == "[failover]\ndeadline = 30.0\n"
    edited, changed = config.edit_file(path, {"failover": {"deadline": 45}})
    assert edited.failover.deadline == 45.0 and changed == [("failover", "deadline")]
