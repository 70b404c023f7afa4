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
4. ``verdict="expected"`` (a local judge only): each parsed verdict is replaced by its *expected*
   values: one forward pass over the judge's own prompt and reply reads the judge's distribution
   over the values at the token of each of its three numbers (h1, h2 over 1–5, the ranking over
   1–6), and the verdict becomes the mean under that distribution. Why: the supervised 135M judge
   writes ``Helpfulness 1: 5 / Helpfulness 2: 1 / Ranking: 1`` for 20 of 20 parsed comparisons of
   the policy's own replies (docs/results/genrm.md), so a ring of greedy verdicts gives every
   response 5 once and 1 once and every group is flat; the distribution under that greedy digit
   still moves with the replies, and a ring puts each response once in each position, so a
   judge's constant lean towards position 1 cancels in the response's mean. A reply whose numbers
   are not single value tokens keeps its text verdict (counted as ``expected_skipped``).

``stats`` counts, over the judge's lifetime: ``calls`` (prompts judged), ``generated`` (replies
generated, retries included), ``retries``, ``fallbacks``, ``failure/<reason>`` (each failed reply),
``truncated`` (replies that hit ``max_new_tokens``) and ``tokens`` (generated tokens).
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal, Sequence

from posttrain.algos.genrm import H_MAX, H_MIN, NEUTRAL_RANK, R_MAX, R_MIN, Judgement
from posttrain.engines.base import Completion, Generator, Message, SamplingParams
from posttrain.envs.genrm.format import ParseFailure, parse_judgement

NEUTRAL = Judgement(3, 3, NEUTRAL_RANK)
VERDICT_VALUES = (tuple(range(H_MIN, H_MAX + 1)), tuple(range(H_MIN, H_MAX + 1)), tuple(range(R_MIN, R_MAX + 1)))
_VALUE_LINE = re.compile(r"(helpfulness\s*1|helpfulness\s*2|ranking)\s*:\s*(\d)\s*$", re.IGNORECASE)


def expected_value(logits: Sequence[float], values: Sequence[float]) -> float:
    """Mean of ``values`` under the softmax of ``logits`` (one logit per value)."""
    if len(logits) != len(values) or not values:
        raise ValueError(f"{len(logits)} logits for {len(values)} values")
    top = max(logits)
    w = [math.exp(x - top) for x in logits]
    return sum(wi * v for wi, v in zip(w, values)) / sum(w)


def verdict_value_tokens(pieces: Sequence[str]) -> list[int] | None:
    """Indices, into a judge reply's tokens (``pieces``: each token decoded on its own), of the value
    tokens of its last three lines (h1, h2, ranking), or None where a value is not a token of its
    own (a single digit, whitespace allowed before it) or the three lines are not the verdict."""
    text, starts = "", []
    for piece in pieces:
        starts.append(len(text))
        text += piece
    lines, pos = [], 0
    for line in text.split("\n"):
        if line.strip():
            lines.append((pos, line))
        pos += len(line) + 1
    if len(lines) < 3:
        return None
    out = []
    for (pos, line), label in zip(lines[-3:], ("helpfulness1", "helpfulness2", "ranking")):
        m = _VALUE_LINE.search(line.rstrip())
        if not m or re.sub(r"\s+", "", m.group(1).lower()) != label:
            return None
        at = pos + m.start(2)
        k = max(i for i, s0 in enumerate(starts) if s0 <= at)
        if pieces[k].strip() != m.group(2):
            return None
        out.append(k)
    return out


