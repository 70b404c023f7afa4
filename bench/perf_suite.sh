#!/usr/bin/env bash
# Issue 16's figures, one run per bench, on an idle machine (~20 min on 2 cores). Each bench appends
# its row to bench/results/ and ends with one `RESULT <name>: ...` line; the RESULT lines are printed
# again at the end. A bench that fails is reported and the others still run. bash bench/perf_suite.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
log=$(mktemp)
step() {  # step "title" command...
  echo "== $1 (load $(cut -d' ' -f1 /proc/loadavg))" | tee -a "$log"
  shift
  "$@" 2>&1 | grep -v "^Loading weights\|Timeout is disabled" | tee -a "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || echo "FAILED: $*" | tee -a "$log"
}
echo "== $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD), $(nproc) cores" | tee -a "$log"
step "precision probe (re-measured), the decision per stage, bf16 log-prob error" python bench/precision.py
step "SFT throughput vs the best matmul peak, with a profile" \
  python bench/sft_throughput.py --steps 3 --batch 16 --seq 512 --profile
step "rollout decode vs the memory-bandwidth limit at batch 1/8/32, fp32 and bf16 sampling weights" \
  python bench/rollout_throughput.py --batches 1,8,32 --new-tokens 48 --rounds 2 --threads 1
step "threads: 1 vs 2, OpenMP wait policy, with and without a competing load" python bench/threads.py --repeats 2
step "GRPO step vs TRL: equal work, equal precision (fp32 and bf16), 3 interleaved repeats" \
  python bench/grpo_vs_trl.py --steps 2 --threads 1 --modes equal,skip --precisions fp32,bf16 --repeats 3
echo "== $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"
grep "^RESULT\|^FAILED" "$log"
