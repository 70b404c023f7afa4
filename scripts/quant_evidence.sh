#!/usr/bin/env bash
# Evidence for issue 14 (docs/results/quantization.md): FP8 PTQ of the embedded model and of the
# tiny NemotronH, one thread. Outputs in runs/quant_evidence/ (weights: never committed); the small
# tables / plots the doc shows are copied to docs/results/.
#   bash scripts/quant_evidence.sh [embedded|nemotronh|transformers|all]
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
R=runs/quant_evidence
PT="python -m posttrain.cli"
mkdir -p $R docs/results
[ -f $R/arith.jsonl ] || $PT make-data arithmetic --n 2000 --seed 0 --out $R/arith.jsonl
what=${1:-all}
# CPU budget (one thread, ~220 tokens/s for the embedded model): 128 calibration texts, 8 held-out ones
Q="threads=1 weights=channel calibration.data=[$R/arith.jsonl] calibration.samples=128 calibration.max_seq_len=128 search.samples=8"
EV="--n 30 --max-new-tokens 256 --threads 1 --no-progress"
ENVS="--env math --env mcq"

if [[ $what == embedded || $what == all ]]; then
  E=$R/embedded
  # the search (all units FP8 one at a time) + the all-FP8 export; static activations so calibration matters
  $PT quantize --model embedded --out $E/all --search $Q activations=static policy.type=all | tee $E.all.log
  $PT quantize --model embedded --out $E/bf16 $Q activations=static policy.type=none | tee $E.bf16.log
  $PT quantize --model embedded --out $E/recipe $Q activations=static policy.type=recipe | tee $E.recipe.log
  # the searched rule at the recipe's BF16 budget (30 of 60 units) and the same FP8 KV cache
  $PT quantize --model embedded --out $E/searched $Q activations=static policy.type=searched \
      policy.ranking=$E/all-search/sensitivity.json policy.budget=30 kv_cache=on | tee $E.searched.log
  $PT quantize --model embedded --out $E/all_generic $Q activations=static policy.type=all calibration.source=generic \
      | tee $E.all_generic.log
  # the KV cache's share: the recipe without it, all-FP8 with it
  $PT quantize --model embedded --out $E/recipe_nokv $Q activations=static policy.type=recipe kv_cache=off
  $PT quantize --model embedded --out $E/all_kv $Q activations=static policy.type=all kv_cache=on
  [ -f $R/arith_val.jsonl ] || $PT make-data arithmetic --n 300 --seed 1 --split validation --out $R/arith_val.jsonl
  python scripts/quant_heldout.py embedded $R/arith_val.jsonl 64 $E/all $E/all_generic $E/all_kv $E/recipe \
      $E/recipe_nokv $E/searched > $R/embedded_heldout.md
  for m in bf16 all recipe searched all_generic; do
    $PT eval $ENVS --model $E/$m $EV --out $E/eval_$m.json > $E/eval_$m.log 2>&1
  done
  cp $E/all-search/sensitivity.png docs/results/quant_sensitivity_embedded.png
  cp $E/all-search/sensitivity.md docs/results/quant_sensitivity_embedded.md
  # prompt sensitivity + recovery + report (greedy, then greedy and sampled)
  $PT eval --env mcq --model $E/bf16 --n 20 --wordings 3 --threads 1 --no-progress --out $E/ps_bf16.json
  $PT eval --env mcq --model $E/recipe --n 20 --wordings 3 --threads 1 --no-progress --against $E/ps_bf16.json \
      --out $E/ps_recipe.json --report $E/ps_report
  $PT eval --env mcq --model $E/recipe --n 20 --wordings 3 --seeds 2 --sampled-k 2 --threads 1 --no-progress \
      --against $E/ps_bf16.json --out $E/ps2_recipe.json --report $E/ps2_report
fi

if [[ $what == nemotronh || $what == all ]]; then
  N=$R/nemotronh
  QN="threads=1 calibration.data=[$R/arith.jsonl] calibration.samples=1024 calibration.max_seq_len=128 search.samples=64"
  $PT quantize --model tiny-nemotronh --out $N/all --search $QN activations=static policy.type=all | tee $N.all.log
  $PT quantize --model tiny-nemotronh --out $N/recipe $QN activations=static policy.type=recipe | tee $N.recipe.log
  $PT quantize --model tiny-nemotronh --out $N/searched $QN activations=static policy.type=searched \
      policy.ranking=$N/all-search/sensitivity.json policy.budget=2 kv_cache=on | tee $N.searched.log
  # "attention also FP8": the recipe's rule minus the attention layer (the Mamba feeder stays BF16)
  $PT quantize --model tiny-nemotronh --out $N/recipe_fp8attn $QN activations=static policy.type=patterns \
      'policy.keep_bf16=[^model\.layers\.0\.mixer$]' kv_cache=on | tee $N.recipe_fp8attn.log
  $PT quantize --model tiny-nemotronh --out $N/all_generic $QN activations=static policy.type=all \
      calibration.source=generic | tee $N.all_generic.log
  [ -f $R/arith_val.jsonl ] || $PT make-data arithmetic --n 300 --seed 1 --split validation --out $R/arith_val.jsonl
  python scripts/quant_heldout.py tiny-nemotronh $R/arith_val.jsonl 128 $N/all $N/all_generic $N/recipe $N/searched \
      $N/recipe_fp8attn > $R/nemotronh_heldout.md
  cp $N/all-search/sensitivity.png docs/results/quant_sensitivity_nemotronh.png
  cp $N/all-search/sensitivity.md docs/results/quant_sensitivity_nemotronh.md
fi

if [[ $what == transformers || $what == all ]]; then
  # (d) needs compressed-tensors: a scratch venv (python -m venv --system-site-packages /tmp/venv-fp8;
  # pip install --no-deps compressed-tensors==0.20.1 loguru)
  ${VENV_PY:-/tmp/venv-fp8/bin/python} scripts/quant_transformers_check.py $R/embedded/all $R/embedded/recipe \
      $R/nemotronh/all $R/nemotronh/recipe | tee $R/transformers_check.log
fi
