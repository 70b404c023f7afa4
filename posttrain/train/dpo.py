"""Direct preference optimisation: ``posttrain dpo --config recipes/dpo.yaml [key=value ...]``.

A stage on the one loop (``train/loop.py``), like SFT and RL: this module supplies the pairs, how
a micro-batch of pairs becomes :class:`~posttrain.algos.losses.LossInputs` and the held-out
metrics; the loss is the registry's ``dpo`` (``algos/losses.py``: ``sigmoid`` or ``ipo``, optional
SFT term on the chosen reply; β and the variant in ``loss``).

Data (``data.train``, JSONL, one pair per line)::

    {"prompt": "..." | "messages": [...], "chosen": "..." | {assistant message}, "rejected": ...,
     "tools": [OpenAI tool definitions, optional]}

Each side is rendered with the chat template (prompt + the reply, with the prompt's tools); only
the reply's tokens count (earlier assistant turns of the prompt do not). A step takes
``train.batch_size`` pairs (the order is a function of (seed, step), as in SFT), in micro-batches
of ``micro_batch_pairs`` pairs = 2 rows each (chosen, rejected), packed with the shared prompt
once (``models/logprobs.py``).

**Reference log-probs, computed once.** Before the first step every pair's per-token reference
log-probs are computed (no grad) with the reference model (``reference``, default the starting
weights) and written to ``<run_dir>/reference_logprobs.pt`` with a fingerprint of the tokenised
pairs and the reference; a resumed run (or a new run in the same directory on the same data)
reads them back and never loads the reference model. A fingerprint mismatch (the data or the
reference changed) recomputes them; the policy checkpoint is not touched.

Metrics (``metrics.jsonl``): ``loss``, ``reward_acc`` (share of pairs whose implicit reward
β·(log π − log π_ref) is higher for the chosen reply), ``margin`` (mean chosen − rejected implicit
reward), ``chosen_reward``, ``rejected_reward``, ``chosen_logp``, ``rejected_logp`` (mean sequence
log-probs), ``sft_nll`` (with ``sft_coef``); held out: ``val_loss``, ``val_reward_acc``,
``val_margin``. The tool-hallucination pair builder is ``train/dpo_pairs.py``.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from posttrain.configs.dpo import DPOConfig
from posttrain.errors import UserError
from posttrain.train.loop import StepBatch, Trainer

REF_FILE = "reference_logprobs.pt"


class DPODataError(UserError, ValueError):
    pass


@dataclass
class Pair:
    chosen_ids: list[int]
    chosen_mask: list[int]
    rejected_ids: list[int]
    rejected_mask: list[int]


# --------------------------------------------------------------------------- data


def _reply(x: Any, where: str) -> dict[str, Any]:
    if isinstance(x, str):
        return {"role": "assistant", "content": x}
    if isinstance(x, dict) and x.get("role", "assistant") == "assistant":
        return {**x, "role": "assistant"}
    raise DPODataError(f"{where}: chosen / rejected must be a string or an assistant message")


def read_dpo_rows(path: str | Path) -> list[dict[str, Any]]:
    """Pairs JSONL → rows ``{messages, chosen, rejected, tools}``; errors name ``file:line``."""
    p = Path(path)
    if not p.exists():
        raise DPODataError(f"pairs file not found: {p}")
    rows = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{p}:{i}"
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise DPODataError(f"{where}: not JSON: {e}") from None
        msgs = d.get("messages") if isinstance(d, dict) else None
        if msgs is None and isinstance(d, dict) and isinstance(d.get("prompt"), str):
            msgs = [{"role": "user", "content": d["prompt"]}]
        if not isinstance(msgs, list) or not msgs or "chosen" not in d or "rejected" not in d:
            raise DPODataError(f"{where}: needs prompt (or messages), chosen and rejected")
        rows.append({"messages": msgs, "chosen": _reply(d["chosen"], where), "rejected": _reply(d["rejected"], where),
                     "tools": d.get("tools")})
    return rows


def render_reply(tokenizer: Any, messages: list[dict[str, Any]], reply: dict[str, Any],
                 tools: Sequence[dict[str, Any]] | None) -> tuple[list[int], list[int]]:
    """(ids, mask) of prompt + reply; the mask is 1 on the reply's tokens only."""
    from posttrain.models.chat_template import render

    prefix = render(tokenizer, messages, tools).input_ids
    full = render(tokenizer, [*messages, reply], tools)
    mask = [0] * len(prefix) + full.loss_mask[len(prefix):]
    assert full.input_ids[: len(prefix)] == prefix, "the prompt renders differently with a reply after it"
    return full.input_ids, mask