class GenRMJudge:
    def __init__(self, generator: Generator, max_new_tokens: int = 256, retries: int = 2,
                 retry_temperature: float = 0.7, reasoning: bool = False, batched: bool = True, seed: int = 0,
                 temperature: float = 0.0, verdict: Literal["text", "expected"] = "text") -> None:
        if retries < 0 or temperature < 0:
            raise ValueError(f"retries and temperature must be >= 0, got {retries}, {temperature}")
        if verdict not in ("text", "expected"):
            raise ValueError(f"verdict must be 'text' or 'expected', got {verdict!r}")
        if verdict == "expected" and not hasattr(generator, "live"):
            raise ValueError("verdict 'expected' reads the judge's token distribution: it needs a local judge model, "
                             "not an endpoint (use verdict: text)")
        self.temperature, self.verdict = temperature, verdict
        self.generator, self.max_new_tokens, self.retries = generator, max_new_tokens, retries
        self.retry_temperature, self.reasoning, self.batched, self.seed = retry_temperature, reasoning, batched, seed
        self.stats: dict[str, int] = {}

    def _count(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n

    def _generate(self, prompts: Sequence[list[Message]], temperature: float, seed: int) -> list[Completion]:
        params = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=temperature, n=1, seed=seed,
                                reasoning=self.reasoning)
        if self.batched:
            outs = self.generator.generate(list(prompts), params)
        else:
            outs = [self.generator.generate([p], params)[0] for p in prompts]
        done = []
        for comps in outs:
            c = comps[0]
            self._count("generated")
            self._count("tokens", len(c.token_ids))
            if c.finish_reason == "length":
                self._count("truncated")
            done.append(c)
        return done

    def _expected(self, comps: Sequence[Completion]) -> list[Judgement | None]:
        """Each completion's expected verdict (module docstring, 4.), None where its values are not
        value tokens. One forward pass per ``batch_size`` completions, over prompt + reply."""
        import torch

        gen: Any = self.generator
        tok, net = gen.tokenizer, gen.live
        # special tokens (the end-of-turn token a reply stops on) decode to nothing, as in the reply's text
        found = [verdict_value_tokens([tok.decode([t], skip_special_tokens=True) for t in c.token_ids]) for c in comps]
        out: list[Judgement | None] = [None] * len(comps)
        todo = [i for i, f in enumerate(found) if f is not None]
        for b in range(0, len(todo), gen.batch_size):
            rows = todo[b: b + gen.batch_size]
            seqs = [list(comps[i].prompt_ids) + list(comps[i].token_ids) for i in rows]
            width = max(map(len, seqs))
            ids = torch.full((len(seqs), width), gen.pad_id, dtype=torch.long)
            mask = torch.zeros((len(seqs), width), dtype=torch.long)
            for r, s in enumerate(seqs):
                ids[r, : len(s)] = torch.tensor(s)
                mask[r, : len(s)] = 1
            with torch.no_grad():
                logits = net(input_ids=ids, attention_mask=mask).logits.float()
            for r, i in enumerate(rows):
                c, n_prompt, values = comps[i], len(comps[i].prompt_ids), []
                for k, choices in zip(found[i] or [], VERDICT_VALUES):
                    # the value token at reply position k was predicted at position n_prompt + k - 1;
                    # the candidates are that token with its digit replaced (" 5" -> " 1" ... " 5")
                    piece = tok.decode([c.token_ids[k]])
                    cand = [tok.encode(piece.replace(piece.strip(), str(v)), add_special_tokens=False)
                            for v in choices]
                    if any(len(x) != 1 for x in cand):
                        break
                    row = logits[r, n_prompt + k - 1]
                    values.append(expected_value([float(row[x[0]]) for x in cand], choices))
                out[i] = Judgement(*values) if len(values) == 3 else None
        return out

    def both_verdicts(self, prompts: Sequence[list[Message]], seed: int = 0
                      ) -> list[tuple[Judgement | None, Judgement | None]]:
        """(text verdict, expected verdict) of each prompt from one first pass, no retries, None where
        a reply does not parse (or its numbers are not value tokens): a measurement of the two
        verdict modes on the same replies (``bench/genrm_expected.py``)."""
        comps = self._generate(list(prompts), self.temperature, self.seed + seed)
        text = [j if not isinstance(j := parse_judgement(c.text), ParseFailure) else None for c in comps]
        ok = [i for i, j in enumerate(text) if j is not None]
        soft = self._expected([comps[i] for i in ok]) if ok else []
        expected: list[Judgement | None] = [None] * len(comps)
        for i, j in zip(ok, soft):
            expected[i] = j
        return list(zip(text, expected))

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
            comps = self._generate([prompts[i] for i in todo], temperature, seed + attempt)
            failed, parsed_now = [], []
            for i, c in zip(todo, comps):
                parsed = parse_judgement(c.text)
                if isinstance(parsed, ParseFailure):
                    self._count(f"failure/{parsed.reason}")
                    failed.append(i)
                else:
                    verdicts[i] = parsed
                    parsed_now.append((i, c))
            if self.verdict == "expected" and parsed_now:
                soft = self._expected([c for _, c in parsed_now])
                for (i, _), j in zip(parsed_now, soft):
                    if j is None:
                        self._count("expected_skipped")
                    else:
                        verdicts[i] = j
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
