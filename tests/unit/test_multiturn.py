"""The multi-turn rollout loop: token/mask/log-prob invariants on the tiny Llama, with a scripted
stand-in environment (``TickEnv``), and the episode plumbing with a scripted message-level generator.

``TickEnv`` episodes: turn 1 gets a tool observation, turn 2 a user reply, turn 3 ends the
episode (``done``) with one final user message. The tiny random model rarely writes
``<|im_end|>``, so its logit gets a constant bonus through a hook on the LM head (as in
test_rollout_hf.py); the teacher-forced reference runs through the same hook.
"""

from __future__ import annotations

import pytest
import torch

from posttrain.envs.base import Environment, Episode, StepResult, Task, VerifyResult
from posttrain.models.chat_template import IM_END, render
from posttrain.models.loading import load_model
from posttrain.engines.base import Completion, SamplingParams
from posttrain.engines.hf import HFGenerator
from posttrain.episodes.multiturn import observation_ids, run_episodes

TOOLS = [{"type": "function", "function": {"name": "clock", "description": "tell the time",
                                           "parameters": {"type": "object", "properties": {}}}}]


class TickEpisode(Episode):
    closed = 0

    def __init__(self, task: Task) -> None:
        super().__init__(task)
        self.seen: list[str] = []

    def step(self, assistant_message):
        self.seen.append(assistant_message["content"])
        self.count("turns")
        turn = len(self.seen)
        if turn == 1:
            return StepResult([{"role": "tool", "name": "clock", "content": f"tick {self.task.id}"}], False)
        if turn == 2:
            return StepResult([{"role": "user", "content": "and again?"}], False)
        return StepResult([{"role": "user", "content": "bye"}], True, {"reason": "script_end"})

    def close(self) -> None:
        TickEpisode.closed += 1


class TickEnv(Environment):
    name = "tick"
    multi_turn = True

    def tasks(self, split="train", n=None, seed=0):
        return [Task(id=f"tick/{i}", domain="test", messages=[{"role": "user", "content": f"Task {i}: what time is it?"}],
                     tools=TOOLS) for i in range(n or 2)]

    def verify(self, task, messages):
        turns = sum(m["role"] == "assistant" for m in messages)
        return VerifyResult(min(1.0, turns / 3), {"turns": float(turns)}, "counted")

    def start_episode(self, task):
        return TickEpisode(task)


class SingleEnv(TickEnv):
    name = "single"
    multi_turn = False


# --------------------------------------------------------------------------- pure helpers


def test_observation_ids_continue_a_sampled_turn_like_render(tiny):
    tok = tiny.tokenizer
    prompt = [{"role": "user", "content": "What time is it?"}]
    turn = [{"role": "assistant", "content": "Let me check."}]
    obs = [{"role": "tool", "name": "clock", "content": "12:00"}, {"role": "user", "content": "thanks"}]
    head = render(tok, prompt + turn, TOOLS).input_ids  # ends with <|im_end|> and the "\n" segment
    newline = tok.encode("\n", add_special_tokens=False)
    full = render(tok, prompt + turn + obs, TOOLS, add_generation_prompt=True).input_ids
    assert full == head[: len(head) - len(newline)] + observation_ids(tok, obs)
    # reasoning off: the next generation prompt opens with the empty think block
    off = render(tok, prompt + turn + obs, TOOLS, add_generation_prompt=True, reasoning=False).input_ids
    assert off[-len(observation_ids(tok, obs, reasoning=False)):] == observation_ids(tok, obs, reasoning=False)


# --------------------------------------------------------------------------- on the tiny model


pytestmark = pytest.mark.usefixtures("one_thread")  # shared fixture in tests/conftest.py


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def stopping(tiny):
    vec = torch.zeros(len(tiny.tokenizer))
    vec[tiny.tokenizer.convert_tokens_to_ids(IM_END)] = 5.0
    handle = tiny.model.lm_head.register_forward_hook(lambda mod, inp, out: out + vec)
    yield HFGenerator(tiny.model, tiny.tokenizer, batch_size=8)
    handle.remove()


PARAMS = SamplingParams(max_new_tokens=8, temperature=1.0, n=3, seed=7)


@pytest.fixture(scope="module")
def rollouts(stopping):
    env = TickEnv()
    TickEpisode.closed = 0
    trajs = run_episodes(stopping, env, env.tasks(n=2), PARAMS, max_turns=10)
    closed = TickEpisode.closed
    alone = run_episodes(stopping, env, env.tasks(n=1), PARAMS, max_turns=10)
    return trajs, alone, closed


def spans(mask: list[int], value: int, start: int) -> list[tuple[int, int]]:
    """Maximal [lo, hi) runs of ``value`` in mask[start:]."""
    out, lo = [], None
    for i in range(start, len(mask) + 1):
        inside = i < len(mask) and mask[i] == value
        if inside and lo is None:
            lo = i
        elif not inside and lo is not None:
            out.append((lo, i))
            lo = None
    return out


def test_episodes_end_for_the_right_reasons(rollouts):
    trajs, _, closed = rollouts
    assert [(t.task.id, t.sample) for t in trajs] == [("tick/0", 0), ("tick/0", 1), ("tick/0", 2),
                                                      ("tick/1", 0), ("tick/1", 1), ("tick/1", 2)]
    assert closed == len(trajs)  # every episode's resources are released
    assert any(t.finish_reason == "done" for t in trajs)
    for t in trajs:
        assert t.finish_reason in ("done", "length")
        if t.finish_reason == "done":
            assert t.turns == 3 and t.info == {"reason": "script_end"} and t.stats == {"turns": 3}
            assert t.messages[-1] == {"role": "user", "content": "bye"}  # kept in messages ...
        roles = [m["role"] for m in t.messages]
        assert roles == ["assistant", "tool", "assistant", "user", "assistant", "user"][: len(roles)]


