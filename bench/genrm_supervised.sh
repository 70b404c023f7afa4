#!/usr/bin/env bash
# Issue 35 (item 2): two supervised judges on the visible pairs, chosen on dev, reported on test.
#   bash bench/genrm_supervised.sh        # re-running skips what is finished
#   ARMS=cue bash bench/genrm_supervised.sh   # one arm only (two at once on 2 cores: one thread each); then
#                                             # a run without ARMS does the continuation and the table
# Arms (the same 1,878 train judgements of recipes/genrm_visible_large.yaml, the same SFT: 40 steps of 16
# conversations, lr 1e-4, checkpoints at 20 and 40), differing only in the reasoning line before the verdict:
#   restate  "Response 1 says: … Response 2 says: …" (the first 80 characters of each; the earlier judge's rows)
#   cue      "One reply stops mid-sentence: response 2. Response 1 does what was asked." (the defect, then the side)
# Rule, written before any figure: each arm's checkpoint is the one with the higher ranking-side accuracy on
# the 226 dev judgements (a tie: the earlier); both arms' chosen checkpoints are then judged once on test,
# and bench/genrm_judge.py prints and records them (cue paired against restate).
set -euo pipefail
cd "$(dirname "$0")/.."
C=recipes/genrm_visible_large.yaml
W=${GENRM_DIR:-runs/genrm_supervised}
mkdir -p "$W"

dev_best() {  # dev_best ARM STEP...: the step whose dev judgements have the highest side accuracy (a tie: the earliest)
  python - "$W" "$@" <<'PY'
import json, sys
w, arm, *steps = sys.argv[1:]
acc = {int(s): json.load(open(f"{w}/dev_{arm}_{s}.json"))["rank_side_acc"] for s in steps}
print(max(acc, key=lambda s: (acc[s], -s)))
PY
}

for arm in ${ARMS:-restate cue}; do
  [ -s "$W/warm_$arm.jsonl" ] || posttrain genrm --config $C --warmstart "$W/warm_$arm.jsonl" --verdicts truth --reasoning $arm
  [ -d "$W/sft_$arm/checkpoints/step_000040" ] || posttrain sft --config recipes/sft.yaml \
      "data.train=[{path: $W/warm_$arm.jsonl, weight: 1.0}]" data.max_seq_len=1024 run_dir="$W/sft_$arm" \
      train.steps=40 train.batch_size=16 train.save_every=20 train.eval_every=20 train.keep_last=2 \
      optim.warmup_steps=4 --no-progress > "$W/sft_$arm.log" 2>&1
  for step in 20 40; do
    [ -s "$W/dev_${arm}_$step.json" ] || posttrain genrm --config $C --split dev \
        --eval "$W/sft_$arm/checkpoints/step_0000$step" --out "$W/dev_${arm}_$step.json"
  done
  best=$(dev_best $arm 20 40)
  echo "$arm: step $best chosen on dev"
  [ -s "$W/test_$arm.json" ] || posttrain genrm --config $C --split test \
      --eval "$W/sft_$arm/checkpoints/step_0000$best" --out "$W/test_$arm.json"
done
# Added after the dev figures of steps 20 and 40, before any test figure of restate (docs/results/genrm.md):
# the dev winner trained 40 more steps from its step 40 (data order seed 1), checkpoints at 60 and 80; its
# judge is the checkpoint among 40, 60 and 80 with the highest dev side accuracy (a tie: the earliest).
[ -z "${ARMS:-}" ] || exit 0  # one arm only: the continuation and the table need both
M="$W/sft_restate_more"
[ -d "$M/checkpoints/step_000040" ] || posttrain sft --config recipes/sft.yaml \
    "data.train=[{path: $W/warm_restate.jsonl, weight: 1.0}]" data.max_seq_len=1024 run_dir="$M" \
    model="$W/sft_restate/checkpoints/step_000040" train.seed=1 train.steps=40 train.batch_size=16 \
    train.save_every=20 train.eval_every=20 train.keep_last=2 optim.warmup_steps=0 --no-progress > "$M.log" 2>&1
for step in 60 80; do
  [ -s "$W/dev_restate_$step.json" ] || posttrain genrm --config $C --split dev \
      --eval "$M/checkpoints/step_0000$((step - 40))" --out "$W/dev_restate_$step.json"
done
best=$(dev_best restate 40 60 80)
echo "restate: step $best of 40/60/80 chosen on dev"
RESTATE="$W/test_restate.json"  # step 40, judged on test by the loop above
if [ "$best" != 40 ]; then
  RESTATE="$W/test_restate_$best.json"
  [ -s "$RESTATE" ] || posttrain genrm --config $C --split test \
      --eval "$M/checkpoints/step_0000$((best - 40))" --out "$RESTATE"
fi
python bench/genrm_judge.py --config $C --judge restate="$RESTATE" --judge cue="$W/test_cue.json"
