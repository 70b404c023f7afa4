# Sourced by tests/gym/build_venv.sh and tests/vllm/build_venv.sh: run the caller's `build` into its
# log and report one line; on any error remove the half-built venv (the tests then print the log's
# tail, and fail under CI). Never fails the caller. Needs VENV, LOG and a `build` function.
#   build_and_report "NeMo Gym"
build_and_report() {
    if build >"$LOG" 2>&1; then
        tail -n 1 "$LOG"
    else
        echo "$1 virtualenv NOT built (the $1 tests will say why): $(tail -n 3 "$LOG" | tr '\n' ' ')"
        rm -rf "$VENV"
    fi
}
