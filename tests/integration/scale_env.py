"""A stand-in environment for the Ray tests, importable by the actors (``scale.worker_imports:
[tests.integration.scale_env]``): reward 1 when the reply has an even number of characters, about
half of a tiny random model's replies, so GRPO groups carry signal."""

from __future__ import annotations

from posttrain.envs.base import ENVIRONMENTS, Environment, Task, VerifyResult, final_answer_text


class EvenLengthEnv(Environment):
    name = "test_even_length_ray"
    domain = "test"

    def tasks(self, split="train", n=None, seed=0):
        return [Task(id=f"even/{split}/{seed}/{i}", domain="test",
                     messages=[{"role": "user", "content": f"Write something about {i}."}]) for i in range(n or 16)]

    def verify(self, task, messages):
        even = len(final_answer_text(messages)) % 2 == 0
        return VerifyResult(float(even), reason="even" if even else "odd")


if EvenLengthEnv.name not in ENVIRONMENTS:
    ENVIRONMENTS.register(EvenLengthEnv.name)(EvenLengthEnv)
