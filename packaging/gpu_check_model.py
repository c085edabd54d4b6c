"""The bundled model as it travels: its file with the large tensors zeroed (`pack_model`, a few MiB gzip'd),
and the same file again on the GPU machine with those tensors generated (`rebuild_model`): the bundled
model's layout, tokenizer, chat template and norm weights, with weights that are not the trained ones.
Standard library only, but for `pack_model` (gguf, in the project's environment)."""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import shutil
import struct
from pathlib import Path
from typing import Any

from check_report import MIB

# ggml types: (elements per block, bytes per block); the generated ones are filled by `generated_tensor`.
GGML_TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    8: ("Q8_0", 32, 34),
}
GENERATED_TYPES = ("F16", "Q4_0", "Q4_1", "Q8_0")
_F16 = struct.Struct("<e")


def _f16(value: float) -> bytes:
    return _F16.pack(value)


def _fill_field(buffer: bytearray, stride: int, offset: int, value: bytes) -> None:
    """Write `value` at `offset` of every `stride`-byte block of `buffer` (a block's scale, say)."""
    blocks = len(buffer) // stride
    for index, byte in enumerate(value):
        buffer[offset + index :: stride] = bytes([byte]) * blocks


# F16 values of magnitude 2^-7..2^-5 with a random sign: the high byte keeps the sign and two mantissa bits.
_F16_HIGH = bytes((byte & 0x83) | (8 << 2) for byte in range(256))


def generated_tensor(type_name: str, nbytes: int, rng: random.Random) -> bytes:
    """`nbytes` of valid weights of a ggml type: random quants under small scales (outputs of a sensible
    size, never NaN or infinity)."""
    data = bytearray(rng.randbytes(nbytes))
    if type_name == "F16":
        data[1::2] = bytes(data[1::2]).translate(_F16_HIGH)
    elif type_name == "Q4_0":  # d (f16), 16 bytes of 4-bit quants: w = (q - 8) * d
        _fill_field(data, 18, 0, _f16(0.004))
    elif type_name == "Q4_1":  # d, m (f16), 16 bytes of 4-bit quants: w = q * d + m
        _fill_field(data, 20, 0, _f16(0.004))
        _fill_field(data, 20, 2, _f16(-0.032))
    elif type_name == "Q8_0":  # d (f16), 32 int8 quants: w = q * d
        _fill_field(data, 34, 0, _f16(0.0003))
    else:
        raise ValueError(f"cannot generate ggml type {type_name}")
    return bytes(data)


def pack_model(model: Path, skeleton: Path, manifest_path: Path) -> dict[str, Any]:
    """The model's file with every tensor that can be generated zeroed (gzip'd), and the list of them."""
    from gguf import GGUFReader  # the project's environment has it

    reader = GGUFReader(str(model))
    generated: list[dict[str, Any]] = []
    for tensor in reader.tensors:
        type_name = tensor.tensor_type.name
        if type_name in GENERATED_TYPES:
            offset = int(tensor.data_offset)
            generated.append(
                {"name": tensor.name, "type": type_name, "offset": offset, "nbytes": int(tensor.n_bytes)}
            )
    digest = hashlib.sha256()
    size = model.stat().st_size
    starts = {item["offset"]: item["nbytes"] for item in generated}
    skeleton.parent.mkdir(parents=True, exist_ok=True)
    with model.open("rb") as source, gzip.open(skeleton, "wb", compresslevel=9) as target:
        position = 0
        for start in sorted(starts):
            chunk = source.read(start - position)
            digest.update(chunk)
            target.write(chunk)
            length = starts[start]
            digest.update(source.read(length))
            target.write(bytes(length))
            position = start + length
        rest = source.read()
        digest.update(rest)
        target.write(rest)
    manifest = {
        "file_name": model.name,
        "file_bytes": size,
        "sha256": digest.hexdigest(),
        "seed": 13,
        "tensors": len(reader.tensors),
        "generated": generated,
        "generated_bytes": sum(item["nbytes"] for item in generated),
        "note": "every tensor listed here was zeroed and is generated again (random quants, small scales); "
        "the rest of the file (header, tokenizer, chat template, norm weights) is the bundled model's own",
    }
    manifest_path.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return {k: v for k, v in manifest.items() if k != "generated"} | {
        "skeleton_bytes": skeleton.stat().st_size
    }


def rebuild_model(skeleton: Path, manifest_path: Path, out: Path) -> dict[str, Any]:
    """The model file from its skeleton: the zeroed tensors filled with generated weights (standard library
    only, a second or two for the bundled model)."""
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    rng = random.Random(manifest.get("seed", 13))
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with gzip.open(skeleton, "rb") as source, partial.open("wb") as target:
        shutil.copyfileobj(source, target, 16 * MIB)
    size = partial.stat().st_size
    if size != manifest["file_bytes"]:
        raise ValueError(f"the skeleton unpacks to {size} bytes, the manifest says {manifest['file_bytes']}")
    with partial.open("r+b") as target:
        for item in manifest["generated"]:
            target.seek(item["offset"])
            target.write(generated_tensor(item["type"], item["nbytes"], rng))
    partial.replace(out)
    return {
        "path": str(out),
        "bytes": size,
        "generated_tensors": len(manifest["generated"]),
        "generated_bytes": manifest.get("generated_bytes"),
        "weights": "generated (the bundled model's layout, tokenizer and template; not its trained weights)",
    }
