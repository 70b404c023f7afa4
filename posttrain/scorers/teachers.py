"""Teachers for on-policy distillation: config, routing, lazy shared loading, batched scoring.

A teacher is configuration (tinker-cookbook's "teachers paired with datasets"): a name, where its
weights are (``model``: a model spec / HF directory / checkpoint of an earlier run, or ``url``: an
OpenAI-compatible server such as vLLM), and the domains it owns (RL environment names). Every
rollout goes to the teacher owning its ``Rollout.env``, or to the default teacher.

:class:`ScoringTeacherPool` is a *signal* scorer (``scorers/base.py``): the RL loop calls it on the
filtered batch, like any other scorer, and it fills ``batch.teacher_logprobs_BT``:

* **Routing** is a dict lookup, env → teacher name; the config is checked up front so a domain
  without a teacher is a config error, not a KeyError at step 12.
* **Shared, lazy weights.** Teachers whose ``model`` resolves to the same place (two names for one
  checkpoint, a default that is also a domain's teacher) share one loaded copy. Nothing is loaded
  until a rollout is routed to the teacher, so an unused default costs nothing. Local teachers are
  in eval mode, have ``requires_grad=False`` and score under ``torch.inference_mode``.
* **Same tokenizer.** The advantage compares log-probs of the *same token ids*, so a teacher must
  use the student's tokenizer: identical vocab (token → id), the same eos token, and the same way
  of splitting text into those tokens: the same merges, normalizer and pre-tokenizer (compared
  from the fast tokenizers' ``tokenizer.json``), and identical ids for a set of probe texts. Same
  vocab with other merges would pass a vocab check, and then the teacher would score token
  sequences it never saw in training. The teacher's embedding must also cover every id the
  student's tokenizer has: ``vocab_size`` in the teacher's ``config.json`` (and the loaded model's
  embedding) must be at least the student tokenizer's length. Checked for every teacher before
  training starts (:meth:`ScoringTeacherPool.check_tokenizers`: tokenizers and config only, cheap). A url teacher can only be probed: its ``/tokenize`` endpoint (vLLM serves one at the
  server root) must give the student's ids for a probe text; a server without it gets a printed
  warning, and every scoring answer that echoes token ids is compared with what was sent.
* **Scoring** = ``models/logprobs.sampled_logprobs`` (the trainer's own routine) under no grad at
  the temperature the rollouts record they were sampled at (``Rollout.sampling``): the same code path that gives the student's log-probs, so a teacher
  with the student's weights yields an advantage of exactly zero up to the sampler-vs-trainer
  numerical difference (tested). One packed forward per micro-batch of ``micro_batch_tokens``.

What a url teacher is sent (OpenAI legacy completions, as vLLM implements it; one request per
rollout, a few in flight at a time)::

    POST {url}/completions  {"model": M, "prompt": [token ids], "max_tokens": 1, "echo": true,
                             "logprobs": 0, "temperature": 1.0, "return_tokens_as_token_ids": true}

and reads ``choices[0].logprobs.token_logprobs[t]`` = log π_teacher(ids[t] | ids[:t]) at every
sampled position t (entry 0 is null: the first token has no context; the one generated token at
the end is ignored). vLLM reports raw (temperature-1) prompt log-probs, so url teachers need
``rollout.temperature: 1`` (checked when the config loads, and again on the rollouts scored).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Protocol, Sequence

from posttrain.configs.distill import TeachersConfig
from posttrain.errors import UserError


class TokenizerMismatch(UserError, ValueError):
    pass


# --------------------------------------------------------------------------- teacher backends


class Teacher(Protocol):
    """Scores token sequences: per sequence, log π_teacher at its mask-1 positions, in order."""

    def score(self, token_ids: Sequence[Sequence[int]], loss_masks: Sequence[Sequence[int]],
              temperature: float = 1.0) -> list[list[float]]: ...


class LocalTeacher:
    """Weights in this process; scored with the trainer's packed log-prob routine, no grad."""

    def __init__(self, model: Any, micro_batch_tokens: int, pad_id: int, name: str = "teacher") -> None:
        from posttrain.models.facts import is_hybrid

        self.name = name
        self.vocab_size = model.get_input_embeddings().num_embeddings
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.micro_batch_tokens = micro_batch_tokens
        self.pack = not is_hybrid(model)  # a Mamba state would leak across a packed row
        self.pad_id = pad_id

    def score(self, token_ids: Sequence[Sequence[int]], loss_masks: Sequence[Sequence[int]],
              temperature: float = 1.0) -> list[list[float]]:
        import torch

        from posttrain.models.logprobs import micro_batches, prompt_key, sampled_logprobs

        self._check_ids(token_ids)
        out: list[list[float]] = [[] for _ in token_ids]
        with torch.inference_mode():
            prompts = [(k, len(k)) for k in (prompt_key(s, m) for s, m in zip(token_ids, loss_masks))]  # shared once
            for mb in micro_batches([len(s) for s in token_ids], self.micro_batch_tokens, self.pack, prompts):
                lps = sampled_logprobs(self.model, [token_ids[i] for i in mb], [loss_masks[i] for i in mb],
                                       temperature, self.pack, self.pad_id)
                for i, lp in zip(mb, lps):
                    out[i] = lp.float().cpu().tolist()
        return out

    def score_topk(self, token_ids: Sequence[Sequence[int]], loss_masks: Sequence[Sequence[int]],
                   k: int, temperature: float = 1.0) -> list[tuple[list[float], Any, Any]]:
        """Per sequence, from one forward: the sampled tokens' log-probs (as :meth:`score`) and the
        teacher's k likeliest tokens at each of those positions, (log-probs, ids) each (n_sampled, k)."""
        import torch

        from posttrain.models.logprobs import micro_batches, prompt_key, topk_logprobs

        self._check_ids(token_ids)
        out: list[tuple[list[float], Any, Any]] = [None] * len(token_ids)  # type: ignore[list-item]
        with torch.inference_mode():
            prompts = [(k, len(k)) for k in (prompt_key(s, m) for s, m in zip(token_ids, loss_masks))]  # shared once
            for mb in micro_batches([len(s) for s in token_ids], self.micro_batch_tokens, self.pack, prompts):
                res = topk_logprobs(self.model, [token_ids[i] for i in mb], [loss_masks[i] for i in mb], k,
                                    temperature, self.pack, self.pad_id)
                for i, (sampled, lp, ids) in zip(mb, res):
                    out[i] = (sampled.float().cpu().tolist(), lp.float().cpu().clone(), ids.cpu().clone())
        return out

    def _check_ids(self, token_ids: Sequence[Sequence[int]]) -> None:
        # the load-time check covers the tokenizer; this catches an id beyond it (a student whose own
        # embedding is padded past its tokenizer can sample one) with a line, not an IndexError
        top = max((max(s) for s in token_ids if len(s)), default=-1)
        if top >= self.vocab_size:
            raise TokenizerMismatch(f"teacher {self.name!r} has an embedding of {self.vocab_size} tokens but a "
                                    f"rollout holds token id {top}: it cannot score the student's tokens")


