#!/usr/bin/env bash
# Evidence for issue 14 (docs/results/quantization.md): FP8 PTQ of the embedded model and of the
# tiny NemotronH, one thread, 1,024 calibration texts. Outputs in runs/quant_evidence/ (weights:
# never committed); the small tables / plots the doc shows are copied to docs/results/.
#   bash bench/quant_evidence.sh [embedded|nemotronh|vllm|bench|heldout|transformers|accuracy|all]
# One calibration pass per (model, calibration source) is shared by every policy
# (calibration.scales=FILE); the generic pass of the embedded model is the bench's.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
R=runs/quant_evidence; E=$R/embedded; N=$R/nemotronh
PT="python -m posttrain.cli"
VLLM_VENV=${POSTTRAIN_VLLM_VENV:-/work/venv-vllm}
mkdir -p $E $N docs/results
[ -f $R/arith.jsonl ] || $PT make-data arithmetic --n 2000 --seed 0 --out $R/arith.jsonl
[ -f $R/arith_val.jsonl ] || $PT make-data arithmetic --n 300 --seed 1 --split dev --out $R/arith_val.jsonl
what=${1:-all}
on() { [[ $what == "$1" || $what == all ]]; }

if on embedded; then
  # static activations (so that the calibration data matter), weights per channel, SFT calibration
  Q="threads=1 weights=channel activations=static calibration.data=[$R/arith.jsonl] calibration.samples=1024
     calibration.max_seq_len=128 search.samples=16 calibration.scales=$E/scales_sft.safetensors"
  $PT quantize --model embedded --out $E/all --search $Q policy.type=all > $E.all.log
  $PT quantize --model embedded --out $E/recipe $Q policy.type=recipe > $E.recipe.log
  # the searched rule at the recipe's BF16 memory (not unit count), with the same FP8 KV cache
  $PT quantize --model embedded --out $E/searched $Q policy.type=searched \
      policy.ranking=$E/all-search/sensitivity.json policy.budget_params=recipe kv_cache=on > $E.searched.log
  # "attention also FP8" on a dense model = every linear + the FP8 KV cache; and the KV cache's share
  $PT quantize --model embedded --out $E/all_kv $Q policy.type=all kv_cache=on > $E.all_kv.log
  $PT quantize --model embedded --out $E/recipe_nokv $Q policy.type=recipe kv_cache=off > $E.recipe_nokv.log
  cp $E/all-search/sensitivity.png docs/results/quant_sensitivity_embedded.png
  cp $E/all-search/sensitivity.md docs/results/quant_sensitivity_embedded.md
fi

if on nemotronh; then
  QN="threads=1 activations=static calibration.data=[$R/arith.jsonl] calibration.samples=1024
      calibration.max_seq_len=128 search.samples=64 calibration.scales=$N/scales_sft.safetensors"
  $PT quantize --model tiny-nemotronh --out $N/all --search $QN policy.type=all > $N.all.log
  $PT quantize --model tiny-nemotronh --out $N/recipe $QN policy.type=recipe > $N.recipe.log
  $PT quantize --model tiny-nemotronh --out $N/searched $QN policy.type=searched \
      policy.ranking=$N/all-search/sensitivity.json policy.budget_params=recipe kv_cache=on > $N.searched.log
  # "attention also FP8": the recipe's rule minus the attention layer (the Mamba feeder stays BF16)
  $PT quantize --model tiny-nemotronh --out $N/recipe_fp8attn $QN policy.type=patterns \
      'policy.keep_bf16=[^model\.layers\.0\.mixer$]' kv_cache=on > $N.recipe_fp8attn.log
  $PT quantize --model tiny-nemotronh --out $N/all_generic threads=1 activations=static calibration.source=generic \
      calibration.samples=1024 calibration.max_seq_len=128 search.samples=64 policy.type=all > $N.all_generic.log
  python bench/quant_heldout.py tiny-nemotronh $R/arith_val.jsonl 128 $N/all $N/all_generic $N/recipe \
      $N/searched $N/recipe_fp8attn --json $R/nemotronh_heldout.json > $R/nemotronh_heldout.md
  cp $N/all-search/sensitivity.png docs/results/quant_sensitivity_nemotronh.png
  cp $N/all-search/sensitivity.md docs/results/quant_sensitivity_nemotronh.md
fi

if on vllm; then
  python bench/quant_vllm_check.py $E/all $E/recipe --venv $VLLM_VENV --json $R/vllm_check.json | tee $R/vllm_check.log
fi

