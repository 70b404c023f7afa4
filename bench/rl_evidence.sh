#!/usr/bin/env bash
# The runs behind docs/results/rlvr.md and docs/results/mopd.md, on the embedded SmolLM2-135M.
#   bash bench/rl_evidence.sh            # every stage not yet finished (re-running resumes)
#   python bench/rl_evidence_report.py   # tables + plots from the runs' metrics
# Two runs at a time with one torch thread each: on 2 cores that beats one run with 2 threads.
# (The recorded runs were scheduled by hand in the same way: each run started as soon as a core
#  and its inputs were free; mopd_math right after math_only, mopd_mix after both specialists.)
set -euo pipefail
cd "$(dirname "$0")/.."
R=recipes/rlvr_cpu.yaml
E=${EVIDENCE_DIR:-runs/evidence}
mkdir -p "$E"
MATH="name: math, args: {families: [addition, chain_sum, multiplication, mixed_arithmetic, linear_equation]}, train_tasks: 48, val_tasks: 48"
MCQ="name: mcq, train_tasks: 48, val_tasks: 48"
INSTR="name: instruction, args: {min_constraints: 1, max_constraints: 2}, train_tasks: 48, val_tasks: 48"

done_() { [ -d "$E/$1/checkpoints/step_0000$2" ]; }  # done_ NAME STEPS: the last checkpoint exists

rl() {  # rl NAME STEPS [key=value ...]: one RL run, skipped when finished (re-running resumes)
  local name=$1 steps=$2; shift 2
  done_ "$name" "$steps" && { echo "$name: done"; return; }
  posttrain rl -c $R run_dir="$E/$name" train.steps="$steps" "$@" --no-progress > "$E/$name.log" 2>&1
}
distill() {  # distill NAME [key=value ...]: a 10-step MOPD run
  local name=$1; shift
  done_ "$name" 10 && { echo "$name: done"; return; }
  posttrain distill -c recipes/mopd_cpu.yaml run_dir="$E/$name" "$@" --no-progress > "$E/$name.log" 2>&1
}

# 0. the curriculum's input: the base model's pass rate on every training task (k=4)
[ -s "$E/profile.jsonl" ] || posttrain profile -c $R --k 4 --out "$E/profile.jsonl" --no-progress

# 1. (a)+(c): the three-domain mix, curriculum vs uniform sampling, same seed and steps
rl mix_curriculum 20 &
rl mix_random 20 curriculum.kind=random &
wait
# 2. (b) + the MOPD teachers: one trained domain each, the other two validated (ratio 0); 10 steps
#    (the CPU budget), compared with the mix runs' step-10 validation
SPEC="train.eval_every=5 train.save_every=5"
rl math_only 10 "envs=[{$MATH}, {$MCQ, ratio: 0}, {$INSTR, ratio: 0}]" $SPEC &
rl instruction_only 10 "envs=[{$MATH, ratio: 0}, {$MCQ, ratio: 0}, {$INSTR}]" $SPEC &
wait
# 3. MOPD, 10 steps: both specialists into the base; and MOPD vs GRPO (math_only) on math alone,
#    compared by held-out score against rollouts spent
distill mopd_mix train.steps=10 $SPEC &
distill mopd_math "envs=[{$MATH}, {$MCQ, ratio: 0}, {$INSTR, ratio: 0}]" train.steps=10 $SPEC \
  "teachers.models=[{name: math_rl, model: $E/math_only/checkpoints/step_000010, domains: [math]}]" \
  teachers.default=math_rl &
wait
# 4. seed noise: the two mix runs again with seed 1
if [ "${SEEDS:-1}" -gt 1 ]; then  # SEEDS=2 bash bench/rl_evidence.sh
  rl mix_curriculum_seed1 20 train.seed=1 &
  rl mix_random_seed1 20 train.seed=1 curriculum.kind=random &
  wait
fi
# 5. (a) final: the three-domain mix with a 256-token limit, instruction at twice the share of the
#    others (4 of 8 prompts a step), 24 steps, 96 validation tasks per domain, seeds 0 and 1; then
#    the base model and both final checkpoints rescored task by task for paired gains
FINAL_ENVS="envs=[{${MATH/val_tasks: 48/val_tasks: 96}}, {${MCQ/val_tasks: 48/val_tasks: 96}}, {${INSTR/val_tasks: 48/val_tasks: 96}, ratio: 2}]"
for S in 0 1; do
  rl mix_final_seed$S 24 train.seed=$S train.eval_every=24 train.save_every=6 rollout.max_new_tokens=256 \
    rollout.prompts_per_step=8 "$FINAL_ENVS" &
done
wait
V=$E/final_val
mkdir -p $V
validate() {  # validate NAME MODEL: per-task held-out rewards on the final runs' validation tasks
  [ -s "$V/$1.jsonl" ] || posttrain validate -c $E/mix_final_seed0/config.yaml --model "$2" --out "$V/$1.jsonl" \
    --threads 1 --no-progress > "$V/$1.log" 2>&1
}
validate base embedded &
validate seed0 $E/mix_final_seed0/checkpoints/step_000024 &
wait
validate seed1 $E/mix_final_seed1/checkpoints/step_000024
echo "evidence runs finished: python bench/rl_evidence_report.py"