class RemoteTeacher:
    """An OpenAI-compatible completions server that echoes prompt log-probs (see module docstring)."""

    def __init__(self, spec: str, *, client: Any = None, max_concurrency: int = 8, timeout_s: float = 600.0,
                 max_retries: int = 3) -> None:
        import httpx

        url, _, model = spec.partition("#")
        self.base_url = url.rstrip("/")
        self._model = model or None
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self._client = client or httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0))

    def _request(self, method: str, url: str, body: Any = None) -> Any:
        from posttrain.engines.openai_compat import request_json

        return request_json(self._client, method, url, json_body=body, max_retries=self.max_retries)

    @property
    def model(self) -> str:
        if self._model is None:
            from posttrain.engines.openai_compat import RemoteCallError

            listed = self._request("GET", f"{self.base_url}/models").get("data") or []
            if not listed:
                raise RemoteCallError(f"GET {self.base_url}/models lists no model; give one as URL#model")
            self._model = str(listed[0]["id"])
        return self._model

    def tokenize(self, text: str) -> list[int] | None:
        """The server's token ids for ``text`` (vLLM's ``/tokenize`` at the server root), or None when
        the server has no such endpoint."""
        from posttrain.engines.openai_compat import RemoteCallError

        root = self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url
        try:
            resp = self._request("POST", f"{root}/tokenize",
                                 {"model": self.model, "prompt": text, "add_special_tokens": False})
        except RemoteCallError as e:
            if "HTTP 404" in str(e) or "HTTP 405" in str(e):
                return None
            raise
        return [int(t) for t in resp["tokens"]]

    def _score_one(self, ids: Sequence[int], mask: Sequence[int]) -> list[float]:
        from posttrain.engines.openai_compat import RemoteCallError

        body = {"model": self.model, "prompt": list(ids), "max_tokens": 1, "echo": True, "logprobs": 0,
                "temperature": 1.0, "return_tokens_as_token_ids": True}
        resp = self._request("POST", f"{self.base_url}/completions", body)
        try:
            lp = resp["choices"][0]["logprobs"]
            token_logprobs = lp["token_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise RemoteCallError(f"POST {self.base_url}/completions gave no echoed logprobs (does the server "
                                  f"support echo with logprobs?): {str(resp)[:300]}") from None
        if len(token_logprobs) < len(ids):
            raise RemoteCallError(f"{self.base_url}: {len(token_logprobs)} echoed log-probs for a "
                                  f"{len(ids)}-token prompt")
        echoed = lp.get("tokens") or []
        if echoed and all(str(t).startswith("token_id:") for t in echoed[: len(ids)]):
            got = [int(str(t)[len("token_id:"):]) for t in echoed[: len(ids)]]
            if got != list(ids):
                raise TokenizerMismatch(f"teacher server {self.base_url} echoed different token ids than it was "
                                        "sent: it does not use the student's tokenizer")
        return [float(token_logprobs[t]) for t, m in enumerate(mask) if m]

    def score(self, token_ids: Sequence[Sequence[int]], loss_masks: Sequence[Sequence[int]],
              temperature: float = 1.0) -> list[list[float]]:
        if temperature != 1.0:
            raise ValueError(f"url teacher {self.base_url}: its prompt log-probs are at temperature 1, the "
                             f"rollouts were sampled at {temperature}")
        if not token_ids:
            return []
        _ = self.model  # resolve once, before the threads race to
        with ThreadPoolExecutor(max(1, min(self.max_concurrency, len(token_ids)))) as pool:
            return list(pool.map(self._score_one, token_ids, loss_masks))


# --------------------------------------------------------------------------- tokenizer check

PROBE_TEXT = "<|im_start|>user\nWhat is 12 + 30? Answer in JSON: {\"answer\": 42}<|im_end|>\n"
# Texts both tokenizers must split into identical ids: chat framing, prose, code, numbers, accents
# and other scripts, emoji, runs of whitespace, tool-call tags. Different merges or pre-tokenizers
# show up here even where the tokenizer.json comparison cannot run (a slow tokenizer).
PROBE_TEXTS = (
    PROBE_TEXT,
    "The quick brown fox jumps over the lazy dog; reasoning, then the answer.",
    "def add(a, b):\n    return a + b  # sum of 1,234.5 and 67890\n",
    "Dates 2024-01-31 and 1999/12/31, pi = 3.14159, -0.001e-7, 123456789012345.",
    "naïve café, Zürich, Ελληνικά, русский, 東京都, 한국어, हिन्दी, emoji 🙂🚀",
    "  two  spaces\n\n\ttab\r\nwindows line   trailing   ",
    ("<think>\nadd them\n</think>\n<tool_call>\n<function=add>\n<parameter=amount>\n5\n</parameter>\n"
     "</function>\n</tool_call>"),
)
# tokenizer.json parts that decide how text becomes ids. Left out on purpose: the decoder (ids →
# text), the post-processor (which special tokens encode() adds), padding and truncation, and the
# added tokens' "special" flag (decoding only): none changes the ids of a rollout.
_SPLIT_PARTS = ("normalizer", "pre_tokenizer", "model")
_ADDED_TOKEN_FIELDS = ("id", "content", "single_word", "lstrip", "rstrip", "normalized")


def _splitting(tok: Any) -> dict[str, Any] | None:
    """The parts of a fast tokenizer's ``tokenizer.json`` that split text into ids; None for a slow one.

    Merges are read as pairs: ``tokenizers`` writes them as ``"a b"`` or ``["a", "b"]`` by version."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    out = {part: spec.get(part) for part in _SPLIT_PARTS}
    model = dict(out["model"] or {})
    if isinstance(model.get("merges"), list):
        model["merges"] = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    out["model"] = model
    added = sorted(spec.get("added_tokens") or [], key=lambda t: t.get("id", 0))
    out["added_tokens"] = [{k: t.get(k) for k in _ADDED_TOKEN_FIELDS} for t in added]
    return out


def _first_difference(student: dict[str, Any], teacher: dict[str, Any]) -> str | None:
    """Which splitting part differs, said briefly (the first differing merge for merges)."""
    for part in (*_SPLIT_PARTS, "added_tokens"):
        a, b = student[part], teacher[part]
        if a == b:
            continue
        if part != "model":
            return f"its {part.replace('_', '-')} differs"
        if a.get("type") != b.get("type"):
            return f"its model is {b.get('type')} where the student's is {a.get('type')}"
        ma, mb = a.get("merges") or [], b.get("merges") or []
        if ma != mb:
            i = next((i for i, (x, y) in enumerate(zip(ma, mb)) if x != y), min(len(ma), len(mb)))
            at_t, at_s = (repr(" ".join(m[i])) if i < len(m) else "nothing" for m in (mb, ma))
            return (f"its merges differ ({len(mb)} vs the student's {len(ma)}; merge {i} is {at_t} where the "
                    f"student's is {at_s})")
        keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        return f"its {a.get('type') or 'model'} settings differ ({', '.join(keys)})"
    return None


def compare_tokenizers(student: Any, teacher: Any, teacher_name: str) -> None:
    """Raise :class:`TokenizerMismatch` unless both map every token to the same id, split text into
    the same ids (merges, normalizer, pre-tokenizer; probe texts) and stop alike."""
    vs, vt = student.get_vocab(), teacher.get_vocab()
    if vs != vt:
        only_s = sorted(set(vs.items()) - set(vt.items()), key=lambda kv: kv[1])[:3]
        only_t = sorted(set(vt.items()) - set(vs.items()), key=lambda kv: kv[1])[:3]
        raise TokenizerMismatch(
            f"teacher {teacher_name!r} uses a different tokenizer than the student ({len(vt)} vs {len(vs)} "
            f"tokens; e.g. student has {only_s}, teacher has {only_t}). On-policy distillation compares "
            "log-probs of the same token ids: use a teacher trained from the student's base model family")
    if student.eos_token != teacher.eos_token:
        raise TokenizerMismatch(f"teacher {teacher_name!r} stops on {teacher.eos_token!r} but the student on "
                                f"{student.eos_token!r}: use teachers with the student's tokenizer")
    def splits_differently(why: str) -> TokenizerMismatch:
        return TokenizerMismatch(
            f"teacher {teacher_name!r} has the student's vocabulary but splits text differently: {why}. On-policy "
            "distillation scores the student's token ids, which the teacher would not have produced for the same "
            "text: use the student's tokenizer for the teacher")

    ss, st = _splitting(student), _splitting(teacher)
    if ss is not None and st is not None:
        why = _first_difference(ss, st)
        if why is not None:
            raise splits_differently(why)
    for text in PROBE_TEXTS:
        want = student(text, add_special_tokens=False)["input_ids"]
        got = teacher(text, add_special_tokens=False)["input_ids"]
        if got != want:
            i = next((i for i, (x, y) in enumerate(zip(want, got)) if x != y), min(len(want), len(got)))
            raise splits_differently(f"the probe text {text[:30]!r}... gives other ids from token {i} "
                                     f"({got[i:i + 4]} vs the student's {want[i:i + 4]})")


def student_vocab_size(tok: Any) -> int:
    """How many embedding rows a model needs for every id the student's tokenizer can produce."""
    return max(len(tok), max(tok.get_vocab().values(), default=-1) + 1)


def check_teacher_vocab(teacher_name: str, teacher_vocab: int | None, student: Any, where: str = "") -> None:
    """Raise :class:`TokenizerMismatch` when the teacher's embedding has fewer rows than the student's
    tokenizer has ids (it would pass the tokenizer check, then fail with an IndexError when scoring)."""
    need = student_vocab_size(student)
    if teacher_vocab is not None and teacher_vocab < need:
        raise TokenizerMismatch(f"teacher {teacher_name!r}{where} has an embedding of {teacher_vocab} tokens but the "
                                f"student's tokenizer has {need} ids: it cannot score every token the student "
                                f"can write; use a teacher with vocab_size >= {need}")


def config_vocab_size(model_dir: Any) -> int | None:
    """``vocab_size`` from a model directory's config.json (a multimodal model's text config
    included), or None when it does not say."""
    from pathlib import Path

    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for c in (cfg, cfg.get("text_config") or {}, cfg.get("llm_config") or {}):
        if isinstance(c, dict) and isinstance(c.get("vocab_size"), int):
            return c["vocab_size"]
    return None


# --------------------------------------------------------------------------- the pool


class ScoringTeacherPool:
    """Routes rollouts to teachers and fills ``batch.teacher_logprobs_BT`` (a signal scorer).

    ``loader(spec) -> (model, tokenizer)`` is ``load_model`` by default; tests count its calls.
    """

    phase = "signal"  # scores the filtered batch, after the rewards

    def __init__(self, cfg: TeachersConfig, student_tokenizer: Any,
                 micro_batch_tokens: int = 4096, loader: Callable[[str], tuple[Any, Any]] | None = None,
                 remote_kwargs: dict[str, Any] | None = None) -> None:
        self.cfg = cfg
        self.specs = {t.name: t for t in cfg.models}
        self.tokenizer = student_tokenizer
        self.micro_batch_tokens = micro_batch_tokens
        self.loader = loader or _load_local
        self.remote_kwargs = remote_kwargs or {}
        self.loaded: dict[str, Teacher] = {}  # key → backend, filled on first use

    def route(self, env: str) -> str:
        return self.cfg.teacher_for(env)

    def teacher(self, name: str) -> Teacher:
        """The backend of teacher ``name``, loaded on first use and shared by equal keys."""
        spec = self.specs[name]
        if spec.key not in self.loaded:
            if spec.url is not None:
                self.loaded[spec.key] = RemoteTeacher(spec.url, **self.remote_kwargs)
            else:
                model, tok = self.loader(spec.model)  # type: ignore[arg-type]
                compare_tokenizers(self.tokenizer, tok, name)
                check_teacher_vocab(name, model.get_input_embeddings().num_embeddings, self.tokenizer)
                pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
                self.loaded[spec.key] = LocalTeacher(model, self.micro_batch_tokens, pad, name)
        return self.loaded[spec.key]

    def check_tokenizers(self) -> None:
        """Compare every teacher's tokenizer with the student's, and a local teacher's embedding size
        (config.json's ``vocab_size``) with the student's tokenizer, before any weights are loaded."""
        from posttrain.models.loading import ModelNotFound, load_tokenizer, resolve_spec

        for spec in self.cfg.models:
            if spec.model is not None:
                try:
                    tok = load_tokenizer(spec.model)
                    where = resolve_spec(spec.model)
                except ModelNotFound as e:
                    raise ModelNotFound(f"teacher {spec.name!r}: {e}") from None
                compare_tokenizers(self.tokenizer, tok, spec.name)
                if not isinstance(where, str):  # a directory; a tiny model is built to its tokenizer's size
                    check_teacher_vocab(spec.name, config_vocab_size(where), self.tokenizer, f" ({where})")
                continue
            remote = self.teacher(spec.name)
            for text in PROBE_TEXTS:
                want = self.tokenizer(text, add_special_tokens=False)["input_ids"]
                got = remote.tokenize(text)  # type: ignore[attr-defined]
                if got is None:
                    print(f"[distill] warning: teacher {spec.name!r} ({spec.url}) has no /tokenize endpoint; its "
                          "tokenizer is only checked against echoed token ids while scoring")
                    break
                if got != want:
                    raise TokenizerMismatch(f"teacher {spec.name!r} ({spec.url}) tokenizes a probe text "
                                            f"differently from the student ({got[:8]}... vs {want[:8]}...): it "
                                            "needs the student's tokenizer")

    def __call__(self, rollouts: Sequence[Any], batch: Any) -> dict[str, float]:
        """Fill ``batch.teacher_logprobs_BT`` for the rollouts still in the batch; return metrics.

        Row b of the batch is rollout b; its T axis holds the rollout's sampled tokens in order.
        Rollouts masked out by a filter are not scored (their row stays 0).
        """
        import torch

        from posttrain.episodes.collect import sampling_temperature

        t0 = time.perf_counter()
        temperature = sampling_temperature(rollouts)
        teacher_BT = torch.zeros_like(batch.mask_BT, dtype=torch.float32)
        valid = batch.mask_BT.bool().any(dim=1).tolist()
        by_key: dict[str, list[int]] = defaultdict(list)
        for b, r in enumerate(rollouts):
            if valid[b]:
                by_key[self.specs[self.route(r.env)].key].append(b)
        k = self.cfg.topk
        if k:  # top-k KL variant: (B, T, k) teacher log-probs and ids; padding rows stay 0
            topk_lp_BTK = torch.zeros(*teacher_BT.shape, k)
            topk_ids_BTK = torch.zeros(*teacher_BT.shape, k, dtype=torch.long)
        for key, rows in by_key.items():
            name = next(n for n, s in self.specs.items() if s.key == key)
            ids, masks = [rollouts[b].token_ids for b in rows], [rollouts[b].loss_mask for b in rows]
            backend = self.teacher(name)
            if not k:
                for b, lp in zip(rows, backend.score(ids, masks, temperature)):
                    teacher_BT[b, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
                continue
            for b, (lp, lp_K, ids_K) in zip(rows, backend.score_topk(ids, masks, k, temperature)):  # type: ignore[attr-defined]
                teacher_BT[b, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
                topk_lp_BTK[b, : lp_K.shape[0]] = lp_K
                topk_ids_BTK[b, : ids_K.shape[0]] = ids_K
        batch.teacher_logprobs_BT = teacher_BT
        if k:
            batch.extras.update(topk_target_logprobs_BTK=topk_lp_BTK, topk_ids_BTK=topk_ids_BTK)  # the topk_kl term's
        seconds = time.perf_counter() - t0

        mask_BT = batch.mask_BT.bool()
        n_tokens = int(mask_BT.sum())
        metrics: dict[str, float] = {"time_teacher_s": seconds, "teacher_tokens": float(n_tokens),
                                     "teacher_models_loaded": float(len(self.loaded))}
        if n_tokens:
            metrics["teacher_tokens_per_s"] = n_tokens / max(seconds, 1e-9)
            gap_BT = (batch.sampler_logprobs_BT.float() - teacher_BT) * mask_BT  # log πS − log πT per token
            metrics["mopd_gap"] = float(gap_BT.sum()) / n_tokens
            envs = [r.env for r in rollouts]
            for env in sorted(set(envs)):
                rows_B = torch.tensor([e == env for e in envs])
                n = int(mask_BT[rows_B].sum())
                if n:
                    metrics[f"mopd_gap/{env}"] = float(gap_BT[rows_B].sum()) / n
        return metrics


def _load_local(spec: str) -> tuple[Any, Any]:
    from posttrain.models.loading import load_model

    loaded = load_model(spec)
    return loaded.model, loaded.tokenizer