if on bench; then
  # the cost bench; its generic calibration pass (1,024 texts) is kept for the generic export
  rm -f $E/scales_generic.safetensors
  python bench/quantize.py --samples 1024 --seq 128 --threads 1 --scales $E/scales_generic.safetensors | tee $R/bench.log
  $PT quantize --model embedded --out $E/all_generic threads=1 weights=channel activations=static \
      calibration.source=generic calibration.samples=1024 calibration.max_seq_len=128 search.samples=16 \
      calibration.scales=$E/scales_generic.safetensors policy.type=all > $E.all_generic.log
fi

if on heldout; then
  python bench/quant_heldout.py embedded $R/arith_val.jsonl 64 $E/all $E/all_kv $E/recipe $E/recipe_nokv \
      $E/searched $E/all_generic --json $R/embedded_heldout.json > $R/embedded_heldout.md
fi

if on transformers; then
  # (d) needs compressed-tensors (the [quant] extra, installed by make setup)
  python bench/quant_transformers_check.py $E/all $N/all $N/recipe | tee $R/transformers_check.log
fi

if on accuracy; then
  # (a) environment accuracy on a model that scores: the pipeline's SFT checkpoint (SmolLM2-135M after
  # `posttrain pipeline` SFT), the exports the field's engine runs here (dynamic per-token activations,
  # per-channel weights), one 1,024-text calibration pass on the pipeline's SFT data (KV scales), a
  # sensitivity search on this checkpoint; then `posttrain eval` on the pipeline's 200 held-out
  # problems (arithmetic env, validation split, seed 2 = the pipeline's measure(), reasoning on,
  # 80 new tokens, batch 32), greedy + sampled avg@4 at t=0.7, and the paired table.
  A=$R/accuracy; SFT=${SFT_CKPT:-/work/ckpt/pipeline_sft_s0}; mkdir -p $A/eval
  QA="threads=1 weights=channel activations=dynamic calibration.data=[$R/arith.jsonl] calibration.samples=1024
      calibration.max_seq_len=128 search.samples=16 calibration.scales=$A/scales_sft.safetensors"
  $PT quantize --model $SFT --out $A/all --search $QA policy.type=all > $A/all.log
  $PT quantize --model $SFT --out $A/recipe $QA policy.type=recipe > $A/recipe.log
  $PT quantize --model $SFT --out $A/searched $QA policy.type=searched \
      policy.ranking=$A/all-search/sensitivity.json policy.budget_params=recipe kv_cache=on > $A/searched.log
  $PT quantize --model $SFT --out $A/all_kv $QA policy.type=all kv_cache=on > $A/all_kv.log
  $PT quantize --model $SFT --out $A/recipe_nokv $QA policy.type=recipe kv_cache=off > $A/recipe_nokv.log
  $PT quantize --model $SFT --out $A/bf16 $QA policy.type=none > $A/bf16.log   # the BF16 reference
  cp $A/all-search/sensitivity.png docs/results/quant_sensitivity_sft.png
  cp $A/all-search/sensitivity.md docs/results/quant_sensitivity_sft.md
  # greedy for every model first, then sampled avg@4 (t=0.7, sampling seed 2); ACC_SAMPLED="" skips it
  ev() {  # model, output name, extra eval args
    local l0; l0=$(cut -d' ' -f1 /proc/loadavg)
    $PT eval --env arithmetic --model $A/$1 --split test --n 200 --seed 2 --max-new-tokens 80 \
        --batch-size 32 --threads 1 --no-progress "${@:3}" --out $A/eval/$2.json > $A/eval/$2.log
    echo "$l0 $(cut -d' ' -f1 /proc/loadavg)" > $A/eval/$2.load
  }
  MODELS="bf16 all recipe searched all_kv recipe_nokv"
  for m in $MODELS; do ev $m $m; done
  for m in ${ACC_SAMPLED-bf16 recipe all_kv searched all recipe_nokv}; do ev $m ${m}_s4 --k 4 --temperature 0.7; done
  arg() { local f=$A/eval/$1.json; [ -f $A/eval/$1_s4.json ] && f=$f,$A/eval/$1_s4.json; echo $f; }
  # PIPE_MEASURE: the pipeline's stage JSON that measured $SFT in float32 (runs/<pipeline>/stages/after*.json)
  python bench/quant_accuracy.py $(arg bf16) ${PIPE_MEASURE:+fp32=$PIPE_MEASURE} \
      $(for m in all recipe searched all_kv recipe_nokv; do echo $m=$(arg $m); done) \
      --md $A/accuracy.md --json $A/accuracy.json --bench-row --exports $A | tee $A/accuracy.log
fi
