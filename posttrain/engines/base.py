"""The generation interface every model sits behind: a policy, a teacher, a judge, a user simulator.

Prompts are chat conversations (lists of OpenAI-style messages); the engine renders them with the
chat template, samples ``n`` completions each and returns, per completion, the exact token ids it
sampled, the sampler's log-probs of those tokens and why it stopped. Keeping the sampled ids (not
re-encoding the decoded text) is what makes the trainer's log-probs comparable to the sampler's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Message = dict[str, Any]
FinishReason = Literal["stop", "length"]


@dataclass
class SamplingParams:
    max_new_tokens: int = 256
    temperature: float = 1.0  # 0 → greedy
    top_p: float = 1.0
    n: int = 1
    seed: int | None = None
    reasoning: bool = True  # False renders the reasoning-off generation prompt


@dataclass
class Completion:
    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason = "stop"
    prompt_ids: list[int] = field(default_factory=list)


class Generator(Protocol):
    def generate(
        self,
        prompts: Sequence[Sequence[Message]],
        params: SamplingParams,
        tools: Sequence[Sequence[dict[str, Any]] | None] | None = None,
    ) -> list[list[Completion]]:
        """``n`` completions per prompt, in prompt order. ``tools[i]`` are prompt i's tools."""
        ...


class TokenEngine:
    """What every local engine shares: render chat prompts to ids with the project's chat template,
    then sample from ids (``generate_ids``, each engine's own). ``HFGenerator`` and
    ``VLLMGenerator`` inherit it, so prompt rendering cannot drift between them."""

    tokenizer: Any

    @classmethod
    def from_spec(cls, spec: str, **kwargs: Any) -> Any:
        from posttrain.models.loading import load_model, load_tokenizer
        from posttrain.quant.checkpoint import is_fp8_checkpoint, load_fp8

        if is_fp8_checkpoint(spec):  # a `posttrain quantize` export: FP8 simulated on the CPU
            return cls(load_fp8(spec), load_tokenizer(spec), **kwargs)
        loaded = load_model(spec)
        return cls(loaded.model, loaded.tokenizer, **kwargs)

    def render_prompt(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None, reasoning: bool = True
    ) -> list[int]:
        from posttrain.models.chat_template import render

        return render(self.tokenizer, messages, tools, add_generation_prompt=True, reasoning=reasoning).input_ids

    def generate(
        self,
        prompts: Sequence[Sequence[Message]],
        params: SamplingParams,
        tools: Sequence[Sequence[dict[str, Any]] | None] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        """``seeds[i]`` (optional) is prompt i's own seed, as in ``generate_ids``: a caller that
        names its prompts (curate: by task id) gets samples that do not depend on the batch."""
        if tools is not None and len(tools) != len(prompts):
            raise ValueError(f"{len(tools)} tool lists for {len(prompts)} prompts")
        ids = [
            self.render_prompt(msgs, tools[i] if tools is not None else None, params.reasoning)
            for i, msgs in enumerate(prompts)
        ]
        return self.generate_ids(ids, params, seeds=seeds)

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams,
                     seeds: Sequence[int] | None = None) -> list[list[Completion]]:
        raise NotImplementedError
