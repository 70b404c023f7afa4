"""MOPD's estimator through the real scoring path on tiny models.

* The sampled advantage ``log π_T(y) − log π_S(y)`` with y ~ π_S, averaged over many samples, equals
  minus the exact reverse KL(π_S ‖ π_T) computed over the whole vocabulary — within 4 standard
  errors of the sample mean (the standard error is estimated from the same samples; the KL itself is
  > 20 standard errors from 0, so the comparison is not vacuous).
* A teacher with the student's weights gives zero advantage on rollouts the student sampled: the
  teacher's scores equal the trainer's log-probs bit for bit (same routine), and differ from the
  sampler's by the sampler-vs-trainer numerical gap only (< 1e-4, the bound the RL test uses).
"""

from __future__ import annotations

import pytest
import torch

from posttrain.algos.advantages import ScoredBatch, make_advantage
from posttrain.configs.distill import TeachersConfig
from posttrain.scorers.teachers import ScoringTeacherPool
from posttrain.envs.base import Environment, Task, VerifyResult
from posttrain.models.loading import load_model
from posttrain.models.tiny import build_tiny, tiny_tokenizer
from posttrain.models.logprobs import sampled_logprobs
from posttrain.configs.rl import AlgoConfig, RLConfig
from posttrain.episodes.collect import Rollout, Sampling
from posttrain.train.rl import filtered_batch

pytestmark = pytest.mark.usefixtures("one_thread")

CONTEXTS = [[5, 17, 33, 40], [7, 8, 9, 10, 11, 12], [3, 4, 250]]  # three next-token distributions


def sharpened(seed: int, scale: float):
    """A tiny-llama whose final norm is scaled up: random tiny models are nearly uniform over the
    vocabulary, and a peakier pair makes the KL (and the test) less trivial."""
    model = build_tiny("tiny-llama", len(tiny_tokenizer()), seed).eval()
    with torch.no_grad():
        model.model.norm.weight.mul_(scale)
    return model


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_estimator_matches_exact_reverse_kl(temperature):
    student, teacher = sharpened(0, 6.0), sharpened(1, 6.0)
    pool = ScoringTeacherPool(TeachersConfig(models=[{"name": "t", "model": "teacher", "domains": ["d"]}]),
                       tiny_tokenizer(), loader=lambda spec: (teacher, tiny_tokenizer()))
    n = 3000
    g = torch.Generator().manual_seed(0)
    for ctx in CONTEXTS:
        with torch.no_grad():  # the exact distributions at the last position, over all 512 tokens
            ls_V = torch.log_softmax(student(input_ids=torch.tensor([ctx])).logits[0, -1].float() / temperature, -1)
            lt_V = torch.log_softmax(teacher(input_ids=torch.tensor([ctx])).logits[0, -1].float() / temperature, -1)
        exact_kl = float((ls_V.exp() * (ls_V - lt_V)).sum())
        ys = torch.multinomial(ls_V.exp(), n, replacement=True, generator=g).tolist()
        # the student "sampled" y with its reported log-prob; the teacher scores it like a rollout
        rollouts = [Rollout("d", "t0", i, ctx + [y], [0] * len(ctx) + [1], [float(ls_V[y])], "stop", 0.0, Sampling(temperature))
                    for i, y in enumerate(ys)]
        batch, _ = filtered_batch(rollouts, AlgoConfig(overlong_filter=False, dynamic_filter=False))
        pool(rollouts, batch)
        torch.testing.assert_close(batch.teacher_logprobs_BT[:, 0], lt_V[torch.tensor(ys)], atol=1e-5, rtol=1e-5)
        adv_B = make_advantage("mopd")(batch)[:, 0]
        estimate, se = float(-adv_B.mean()), float(adv_B.std() / n**0.5)
        assert exact_kl > 20 * se, (exact_kl, se)
        assert abs(estimate - exact_kl) < 4 * se, (estimate, exact_kl, se)


class CountEnv(Environment):
    """Stand-in domain: reward 1 for a reply of even length (about half of random replies)."""

    name = "test_mopd_count"
    domain = "test"

    def tasks(self, split="train", n=None, seed=0):
        return [Task(id=f"c/{i}", domain="test", messages=[{"role": "user", "content": f"Count to {i}."}])
                for i in range(n or 4)]

    def verify(self, task, messages):
        return VerifyResult(float(len(messages[-1]["content"]) % 2 == 0))


def test_teacher_equal_to_student_gives_zero_advantage(sample_rollouts):
    from posttrain.engines.hf import HFGenerator

    loaded = load_model("tiny-llama", device="cpu", dtype=torch.float32)
    env = CountEnv()
    cfg = RLConfig(rollout={"group_size": 3, "max_new_tokens": 8}).rollout
    rollouts = sample_rollouts(HFGenerator(loaded.model, loaded.tokenizer), {env.name: env},
                               [(env.name, t) for t in env.tasks("train", 3)], cfg, seed=1)
    batch, _ = filtered_batch(rollouts, AlgoConfig(overlong_filter=False, dynamic_filter=False))
    # the teacher is loaded by the pool from the same spec: a second copy of the student's weights
    pool = ScoringTeacherPool(TeachersConfig(models=[{"name": "self", "model": "tiny-llama", "domains": [env.name]}]),
                       loaded.tokenizer)
    metrics = pool(rollouts, batch)
    adv_BT = make_advantage("mopd")(batch)
    assert batch.mask_BT.sum() == metrics["teacher_tokens"] > 0
    assert float(adv_BT.abs().max()) < 1e-4 and abs(metrics["mopd_gap"]) < 1e-4
    with torch.no_grad():
        trainer = sampled_logprobs(loaded.model.eval(), [r.token_ids for r in rollouts],
                                   [r.loss_mask for r in rollouts], cfg.temperature)
    for b, lp in enumerate(trainer):
        assert torch.equal(batch.teacher_logprobs_BT[b, : lp.shape[0]], lp)  # the very same numbers


def test_mopd_advantage_mixes_in_the_verifier_reward():
    """reward_coef adds GRPO's group advantage to the dense teacher signal (hand-computed)."""
    batch = ScoredBatch(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
                        sampler_logprobs_BT=torch.tensor([[-1.0, -2.0], [-0.5, 0.0]]),
                        teacher_logprobs_BT=torch.tensor([[-0.5, -2.5], [-1.5, 0.0]]))
    plain = make_advantage("mopd")(batch)
    torch.testing.assert_close(plain, torch.tensor([[0.5, -0.5], [-1.0, 0.0]]))
    mixed = make_advantage("mopd", reward_coef=0.5, grpo={"scale_by_std": False})(batch)
    torch.testing.assert_close(mixed, torch.tensor([[0.75, -0.25], [-1.25, 0.0]]))  # ± 0.5 · 0.5


def test_distillation_keeps_cut_rollouts_by_default():
    # The overlong filter is about the reward; a cut rollout's teacher signal is valid, so MOPD keeps
    # it (a rambling just-pruned student would otherwise train on nothing), while RLVR drops it.
    from posttrain.configs.distill import DistillAlgoConfig

    cut = [Rollout("d", "t0", i, [5, 17, 33], [0, 1, 1], [-1.0, -1.0], "length", float(i), Sampling(1.0))
           for i in range(2)]
    kept, stats = filtered_batch(cut, DistillAlgoConfig())
    assert kept.mask_BT.sum() == 4 and stats["truncated"] == 0
    dropped, stats = filtered_batch(cut, AlgoConfig(dynamic_filter=False))
    assert dropped.mask_BT.sum() == 0 and stats["truncated"] == 2
