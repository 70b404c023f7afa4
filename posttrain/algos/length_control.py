"""Group-relative length control for RLHF (docs/recipe.md §4, docs/rlhf.md): pure functions.

Within the G responses to one prompt, separately for the reasoning part and the answer part::

    w_i  = 1 − (ℓ_i − ℓ_min) / (ℓ_max − ℓ_min)     1 for the shortest, 0 for the longest
    w̃_i  = w_i − mean(w)                            centred: zero-sum within the group
    R_i  = R_base_i + a·w̃_think_i + b·w̃_answer_i     a = b = 0.5 by default

plus the quality-gated conciseness bonus: +``bonus`` (0.5) to the response with the shortest
reasoning if its R_base is at least the group's ``quantile`` (0.8) percentile of R_base, and
independently the same for the shortest answer.

Two protections the recipe does not write (docs/results/rlhf_length_control.md: with a 135M judge
whose scores spread by 0.1–0.2 within a group, the ±0.5 length terms decided the reward and two
seeds of three learned to answer nothing):

* ``empty_answer_credit=False`` (the default): an empty answer is not concise, it said nothing. It
  gets the longest answer's weight (w = 0) and no answer bonus, so a lazy policy is not paid for
  silence. Reasoning may be empty (reasoning off), so this applies to the answer part only.
* ``scale`` multiplies every length term and bonus; the scorer passes the group's base-reward
  standard deviation with ``length_control.scale: base_std``, so length can only break what the
  judge sees as near-ties (a flat group gets no length signal).

Degenerate groups, by rule: when every length in the group is equal (a group of one, reasoning off
so every reasoning is empty, all answers empty) no response is shorter than another, so w̃ = 0 and
there is no bonus for that part. Several responses tied at the shortest length each get the bonus
when they pass the gate (none is more concise than the other). The percentile is linear
interpolation between order statistics (numpy's default): position q·(G−1) in the sorted R_base.
"""

from __future__ import annotations

from typing import Sequence


def length_weights(lengths: Sequence[float], empty_credit: bool = True) -> list[float]:
    """Centred w̃ of each response (all zero when every length is equal). With ``empty_credit=False``
    an empty response (length 0) gets w = 0, the longest's weight, and the shortest is the shortest
    non-empty one."""
    if not lengths:
        return []
    said = [x for x in lengths if empty_credit or x > 0]
    if not said or min(lengths) == max(lengths):
        return [0.0] * len(lengths)
    lo, hi = min(said), max(said)  # equal only when every non-empty one is: they share w = 1
    span = (hi - lo) or 1.0
    w = [1.0 - (x - lo) / span if (empty_credit or x > 0) else 0.0 for x in lengths]
    mean = sum(w) / len(w)
    return [x - mean for x in w]


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile, q in [0, 1] (numpy's default method)."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def conciseness_bonus(lengths: Sequence[float], base: Sequence[float], bonus: float = 0.5,
                      quantile: float = 0.8, empty_credit: bool = True) -> list[float]:
    """+``bonus`` to the shortest response(s) whose base reward is ≥ the group's ``quantile``
    percentile of base rewards; nothing when every length is equal. With ``empty_credit=False`` the
    shortest is the shortest non-empty response (an empty one never gets the bonus)."""
    if not lengths or min(lengths) == max(lengths):
        return [0.0] * len(lengths)
    said = [x for x in lengths if empty_credit or x > 0]
    if not said:
        return [0.0] * len(lengths)
    gate, shortest = percentile(base, quantile), min(said)
    return [bonus if x == shortest and b >= gate - 1e-12 else 0.0 for x, b in zip(lengths, base)]


def length_controlled_rewards(base: Sequence[float], think_lengths: Sequence[float],
                              answer_lengths: Sequence[float], think_coef: float = 0.5,
                              answer_coef: float = 0.5, bonus: float = 0.5, quantile: float = 0.8,
                              empty_answer_credit: bool = False, scale: float = 1.0) -> list[float]:
    """R_i of one group (see the module docstring)."""
    n = len(base)
    if not (len(think_lengths) == len(answer_lengths) == n):
        raise ValueError(f"{n} rewards, {len(think_lengths)} reasoning and {len(answer_lengths)} answer lengths")
    if scale < 0:
        raise ValueError(f"scale must be >= 0, got {scale}")
    wt, wa = length_weights(think_lengths), length_weights(answer_lengths, empty_answer_credit)
    bt = conciseness_bonus(think_lengths, base, bonus, quantile)
    ba = conciseness_bonus(answer_lengths, base, bonus, quantile, empty_answer_credit)
    return [base[i] + scale * (think_coef * wt[i] + answer_coef * wa[i] + bt[i] + ba[i]) for i in range(n)]