def tokenize_pairs(tokenizer: Any, rows: list[dict[str, Any]], max_len: int) -> tuple[list[Pair], int]:
    """Pairs that fit ``max_len`` (both sides, reply non-empty) and the number dropped."""
    out, dropped = [], 0
    for r in rows:
        c = render_reply(tokenizer, r["messages"], r["chosen"], r["tools"])
        j = render_reply(tokenizer, r["messages"], r["rejected"], r["tools"])
        if max(len(c[0]), len(j[0])) > max_len or not sum(c[1]) or not sum(j[1]):
            dropped += 1
            continue
        out.append(Pair(c[0], c[1], j[0], j[1]))
    return out, dropped


def load_dpo_data(cfg: DPOConfig, tokenizer: Any) -> tuple[list[Pair], list[Pair], int]:
    if not cfg.data.train:
        raise DPODataError("no training pairs: set data.train (a pairs JSONL)")
    rows = read_dpo_rows(cfg.data.train)
    if cfg.data.validation:
        held = read_dpo_rows(cfg.data.validation)
    else:
        random.Random(cfg.train.seed).shuffle(rows)
        n_val = int(len(rows) * cfg.data.val_frac) if len(rows) > 1 else 0
        held, rows = rows[:n_val], rows[n_val:]
    train, d1 = tokenize_pairs(tokenizer, rows, cfg.data.max_seq_len)
    val, d2 = tokenize_pairs(tokenizer, held, cfg.data.max_seq_len)
    if not train:
        raise DPODataError(f"{cfg.data.train}: no usable pairs (all longer than data.max_seq_len?)")
    return train, val, d1 + d2


# --------------------------------------------------------------------------- reference log-probs


def fingerprint(pairs: Sequence[Pair], reference: str) -> str:
    h = hashlib.sha256(reference.encode())
    for p in pairs:
        h.update(json.dumps([p.chosen_ids, p.chosen_mask, p.rejected_ids, p.rejected_mask]).encode())
    return h.hexdigest()


def pair_rows(pairs: Sequence[Pair]) -> tuple[list[list[int]], list[list[int]]]:
    """Rows in (chosen, rejected) order: ids and masks."""
    ids = [x for p in pairs for x in (p.chosen_ids, p.rejected_ids)]
    masks = [x for p in pairs for x in (p.chosen_mask, p.rejected_mask)]
    return ids, masks


def compute_reference(model: Any, pairs: Sequence[Pair], chunk: int, pack: bool, pad_id: int) -> list[Any]:
    """Per row (chosen, rejected, …) the reference's per-token log-probs, no grad."""
    import torch

    from posttrain.models.logprobs import sampled_logprobs

    was = model.training
    model.eval()
    out: list[Any] = []
    with torch.no_grad():
        for s in range(0, len(pairs), chunk):
            ids, masks = pair_rows(pairs[s: s + chunk])
            out += [lp.detach().float().cpu() for lp in sampled_logprobs(model, ids, masks, 1.0, pack, pad_id)]
    model.train(was)
    return out


def cached_reference(path: Path, key: str, compute: Any) -> tuple[list[Any], bool]:
    """(reference log-probs, computed now?): read ``path`` when its fingerprint is ``key``, else
    compute and write it (atomically)."""
    import os

    import torch

    if path.exists():
        saved = torch.load(path, weights_only=True)
        if saved.get("fingerprint") == key:
            return saved["logprobs"], False
    logprobs = compute()
    tmp = path.with_suffix(".tmp")
    torch.save({"fingerprint": key, "logprobs": logprobs}, tmp)
    os.replace(tmp, path)
    return logprobs, True


# --------------------------------------------------------------------------- the stage