def test_trajectory_tokens_are_exactly_what_was_sampled_and_rendered(tiny, rollouts):
    tok = tiny.tokenizer
    stop_id = tok.convert_tokens_to_ids(IM_END)
    for t in rollouts[0]:
        assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs)
        prompt = render(tok, t.task.messages, t.task.tools, add_generation_prompt=True).input_ids
        assert t.token_ids[: t.prompt_len] == prompt and not any(t.loss_mask[: t.prompt_len])
        model_spans = spans(t.loss_mask, 1, t.prompt_len)
        assert len(model_spans) == t.turns and t.response_tokens == sum(hi - lo for lo, hi in model_spans)
        assistant = [m for m in t.messages if m["role"] == "assistant"]
        for (lo, hi), msg in zip(model_spans, assistant):
            ids = t.token_ids[lo:hi]
            body = ids[:-1] if ids[-1] == stop_id else ids
            assert tok.decode(body, skip_special_tokens=True) == msg["content"]
        # the gaps between model turns are the rendered observations of that step, nothing else
        gaps = spans(t.loss_mask, 0, model_spans[0][0])
        observations = [[m for m in t.messages[1:] if m["role"] != "assistant"][i:i + 1] for i in range(len(gaps))]
        for (lo, hi), obs in zip(gaps, observations):
            assert t.token_ids[lo:hi] == observation_ids(tok, obs)
        # ... but the final observations after `done` are not appended to the ids
        assert t.loss_mask[-1] == 1


def test_logprobs_are_the_models_on_the_exact_context(tiny, stopping, rollouts):
    """Teacher forcing on the stored ids reproduces the sampler's log-probs: the context each turn
    was sampled from is exactly the stored prefix (no decode/re-encode drift)."""
    for t in rollouts[0]:
        with torch.inference_mode():
            logits = tiny.model(torch.tensor([t.token_ids])).logits[0, :-1].float()
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(t.token_ids[1:])[:, None])[:, 0]
        trained = [i for i, m in enumerate(t.loss_mask) if m]
        assert [t.logprobs[i] for i in trained] == pytest.approx([ref[i - 1].item() for i in trained], abs=1e-4)
        assert all(t.logprobs[i] == 0.0 for i, m in enumerate(t.loss_mask) if not m)


def test_a_tasks_episodes_do_not_depend_on_batch_mates(rollouts):
    trajs, alone, _ = rollouts
    assert [t.token_ids for t in alone] == [t.token_ids for t in trajs[:3]]


def test_turn_and_context_limits(stopping):
    env = TickEnv()
    capped = run_episodes(stopping, env, env.tasks(n=1), SamplingParams(max_new_tokens=8, temperature=1.0, seed=7),
                          max_turns=1)
    assert capped[0].finish_reason in ("max_turns", "length") and capped[0].turns == 1
    prompt_len = capped[0].prompt_len
    full = run_episodes(stopping, env, env.tasks(n=1), SamplingParams(max_new_tokens=8, temperature=1.0, seed=7),
                        max_context_tokens=prompt_len + 10)
    assert full[0].finish_reason in ("context", "length") and full[0].turns == 1


def test_single_turn_env_is_one_turn_without_an_episode(stopping):
    env = SingleEnv()
    trajs = run_episodes(stopping, env, env.tasks(n=2), SamplingParams(max_new_tokens=8, temperature=1.0, n=2, seed=1))
    assert len(trajs) == 4
    for t in trajs:
        assert t.turns == 1 and t.finish_reason in ("done", "length") and [m["role"] for m in t.messages] == ["assistant"]


# --------------------------------------------------------------------------- message-level generator


class ScriptedGenerator:
    """A Generator without ``generate_ids`` (like a remote server): returns numbered replies."""

    def __init__(self) -> None:
        self.prompts: list = []

    def generate(self, prompts, params, tools=None):
        self.prompts.extend(prompts)
        return [[Completion(text=f"reply {len(p)}") for _ in range(params.n)] for p in prompts]


def test_message_level_generator_gets_the_conversation_so_far():
    gen, env = ScriptedGenerator(), TickEnv()
    (t,) = run_episodes(gen, env, env.tasks(n=1), SamplingParams(n=1))
    assert t.finish_reason == "done" and t.turns == 3 and t.token_ids == []
    assert [len(p) for p in gen.prompts] == [1, 3, 5]  # prompt, + reply and tool, + reply and user
    assert [m["content"] for m in t.messages if m["role"] == "assistant"] == ["reply 1", "reply 3", "reply 5"]
    assert env.verify(t.task, t.messages).reward == 1.0


class HostileGenerator:
    """A message-level generator whose every turn is one hostile tool call (issue 12, item 7)."""

    def generate(self, prompts, params, tools=None):
        deep = "[" * 3000 + "]" * 3000
        text = f"<tool_call>\n<function=email_get>\n<parameter=email_id>\n{deep}\n</parameter>\n</function>\n</tool_call>"
        return [[Completion(text=text) for _ in range(params.n)] for _ in prompts]


def test_item7_episode_loop_and_verify_survive_a_deeply_nested_tool_argument():
    from posttrain.envs.workplace.env import WorkplaceEnv

    env = WorkplaceEnv(max_turns=2)
    (t,) = run_episodes(HostileGenerator(), env, env.tasks("dev", n=1), SamplingParams(n=1), max_turns=2)
    assert t.finish_reason in ("done", "max_turns") and t.stats["error:argument_too_deep"] == 2
    result = env.verify(t.task, t.messages)
    assert result.reward == 0.0 and "argument_too_deep" in result.reason
