#!/usr/bin/env bash
# Issue 35 item 5: DPO against tool hallucination, seeds on the test split (docs/results/dpo_tool_hallucination.md).
#   bash bench/dpo_evidence.sh [SEEDS...]     (default: 0 1; re-running skips what is finished)
#   NO_TABLE=1 bash bench/dpo_evidence.sh 1 & NO_TABLE=1 bash bench/dpo_evidence.sh 0; wait; bash bench/dpo_evidence.sh
#                                             (two seeds at once on 2 cores, then the table alone)
# Per seed S, in runs/dpo_test/sS: tool-use SFT data and SFT (seed S), the measurements of the SFT model,
# pairs mined from its own samples on the train split (seed S), DPO (seed S), the same measurements after.
# The settings are the first run's (2026-11-30, one seed, validation split), nothing re-chosen. Every
# measurement reads the test split with evaluation seed 0, so all seeds are measured on the same prompts.
# Then bench/dpo_tool_hallucination.py prints each seed's table and the mean over seeds, and appends a row.
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=("$@"); [ ${#seeds[@]} -eq 0 ] && seeds=(0 1)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
OUT=${OUT:-runs/dpo_test}

measure() {  # measure MODEL TAG DIR
  local m=$1 t=$2 w=$3
  [ -s "$w/rates_$t.jsonl" ] || posttrain dpo-pairs --model "$m" --split test --envs math,mcq --n 32 --k 4 \
      --max-new-tokens 192 --seed 0 --out "$w/testpairs_$t.jsonl" --rates "$w/rates_$t.jsonl"
  [ -s "$w/decisions_$t.jsonl" ] || posttrain tool-decisions --model "$m" --split test --n 8 --seed 0 \
      --out "$w/decisions_$t.jsonl"
  [ -s "$w/heldout_$t.jsonl" ] || posttrain validate -c recipes/dpo_heldout.yaml --model "$m" --split test \
      --out "$w/heldout_$t.jsonl" --threads 1 --no-progress
}

dirs=()
for s in "${seeds[@]}"; do
  w="$OUT/s$s"; mkdir -p "$w"; dirs+=(--dir "$w")
  echo "[dpo_evidence] seed $s: $w ($(date -u +%H:%M:%S))"
  [ -s "$w/banking.jsonl" ] || posttrain make-data banking --n 64 --seed "$s" --out "$w/banking.jsonl"
  [ -s "$w/arith.jsonl" ] || posttrain make-data arithmetic --n 256 --seed "$s" --out "$w/arith.jsonl"
  sft="$w/sft/checkpoints/step_000008"
  [ -d "$sft" ] || posttrain sft --config recipes/sft.yaml \
      "data.train=[{path: $w/banking.jsonl, weight: 0.6}, {path: $w/arith.jsonl, weight: 0.4}]" \
      data.max_seq_len=2304 data.val_frac=0.02 train.steps=8 train.batch_size=8 train.threads=1 train.seed="$s" \
      optim.warmup_steps=2 train.eval_every=8 train.save_every=8 run_dir="$w/sft" --no-progress > "$w/sft.log" 2>&1
  measure "$sft" sft "$w"
  [ -s "$w/pairs.jsonl" ] || posttrain dpo-pairs --model "$sft" --split train --envs math,mcq --n 32 --k 4 \
      --tools unfitting --plain-fallback --max-new-tokens 192 --seed "$s" --out "$w/pairs.jsonl" \
      --rates "$w/rates_train_sft.jsonl"
  dpo="$w/dpo/checkpoints/step_000006"
  [ -d "$dpo" ] || posttrain dpo --config recipes/dpo.yaml model="$sft" data.train="$w/pairs.jsonl" \
      run_dir="$w/dpo" train.steps=6 train.batch_size=8 optim.lr=1e-5 train.save_every=6 train.eval_every=3 \
      train.threads=1 train.seed="$s" --no-progress > "$w/dpo.log" 2>&1
  measure "$dpo" dpo "$w"
done
[ -n "${NO_TABLE:-}" ] || python bench/dpo_tool_hallucination.py --split test "${dirs[@]}"
