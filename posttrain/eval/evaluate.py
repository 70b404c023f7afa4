"""Evaluate a generator on one environment: rewards per task and the usual aggregates.

``evaluate(generator, env, split, n_tasks, k, temperature, max_new_tokens, seed)``:

1. draws ``n_tasks`` tasks of the split (``env.tasks(split, n_tasks, seed)``; the same seed also
   seeds sampling, so a run is reproducible);
2. samples ``k`` rollouts per task through ``run_episodes`` — one turn for single-turn
   environments, the full tool / user loop for multi-turn ones;
3. grades every rollout with ``env.verify(task, messages)``.

Aggregates (docs/recipe.md §7), all means over tasks:

* ``mean_reward`` = avg@k, the mean reward of the k samples. With k = 1 and temperature 0 this is
  the greedy accuracy.
* ``pass_at_1``: the fraction of samples that are fully correct (reward >= ``success_threshold``);
  it differs from ``mean_reward`` only where rewards give partial credit.
* ``pass_at_k``: the unbiased estimator from the k samples (``passk.pass_at_k``).
* ``mean_response_tokens``: tokens the model wrote per rollout (all turns);
  ``finish_reasons`` and ``reasons`` count how rollouts ended and the verifiers' reason labels
  (the text before the first ':' or ';' of ``VerifyResult.reason``, so variable details such as an
  error message do not split the counts); ``components`` are the verifiers' named components,
  averaged over the samples that report them.

Tasks are rolled out in chunks of about one generator batch so the progress bar moves; within a
chunk all episodes advance together (one batched generate call per turn).
"""

from __future__ import annotations

import inspect
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from posttrain.engines.base import Generator, SamplingParams
from posttrain.envs.base import Environment, Split, final_answer_text
from posttrain.episodes.multiturn import run_episodes
from posttrain.eval.passk import avg_at_k, n_correct, pass_at_k
from posttrain.errors import UserError
from posttrain.eval.robust import reword
from posttrain.models.chat_template import response_parts


@dataclass
class SampleResult:
    reward: float
    reason: str
    components: dict[str, float]
    response_tokens: int
    finish_reason: str
    turns: int
    reasoning_tokens: int | None = None
    """Tokens of the reply's reasoning (``<think>`` blocks) and of its answer (the rest), over all
    assistant turns, in the generator's tokenizer; None when the generator has no tokenizer."""
    answer_tokens: int | None = None
    answer: str | None = None
    """The graded answer text (the last assistant turn without its reasoning), so a second grader can
    read the same reply later (the pipeline's test table: the IFEval checkers beside our verifier)."""


@dataclass
class TaskResult:
    task_id: str
    samples: list[SampleResult]

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]


@dataclass
class EvalResult:
    env: str
    split: str
    n_tasks: int
    k: int
    temperature: float
    max_new_tokens: int
    seed: int
    mean_reward: float  # avg@k; the greedy accuracy when k = 1 and temperature = 0
    pass_at_1: float
    pass_at_k: float
    mean_response_tokens: float
    seconds: float
    finish_reasons: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)
    components: dict[str, float] = field(default_factory=dict)
    tasks: list[TaskResult] = field(default_factory=list)
    wording: int = 0  # prompt wording (eval/robust.py: WORDINGS); 0 = the task's own prompt
    task_seed: int | None = None  # the seed that drew the tasks, when it differs from ``seed``

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def reason_label(reason: str, max_len: int = 60) -> str:
    """The stable head of a verifier's reason string (see the module docstring)."""
    head = reason.split(":", 1)[0].split(";", 1)[0].strip()
    return (head or "(none)")[:max_len]


def summarize(
    env_name: str, split: str, params: SamplingParams, seed: int, tasks: list[TaskResult],
    seconds: float, success_threshold: float = 1.0,
) -> EvalResult:
    """Aggregates over graded tasks (pure: no model, no environment)."""
    if not tasks:
        raise ValueError(f"{env_name}: no tasks to summarize")
    k = len(tasks[0].samples)
    samples = [s for t in tasks for s in t.samples]
    comp_sum: Counter[str] = Counter()
    comp_n: Counter[str] = Counter()
    for s in samples:
        for name, value in s.components.items():
            comp_sum[name] += value
            comp_n[name] += 1
    return EvalResult(
        env=env_name, split=split, n_tasks=len(tasks), k=k, temperature=params.temperature,
        max_new_tokens=params.max_new_tokens, seed=seed,
        mean_reward=sum(avg_at_k(t.rewards) for t in tasks) / len(tasks),
        pass_at_1=sum(pass_at_k(k, n_correct(t.rewards, success_threshold), 1) for t in tasks) / len(tasks),
        pass_at_k=sum(pass_at_k(k, n_correct(t.rewards, success_threshold), k) for t in tasks) / len(tasks),
        mean_response_tokens=sum(s.response_tokens for s in samples) / len(samples),
        seconds=seconds,
        finish_reasons=dict(Counter(s.finish_reason for s in samples).most_common()),
        reasons=dict(Counter(reason_label(s.reason) for s in samples).most_common()),
        components={name: comp_sum[name] / comp_n[name] for name in sorted(comp_sum)},
        tasks=tasks,
    )


