"""The planner's own GGUF header reader (budget.gguf_header) against gguf-py's, on the real models the tests
run and a small Mixture-of-Experts file written by gguf-py: the same metadata, the same tensor sizes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import pytest

from tests.support.tiny_moe import write_tiny_moe
from tray_app.budget.gguf_header import GGML_BLOCKS, GgufError, StringArray, read_gguf_header


def test_the_block_sizes_are_ggmls() -> None:
    assert {int(kind): sizes for kind, sizes in gguf.GGML_QUANT_SIZES.items()} == GGML_BLOCKS


def same_as_gguf_py(path: Path) -> None:
    mine = read_gguf_header(path)
    theirs = gguf.GGUFReader(str(path))
    assert {t.name: t.n_bytes for t in mine.tensors} == {t.name: int(t.n_bytes) for t in theirs.tensors}
    for field in theirs.fields.values():
        if field.name.startswith("GGUF."):
            continue  # the reader's own entries (version, counts), not the file's metadata
        value: Any = field.contents()
        read = mine.fields[field.name]
        if isinstance(read, StringArray):
            assert len(read) == len(value), field.name  # stepped over, its length kept
        elif isinstance(value, float):
            assert read == pytest.approx(value), field.name
        else:
            assert read == value, field.name
    assert len(mine.fields) == len([name for name in theirs.fields if not name.startswith("GGUF.")])


def test_the_bundled_model_reads_as_gguf_py_reads_it(model_path: Path) -> None:
    same_as_gguf_py(model_path)
    assert len(read_gguf_header(model_path).fields["tokenizer.ggml.tokens"]) == 49152


def test_gemma_reads_as_gguf_py_reads_it(gemma_model_path: Path) -> None:
    same_as_gguf_py(gemma_model_path)


def test_a_mixture_of_experts_file_reads_as_gguf_py_reads_it(tmp_path: Path) -> None:
    same_as_gguf_py(write_tiny_moe(tmp_path / "moe.gguf"))


@pytest.mark.parametrize("keep", [0.5, 0.001])
def test_a_cut_file_is_refused(tmp_path: Path, model_path: Path, keep: float) -> None:
    data = model_path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(GgufError):
        read_gguf_header(cut)
