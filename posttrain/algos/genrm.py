"""GenRM maths (docs/rlhf.md, docs/recipe.md §4): pure functions, no model, no torch.

* :func:`genrm_reward` — the reward of one judgement while the GenRM itself is trained with GRPO::

      R = −C1·[format error] − |P_h1 − G_h1| − |P_h2 − G_h2| − C2·|P_r − G_r|      C1 = 10, C2 = 1

  P is the parsed prediction, G the ground truth (helpfulness 1–5 per response, ranking 1–6). A
  judgement whose format is broken has no prediction; its distance terms take their largest
  possible values (4, 4 and 5·C2), so R = −C1 − 8 − 5·C2 (−23 by default) is the worst reward of
  all and any parseable judgement beats any unparseable one. (With the distances dropped instead, a
  format error (−10) would beat a parseable but maximally wrong judgement (−13).)
* :func:`genrm_reward_unit` — the affine map of R onto [0, 1] that the environment contract needs:
  ``1 + R / R_worst`` with ``R_worst = C1 + 8 + 5·C2``: 1 = a perfect judgement, 0 = a format error.
  GRPO's group-normalised advantage (``scale_by_std``) is invariant to a positive affine map of
  the rewards, so training on the unit reward is training on R.
* :func:`swap_truth` — the ground truth of the same pair with the responses swapped:
  (h1, h2, r) → (h2, h1, 7 − r).
* :func:`ring_pairs`, :func:`tie_break`, :func:`ring_base_rewards` — RLHF with the GenRM: the G
  responses to one prompt are compared in a ring, (0, 1), (1, 2), …, (G−1, 0), so each is judged
  twice, once in each position; a comparison's two helpfulness scores, when equal, are moved apart
  by the ranking (zero-sum, neutral at 3.5); a response's base reward is the mean of its scores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

C1, C2 = 10.0, 1.0
H_MIN, H_MAX = 1, 5  # helpfulness
R_MIN, R_MAX = 1, 6  # ranking: 1 = response 1 far better … 6 = response 2 far better
NEUTRAL_RANK = 3.5


@dataclass(frozen=True)
class Judgement:
    """A parsed GenRM verdict (or a ground truth): helpfulness of responses 1 and 2, and the ranking."""

    h1: float
    h2: float
    rank: float


def worst_reward(c1: float = C1, c2: float = C2) -> float:
    """−R of a format error: C1 plus the largest possible distances."""
    return c1 + 2 * (H_MAX - H_MIN) + c2 * (R_MAX - R_MIN)


def genrm_reward(pred: Judgement | None, truth: Judgement, c1: float = C1, c2: float = C2) -> float:
    """R of one judgement; ``pred`` None = format error (see the module docstring)."""
    if pred is None:
        return -worst_reward(c1, c2)
    return 0.0 - (abs(pred.h1 - truth.h1) + abs(pred.h2 - truth.h2) + c2 * abs(pred.rank - truth.rank))


def genrm_reward_unit(pred: Judgement | None, truth: Judgement, c1: float = C1, c2: float = C2) -> float:
    """R mapped affinely onto [0, 1]: ``1 + R / worst_reward`` (1 perfect, 0 format error)."""
    return 1.0 + genrm_reward(pred, truth, c1, c2) / worst_reward(c1, c2)


def swap_truth(truth: Judgement) -> Judgement:
    """The same pair with the two responses in the other order."""
    return Judgement(truth.h2, truth.h1, R_MIN + R_MAX - truth.rank)


def rank_from_scores(h1: float, h2: float) -> int | None:
    """The documented ground-truth ranking of a pair whose helpfulness is known (docs/rlhf.md):
    d = h1 − h2; d ≥ 3 → 1, d = 2 → 2, d = 1 → 3, d = −1 → 4, d = −2 → 5, d ≤ −3 → 6;
    equal scores (d = 0) are not a preference pair: None."""
    d = round(h1 - h2)
    if d == 0:
        return None
    table = {2: 2, 1: 3, -1: 4, -2: 5}
    return table.get(d, 1 if d > 0 else 6)


def score_from_reward(reward: float) -> int:
    """Helpfulness of a response graded by a verifier with reward in [0, 1]: 1 + round(4·reward)
    (wrong → 1, correct → 5; a partial instruction-following score lands in between)."""
    return H_MIN + round((H_MAX - H_MIN) * min(max(reward, 0.0), 1.0))


# --------------------------------------------------------------------------- RLHF: the ring


def ring_pairs(n: int) -> list[tuple[int, int]]:
    """(i, i+1) for each response, the last with the first: n comparisons for n ≥ 3, each response
    once in position 1 and once in position 2. n = 2: (0, 1) and (1, 0) (both orders); n < 2: none."""
    if n < 2:
        return []
    return [(i, (i + 1) % n) for i in range(n)]


def tie_break(s_i: float, s_j: float, rank: float) -> tuple[float, float]:
    """Scores of one comparison (response i in position 1, j in position 2) after the tie-break:
    when they are equal, ``s_i + (3.5 − rank)`` and ``s_j + (rank − 3.5)``; otherwise unchanged."""
    if s_i != s_j:
        return s_i, s_j
    return s_i + (NEUTRAL_RANK - rank), s_j + (rank - NEUTRAL_RANK)


def ring_base_rewards(n: int, verdicts: Sequence[Judgement]) -> list[float]:
    """Base reward of each of n responses from the verdicts of ``ring_pairs(n)`` (same order): the
    mean of the response's tie-broken scores over the comparisons it took part in. One response:
    no comparison, base reward 0."""
    pairs = ring_pairs(n)
    if len(verdicts) != len(pairs):
        raise ValueError(f"{len(pairs)} comparisons for {n} responses, got {len(verdicts)} verdicts")
    sums, counts = [0.0] * n, [0] * n
    for (i, j), v in zip(pairs, verdicts):
        s_i, s_j = tie_break(v.h1, v.h2, v.rank)
        sums[i] += s_i
        sums[j] += s_j
        counts[i] += 1
        counts[j] += 1
    return [s / c if c else 0.0 for s, c in zip(sums, counts)]
