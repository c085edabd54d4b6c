"""A main model from Ollama's store goes by its Ollama name (`smollm2:135m`), not by its blob's file name
(`sha256-…`): in the config, the catalog, `failsoft models`, and what a running service shows and answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.library.stores import ollama_store
from tests.support.fake_worker import fake_llama_server
from tests.support.helpers import base_settings, client_for, reload_settings
from tests.support.service import running_service
from tray_app import cli, config, paths
from tray_app.budget.device import SimulatedDevice
from tray_app.budget.plan_set import plan_from_config
from tray_app.engine.profile import WorkerProfiles
from tray_app.library.catalog import catalog_from_config
from tray_app.supervisor.profile import profiles_from_plans

NAME = "smollm2:135m"


@pytest.fixture
def blob(home: Path, model_path: Path) -> Path:
    """The model pulled with Ollama: a file of its own, not the bundled model (the main one by default)."""
    return ollama_store(home / ".ollama" / "models", model_path, copy=True)


def listed(capsys: pytest.CaptureFixture[str]) -> list[dict[str, str]]:
    """What `failsoft models --json` lists as configured."""
    capsys.readouterr()
    assert cli.main(["models", "--json"]) == 0
    configured: list[dict[str, str]] = json.loads(capsys.readouterr().out)["configured"]
    return configured


def test_the_main_model_from_ollama_is_named_as_ollama_names_it(
    blob: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["models", "add", NAME, "--main"]) == 0
    assert f"{NAME} is now the main model" in capsys.readouterr().out
    cfg = config.load()
    assert (cfg.model.path, cfg.model.name) == (str(blob), NAME)  # the blob stays the file
    main = catalog_from_config(cfg).main
    assert (main.name, main.path) == (NAME, blob)
    assert blob.name in main.aliases  # a request naming the file still finds it
    assert listed(capsys)[0] == {"name": NAME, "path": str(blob), "role": "main"}


def test_a_config_from_before_keeps_the_file_name_until_the_model_is_added_again(
    blob: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths.config_file().write_text(f'[model]\npath = "{blob}"\n', encoding="utf-8")
    assert catalog_from_config(config.load()).main.name == blob.name  # unchanged: clients using it still work

    assert cli.main(["models", "add", NAME]) == 0  # the same command, run again, gives it its name
    assert f"is now called {NAME}" in capsys.readouterr().out
    cfg = config.load()
    assert (cfg.model.path, cfg.model.name) == (str(blob), NAME)
    catalog = catalog_from_config(cfg)
    assert catalog.main.name == NAME and catalog.find(blob.name) is catalog.main

    assert cli.main(["models", "add", NAME]) == 0
    assert "configured already (main)" in capsys.readouterr().out


def test_a_name_given_for_one_file_does_not_follow_another(blob: Path, home: Path, model_path: Path) -> None:
    assert cli.main(["models", "add", NAME, "--main"]) == 0
    target = paths.config_file()
    # `failsoft serve --model`: this run's file goes by its own name.
    other = config.apply_overrides(config.load(target), {"model.path": str(model_path)})
    assert (other.model.name, catalog_from_config(other).main.name) == ("", model_path.name)
    # The tray's settings write model.path alone: a new file loses the old name, the same file keeps it.
    assert config.edit_file(target, {"model": {"path": str(blob)}})[0].model.name == NAME
    assert config.edit_file(target, {"model": {"path": str(model_path)}})[0].model.name == ""
    # `ollama pull` of a newer version: a new blob under the same name keeps that name.
    config.edit_file(target, {"model": {"path": str(blob), "name": NAME}})
    newer = ollama_store(home / ".ollama" / "models", model_path, tag="135m-new", copy=True)
    assert config.edit_file(target, {"model": {"path": str(newer), "name": NAME}})[0].model.name == NAME
    # Another model made the main one by `models add`: its own name, none left over.
    assert cli.main(["models", "add", str(model_path), "--main"]) == 0
    assert (config.load().model.path, config.load().model.name) == (str(model_path), "")


def test_making_a_library_model_the_main_one_moves_it_with_its_name(
    blob: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["models", "add", NAME]) == 0  # the bundled model is the main one: into the library
    assert [item["role"] for item in listed(capsys)] == ["main", "library"]
    assert cli.main(["models", "add", NAME, "--main"]) == 0
    assert "no longer in the library" in capsys.readouterr().out
    cfg = config.load()
    assert (cfg.model.name, cfg.models) == (NAME, [])
    assert [(item["name"], item["role"]) for item in listed(capsys)] == [(NAME, "main")]


@pytest.mark.parametrize("name", ["a,b", " padded", "padded "])
def test_a_main_model_name_llama_server_would_split_is_refused(
    blob: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(config.ConfigError, match=r"model\.name"):
        config.from_dict({"model": {"path": str(blob), "name": name}})
    assert cli.main(["models", "add", NAME, "--main", "--as", name]) == 1
    assert "model.name" in capsys.readouterr().err
    assert not paths.config_file().exists()


def test_the_main_models_workers_are_named_by_it_and_an_embeddings_file_by_its_own(
    blob: Path, model_path: Path
) -> None:
    def named(embeddings_model: str) -> WorkerProfiles:
        main = {"path": str(blob), "name": NAME}
        cfg = config.from_dict({"model": main, "embeddings": {"model": embeddings_model}})
        plans = plan_from_config(cfg, gpu=SimulatedDevice(4 * 1024**3))
        return profiles_from_plans(cfg, plans)

    profiles = named("")
    assert profiles.gpu is not None and profiles.cpu is not None and profiles.embeddings
    assert {profile.model_name for profile in (profiles.gpu, profiles.cpu, *profiles.embeddings)} == {NAME}
    assert {profile.model_name for profile in named(str(model_path)).embeddings} == {model_path.name}


def test_a_service_serving_an_ollama_model_calls_it_by_its_ollama_name(
    blob: Path, home: Path, tmp_path: Path
) -> None:
    """The way a user gets there: `failsoft models add NAME --main` (its own process), then `failsoft serve`
    on that config (fake llama-servers: no model is loaded)."""
    env = {**os.environ, "HOME": str(home), "OLLAMA_MODELS": str(home / ".ollama" / "models")}
    added = subprocess.run(
        [sys.executable, "-m", "tray_app", "models", "add", NAME, "--main"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    written = tomllib.loads(paths.config_file().read_text(encoding="utf-8"))
    assert written["model"]["path"] == str(blob) and written["model"]["name"] == NAME
    engine = fake_llama_server(tmp_path)
    settings = base_settings(model=written["model"], engine={"llama_server": str(engine)})
    with running_service(tmp_path / "service", settings=settings, ready_timeout=30) as svc:
        ids = [model["id"] for model in httpx.get(svc.v1 + "/models", timeout=10).json()["data"]]
        assert ids[0] == NAME and not any(name.startswith("sha256-") for name in ids)
        status = svc.status()
        assert status["model"]["id"] == NAME
        assert status["models"][0]["name"] == NAME
        tags = httpx.get(svc.base_url + "/api/tags", timeout=10).json()["models"]
        assert tags[0]["name"] == NAME
        client = client_for(svc)
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        assert client.chat.completions.create(model="default", **chat).model == NAME
        assert client.chat.completions.create(model=blob.name, **chat).model == NAME  # the file still works
        # llama-server itself names it so in what it streams (--alias); the fake here says "fake".
        assert worker_argv(status) == [NAME, str(blob)]

        # A name changed in the file is taken over by a reload that restarts the workers.
        renamed = {**settings, "model": {**written["model"], "name": "small"}}
        assert reload_settings(svc, renamed, restart=True)["restarted"]
        status = svc.wait_workers_ready()
        assert status["model"]["id"] == "small" and worker_argv(status) == ["small", str(blob)]
        assert client.chat.completions.create(model="small", **chat).model == "small"


def worker_argv(status: dict[str, Any]) -> list[str]:
    """The GPU worker's --alias and --model, as its command line has them."""
    pid = status["workers"]["gpu"]["pid"]
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return [argv[argv.index("--alias") + 1], argv[argv.index("--model") + 1]]
