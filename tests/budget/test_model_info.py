"""GGUF inspection of the bundled model, and clear errors for files that are not usable GGUF."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tray_app import paths
from tray_app.budget import model_info
from tray_app.budget.model_info import ModelFileError, inspect_model


def test_bundled_model_fields(model_path: Path) -> None:
    info = inspect_model(model_path)
    assert (info.architecture, info.n_layers, info.n_embd, info.n_head) == ("llama", 30, 576, 9)
    assert info.n_head_kv == (3,) * 30
    assert (info.head_dim_k, info.head_dim_v) == (64, 64)
    assert (info.n_ctx_train, info.n_vocab, info.n_ff) == (8192, 49152, 1536)
    assert info.file_bytes == model_path.stat().st_size
    assert len(info.layer_bytes) == 30 and len(set(info.layer_bytes)) == 1
    # the tied embedding (q8_0, 49152 x 576) is the only large tensor outside the blocks
    assert info.input_bytes == 49152 * 576 // 32 * 34
    assert info.output_layer_bytes == info.input_bytes + 576 * 4  # the duplicated embedding + output norm
    assert info.non_layer_bytes == info.input_bytes + 576 * 4
    assert info.tied_embeddings
    # tensors plus the header and alignment make the file
    assert 0 < info.file_bytes - info.weights_bytes < 4 * 1024**2
    data = info.to_dict()
    assert data["n_head_kv"] == [3] * 30 and data["weights_bytes"] == info.weights_bytes
    assert data["path"] == str(model_path)


def test_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.gguf"
    with pytest.raises(ModelFileError, match=f"{missing}: model file not found"):
        inspect_model(missing)


def test_non_gguf_file_is_named(tmp_path: Path) -> None:
    text = tmp_path / "notes.gguf"
    text.write_text("this is not a model\n" * 20)
    with pytest.raises(ModelFileError, match=f"{text}: not a GGUF file"):
        inspect_model(text)


def test_empty_file_is_named(tmp_path: Path) -> None:
    empty = tmp_path / "empty.gguf"
    empty.touch()
    with pytest.raises(ModelFileError, match=f"{empty}: not a GGUF file"):
        inspect_model(empty)


@pytest.mark.parametrize("keep", [0.5, 0.99])
def test_file_truncated_in_the_tensor_data_is_named(tmp_path: Path, model_path: Path, keep: float) -> None:
    cut = tmp_path / "cut.gguf"
    with model_path.open("rb") as source, cut.open("wb") as target:
        target.write(source.read(int(model_path.stat().st_size * keep)))
    with pytest.raises(ModelFileError, match=f"{cut}: truncated or damaged GGUF file"):
        inspect_model(cut)


def test_file_truncated_in_the_header_is_named(tmp_path: Path, model_path: Path) -> None:
    cut = tmp_path / "header.gguf"
    with model_path.open("rb") as source, cut.open("wb") as target:
        target.write(source.read(4096))
    with pytest.raises(ModelFileError, match=f"{cut}: truncated or damaged GGUF file"):
        inspect_model(cut)


def test_result_is_cached_in_the_data_dir_and_a_damaged_cache_is_ignored(
    tmp_path: Path, model_path: Path
) -> None:
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(model_path, copy)
    first = inspect_model(copy)
    cached = list((paths.data_dir() / "model_info").glob("copy.gguf-*.json"))
    assert len(cached) == 1
    model_info._memo.clear()  # forget this process's copy: read the data dir's
    assert inspect_model(copy) == first
    cached[0].write_text("{not json")
    model_info._memo.clear()
    assert inspect_model(copy) == first  # read again from the file
    assert json.loads(cached[0].read_text())["n_layers"] == 30  # and the cache repaired
    assert inspect_model(copy, use_cache=False) == first
