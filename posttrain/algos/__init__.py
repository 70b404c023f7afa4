"""The pure maths of post-training: advantage estimators, losses, rollout filters, curriculum.

Registries: ``ADVANTAGES`` (grpo, mopd, rft) and ``LOSSES`` (pg, ce, dpo). See docs/algorithms.md for
the formulas and the tensor shape-suffix convention.
"""

from posttrain.algos.advantages import ADVANTAGES, ScoredBatch, make_advantage
from posttrain.algos.losses import LOSSES, LossInputs, LossOutput, make_loss, token_logprobs

__all__ = [
    "ADVANTAGES", "LOSSES", "LossInputs", "LossOutput", "ScoredBatch", "make_advantage", "make_loss",
    "token_logprobs",
]
