"""A GGUF file's metadata and tensor table, read the way the planner needs them: quickly.

gguf-py's reader builds a numpy view for every item of every array (about 250,000 for a 50k-token
vocabulary): 1.5 s on the 2-core machine, and numpy's import on top, before the service can plan anything.
The planner needs the model's numbers and the tensors' sizes, not the vocabulary: here a string array is
stepped over (its length kept), a number array read in one call, and nothing else is imported. The format:
https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (version 2 and 3; little- or big-endian).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# ggml's types: (elements per block, bytes per block), as gguf-py's GGML_QUANT_SIZES has them
# (tests/budget/test_gguf_header.py checks the two agree).
GGML_BLOCKS = {
    0: (1, 4),  # F32
    1: (1, 2),  # F16
    2: (32, 18),  # Q4_0
    3: (32, 20),  # Q4_1
    6: (32, 22),  # Q5_0
    7: (32, 24),  # Q5_1
    8: (32, 34),  # Q8_0
    9: (32, 40),  # Q8_1
    10: (256, 84),  # Q2_K
    11: (256, 110),  # Q3_K
    12: (256, 144),  # Q4_K
    13: (256, 176),  # Q5_K
    14: (256, 210),  # Q6_K
    15: (256, 292),  # Q8_K
    16: (256, 66),  # IQ2_XXS
    17: (256, 74),  # IQ2_XS
    18: (256, 98),  # IQ3_XXS
    19: (256, 50),  # IQ1_S
    20: (32, 18),  # IQ4_NL
    21: (256, 110),  # IQ3_S
    22: (256, 82),  # IQ2_S
    23: (256, 136),  # IQ4_XS
    24: (1, 1),  # I8
    25: (1, 2),  # I16
    26: (1, 4),  # I32
    27: (1, 8),  # I64
    28: (1, 8),  # F64
    29: (256, 56),  # IQ1_M
    30: (1, 2),  # BF16
    34: (256, 54),  # TQ1_0
    35: (256, 66),  # TQ2_0
    39: (32, 17),  # MXFP4
    40: (64, 36),  # NVFP4
    41: (128, 18),  # Q1_0
}
# Metadata value types: struct format of a scalar (STRING = 8 and ARRAY = 9 are read apart).
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9


class GgufError(ValueError):
    """The file is not GGUF as this reader knows it, or it is cut off."""


@dataclass(frozen=True)
class StringArray:
    """A string array's length: its items (a vocabulary, merges) are stepped over, not read."""

    count: int

    def __len__(self) -> int:
        return self.count


class TensorInfo(NamedTuple):
    """One tensor's name and size. A tuple, not a frozen dataclass: a model has up to hundreds of thousands
    of them, and a frozen dataclass's constructor costs several times a tuple's."""

    name: str
    n_bytes: int


@dataclass(frozen=True)
class GgufHeader:
    version: int
    fields: dict[str, Any]  # scalars, strings, number arrays as lists, string arrays as StringArray
    tensors: tuple[TensorInfo, ...]


class _Cursor:
    def __init__(self, data: mmap.mmap, order: str) -> None:
        self.data = data
        self.order = order
        self.at = 0

    def take(self, fmt: str) -> Any:
        full = self.order + fmt
        try:
            (value,) = struct.unpack_from(full, self.data, self.at)
        except struct.error:
            raise GgufError("the file ends inside its header") from None
        self.at += struct.calcsize(full)
        return value

    def string(self) -> str:
        raw = self.raw_string()
        return raw.decode("utf-8", errors="replace")

    def raw_string(self) -> bytes:
        length = self.take("Q")
        end = self.at + length
        if end > len(self.data):
            raise GgufError("the file ends inside a string of its header")
        raw = self.data[self.at : end]
        self.at = end
        return raw

    def value(self, kind: int) -> Any:
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            return self.array()
        fmt = SCALARS.get(kind)
        if fmt is None:
            raise GgufError(f"unknown metadata value type {kind}")
        return self.take(fmt)

    def array(self) -> Any:
        kind = self.take("I")
        count = self.take("Q")
        if kind == STRING:
            for _ in range(count):  # each item's length, to step over it
                length = self.take("Q")
                self.at += length
            if self.at > len(self.data):
                raise GgufError("the file ends inside a string array of its header")
            return StringArray(count)
        if kind == ARRAY:
            return [self.array() for _ in range(count)]
        fmt = SCALARS.get(kind)
        if fmt is None:
            raise GgufError(f"unknown array item type {kind}")
        full = f"{self.order}{count}{fmt}"
        try:
            values = struct.unpack_from(full, self.data, self.at)
        except struct.error:
            raise GgufError("the file ends inside an array of its header") from None
        self.at += struct.calcsize(full)
        return list(values)


def read_gguf_header(path: Path) -> GgufHeader:
    """The metadata and the tensor table of the GGUF file at `path`; GgufError when it cannot be read."""
    with path.open("rb") as stream, mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != MAGIC:
            raise GgufError(f"not a GGUF file (it starts with {bytes(data[:4])!r})")
        order = "<"
        (version,) = struct.unpack_from("<I", data, 4)
        if version & 0xFFFF == 0:  # a big-endian file: its version reads byte-swapped
            order = ">"
            (version,) = struct.unpack_from(">I", data, 4)
        if version not in (2, 3):
            raise GgufError(f"GGUF version {version} (this reader knows 2 and 3)")
        cursor = _Cursor(data, order)
        cursor.at = 8
        n_tensors = cursor.take("Q")
        n_fields = cursor.take("Q")
        fields: dict[str, Any] = {}
        for _ in range(n_fields):
            key = cursor.string()
            fields[key] = cursor.value(cursor.take("I"))
        placed: list[tuple[str, int, int]] = []  # name, offset in the data, bytes
        for _ in range(n_tensors):
            name = cursor.string()
            n_dims = cursor.take("I")
            elements = 1
            for _ in range(n_dims):
                elements *= cursor.take("Q")
            kind = cursor.take("I")
            offset = cursor.take("Q")
            block = GGML_BLOCKS.get(kind)
            if block is None:
                raise GgufError(f"tensor {name} has an unknown ggml type {kind}")
            placed.append((name, offset, elements // block[0] * block[1]))
        alignment = int(fields.get("general.alignment") or DEFAULT_ALIGNMENT)
        start = -(-cursor.at // alignment) * alignment
        end = max((start + offset + size for _, offset, size in placed), default=start)
        if end > len(data):
            raise GgufError(f"the tensor data ends at byte {end}, past the file's {len(data)}")
        tensors = tuple(TensorInfo(name, size) for name, _, size in placed)
        return GgufHeader(version, fields, tensors)
