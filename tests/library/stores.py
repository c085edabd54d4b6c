"""Model stores as Ollama, LM Studio and the Hugging Face hub lay them out, built around one real GGUF
(linked, not copied): what `failsoft models` reads on a user's machine."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

# A manifest as `ollama pull` writes it: the model layer names the GGUF blob; the others are not GGUF.
OLLAMA_LAYERS = (
    ("application/vnd.ollama.image.model", None),
    ("application/vnd.ollama.image.template", b"{{ .Prompt }}"),
    ("application/vnd.ollama.image.params", b'{"stop": ["<|im_end|>"]}'),
)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def ollama_store(
    root: Path,
    model: Path,
    name: str = "smollm2",
    tag: str = "135m",
    namespace: str = "library",
    host: str = "registry.ollama.ai",
    copy: bool = False,
) -> Path:
    """`root` as Ollama's models folder holding `model` as NAME:TAG (a link to it, or with `copy` a file of
    its own); returns the model's blob. The blob's name is a made-up digest: hashing 100 MB in every test
    would only slow them down."""
    blobs = root / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    layers = []
    for media_type, data in OLLAMA_LAYERS:
        if data is None:
            digest = _digest(f"{host}/{namespace}/{name}:{tag}".encode())
            blob = blobs / digest.replace(":", "-")
            blob.unlink(missing_ok=True)
            if copy:
                shutil.copyfile(model, blob)
            else:
                blob.symlink_to(model)
            size = model.stat().st_size
            model_blob = blob
        else:
            digest = _digest(data)
            (blobs / digest.replace(":", "-")).write_bytes(data)
            size = len(data)
        layers.append({"mediaType": media_type, "digest": digest, "size": size})
    config = b'{"model_format": "gguf", "model_family": "llama"}'
    (blobs / _digest(config).replace(":", "-")).write_bytes(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": _digest(config),
                   "size": len(config)},
        "layers": layers,
    }  # fmt: skip
    path = root / "manifests" / host / namespace / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest), encoding="utf-8")
    return model_blob


def hf_cache(
    root: Path,
    model: Path,
    repo: str = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF",
    revision: str = "0123456789abcdef0123456789abcdef01234567",
) -> Path:
    """`root` as the hub cache with `model` in one snapshot of `repo` (a link into blobs/, as the hub makes
    it); returns the snapshot's file."""
    folder = root / ("models--" + repo.replace("/", "--"))
    blob = folder / "blobs" / hashlib.sha256(repo.encode()).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.unlink(missing_ok=True)
    blob.symlink_to(model)
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(revision, encoding="utf-8")
    snapshot = folder / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    file = snapshot / model.name
    file.unlink(missing_ok=True)
    file.symlink_to(Path("../../blobs") / blob.name)
    return file


def lm_studio(
    root: Path, model: Path, publisher: str = "lmstudio-community", repo: str = "SmolLM2-135M-Instruct-GGUF"
) -> Path:
    folder = root / publisher / repo
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / model.name
    file.unlink(missing_ok=True)
    file.symlink_to(model)
    return file
