"""Sample-based accuracy estimators: pass@k (unbiased) and avg@k.

pass@k is the probability that at least one of ``k`` samples is correct. Estimating it by drawing
exactly ``k`` samples per task is high-variance; the unbiased estimator of Chen et al. (2021,
"Evaluating Large Language Models Trained on Code") uses ``n >= k`` samples of which ``c`` are
correct:

    pass@k = 1 - C(n - c, k) / C(n, k)

The binomials overflow for large ``n``, so it is computed as the product

    C(n - c, k) / C(n, k) = prod_{i = n - c + 1}^{n} (1 - k / i)

(each factor in [0, 1]; no large intermediate numbers). When ``n - c < k`` every draw of ``k``
samples contains a correct one and pass@k is exactly 1.

avg@k is the mean reward of the ``k`` samples (docs/recipe.md §7: the
reports average k samples per problem); with binary rewards it equals pass@1 estimated from ``k`` samples.

A sample counts as correct when its reward reaches ``success_threshold`` (1.0 by default: full
marks; environments with partial credit, such as the fraction of unit tests passed, only count
complete solutions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct (see the module docstring)."""
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need n >= 1, 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def avg_at_k(rewards: Sequence[float]) -> float:
    """Mean reward of one task's samples."""
    if not rewards:
        raise ValueError("avg@k of no samples")
    return sum(rewards) / len(rewards)


def n_correct(rewards: Sequence[float], success_threshold: float = 1.0) -> int:
    return sum(r >= success_threshold for r in rewards)
