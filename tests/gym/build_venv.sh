#!/bin/sh
# Build NeMo Gym's own virtualenv (default .venv-gym at the repository root) for the Gym tests
# (tests/integration/test_gym_conformance.py, test_gym_client.py). Called by `make setup`.
#
# nemo-gym 0.7.0 declares Python >= 3.13.14, newer than ours, so it goes into its own venv with
# --ignore-requires-python --no-deps, plus the pinned packages its code imports (requirements.txt).
# Never fails the caller: on any error the half-built venv is removed, the reason goes to
# .venv-gym.log, and the Gym tests print it (and fail under CI).
#   PY=python3.11 GYM_VENV=/path sh tests/gym/build_venv.sh
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-python}
VENV=${GYM_VENV:-$ROOT/.venv-gym}
LOG=${GYM_VENV_LOG:-$VENV.log}
GYM=${GYM_PACKAGE:-nemo-gym==0.7.0}

build() {
    start=$(date +%s)
    rm -rf "$VENV"
    "$PY" -m venv "$VENV" || "$PY" -m virtualenv "$VENV" || return 1
    P="$VENV/bin/python -m pip --disable-pip-version-check -q"
    $P install --ignore-requires-python --no-deps "$GYM" || return 1
    $P install --no-deps "ray==2.60.0" || return 1
    $P install -r "$ROOT/tests/gym/requirements.txt" || return 1
    "$VENV/bin/python" -c "import nemo_gym.testing.session_conformance, responses_api_agents.simple_agent.app, environment_servers.single_agent_turn.app, resources_servers.example_single_tool_call.app" || return 1
    echo "NeMo Gym virtualenv built at $VENV in $(( $(date +%s) - start )) s ($GYM)"
}

. "$ROOT/tests/venv_build.sh"
build_and_report "NeMo Gym"
exit 0