def part_tokens(messages: Any, tokenizer: Any) -> tuple[int | None, int | None]:
    """(reasoning tokens, answer tokens) of a rollout's assistant turns; (None, None) without a tokenizer."""
    if tokenizer is None:
        return None, None
    think, answer, _ = response_parts(messages)
    count = lambda text: len(tokenizer.encode(text, add_special_tokens=False)) if text else 0  # noqa: E731
    return count(think), count(answer)


def evaluate(
    generator: Generator,
    env: Environment,
    split: Split = "test",
    n_tasks: int = 50,
    k: int = 1,
    temperature: float = 0.0,
    max_new_tokens: int = 256,
    seed: int = 0,
    top_p: float = 1.0,
    reasoning: bool = True,
    max_turns: int = 50,
    success_threshold: float = 1.0,
    progress: Any = None,
    wording: int = 0,
    task_seed: int | None = None,
) -> EvalResult:
    """Roll out and grade ``k`` samples on each of ``n_tasks`` tasks (see the module docstring).
    ``progress`` (a tqdm bar, optional) advances by one per finished rollout. ``wording`` frames the
    prompts differently (``robust.reword``); ``task_seed`` draws the tasks with another seed than
    the sampling one (the same tasks under several sampling seeds)."""
    if k < 1 or n_tasks < 1:
        raise ValueError(f"need k >= 1 and n_tasks >= 1, got k={k}, n_tasks={n_tasks}")
    start = time.perf_counter()
    tasks = [reword(t, wording) for t in env.tasks(split, n_tasks, seed if task_seed is None else task_seed)]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, n=k,
                            seed=seed, reasoning=reasoning)
    chunk = max(1, getattr(generator, "batch_size", 16) // k)
    tokenizer = getattr(generator, "tokenizer", None)
    results: list[TaskResult] = []
    for lo in range(0, len(tasks), chunk):
        trajectories = run_episodes(generator, env, tasks[lo:lo + chunk], params, max_turns, progress=progress)
        for i in range(0, len(trajectories), k):
            group = trajectories[i:i + k]
            samples = []
            for traj in group:
                verdict = env.verify(traj.task, traj.messages)
                think, answer = part_tokens(traj.messages, tokenizer)
                samples.append(SampleResult(
                    reward=verdict.reward, reason=verdict.reason, components=dict(verdict.components),
                    response_tokens=traj.response_tokens, finish_reason=traj.finish_reason, turns=traj.turns,
                    reasoning_tokens=think, answer_tokens=answer, answer=final_answer_text(traj.messages),
                ))
            results.append(TaskResult(group[0].task.id, samples))
    res = summarize(env.name, split, params, seed, results, time.perf_counter() - start, success_threshold)
    res.wording, res.task_seed = wording, task_seed
    return res


# --------------------------------------------------------------------------- what an evaluation runs on


def env_names(requested: list[str]) -> list[str]:
    import posttrain.envs  # noqa: F401  (registers the built-in environments)
    from posttrain.envs.base import ENVIRONMENTS

    names = ENVIRONMENTS.names() if "all" in requested else list(dict.fromkeys(requested))
    unknown = [n for n in names if n not in ENVIRONMENTS]
    if unknown:
        raise UserError(f"unknown environment(s) {', '.join(unknown)}; known: {', '.join(ENVIRONMENTS.names())}")
    return names


def build_env(name: str, judge: Any) -> Any:
    """The environment, given the judge if its constructor takes one."""
    from posttrain.envs.base import ENVIRONMENTS

    cls = ENVIRONMENTS.get(name)
    takes_judge = "judge" in inspect.signature(cls.__init__).parameters
    return cls(judge=judge) if takes_judge and judge is not None else cls()


def make_eval_judge(spec: str, policy: Any) -> Any:
    if spec == "none":
        return None
    if spec == "policy":
        from posttrain.envs.judge import LLMJudge

        return LLMJudge(policy)
    from posttrain.envs.judge import make_judge

    return make_judge(spec)
