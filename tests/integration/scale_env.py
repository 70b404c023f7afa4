"""Stand-in environments for the RL tests, in a module the Ray actors can import too
(``scale.worker_imports: [tests.integration.scale_env]``). ``test_even_length``: reward 1 when the
reply has an even number of characters, about half of a tiny random model's replies, so GRPO groups
carry signal (tests/integration/test_rl.py, test_rlhf.py, test_scale_ray.py)."""

from __future__ import annotations

from posttrain.envs.base import ENVIRONMENTS, Environment, Task, VerifyResult, final_answer_text


class EvenLengthEnv(Environment):
    name = "test_even_length"
    domain = "test"

    def tasks(self, split="train", n=None, seed=0):
        return [Task(id=f"even/{split}/{seed}/{i}", domain="test",
                     messages=[{"role": "user", "content": f"Write something about {i}."}]) for i in range(n or 16)]

    def verify(self, task, messages):
        even = len(final_answer_text(messages)) % 2 == 0
        return VerifyResult(float(even), reason="even" if even else "odd")


if EvenLengthEnv.name not in ENVIRONMENTS:
    ENVIRONMENTS.register(EvenLengthEnv.name)(EvenLengthEnv)


class VowelShareEnv(Environment):
    """Reward = the share of the reply's characters that are vowels or spaces: a graded signal a
    tiny random model can climb, so held-out (greedy) reward tells runs apart (bench/scale_rl.py)."""

    name = "test_vowel_share_ray"
    domain = "test"

    def tasks(self, split="train", n=None, seed=0):
        return [Task(id=f"vowel/{split}/{seed}/{i}", domain="test",
                     messages=[{"role": "user", "content": f"Say something about {i} in {split}."}])
                for i in range(n or 16)]

    def verify(self, task, messages):
        text = final_answer_text(messages)
        share = sum(c in "aeiou " for c in text.lower()) / max(len(text), 1)
        return VerifyResult(round(share, 4), reason=f"{share:.2f} vowels")


if VowelShareEnv.name not in ENVIRONMENTS:
    ENVIRONMENTS.register(VowelShareEnv.name)(VowelShareEnv)
