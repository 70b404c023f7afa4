"""Preference pairs with ground truth for training and measuring the GenRM.

A pair (:class:`PreferencePair`) is a prompt (the conversation, ending with the new user turn), two
responses and the ground truth: helpfulness of each (1–5) and the ranking (1–6).

Where pairs come from:

* **User-supplied JSONL** (:func:`read_pairs`), one object per line, either with scores::

      {"messages": [{"role": "user", "content": "..."}], "response_1": "...", "response_2": "...",
       "helpfulness_1": 4, "helpfulness_2": 2, "ranking": 2, "id": "optional"}

  or as a plain preference (the DPO pairs format; ``prompt`` may be a string instead of
  ``messages``)::

      {"prompt": "...", "chosen": "...", "rejected": "..."}

  A plain preference gets helpfulness 4 (chosen) and 2 (rejected) and the ranking of that
  difference (2: "better"), by the rule of :func:`~posttrain.algos.genrm.rank_from_scores`.
  Responses may be strings or assistant messages (with ``tool_calls``). A malformed line is an
  error naming ``file:line``.
* **The verifiable environments** (:func:`mine_pairs`): k sampled responses per task, graded by
  the environment's verifier; helpfulness = 1 + round(4·reward) (wrong → 1, verified correct or
  every constraint met → 5), and the ranking from the difference of the two scores
  (``rank_from_scores``: 5 vs 1 → 1 "far better"). Per task, the first response with the highest
  reward is paired with the first with the lowest; a task whose responses all score the same
  gives no pair.
* **Rule-built math pairs** (:func:`math_rule_pairs`, no model needed): the reference answer in the
  format the task asks for vs the same reply with a wrong number; both are graded by the math
  verifier and kept only when it says correct (1) and wrong (0).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from posttrain.algos.genrm import Judgement, rank_from_scores, score_from_reward
from posttrain.errors import UserError

Message = dict[str, Any]


class PairsError(UserError, ValueError):
    pass


@dataclass
class PreferencePair:
    id: str
    messages: list[Message]  # the prompt: history + the new user turn
    response_1: Any  # str or an assistant message
    response_2: Any
    truth: Judgement
    source: str = "user"
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "messages": self.messages, "response_1": self.response_1,
                "response_2": self.response_2, "helpfulness_1": self.truth.h1, "helpfulness_2": self.truth.h2,
                "ranking": self.truth.rank, "source": self.source}


def pair_id(messages: Any, r1: Any, r2: Any) -> str:
    key = json.dumps([messages, r1, r2], sort_keys=True, ensure_ascii=False)
    return "pair-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def pair_from_dict(d: dict[str, Any], where: str = "") -> PreferencePair:
    """One JSONL object → a pair (see the module docstring); raises :class:`PairsError`."""
    if not isinstance(d, dict):
        raise PairsError(f"{where}: expected a JSON object")
    msgs = d.get("messages")
    if msgs is None and isinstance(d.get("prompt"), str):
        msgs = [{"role": "user", "content": d["prompt"]}]
    if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
        raise PairsError(f"{where}: needs 'messages' (a list of chat messages) or 'prompt' (a string)")
    if "chosen" in d and "rejected" in d:
        r1, r2, h1, h2 = d["chosen"], d["rejected"], 4, 2
        rank = rank_from_scores(h1, h2)
    else:
        try:
            r1, r2 = d["response_1"], d["response_2"]
            h1, h2, rank = int(d["helpfulness_1"]), int(d["helpfulness_2"]), int(d["ranking"])
        except (KeyError, TypeError, ValueError) as e:
            raise PairsError(f"{where}: needs response_1, response_2, helpfulness_1, helpfulness_2, ranking "
                             f"(or chosen/rejected): {e!r}") from None
        if not (1 <= h1 <= 5 and 1 <= h2 <= 5 and 1 <= rank <= 6):
            raise PairsError(f"{where}: helpfulness must be 1..5 and ranking 1..6, got {h1}, {h2}, {rank}")
    for name, r in (("response 1", r1), ("response 2", r2)):
        if not isinstance(r, (str, dict)):
            raise PairsError(f"{where}: {name} must be a string or an assistant message")
    assert rank is not None
    return PreferencePair(str(d.get("id") or pair_id(msgs, r1, r2)), msgs, r1, r2, Judgement(h1, h2, rank),
                          str(d.get("source", "user")))


def read_pairs(path: str | Path) -> list[PreferencePair]:
    p = Path(path)
    if not p.exists():
        raise PairsError(f"pairs file not found: {p}")
    out = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise PairsError(f"{p}:{i}: not JSON: {e}") from None
        out.append(pair_from_dict(d, f"{p}:{i}"))
    return out


def write_pairs(pairs: Sequence[PreferencePair], path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(json.dumps(x.to_json(), ensure_ascii=False) + "\n" for x in pairs))
    return p


def pair_from_graded(task: Any, best: tuple[Message, float], worst: tuple[Message, float], source: str
                     ) -> PreferencePair | None:
    """A pair from two graded responses to one task (the rule in the module docstring)."""
    h1, h2 = score_from_reward(best[1]), score_from_reward(worst[1])
    rank = rank_from_scores(h1, h2)
    if rank is None:
        return None
    msgs = list(task.messages)
    return PreferencePair(pair_id(msgs, best[0], worst[0]), msgs, best[0], worst[0], Judgement(h1, h2, rank), source,
                          {"task_id": task.id})


def mine_pairs(generator: Any, env: Any, tasks: Sequence[Any], k: int = 4, max_new_tokens: int = 256,
               temperature: float = 1.0, seed: int = 0, reasoning: bool = True) -> list[PreferencePair]:
    """Sample k single-turn responses per task, grade them with ``env.verify``, pair the best with the
    worst (see the module docstring). ``reasoning``: the generation prompt's mode, as the policy
    will be prompted."""
    from posttrain.engines.base import SamplingParams
    from posttrain.models.chat_template import parse_assistant

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, n=k, seed=seed,
                            reasoning=reasoning)
    outs = generator.generate([t.messages for t in tasks], params, [t.tools for t in tasks])
    pairs = []
    for task, comps in zip(tasks, outs):
        graded = []
        for c in comps:
            try:
                msg = parse_assistant(c.text, task.tools).to_message()
            except ValueError:
                msg = {"role": "assistant", "content": c.text}
            graded.append((msg, env.verify(task, [msg]).reward))
        best = max(graded, key=lambda g: g[1])
        worst = min(graded, key=lambda g: g[1])
        pair = pair_from_graded(task, best, worst, f"mined/{env.name}")
        if pair is not None:
            pairs.append(pair)
    return pairs


def _wrong_number(answer: str) -> str:
    try:
        return str(int(answer) + 7)
    except ValueError:
        return "0" if answer.strip() not in ("0", "0.0") else "1"


def math_rule_pairs(n: int, split: str = "train", seed: int = 0) -> list[PreferencePair]:
    """Rule-built math pairs, verified (see the module docstring); ``split`` follows the math tasks'
    own split, so validation pairs come from validation questions."""
    from posttrain.envs.base import make_env

    env = make_env("math")
    pairs = []
    for task in env.tasks(split, n, seed):  # type: ignore[arg-type]
        good = {"role": "assistant", "content": f"The answer is \\boxed{{{task.ground_truth}}}."}
        bad = {"role": "assistant", "content": f"The answer is \\boxed{{{_wrong_number(str(task.ground_truth))}}}."}
        rg, rb = env.verify(task, [good]).reward, env.verify(task, [bad]).reward
        pair = pair_from_graded(task, (good, rg), (bad, rb), "rule/math") if rg > rb else None
        if pair is not None:
            pairs.append(pair)
    return pairs
