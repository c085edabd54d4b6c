"""`failsoft models`: GGUF files from Ollama's store, LM Studio's folder and the Hugging Face cache, built
here around the bundled SmolLM2; `failsoft models add` and the first run that names them."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from tests.library.stores import hf_cache, lm_studio, ollama_store
from tray_app import cli, paths
from tray_app.library import discovery


@pytest.fixture
def no_bundled_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paths, "bundled_model_path", lambda: None)


def test_an_ollama_manifest_names_its_model_blob(home: Path, model_path: Path) -> None:
    blob = ollama_store(home / ".ollama" / "models", model_path)
    found = discovery.discover()
    assert [(m.name, m.source, m.path) for m in found] == [("smollm2:135m", "ollama", blob)]
    assert found[0].size == model_path.stat().st_size


def test_ollama_names_as_ollama_list_shows_them(tmp_path: Path, model_path: Path) -> None:
    ollama_store(tmp_path, model_path, name="qwen", tag="7b", namespace="someone")
    ollama_store(tmp_path, model_path, name="gemma-gguf", tag="Q4_K_M", namespace="bartowski", host="hf.co")
    names = sorted(model.name for model in discovery.ollama_models(tmp_path))
    assert names == ["hf.co/bartowski/gemma-gguf:Q4_K_M", "someone/qwen:7b"]


def test_ollama_models_folder_from_the_environment_and_what_is_not_a_model(
    home: Path, tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "elsewhere"
    ollama_store(store, model_path)
    broken = store / "manifests" / "registry.ollama.ai" / "library" / "broken" / "latest"
    broken.parent.mkdir(parents=True)
    broken.write_text("not json")
    missing = store / "manifests" / "registry.ollama.ai" / "library" / "gone" / "latest"
    missing.parent.mkdir(parents=True)
    missing.write_text(json.dumps({"layers": [{"mediaType": discovery.OLLAMA_MODEL_LAYER,
                                              "digest": "sha256:" + "0" * 64}]}))  # fmt: skip
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    assert [model.name for model in discovery.discover()] == ["smollm2:135m"]


def test_the_hugging_face_cache_and_lm_studio_folders(home: Path, tmp_path: Path, model_path: Path) -> None:
    cache = hf_cache(home / ".cache" / "huggingface" / "hub", model_path)
    found = list(discovery.hf_cache_models(home / ".cache" / "huggingface" / "hub"))
    assert [(m.name, m.detail, m.path) for m in found] == [
        ("SmolLM2-135M-Instruct.Q4_1", "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", cache)
    ]
    studio = lm_studio(home / ".lmstudio" / "models", model_path)
    (studio.parent / "mmproj-model-f16.gguf").symlink_to(model_path)  # a vision projector
    (studio.parent / "big-00002-of-00002.gguf").symlink_to(model_path)  # a split model's later part
    (studio.parent / "fake.gguf").write_bytes(b"not a gguf")
    found = list(discovery.lm_studio_models(home / ".lmstudio" / "models"))
    assert [(m.name, m.source, m.detail) for m in found] == [
        ("SmolLM2-135M-Instruct.Q4_1", "lm-studio", "lmstudio-community/SmolLM2-135M-Instruct-GGUF")
    ]
    # The same file reached from three stores is listed once, by the first store in the order.
    ollama_store(home / ".ollama" / "models", model_path)
    assert [model.source for model in discovery.discover()] == ["ollama"]


def test_hf_home_and_hub_cache_variables(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "hf" / "hub").mkdir(parents=True)
    (tmp_path / "cache").mkdir()
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    roots = [store.root for store in discovery.stores() if store.source == "hf-cache"]
    assert roots == [tmp_path / "cache", tmp_path / "hf" / "hub"]


def read_config() -> dict[str, object]:
    return tomllib.loads(paths.config_file().read_text(encoding="utf-8"))


def test_models_add_puts_a_found_model_in_the_library_by_path(
    home: Path, model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A file of its own: the bundled model is the main one, and a configured file is not listed as found.
    blob = ollama_store(home / ".ollama" / "models", model_path, copy=True)
    assert cli.main(["models", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in listed["found"]] == ["smollm2:135m"]
    assert [m["role"] for m in listed["configured"]] == ["main"]  # the bundled model

    assert cli.main(["models", "add", "smollm2:135m"]) == 0
    assert "smollm2:135m is in the library" in capsys.readouterr().out
    models = read_config()["models"]
    assert isinstance(models, list) and len(models) == 1
    assert models[0]["name"] == "smollm2:135m" and models[0]["path"] == str(blob)

    assert cli.main(["models", "add", "smollm2:135m"]) == 0  # a second time changes nothing
    assert "configured already" in capsys.readouterr().out
    assert cli.main(["models", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["found"] == [] and [m["name"] for m in listed["configured"]][1:] == ["smollm2:135m"]


def test_models_add_refuses_what_it_cannot_find(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["models", "add", "llama9:70b"]) == 1
    assert "no model named 'llama9:70b' was found" in capsys.readouterr().err
    assert cli.main(["models", "add", str(home / "nothing.gguf")]) == 1
    assert "no file" in capsys.readouterr().err
    assert not paths.config_file().exists()


@pytest.mark.usefixtures("no_bundled_model")
def test_first_run_with_nothing_found_says_what_to_do(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["serve"], []):
        assert cli.main(argv) == 2
        said = capsys.readouterr().err
        assert "no model is configured" in said and "no GGUF model was found in Ollama's store" in said
        assert "failsoft serve --model" in said and "Traceback" not in said


@pytest.mark.usefixtures("no_bundled_model")
def test_first_run_names_a_found_model_and_models_add_makes_it_the_main_one(
    home: Path, model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blob = lm_studio(home / ".cache" / "lm-studio" / "models", model_path)
    assert cli.main(["serve"]) == 2
    said = capsys.readouterr().err
    assert "SmolLM2-135M-Instruct.Q4_1" in said and str(blob) in said
    assert "failsoft models add SmolLM2-135M-Instruct.Q4_1" in said

    assert cli.main(["models", "add", "SmolLM2-135M-Instruct.Q4_1"]) == 0
    assert "is now the main model" in capsys.readouterr().out
    config = read_config()
    assert config["model"] == {"path": str(blob), "name": "", "chat_format": "", "stand_in": ""}
    assert config["models"] == []
