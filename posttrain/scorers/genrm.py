"""The GenRM reward scorer (RLHF, docs/rlhf.md): replaces the verifier in the reward phase.

For one step's rollouts, grouped by prompt (``Rollout.group``, in sampling order):

1. **Ring comparisons** (``algos.genrm.ring_pairs``): within a group of G responses, (r_1, r_2),
   (r_2, r_3), …, (r_G, r_1): G comparisons, each response judged twice, once in each position.
2. **One judge pass for the whole step**: every comparison of every group goes to
   :class:`~posttrain.envs.genrm.judge.GenRMJudge` in one batched call (bounded retries, neutral
   fallback, all counted). The judge sees the prompt's history, its last user turn and the two
   responses' final answers (reasoning stripped; ``envs/genrm/format.py``).
3. **Base reward** (``algos.genrm.ring_base_rewards``): scores tie-broken by the ranking when
   equal, then the mean of a response's two scores.
4. **Length control** (``algos/length_control.py``, when enabled): centred reasoning- and
   answer-length terms and the quality-gated conciseness bonus, within the group.

The reward is not in [0, 1] (about 1–5, plus the length terms); GRPO normalises within groups, so
the scale does not matter to the advantage. ``pass_rate`` (reward ≥ 1) means nothing here.

Lengths: of a response's reasoning (``<think>`` block) and answer (the rest), summed over its
assistant turns, in the policy tokenizer's tokens (``unit: chars``: characters).

Metrics: ``reward_base`` (mean base reward), ``reward_base_group_std`` (the within-group standard
deviation of the base reward, averaged over groups) and ``reward_base_flat_frac`` (share of groups
whose base rewards are all equal: without length control such a group has no advantage and trains
nothing; a constant judge makes every group flat), ``think_len_mean``, ``answer_len_mean``,
``genrm_comparisons``, ``genrm_retries``, ``genrm_fallbacks``, ``genrm_fallback_frac``,
``genrm_judge_tokens``, ``time_judge_s`` (also reported as ``time_verify_s``).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Sequence

from posttrain.algos.genrm import ring_base_rewards, ring_pairs
from posttrain.algos.length_control import length_controlled_rewards
from posttrain.configs.rlhf import LengthControlConfig
from posttrain.envs.genrm.format import build_genrm_prompt, split_prompt
from posttrain.models.chat_template import response_parts


def group_indices(rollouts: Sequence[Any]) -> list[list[int]]:
    """Rollout indices per group, groups in first-seen order, rollouts in sampling order."""
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(rollouts):
        groups.setdefault(r.group, []).append(i)
    return list(groups.values())


def group_std(values: Sequence[float]) -> float:
    """Population standard deviation of one group's rewards (exactly 0 for a flat group or a group of one)."""
    return statistics.pstdev(values) if len(values) > 1 else 0.0


class GenRMReward:
    """Reward scorer: the judge's ring comparisons + length control (module docstring)."""

    phase = "reward"

    def __init__(self, judge: Any, tokenizer: Any = None, length: LengthControlConfig | None = None) -> None:
        self.judge, self.tokenizer = judge, tokenizer
        self.length = length or LengthControlConfig(enabled=False)
        if self.length.enabled and self.length.unit == "tokens" and tokenizer is None:
            raise ValueError("length control in tokens needs the policy's tokenizer")

    def _len(self, text: str) -> int:
        if not text:
            return 0
        if self.length.unit == "chars" or self.tokenizer is None:  # no tokenizer: metrics only, in chars
            return len(text)
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def __call__(self, rollouts: Sequence[Any], batch: Any = None) -> dict[str, float]:
        t0 = time.perf_counter()
        before = dict(self.judge.stats)
        groups = group_indices(rollouts)
        parts = [response_parts(r.messages) for r in rollouts]
        prompts, owners = [], []
        for g in groups:
            history, turn = split_prompt(rollouts[g[0]].task.messages)
            for i, j in ring_pairs(len(g)):
                prompts.append(build_genrm_prompt(history, turn, parts[g[i]][2], parts[g[j]][2]))
            owners.append(len(ring_pairs(len(g))))
        # retry seeds are a function of the step (the rollouts' policy version): a resumed run re-asks alike
        step = getattr(getattr(rollouts[0], "sampling", None), "policy_version", 0) if rollouts else 0
        verdicts = self.judge.judge_many(prompts, seed=1_000_003 * step)
        base_all, pos, spreads = [0.0] * len(rollouts), 0, []
        think_len = [self._len(p[0]) for p in parts]
        answer_len = [self._len(p[1]) for p in parts]
        for g, n in zip(groups, owners):
            base = ring_base_rewards(len(g), verdicts[pos: pos + n])
            pos += n
            spreads.append(group_std(base))
            final = base
            if self.length.enabled:
                lc = self.length
                final = length_controlled_rewards(base, [think_len[i] for i in g], [answer_len[i] for i in g],
                                                  lc.think_coef, lc.answer_coef, lc.bonus, lc.quantile,
                                                  lc.empty_answer_credit,
                                                  spreads[-1] if lc.scale == "base_std" else 1.0)
            for k, i in enumerate(g):
                base_all[i] = base[k]
                rollouts[i].reward, rollouts[i].reason = final[k], f"genrm base {base[k]:.2f}"
        delta = {k: v - before.get(k, 0) for k, v in self.judge.stats.items()}
        dt = time.perf_counter() - t0
        n = max(len(rollouts), 1)
        return {"reward_base": sum(base_all) / n,
                "reward_base_group_std": sum(spreads) / max(len(spreads), 1),
                "reward_base_flat_frac": sum(sd == 0.0 for sd in spreads) / max(len(spreads), 1),
                "think_len_mean": sum(think_len) / n,
                "answer_len_mean": sum(answer_len) / n, "answer_empty_frac": sum(x == 0 for x in answer_len) / n,
                "genrm_comparisons": float(len(prompts)),
                "genrm_retries": float(delta.get("retries", 0)), "genrm_fallbacks": float(delta.get("fallbacks", 0)),
                "genrm_fallback_frac": delta.get("fallbacks", 0) / max(len(prompts), 1),
                "genrm_judge_tokens": float(delta.get("tokens", 0)), "time_judge_s": dt, "time_verify_s": dt}
