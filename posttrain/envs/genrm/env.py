"""The ``genrm`` environment: training a generative reward model with GRPO is RL on this.

A task is one preference pair with ground truth (``envs/genrm/pairs.py``), rendered as the GenRM
prompt (``envs/genrm/format.py``); the policy is the judge being trained. ``verify`` parses the
judgement and returns the reward of ``algos/genrm.py`` mapped onto [0, 1] (the environment
contract): ``reward = 1 + R / 23`` with R = −10·[format error] − |ΔH1| − |ΔH2| − |ΔR| (a format error
is R = −23, reward 0; a perfect judgement is R = 0, reward 1). The raw R, the two score errors, the
ranking error and whether the predicted ranking has the right side (``rank_sign_ok``) are the
verify result's components; the reason is ``ok`` or ``format:<failure reason>``.

Every pair appears twice in its split, as given and with the responses swapped (ground truth
(h2, h1, 7 − r)): against position bias. Train, dev and test are disjoint by pair: the split is a
hash of the pair id (``val_frac`` of the pairs held out, half dev and half test), or the pairs of
``val_pairs`` (cut in dev and test by hash) when that file is given.

Constructor arguments (``envs: [{name: genrm, args: {...}}]``): ``pairs`` (JSONL path, the format
of ``pairs.read_pairs``), ``val_pairs`` (optional JSONL), ``math_pairs`` (how many rule-built math
pairs to add, default 0; with no ``pairs`` file at all, 64), ``val_frac`` (0.2), ``c1`` (10) and
``c2`` (1), the reward's weights (the [0, 1] map divides by ``c1 + 8 + 5·c2``); ``visible_pairs``
(pairs per kind from train tasks, default 0) with ``visible_val_pairs`` (per kind from dev and from
test tasks, default 24) and ``visible_kinds`` (default all): the pairs of ``visible_pairs.py``, whose
better side shows on the page. Their split is their task's split, not a hash of the pair.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Literal

from posttrain.algos.genrm import C1, C2, Judgement, genrm_reward, genrm_reward_unit, rank_from_scores, swap_truth
from posttrain.envs.splits import check_split, held_out_split
from posttrain.envs.base import ENVIRONMENTS, Environment, Message, Split, Task, VerifyResult
from posttrain.envs.genrm.format import (ParseFailure, build_genrm_prompt, format_judgement, parse_judgement,
                                         response_text, split_prompt)
from posttrain.envs.genrm.pairs import PreferencePair, math_rule_pairs, read_pairs
from posttrain.envs.genrm.visible_pairs import KINDS, cue_reasoning, visible_pairs


def pair_task(pair: PreferencePair, swapped: bool) -> Task:
    """The GenRM task of a pair, in one order."""
    history, turn = split_prompt(pair.messages)
    r1, r2 = (pair.response_2, pair.response_1) if swapped else (pair.response_1, pair.response_2)
    truth = swap_truth(pair.truth) if swapped else pair.truth
    return Task(id=f"{pair.id}/{'swapped' if swapped else 'given'}", domain="genrm",
                messages=build_genrm_prompt(history, turn, r1, r2),
                ground_truth={"h1": truth.h1, "h2": truth.h2, "rank": truth.rank},
                metadata={"pair_id": pair.id, "swapped": swapped, "source": pair.source})


def _final_text(messages: list[Message]) -> str:
    for m in reversed(messages):
        if m.get("role") == "assistant":
            c = m.get("content")
            return c if isinstance(c, str) else ""
    return ""


def score_judgement(raw: str, truth: Judgement, c1: float = C1, c2: float = C2) -> VerifyResult:
    """The verify result of one judge reply against the ground truth (module docstring)."""
    pred = parse_judgement(raw)
    if isinstance(pred, ParseFailure):
        return VerifyResult(0.0, {"R": genrm_reward(None, truth, c1, c2), "format_error": 1.0}, f"format:{pred.reason}")
    side_ok = (pred.rank < 3.5) == (truth.rank < 3.5)
    comps = {"R": genrm_reward(pred, truth, c1, c2), "format_error": 0.0, "h1_err": abs(pred.h1 - truth.h1),
             "h2_err": abs(pred.h2 - truth.h2), "rank_err": abs(pred.rank - truth.rank), "rank_sign_ok": float(side_ok)}
    return VerifyResult(genrm_reward_unit(pred, truth, c1, c2), comps, "ok")


class GenRMEnv(Environment):
    name = "genrm"
    domain = "genrm"

    def __init__(self, pairs: str | None = None, val_pairs: str | None = None, math_pairs: int | None = None,
                 val_frac: float = 0.2, c1: float = C1, c2: float = C2, visible_pairs: int = 0,
                 visible_val_pairs: int = 24, visible_kinds: list[str] | None = None) -> None:
        kinds = list(KINDS if visible_kinds is None else visible_kinds)
        if unknown := [k for k in kinds if k not in KINDS]:
            raise ValueError(f"genrm: unknown visible_kinds {unknown}; known: {', '.join(KINDS)}")
        if visible_pairs < 0 or visible_val_pairs < 0:
            raise ValueError(f"genrm: visible_pairs and visible_val_pairs must be >= 0, got {visible_pairs}, {visible_val_pairs}")
        self.visible = (visible_pairs, visible_val_pairs, kinds)
        self.pairs_path, self.val_path, self.val_frac = pairs, val_pairs, val_frac
        self.c1, self.c2 = c1, c2
        self.math_pairs = (0 if pairs or visible_pairs else 64) if math_pairs is None else math_pairs
        self._cache: dict[str, list[PreferencePair]] = {}

    def _split_of(self, pair_id: str) -> str:
        """train for 1 − ``val_frac`` of the pairs by hash; the rest dev and test, half each."""
        bucket = int.from_bytes(hashlib.sha256(pair_id.encode()).digest()[:8], "big") / 2**64
        return "train" if bucket >= self.val_frac else held_out_split(pair_id)

    def pairs(self, split: Split) -> list[PreferencePair]:
        check_split(split)
        if split not in self._cache:
            given = read_pairs(self.pairs_path) if self.pairs_path else []
            if self.val_path:
                mine = given if split == "train" else [p for p in read_pairs(self.val_path)
                                                       if held_out_split(p.id) == split]
            else:
                mine = [p for p in given if self._split_of(p.id) == split]
            if self.math_pairs:
                n = self.math_pairs if split == "train" else max(1, int(self.math_pairs * self.val_frac))
                mine = mine + math_rule_pairs(n, split)
            n_train, n_val, kinds = self.visible
            if n_train:
                mine = mine + visible_pairs(split, n_train if split == "train" else n_val, kinds)
            self._cache[split] = mine
        return self._cache[split]

    def tasks(self, split: Split = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        """Each pair as given, then swapped, pair after pair (``n`` counts tasks, not pairs)."""
        out = [pair_task(p, s) for p in self.pairs(split) for s in (False, True)]
        if not out:
            raise ValueError(f"genrm: no {split} pairs (set args.pairs, args.val_pairs or args.math_pairs)")
        return out if n is None else out[:n]

    def verify(self, task: Task, messages: list[Message]) -> VerifyResult:
        gt = task.ground_truth
        return score_judgement(_final_text(messages), Judgement(gt["h1"], gt["h2"], gt["rank"]), self.c1, self.c2)


def warmstart_conversations(env: GenRMEnv, verdicts: Literal["random", "truth"] = "random", n: int | None = None,
                            seed: int = 0, reasoning: Literal["restate", "cue"] = "restate") -> list[dict[str, Any]]:
    """SFT rows that teach the judge the *format* before GRPO (``posttrain genrm --warmstart``).

    Why: a small model never writes the three verdict lines unprompted (the embedded 135M model:
    32 of 32 held-out judgements were format errors), so every GRPO group scores −23 throughout
    and has no advantage to learn from. Each row is a train task's prompt plus a reply in the
    strict format: a one-line reasoning that restates the two final answers, then the verdict.
    ``verdicts="random"`` draws the verdict uniformly (h1, h2 in 1–5, a ranking on the side the
    scores imply, 3 or 4 on ties), so the rows carry no preference and no position information:
    what the judge then gets right is GRPO's doing. ``"truth"`` writes the ground truth instead
    (plain supervised GenRM training, for comparison). Train split only: held-out pairs never
    appear.

    ``reasoning``: ``"restate"`` (above) or ``"cue"``, with ``"truth"`` only: the visible pair's
    defect and the response that has it (``visible_pairs.cue_reasoning``: "One reply stops
    mid-sentence: response 2. Response 1 does what was asked."), so the judge learns to say what is
    wrong before its verdict; a pair with no visible kind keeps the restatement. Measured on the
    visible pairs: a *worse* judge than ``restate``, 63.3% against 73.0% ranking side right at equal
    steps (docs/results/genrm.md); the restatement stays the default."""
    if reasoning not in ("restate", "cue"):
        raise ValueError(f"genrm warm start: reasoning must be 'restate' or 'cue', got {reasoning!r}")
    if reasoning == "cue" and verdicts != "truth":
        raise ValueError("genrm warm start: reasoning='cue' names the worse response, so it needs verdicts='truth' "
                         "(random verdicts would contradict it)")
    rng = random.Random(seed)
    rows = []
    tasks = [(pair_task(p, swapped), p, swapped) for p in env.pairs("train") for swapped in (False, True)]
    for task, pair, swapped in tasks[:n]:
        r1, r2 = (pair.response_2, pair.response_1) if swapped else (pair.response_1, pair.response_2)
        short = [response_text(r)[:80].replace("\n", " ") for r in (r1, r2)]
        why = f"Response 1 says: {short[0]} Response 2 says: {short[1]}"
        if reasoning == "cue":
            why = cue_reasoning(pair, swapped) or why
        if verdicts == "truth":
            gt = task.ground_truth
            j = Judgement(gt["h1"], gt["h2"], gt["rank"])
        else:
            h1, h2 = rng.randint(1, 5), rng.randint(1, 5)  # the ground-truth rule's ranking; a tie: 3 or 4
            j = Judgement(h1, h2, rank_from_scores(h1, h2) or rng.choice((3, 4)))
        rows.append({"messages": [*task.messages, {"role": "assistant", "content": format_judgement(j, why)}],
                     "id": task.id})
    return rows


if GenRMEnv.name not in ENVIRONMENTS:
    ENVIRONMENTS.register(GenRMEnv.name)(GenRMEnv)
