"""The rollout loop of tool / multi-turn environments: model turn → environment step → next turn.

``run_episodes(generator, env, tasks, params, max_turns)`` plays ``params.n`` episodes per task,
all episodes in lock-step so each model turn is one batched ``generate_ids`` call over the
episodes still running:

1. the prompt is rendered once with the chat template (task messages + tools + generation prompt);
2. the model samples a turn; its ids (ending in ``<|im_end|>``) are appended *exactly as sampled*,
   mask 1, with the sampler's log-probs; the decoded text becomes an assistant message
   ``{"role": "assistant", "content": text}`` that goes to ``Episode.step`` (which parses the tool
   calls and counts malformed ones);
3. the observations (tool results, simulated-user replies) are rendered as chat-template segments
   and appended, mask 0, followed by the next generation prompt.

So the next prompt is the previous ids + sampled ids + rendered observation ids, never a
re-rendering of decoded text: a BPE re-encoding of the model's text need not give back the ids it
sampled, and the trainer must score exactly the ids the sampler drew. One consequence: the
template drops earlier turns' reasoning when a new user message arrives, but an episode's context
keeps all of it (the tokens the model actually saw), and the trajectory trains on that context.
Each turn re-prefills the whole context (no cache kept between turns): simple, and the cost is
the prefill of the context per turn.

An episode ends when the environment says ``done`` ("done"), after ``max_turns`` model turns
("max_turns"), when a turn hits ``max_new_tokens`` without a stop token ("length": a truncated turn
is not sent to the environment, and RL's overlong filtering drops such rollouts anyway), or when
the next turn would not fit ``max_context_tokens`` ("context"). Final observations after ``done``
are kept in ``messages`` but not appended to the ids (nothing after them is trained on).
Single-turn environments run the same loop with one turn and no episode.

A generator without ``generate_ids`` (a remote OpenAI-compatible server) gets the conversation
as messages each turn instead; its trajectories have messages and rewards but no token fields —
good for evaluation, not for training.

Trajectories come back task-major: the ``n`` episodes of task 0, then task 1, ...
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from posttrain.envs.base import Environment, Episode, Message, Task
from posttrain.models.chat_template import render, render_segments
from posttrain.engines.base import Completion, Generator, SamplingParams
from posttrain.engines.hf import row_seed


@dataclass
class Trajectory:
    task: Task
    sample: int  # which of the task's n episodes
    messages: list[Message] = field(default_factory=list)  # after the prompt: what env.verify grades
    token_ids: list[int] = field(default_factory=list)  # prompt + all turns, as sampled / rendered
    loss_mask: list[int] = field(default_factory=list)  # 1 on model-sampled tokens only
    logprobs: list[float] = field(default_factory=list)  # sampler log-probs where mask is 1, else 0.0
    prompt_len: int = 0
    turns: int = 0
    finish_reason: str = ""  # done | max_turns | length | context
    stats: dict[str, int] = field(default_factory=dict)  # the episode's counters (tool errors, ...)
    info: dict[str, Any] = field(default_factory=dict)  # the last StepResult.info

    @property
    def response_tokens(self) -> int:
        """Tokens the model wrote (the trained ones)."""
        return sum(self.loss_mask)


def observation_ids(tokenizer: Any, observations: Sequence[Message], reasoning: bool = True) -> list[int]:
    """Ids that follow a sampled ``...<|im_end|>``: the newline closing the assistant turn, the
    observation turns, and the next generation prompt — tokenized segment by segment exactly as
    ``render`` does, so they equal the ids ``render`` gives for the same conversation."""
    segments = render_segments(observations, add_generation_prompt=True, reasoning=reasoning)[1:]  # no system
    ids = tokenizer.encode("\n", add_special_tokens=False)
    for text, _ in segments:
        ids.extend(tokenizer.encode(text, add_special_tokens=False))
    return ids


class _Running:
    """One episode in flight."""

    def __init__(self, traj: Trajectory, episode: Episode | None, seed: int) -> None:
        self.traj = traj
        self.episode = episode
        self.seed = seed

    def finish(self, reason: str) -> None:
        self.traj.finish_reason = reason
        if self.episode is not None:
            self.traj.stats = dict(self.episode.stats)
            self.episode.close()


def _sample_turns(generator: Generator, running: list[_Running], params: SamplingParams) -> list[Completion]:
    if hasattr(generator, "generate_ids"):
        seeds = [row_seed(r.seed, r.traj.turns) for r in running]
        out = generator.generate_ids([r.traj.token_ids for r in running], params, seeds=seeds)
    else:
        prompts = [r.traj.task.messages + r.traj.messages for r in running]
        out = generator.generate(prompts, params, [r.traj.task.tools for r in running])
    return [comps[0] for comps in out]


def run_episodes(
    generator: Generator,
    env: Environment,
    tasks: Sequence[Task],
    params: SamplingParams,
    max_turns: int = 50,
    max_context_tokens: int | None = None,
    progress: Any = None,
) -> list[Trajectory]:
    """Play ``params.n`` episodes of every task (see the module docstring). ``progress`` (a tqdm
    bar, optional) is advanced by one per finished episode."""
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    tokenizer = getattr(generator, "tokenizer", None)
    token_level = tokenizer is not None and hasattr(generator, "generate_ids")
    if max_context_tokens is None and token_level:
        max_context_tokens = getattr(generator.model.config, "max_position_embeddings", None)
    base = params.seed if params.seed is not None else secrets.randbits(62)
    turn_params = replace(params, n=1)

    running: list[_Running] = []
    for task in tasks:
        for j in range(params.n):
            traj = Trajectory(task=task, sample=j)
            if token_level:
                traj.token_ids = render(tokenizer, task.messages, task.tools, add_generation_prompt=True,
                                        reasoning=params.reasoning).input_ids
                traj.loss_mask = [0] * len(traj.token_ids)
                traj.logprobs = [0.0] * len(traj.token_ids)
                traj.prompt_len = len(traj.token_ids)
            episode = env.start_episode(task) if env.multi_turn else None
            # seeded by task id, not position: a task's episodes do not depend on its batch-mates
            running.append(_Running(traj, episode, row_seed(base, task.id, j)))
    trajectories = [r.traj for r in running]

    try:
        while running:
            completions = _sample_turns(generator, running, turn_params)
            still: list[_Running] = []
            for r, c in zip(running, completions):
                reason = _advance(r, c, token_level, params, tokenizer, max_turns, max_context_tokens)
                if reason is None:
                    still.append(r)
                else:
                    r.finish(reason)
                    if progress is not None:
                        progress.update(1)
            running = still
    finally:  # an error mid-rollout must not leak the open episodes' databases
        for r in running:
            if r.episode is not None:
                r.episode.close()
    return trajectories


def _advance(
    r: _Running, c: Completion, token_level: bool, params: SamplingParams, tokenizer: Any,
    max_turns: int, max_context_tokens: int | None,
) -> str | None:
    """Record one sampled turn and step the environment; the finish reason, or None to go on."""
    traj = r.traj
    traj.turns += 1
    message: Message = {"role": "assistant", "content": c.text}
    traj.messages.append(message)
    if token_level:
        traj.token_ids.extend(c.token_ids)
        traj.loss_mask.extend([1] * len(c.token_ids))
        traj.logprobs.extend(c.logprobs)
    if c.finish_reason == "length":
        return "length"
    if r.episode is None:
        return "done"
    step = r.episode.step(message)
    traj.messages.extend(step.observations)
    traj.info = dict(step.info)
    if step.done:
        return "done"
    if traj.turns >= max_turns:
        return "max_turns"
    if token_level:
        obs = observation_ids(tokenizer, step.observations, params.reasoning)
        if max_context_tokens is not None and len(traj.token_ids) + len(obs) + params.max_new_tokens > max_context_tokens:
            return "context"
        traj.token_ids.extend(obs)
        traj.loss_mask.extend([0] * len(obs))
        traj.logprobs.extend([0.0] * len(obs))
    return None