class DPOStage:
    """Pairs → (chosen, rejected) log-probs beside the cached reference → the ``dpo`` loss."""

    name = "dpo"
    balance_loss = False

    def __init__(self, cfg: DPOConfig, t: Trainer) -> None:
        from posttrain.models.facts import use_packing
        from posttrain.train.sft import step_plan

        self.cfg, self.t = cfg, t
        self.pack = use_packing(t.model, cfg.train.pack)
        self.train, self.val, self.dropped = load_dpo_data(cfg, t.tokenizer)
        self.plan = step_plan([len(self.train)], [1.0], cfg.train.batch_size, cfg.train.steps, cfg.train.seed)
        self.ref, self.ref_computed = self.reference()
        self.pairs_trained = 0
        self.current: list[int] = []

    def reference(self) -> tuple[list[Any], bool]:
        """Cached per-row reference log-probs of the training then the held-out pairs."""
        spec = self.cfg.reference or self.cfg.model
        pairs = self.train + self.val

        def compute() -> list[Any]:
            model = self.t.model
            if self.cfg.reference is not None or self.t.start > 0:  # the live weights are not the reference
                from posttrain.models.loading import load_model

                model = load_model(spec, device=str(self.t.device)).model
            with self.t.amp():  # the precision the policy's log-probs are computed in
                return compute_reference(model, pairs, self.cfg.train.micro_batch_pairs, self.pack, self.t.pad_id)

        return cached_reference(self.t.run_dir / REF_FILE, fingerprint(pairs, spec), compute)

    def micro_inputs(self, model: Any, idx: Sequence[int], offset: int, num_pairs: int) -> Any:
        """LossInputs of pairs ``idx`` (of the training list, or of the held-out list at ``offset``)."""
        import torch
        import torch.nn.functional as F

        from posttrain.algos.losses import LossInputs
        from posttrain.models.logprobs import sampled_logprobs

        pairs = [(self.train + self.val)[offset + i] for i in idx]
        ids, masks = pair_rows(pairs)
        lps = sampled_logprobs(model, ids, masks, 1.0, self.pack, self.t.pad_id)
        refs = [self.ref[2 * (offset + i) + k] for i in idx for k in (0, 1)]
        T = max(len(x) for x in lps)
        logprobs_BT = torch.stack([F.pad(x, (0, T - len(x))) for x in lps])
        ref_BT = torch.stack([F.pad(x, (0, T - len(x))) for x in refs]).to(logprobs_BT.device)
        mask_BT = torch.stack([F.pad(torch.ones(len(x)), (0, T - len(x))) for x in lps]).bool().to(logprobs_BT.device)
        return LossInputs(logprobs_BT, mask_BT, ref_logprobs_BT=ref_BT, num_pairs=float(num_pairs))

    def prepare(self, step: int) -> StepBatch:
        idx = [i for _, i in self.plan[step]]
        k = self.cfg.train.micro_batch_pairs
        self.current = idx
        micro = [idx[s: s + k] for s in range(0, len(idx), k)]
        return StepBatch(micro, {"pairs": len(idx)})

    def loss_inputs(self, model: Any, micro: list[int]) -> Any:
        return self.micro_inputs(model, micro, 0, len(self.current))

    def heldout(self) -> dict[str, float]:
        """Held-out loss, implicit-reward accuracy and margin (pair means); empty with no pairs."""
        import torch

        from posttrain.algos.losses import make_loss

        if not self.val:
            return {}
        loss_fn, k, n = make_loss(self.cfg.loss), self.cfg.train.micro_batch_pairs, len(self.val)
        was = self.t.model.training
        self.t.model.eval()
        sums = {"val_loss": 0.0, "val_reward_acc": 0.0, "val_margin": 0.0}
        with torch.no_grad(), self.t.amp():
            for s in range(0, n, k):
                idx = list(range(s, min(s + k, n)))
                out = loss_fn(self.micro_inputs(self.t.model, idx, len(self.train), n))
                sums["val_loss"] += float(out.loss)
                sums["val_reward_acc"] += out.metrics["reward_acc"] * len(idx) / n
                sums["val_margin"] += out.metrics["margin"] * len(idx) / n
        self.t.model.train(was)
        return sums

    def after_update(self) -> None:
        pass

    def begin(self, start: int) -> dict[str, Any]:
        m = self.heldout() if start == 0 else {}
        return {**m, "pairs_dropped": self.dropped, "reference_computed": float(self.ref_computed)} if start == 0 else m

    def end_step(self, done: int, batch: StepBatch, m: dict[str, Any]) -> dict[str, Any]:
        self.pairs_trained += m["pairs"]
        every = self.cfg.train.eval_every
        if done == self.cfg.train.steps or (every and done % every == 0):
            m.update(self.heldout())
        return m

    def state_dict(self) -> dict[str, Any]:
        return {"pairs_trained": self.pairs_trained}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pairs_trained = state.get("pairs_trained", 0)

    def postfix(self, m: dict[str, Any]) -> dict[str, Any]:
        return {"loss": f"{m.get('loss', float('nan')):.3f}", "acc": f"{m.get('reward_acc', float('nan')):.2f}"}


@dataclass
class DPOResult:
    run_dir: Path
    checkpoint: Path | None
    steps: int
    reference_computed: bool
    seconds: float
    last: dict[str, Any]


def train_dpo(cfg: DPOConfig, progress: bool = True, stop_after: int | None = None) -> DPOResult:
    """Run the stage (see the module docstring)."""
    from posttrain.algos.losses import make_loss
    from posttrain.train import loop
    from posttrain.train.checkpoint import latest_checkpoint

    t_start = time.time()
    t = loop.setup(cfg, numerics="dpo")
    stage = DPOStage(cfg, t)
    last = loop.run(t, stage, make_loss(cfg.loss), progress, stop_after)
    return DPOResult(t.run_dir, latest_checkpoint(t.run_dir), cfg.train.steps, stage.ref_computed,
                     time.time() - t_start, last)
