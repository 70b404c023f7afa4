"""Running a GenRM: any :class:`~posttrain.engines.base.Generator` as the judge of pairs.

:class:`GenRMJudge` takes a batch of GenRM prompts (``format.build_genrm_prompt``) and returns one
:class:`~posttrain.algos.genrm.Judgement` per prompt, never raising on what the model writes:

1. One batched ``generate`` over every prompt, greedy by default (``temperature`` > 0: sampled
   with the call's seed, for a judge whose greedy verdict does not depend on the responses);
   ``batched=False``: one call per prompt, for the speed comparison of ``bench/rlhf_step.py``.
2. Prompts whose reply does not parse (``format.parse_judgement``) are asked again, together, up to
   ``retries`` times, sampled at ``retry_temperature`` with a fresh seed each round (a greedy retry
   would write the same reply again).
3. What still fails gets the **neutral fallback** ``Judgement(3, 3, 3.5)``: equal middling scores
   and the neutral ranking, so the tie-break moves nothing and both responses get the same score
   from that comparison: the failed comparison carries no preference.

``stats`` counts, over the judge's lifetime: ``calls`` (prompts judged), ``generated`` (replies
generated, retries included), ``retries``, ``fallbacks``, ``failure/<reason>`` (each failed reply),
``truncated`` (replies that hit ``max_new_tokens``) and ``tokens`` (generated tokens).
"""

from __future__ import annotations

from typing import Sequence

from posttrain.algos.genrm import NEUTRAL_RANK, Judgement
from posttrain.engines.base import Generator, Message, SamplingParams
from posttrain.envs.genrm.format import ParseFailure, parse_judgement

NEUTRAL = Judgement(3, 3, NEUTRAL_RANK)


class GenRMJudge:
    def __init__(self, generator: Generator, max_new_tokens: int = 256, retries: int = 2,
                 retry_temperature: float = 0.7, reasoning: bool = False, batched: bool = True, seed: int = 0,
                 temperature: float = 0.0) -> None:
        if retries < 0 or temperature < 0:
            raise ValueError(f"retries and temperature must be >= 0, got {retries}, {temperature}")
        self.temperature = temperature
        self.generator, self.max_new_tokens, self.retries = generator, max_new_tokens, retries
        self.retry_temperature, self.reasoning, self.batched, self.seed = retry_temperature, reasoning, batched, seed
        self.stats: dict[str, int] = {}

    def _count(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n

    def _generate(self, prompts: Sequence[list[Message]], temperature: float, seed: int) -> list[str]:
        params = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=temperature, n=1, seed=seed,
                                reasoning=self.reasoning)
        if self.batched:
            outs = self.generator.generate(list(prompts), params)
        else:
            outs = [self.generator.generate([p], params)[0] for p in prompts]
        texts = []
        for comps in outs:
            c = comps[0]
            self._count("generated")
            self._count("tokens", len(c.token_ids))
            if c.finish_reason == "length":
                self._count("truncated")
            texts.append(c.text)
        return texts

    def judge_many(self, prompts: Sequence[list[Message]], seed: int = 0) -> list[Judgement]:
        """One judgement per prompt (see the module docstring); retry round k samples with seed
        ``self.seed + seed + k``."""
        seed = self.seed + seed
        self._count("calls", len(prompts))
        verdicts: list[Judgement | None] = [None] * len(prompts)
        todo = list(range(len(prompts)))
        for attempt in range(self.retries + 1):
            if not todo:
                break
            if attempt:
                self._count("retries", len(todo))
            temperature = self.temperature if attempt == 0 else self.retry_temperature
            texts = self._generate([prompts[i] for i in todo], temperature, seed + attempt)
            failed = []
            for i, text in zip(todo, texts):
                parsed = parse_judgement(text)
                if isinstance(parsed, ParseFailure):
                    self._count(f"failure/{parsed.reason}")
                    failed.append(i)
                else:
                    verdicts[i] = parsed
            todo = failed
        self._count("fallbacks", len(todo))
        return [v if v is not None else NEUTRAL for v in verdicts]


def make_generator(model: str | None = None, url: str | None = None, batch_size: int = 32) -> Generator:
    """A judge's generator: an OpenAI-compatible server (``url``: ``http://host:port/v1[#model]``) or a
    local model spec / HF directory (``model``)."""
    if url:
        from posttrain.engines.openai_compat import OpenAIGenerator

        return OpenAIGenerator.from_spec(url)
    from posttrain.engines.hf import HFGenerator

    return HFGenerator.from_spec(model or "embedded", batch_size=batch_size)
