#!/usr/bin/env bash
# Issue 35 item 4: MOPD's two claims with three student seeds, on the embedded SmolLM2-135M.
#   bash bench/mopd_evidence.sh [SEED ...]      # default seeds 0 1 2; re-running resumes
#   python bench/mopd_evidence.py               # test tables, dev curves, RESULT line, row
# 1. Two teachers from the base model, one domain each (GRPO, seed 0, 30 steps, dev validation every
#    10), each the checkpoint with the best dev score on its own domain (ties: the later step). A
#    teacher must sit >= 3 paired se above the base on its domain's dev tasks; where the GRPO
#    specialist does not, the registered fallback is an SFT specialist: 400 verified demonstrations
#    of the instruction environment's scripted writer (train split), recipes/sft.yaml's 60 steps of 16
#    (bench/mopd_evidence.py --pick-teacher). Trained once: the seeds are the students'.
# 2. Per seed, from the base model: MOPD on both domains (10 steps), and GRPO on both domains
#    (40 steps, a checkpoint every 5) for the two comparisons of equal compute: the GRPO checkpoint
#    at MOPD's student rollouts (step 10) and the one at MOPD's training time (the report picks it
#    by the runs' step times, never by a score). A MOPD step costs three to four GRPO steps (the
#    teacher's forward, and every rollout trained where GRPO skips groups with equal rewards).
# Two runs at a time with one torch thread each: on 2 cores that beats one run with 2 threads (the
# SFT fallback, a few minutes, trains beside the two teachers).
# Disk: every checkpoint is kept (1.6 GB with the optimizer's state), about 45 GB in all; once the
# report has scored a run, its checkpoints' trainer_state.pt can go (the marks keep it finished).
set -euo pipefail
cd "$(dirname "$0")/.."
E=${MOPD_DIR:-runs/mopd3}
R=recipes/mopd_evidence_rl.yaml
D=recipes/mopd_evidence.yaml
SEEDS=${*:-0 1 2}
mkdir -p "$E"
MATH="name: math, args: {families: [addition, chain_sum, multiplication, mixed_arithmetic, linear_equation]}, train_tasks: 96, val_tasks: 96"
INSTR="name: instruction, args: {min_constraints: 1, max_constraints: 2}, train_tasks: 96, val_tasks: 96"

# done_ NAME STEPS: the run finished (its last checkpoint, or the mark left when it did: checkpoints
# are 1.6 GB with the optimizer's state, and a finished run's may be deleted once scored)
done_() { [ -d "$E/$1/checkpoints/step_$(printf %06d "$2")" ] || [ -e "$E/$1/finished" ]; }
rl() {  # rl NAME STEPS [key=value ...]: one GRPO run, skipped when finished
  local name=$1 steps=$2; shift 2
  done_ "$name" "$steps" && { echo "$name: done"; return; }
  posttrain rl -c $R run_dir="$E/$name" train.steps="$steps" "$@" --no-progress > "$E/$name.log" 2>&1
  touch "$E/$name/finished"
}
distill() {  # distill NAME [key=value ...]: one 10-step MOPD run, skipped when finished
  local name=$1; shift
  done_ "$name" 10 && { echo "$name: done"; return; }
  posttrain distill -c $D run_dir="$E/$name" "$@" --no-progress > "$E/$name.log" 2>&1
  touch "$E/$name/finished"
}

TEACH="train.eval_every=10 train.save_every=10"
rl teacher_math 30 $TEACH "envs=[{$MATH}, {$INSTR, ratio: 0}]" &
rl teacher_instruction 30 $TEACH "envs=[{$MATH, ratio: 0}, {$INSTR}]" &
[ -s "$E/instruction_sft.jsonl" ] || python -c "import json; from posttrain.experiments.stages import instruction_rows as r
open('$E/instruction_sft.jsonl', 'w').write(''.join(json.dumps(x) + '\\n' for x in r(400, 0)))"
[ -d "$E/teacher_instruction_sft/checkpoints/step_000060" ] || posttrain sft -c recipes/sft.yaml \
  run_dir="$E/teacher_instruction_sft" "data.train=[{path: $E/instruction_sft.jsonl, weight: 1.0}]" \
  train.threads=1 train.save_every=60 train.eval_every=60 --no-progress > "$E/teacher_instruction_sft.log" 2>&1
wait
TM=$(python bench/mopd_evidence.py --runs "$E" --pick-teacher math teacher_math)
TI=$(python bench/mopd_evidence.py --runs "$E" --pick-teacher instruction teacher_instruction teacher_instruction_sft)
echo "teachers: $TM $TI"
TEACHERS="teachers.models=[{name: math_rl, model: $TM, domains: [math]}, {name: instruction_rl, model: $TI, domains: [instruction]}]"
for S in $SEEDS; do
  distill "mopd_mix_s$S" train.seed="$S" "$TEACHERS" &
  rl "grpo_mix_s$S" 40 train.seed="$S" &
  wait
done
echo "MOPD evidence runs finished: python bench/mopd_evidence.py --runs $E"
