#!/usr/bin/env bash
# Issue 13 evidence (b): RLHF with vs without group length control, equal steps, same judge, two
# seeds, one after another on one thread (docs/results/rlhf_length_control.md). Each run resumes
# from its own latest checkpoint when re-run, so a killed chain is restarted by running this again.
#   bash bench/rlhf_length_control.sh [SEEDS...]        (default: 0 1)
# Then: python bench/rlhf_length_control.py runs/lc      (the tables, paired se, and a results row)
# OUT, RECIPE: another chain of the same shape (bench/rlhf_judge.sh); KEEP_CHECKPOINTS=1 keeps each
# finished run's checkpoints (for a test evaluation after the runs).
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 PYTHONPATH=$PWD
OUT=${OUT:-runs/lc}
RECIPE=${RECIPE:-recipes/rlhf_length_evidence.yaml}
seeds=("$@"); [ ${#seeds[@]} -eq 0 ] && seeds=(0 1)
mkdir -p "$OUT"
# the machine's load every 30 s while the chain runs (the CPU is shared: timings need it)
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
        --no-progress >> "$run.log" 2>&1   # appended: a resumed run keeps the log of its first part
    rc=$?
    t1=$(date +%s)
    echo "== $run end $(date -u +%FT%TZ) rc=$rc wall_s=$((t1 - t0)) load $(cut -d' ' -f1-3 /proc/loadavg)"
    tail -4 "$run.log"
    if [ $rc -eq 0 ]; then
      echo "{\"wall_s\": $((t1 - t0)), \"load_end\": \"$(cut -d' ' -f1-3 /proc/loadavg)\"}" > "$run/DONE"
      [ "${KEEP_CHECKPOINTS:-0}" = 1 ] || rm -rf "$run"/checkpoints/step_* "$run/best"   # the figures are in metrics.jsonl and validation/
    fi
  done
done
