#!/usr/bin/env bash
# Issue 35 item 3: RLHF with the supervised judge, with vs without group length control, equal steps,
# three seeds (docs/results/rlhf_length_control.md), one after another on one thread. Each run
# resumes from its own latest checkpoint when re-run, so a killed chain is restarted by running this
# again; then the test table (bench/rlhf_judge.py, which evaluates each finished run once).
#   bash bench/rlhf_judge.sh [SEEDS...]        (default: 0 1 2)
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 PYTHONPATH=$PWD
OUT=${OUT:-runs/rlhf_judge}
RECIPE=${RECIPE:-recipes/rlhf_judge_evidence.yaml}
seeds=("$@"); [ ${#seeds[@]} -eq 0 ] && seeds=(0 1 2)
mkdir -p "$OUT"
( while true; do echo "$(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 30; done ) >> "$OUT/load.log" &
loadpid=$!
trap 'kill $loadpid' EXIT
for s in "${seeds[@]}"; do
  for arm in on off; do
    run="$OUT/${arm}_$s"
    if [ -f "$run/DONE" ]; then echo "skip $run (done)"; continue; fi
    lc=true; [ "$arm" = off ] && lc=false
    echo "== $run start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"
    t0=$(date +%s)
    python -m posttrain.cli rlhf --config "$RECIPE" train.seed=$s length_control.enabled=$lc run_dir="$run" \
        --no-progress >> "$run.log" 2>&1
    rc=$?
    t1=$(date +%s)
    echo "== $run end $(date -u +%FT%TZ) rc=$rc wall_s=$((t1 - t0)) load $(cut -d' ' -f1-3 /proc/loadavg)"
    tail -3 "$run.log"
    if [ $rc -eq 0 ]; then
      echo "{\"wall_s\": $((t1 - t0)), \"load_end\": \"$(cut -d' ' -f1-3 /proc/loadavg)\"}" > "$run/DONE"
    fi
  done
done
python bench/rlhf_judge.py --dir "$OUT"
