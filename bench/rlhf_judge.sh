#!/usr/bin/env bash
# Issue 35 item 3: RLHF with the supervised judge, with vs without group length control, equal steps,
# three seeds (docs/results/rlhf_length_control.md): the chain of bench/rlhf_length_control.sh (one run
# after another on one thread, each resumed from its latest checkpoint when re-run) on this recipe,
# keeping each run's last checkpoint; then the test table (bench/rlhf_judge.py evaluates each
# finished run once).
#   bash bench/rlhf_judge.sh [SEEDS...]        (default: 0 1 2)
set -u
cd "$(dirname "$0")/.."
seeds=("$@"); [ ${#seeds[@]} -eq 0 ] && seeds=(0 1 2)
export OUT=${OUT:-runs/rlhf_judge} RECIPE=${RECIPE:-recipes/rlhf_judge_evidence.yaml} KEEP_CHECKPOINTS=1
bash bench/rlhf_length_control.sh "${seeds[@]}"
OMP_NUM_THREADS=1 PYTHONPATH=$PWD python bench/rlhf_judge.py --dir "$OUT"
