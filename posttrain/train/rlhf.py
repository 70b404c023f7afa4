"""RLHF with a generative reward model, and GenRM training: both are the RL stage (docs/rlhf.md).

* ``posttrain rlhf`` (:func:`train_rlhf`): the RLVR step of ``train/rl.py`` with the verifier
  replaced by the GenRM reward scorer (``scorers/genrm.py``): per prompt G responses, compared in
  a ring by the judge (one batched judge pass per step), base reward = mean of a response's
  tie-broken scores, plus group-relative length control; then the same filters, ``grpo``
  advantage and ``pg`` loss. Validation still uses the environments' verifiers: a quality measure
  that does not come from the GenRM.
* ``posttrain genrm`` (:func:`train_genrm`): the RL stage on the ``genrm`` environment
  (``envs/genrm/``): the policy is the judge, each task a preference pair (in both orders), the
  reward the GenRM reward mapped onto [0, 1]; validation on held-out pairs measures it.

Configs: ``configs/rlhf.py``; CLI: ``commands/rlhf.py``.
"""

from __future__ import annotations

from typing import Any

from posttrain.configs.rlhf import GenRMConfig, RLHFConfig
from posttrain.train.rl import RLResult


def make_genrm_reward(cfg: RLHFConfig, judge_generator: Any = None) -> Any:
    """``t → GenRMReward``: the judge (built from ``cfg.judge`` unless given) and the trainer's
    tokenizer for token lengths."""
    from posttrain.envs.genrm.judge import GenRMJudge, make_generator
    from posttrain.scorers.genrm import GenRMReward

    j = cfg.judge
    gen = judge_generator if judge_generator is not None else make_generator(j.model, j.url, j.batch_size)
    judge = GenRMJudge(gen, j.max_new_tokens, j.retries, j.retry_temperature, j.reasoning, j.batched,
                       seed=cfg.train.seed, temperature=j.temperature, verdict=j.verdict)
    return lambda t: GenRMReward(judge, t.tokenizer, cfg.length_control)


def train_rlhf(cfg: RLHFConfig, progress: bool = True, stop_after: int | None = None,
               judge_generator: Any = None) -> RLResult:
    """The RL stage with the GenRM as the reward (see the module docstring)."""
    from posttrain.train.rl import train_rl

    return train_rl(cfg, progress=progress, stop_after=stop_after, reward=make_genrm_reward(cfg, judge_generator))


def train_genrm(cfg: GenRMConfig, progress: bool = True, stop_after: int | None = None) -> RLResult:
    """GRPO on the ``genrm`` environment (see the module docstring)."""
    from posttrain.train.rl import train_rl

    return train_rl(cfg, progress=progress, stop_after=stop_after)
