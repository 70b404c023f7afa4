"""The in-process CPU generation engine: a lean sampling loop over a Hugging Face causal LM.

``HFGenerator`` implements the ``Generator`` protocol (``engines/base.py``) for a local model, and
adds ``generate_ids`` for callers that hold exact token prefixes (the multi-turn loop continues a
conversation from the ids it sampled, never from re-encoded text).

The loop (``_generate_group``), per batch of prompts:

1. left-pad the rendered prompts and prefill them once with a fresh ``DynamicCache`` (only the last
   position's logits are computed: ``logits_to_keep=1``);
2. equal prompts (the ``n`` samples of one prompt, or a task the caller repeated) are prefilled
   once and their cache rows repeated (``reorder_cache``), instead of recomputing the prefill;
3. decode one token per step for the rows still running; a row that samples a stop token
   (``<|im_end|>``, or the tokenizer's eos) is *dropped from the batch* (cache rows, mask and
   positions are index-selected), so the batch shrinks as sequences finish instead of carrying
   padding to the longest one.

Llama-architecture models on the CPU (the embedded SmolLM2) run the same loop over
``engines/static_llama.py`` instead: a preallocated KV cache written in place, finished rows
compacted only once an eighth of the batch has finished, and, sampling in bf16, prepacked weights:
1.5-1.9x the tokens/s of the ``DynamicCache`` loop (bench/rollout_throughput.py, docs/benchmarks.md).
``static_cache=False`` (config ``rollout.engine.static_cache``) keeps the loop described here.

``reorder_cache`` is the cache operation every layer type implements (attention KV and the Mamba
conv/SSM states of the hybrid NemotronH), which is why one loop serves both architectures.

Why not ``model.generate``: measured with ``bench/rollout_throughput.py`` as of 27d0940d (its row of
2026-11-29 in bench/results/rollout_throughput.jsonl; embedded 135M model,
fp32, 8 prompts × 4 samples, 48 new tokens, temperature 1, 3 interleaved rounds, 1 thread):
this loop 91.8 generated tokens/s, ``model.generate(output_logits=True)`` + log-softmax
73.1 tokens/s (1.26×). Most rows of that workload run to the 48-token limit, so the gain there is
mostly the shared prefill; row dropping pays more when response lengths spread. ``generate`` also
gives raw logits that still need turning into the sampler's log-probs, and its random stream
depends on the batch layout. Nearly all the time is the model's matmuls (~75%); sampling over the
49k vocabulary is ~5%.

Threads: on a machine whose cores are busy with other processes, OpenMP threads waiting for each
other made decoding up to ~10x *slower* than one thread (bench/threads.py), so the CLI starts torch
with one thread per idle core and ``OMP_WAIT_POLICY=PASSIVE`` (``models/threads.py``);
``num_threads`` (``--threads``) sets an exact count.

Precision: the engine samples from the live fp32 module by default. ``dtype="bf16"`` (config
``rollout.engine: {type: hf, dtype: bf16}``) decodes from a bf16 copy, refreshed by
``update_weights`` after every optimizer step: fewer bytes per decode step and bf16 matmuls, at the
price of sampled log-probs that differ from the fp32 trainer's (bench/rollout_throughput.py prints
both the speed and the log-prob error; ``models/precision.py`` why it is not the default).

What comes back, per completion:

* ``token_ids``: exactly the sampled ids, *including* the terminating stop token when the row
  stopped (``finish_reason == "stop"``); the trainer trains on these ids, and the stop token is a
  trained token (it is how the model learns to end a turn). ``finish_reason == "length"`` means the
  row hit ``max_new_tokens`` with no stop token.
* ``text``: the decoded ids without the stop token and without special tokens.
* ``logprobs``: one per token id, the log-probability of that token under the distribution it was
  actually sampled from: ``log_softmax(logits / temperature)``, restricted to the top-p nucleus
  and renormalised when ``top_p < 1``. This is the behaviour policy that importance sampling needs;
  a trainer comparing against it must apply the same temperature (and, if used, top-p). Greedy
  decoding (``temperature == 0``) samples from a point mass, whose log-prob (0) says nothing, so
  there the model's own ``log_softmax(logits)`` (temperature 1) of the chosen token is returned.
* ``prompt_ids``: the rendered prompt, unpadded.

Reproducibility: every (prompt, sample) row draws its uniforms from its own ``torch.Generator``
seeded from ``(seed, prompt index, sample index)`` and samples by inverse CDF, so a row's random
stream does not depend on which other rows share its batch or when they finish. Same arguments and
seed → same completions. (Different batch sizes can still change a token in rare near-ties, since
padded fp32 matmuls are not bit-identical across shapes.)
"""

from __future__ import annotations

import hashlib
import inspect
import secrets
from dataclasses import dataclass
from typing import Any, Sequence

from posttrain.engines import static_llama
from posttrain.models import threads
from posttrain.models.chat_template import IM_END
from posttrain.engines.base import Completion, FinishReason, SamplingParams, TokenEngine


def row_seed(seed: int, *parts: int | str) -> int:
    """A 63-bit seed for one sampling stream, mixed from a base seed and row coordinates."""
    digest = hashlib.blake2b(":".join(map(str, (seed, *parts))).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def check_params(params: SamplingParams) -> None:
    if params.n < 1:
        raise ValueError(f"n must be >= 1, got {params.n}")
    if params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {params.max_new_tokens}")
    if params.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {params.temperature}")
    if not 0.0 < params.top_p <= 1.0:
        raise ValueError(f"top_p must lie in (0, 1], got {params.top_p}")


def sample_next(logits_BV: Any, temperature: float, top_p: float, uniforms_B: Any) -> tuple[Any, Any]:
    """One sampling step: (token ids [B], log-probs [B]) from fp32 logits [B, V].

    ``uniforms_B`` in [0, 1) pick the token by inverse CDF (unused when greedy). The log-prob is the
    one documented in the module docstring (the sampling distribution's; model's own when greedy).
    """
    import torch

    if temperature == 0:
        tokens_B = logits_BV.argmax(dim=-1)
        logprobs_B = torch.log_softmax(logits_BV, dim=-1).gather(-1, tokens_B[:, None])[:, 0]
        return tokens_B, logprobs_B
    if top_p == 1.0:
        # the common case in one softmax and a two-level CDF: 6.2 -> ~1.5 ms a step at [32, 49152]
        probs_BV = torch.softmax(logits_BV if temperature == 1 else logits_BV / temperature, dim=-1)
        tokens_B = inverse_cdf(probs_BV, uniforms_B)
        return tokens_B, probs_BV.gather(-1, tokens_B[:, None])[:, 0].log()
    logp_BV = torch.log_softmax(logits_BV / temperature, dim=-1)
    if top_p < 1.0:
        logp_BV, order_BV = logp_BV.sort(dim=-1, descending=True)
        probs_BV = logp_BV.exp()
        # keep the smallest prefix whose mass reaches top_p: a token stays if the mass before it is
        # still short of top_p (so the most likely token always stays)
        keep_BV = (probs_BV.cumsum(dim=-1) - probs_BV) < top_p
        logp_BV = logp_BV.masked_fill(~keep_BV, float("-inf"))
        logp_BV = logp_BV - torch.logsumexp(logp_BV, dim=-1, keepdim=True)
    cdf_BV = logp_BV.exp().cumsum(dim=-1)
    # right=True: the first index whose CDF exceeds the draw, which never lands on a zero-mass token
    idx_B = torch.searchsorted(cdf_BV, (uniforms_B * cdf_BV[:, -1])[:, None].contiguous(), right=True)[:, 0]
    idx_B = idx_B.clamp(max=logits_BV.shape[-1] - 1)
    logprobs_B = logp_BV.gather(-1, idx_B[:, None])[:, 0]
    tokens_B = order_BV.gather(-1, idx_B[:, None])[:, 0] if top_p < 1.0 else idx_B
    return tokens_B, logprobs_B


def inverse_cdf(probs_BV: Any, uniforms_B: Any, block: int = 256) -> Any:
    """Per row, the first index whose cumulative probability exceeds ``uniform * total``.

    The same pick as ``searchsorted(probs.cumsum(-1), u * total, right=True)``, but in two levels:
    block sums and their cumsum find the block, one cumsum inside it finds the token. A full cumsum
    over a 49k vocabulary was 2.7 ms of a 47 ms decode step at batch 32 (the block sums ~0.3).
    A token with no mass is never picked: the draw inside the block is kept below the block's own
    total, so rounding between the two levels cannot run past its last token with mass.
    """
    import torch
    import torch.nn.functional as F

    B, V = probs_BV.shape
    # (a zero pad is a copy of the whole row: 1.6 ms a step at [32, 49152], so only when needed)
    blocks = (F.pad(probs_BV, (0, (-V) % block)) if V % block else probs_BV).view(B, -1, block)
    csum_BN = blocks.sum(-1).cumsum(-1)
    target_B = uniforms_B * csum_BN[:, -1]
    b_B = torch.searchsorted(csum_BN, target_B[:, None].contiguous(), right=True)[:, 0].clamp(max=csum_BN.shape[1] - 1)
    before_B = torch.where(b_B > 0, csum_BN.gather(1, (b_B - 1).clamp(min=0)[:, None])[:, 0], 0.0)
    inner_BK = blocks[torch.arange(B, device=probs_BV.device), b_B].cumsum(-1)
    below_B = torch.nextafter(inner_BK[:, -1], torch.zeros_like(inner_BK[:, -1]))
    r_B = torch.minimum((target_B - before_B).clamp(min=0), below_B)
    j_B = torch.searchsorted(inner_BK, r_B[:, None].contiguous(), right=True)[:, 0].clamp(max=block - 1)
    return b_B * block + j_B


@dataclass
class _Row:
    """One (prompt, sample) stream while it is being generated."""

    prompt: int  # index into the group's prompts
    seed: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason = "length"


class HFGenerator(TokenEngine):
    """Batched sampling from a local HF causal LM (see the module docstring for the design)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        batch_size: int = 16,
        max_prefill_tokens: int = 8192,
        num_threads: int | None = None,
        dtype: str = "fp32",
        greedy_in_dtype: bool = False,
        static_cache: bool = True,
    ) -> None:
        """``batch_size`` bounds the rows (prompt × sample) decoded together; the ``n`` samples of
        one prompt always share a batch. ``max_prefill_tokens`` bounds rows × padded prompt length
        of one prefill (memory of long-context prompts). ``num_threads`` sets torch's (process-wide)
        thread count; left alone, torch uses one thread per core. ``dtype="bf16"`` decodes from a
        bf16 copy of an fp32 model (``update_weights`` refreshes it); ``fp32`` samples from the live
        module itself. Greedy decoding is a measurement and runs on the live module unless
        ``greedy_in_dtype``: then it runs on the ``dtype`` copy too (``pipeline --quick``'s test table:
        1.6x faster in bf16 on an AVX-512-bf16 core, and 25 of an SFT checkpoint's 96 greedy replies
        differ from fp32's, bench/results/eval_precision.jsonl#L1; only checkpoints decoded alike
        may be compared). ``static_cache`` (default on): Llama-architecture modules decode over a
        preallocated KV cache (``engines/static_llama.py``), the same tokens and log-probs to float
        rounding at about twice the speed; off, or for other architectures, the ``DynamicCache`` loop."""
        import torch

        if batch_size < 1 or max_prefill_tokens < 1:
            raise ValueError("batch_size and max_prefill_tokens must be >= 1")
        if dtype not in ("fp32", "bf16"):
            raise ValueError(f"dtype must be fp32 or bf16, got {dtype!r}")
        self.live = model.eval()  # the trainer's module: greedy decoding runs on it (unless greedy_in_dtype)
        self.model = self.live  # what samples: the live module, or its bf16 copy
        if dtype == "bf16" and next(model.parameters()).dtype != torch.bfloat16:
            import copy

            self.model = copy.deepcopy(model).to(torch.bfloat16).eval()
        self.greedy_net = self.model if greedy_in_dtype else self.live
        self.static_cache = static_cache  # Llama modules decode over engines/static_llama.py's cache
        self._pack: Any = None  # static_llama.PackedWeights of the bf16 module that samples, once built
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.device = next(model.parameters()).device
        if num_threads is not None:  # process-wide; torch's default is already one per core
            threads.set_exact(num_threads)
        stops = {tokenizer.convert_tokens_to_ids(IM_END), tokenizer.eos_token_id}
        self.stop_ids = frozenset(t for t in stops if t is not None and t != tokenizer.unk_token_id)
        if not self.stop_ids:
            raise ValueError(f"tokenizer has neither {IM_END} nor an eos token to stop on")
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.stop_ids)
        # transformers 5 renamed the forward's ``past_key_values`` to ``cache`` (the old name warns)
        self.cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    @property
    def precision(self) -> str:
        """What samples: ``bf16`` (a bf16 copy of the live module) or ``fp32`` (the live module)."""
        return "fp32" if self.model is self.live else "bf16"

    def update_weights(self, model: Any) -> None:
        """After an optimizer step: refresh a bf16 sampling copy (nothing to do when sampling from
        the live module)."""
        import torch

        if self.model is self.live:
            return
        with torch.no_grad():
            for dst, src in zip(self.model.parameters(), model.parameters()):
                dst.copy_(src)

    # from_spec, render_prompt and generate: TokenEngine (engines/base.py)

    def generate_ids(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        """``params.n`` completions per token-id prompt, in prompt order.

        ``seeds[i]`` (optional) is prompt i's own seed; by default it is derived from
        ``params.seed`` and i, so a prompt's samples do not depend on the other prompts.
        """
        check_params(params)
        if seeds is not None and len(seeds) != len(prompt_ids):
            raise ValueError(f"{len(seeds)} seeds for {len(prompt_ids)} prompts")
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("empty prompt")
        base = params.seed if params.seed is not None else secrets.randbits(62)
        seeds = list(seeds) if seeds is not None else [row_seed(base, i) for i in range(len(prompt_ids))]
        out: list[list[Completion]] = [[] for _ in prompt_ids]
        for group in self._groups(prompt_ids, params.n):
            completions = self._generate_group([list(prompt_ids[i]) for i in group], [seeds[i] for i in group], params)
            for i, comps in zip(group, completions):
                out[i] = comps
        return out

    # ------------------------------------------------------------------ internals

    def _groups(self, prompt_ids: Sequence[Sequence[int]], n: int) -> list[list[int]]:
        """Prompt indices batched by length, longest first (little padding; memory trouble shows at
        once), equal prompts next to each other (they share a prefill), each group within
        ``batch_size`` rows and ``max_prefill_tokens``."""
        order = sorted(range(len(prompt_ids)), key=lambda i: (-len(prompt_ids[i]), list(prompt_ids[i])))
        per_group = max(1, self.batch_size // n)
        groups: list[list[int]] = []
        for i in order:
            g = groups[-1] if groups else None
            # a group's padded length is its first (longest) prompt's length
            if g is None or len(g) >= per_group or (len(g) + 1) * len(prompt_ids[g[0]]) > self.max_prefill_tokens:
                groups.append([i])
            else:
                g.append(i)
        return groups

    def _left_pad(self, prompts: list[list[int]]) -> tuple[Any, Any]:
        """(token ids [U, W] left-padded with ``pad_id``, which of them are real [U, W] bool)."""
        import torch

        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        valid = torch.zeros((len(prompts), width), dtype=torch.bool)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            valid[i, width - len(p):] = True
        return ids, valid

    def _prefill(self, net: Any, unique: list[list[int]], cache: Any) -> tuple[Any, Any, Any]:
        """Left-padded prefill: (last-position logits [U, V], attention mask [U, W], next positions [U])."""
        input_ids, valid = self._left_pad(unique)
        attention = valid.long()
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        dev = self.device
        logits = net(
            input_ids=input_ids.to(dev), attention_mask=attention.to(dev), position_ids=positions.to(dev),
            use_cache=True, logits_to_keep=1, **{self.cache_kwarg: cache},
        ).logits[:, -1].float()
        return logits, attention, positions[:, -1] + 1

    def _generate_group(self, prompts: list[list[int]], seeds: list[int], params: SamplingParams) -> list[list[Completion]]:
        import torch
        from transformers import DynamicCache

        dev = self.device
        rows = [_Row(i, row_seed(seeds[i], j), [], []) for i in range(len(prompts)) for j in range(params.n)]
        rngs = [torch.Generator().manual_seed(r.seed) for r in rows]
        # equal prompts (the n samples of one prompt, or a task repeated by the caller) are
        # prefilled once; the cache rows are then repeated to one per sample
        unique: dict[tuple[int, ...], int] = {}
        owner = [unique.setdefault(tuple(p), len(unique)) for p in prompts]
        # greedy decoding is a measurement (validation, evals): it runs on the fp32 module even when
        # sampling uses a bf16 copy, so its results do not depend on the machine's sampling precision
        # (unless the caller asked for greedy in ``dtype`` too: ``greedy_in_dtype``)
        net = self.greedy_net if params.temperature == 0 else self.model
        # the static loop is measured and tested on the CPU only: a GPU keeps the DynamicCache loop
        if self.static_cache and self.device.type == "cpu" and static_llama.supports(net):
            self._decode_static(net, prompts, unique, owner, rows, rngs, params)
            return self._completions(prompts, rows)
        with torch.inference_mode():
            cache = DynamicCache(config=net.config)
            logits, attention, next_pos = self._prefill(net, [list(u) for u in unique], cache)
            expand = torch.tensor([owner[r.prompt] for r in rows])
            if len(rows) != len(unique):
                cache.reorder_cache(expand.to(dev))
                logits, attention, next_pos = logits[expand.to(dev)], attention[expand], next_pos[expand]
            live = list(range(len(rows)))  # batch position → index into rows
            for step in range(params.max_new_tokens):
                threads.govern()  # fewer threads while other processes use the cores (models/threads.py)
                uniforms = torch.cat([torch.rand(1, generator=rngs[r]) for r in live])
                tokens, logprobs = sample_next(logits, params.temperature, params.top_p, uniforms.to(dev))
                keep = self._record(rows, live, tokens, logprobs)
                if not keep or step == params.max_new_tokens - 1:
                    break
                if len(keep) < len(live):  # drop finished rows from the batch
                    sel = torch.tensor(keep)
                    cache.reorder_cache(sel.to(dev))
                    tokens, attention, next_pos = tokens[sel.to(dev)], attention[sel], next_pos[sel]
                    live = [live[b] for b in keep]
                attention = torch.cat([attention, torch.ones((len(live), 1), dtype=torch.long)], dim=1)
                logits = net(
                    input_ids=tokens[:, None], attention_mask=attention.to(dev), position_ids=next_pos[:, None].to(dev),
                    use_cache=True, **{self.cache_kwarg: cache},
                ).logits[:, -1].float()
                next_pos = next_pos + 1
        return self._completions(prompts, rows)

    def _decode_static(self, net: Any, prompts: list[list[int]], unique: dict[tuple[int, ...], int],
                       owner: list[int], rows: list[_Row], rngs: list[Any], params: SamplingParams) -> None:
        """The same loop over ``static_llama.StaticCacheDecoder`` (Llama modules only): every row
        keeps its own random stream and stops on its own; finished rows stay in the batch until an
        eighth of it has finished, then the cache is compacted (a copy of every layer's K and V)."""
        import torch

        dev = self.device
        ids, valid = self._left_pad([list(u) for u in unique])
        width = ids.shape[1]
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        expand = torch.tensor([owner[r.prompt] for r in rows])
        with torch.inference_mode():
            dec = static_llama.StaticCacheDecoder(net, len(rows), width, params.max_new_tokens, self._packed(net))
            logits = dec.prefill(ids.to(dev), valid.to(dev), positions.to(dev), expand.to(dev))
            next_pos = positions[:, -1][expand] + 1
            batch = list(range(len(rows)))  # cache row → index into rows
            running = list(range(len(rows)))  # cache rows still generating
            tokens = torch.full((len(rows),), self.pad_id, dtype=torch.long)
            for step in range(params.max_new_tokens):
                threads.govern()  # fewer threads while other processes use the cores (models/threads.py)
                uniforms = torch.cat([torch.rand(1, generator=rngs[batch[b]]) for b in running])
                run_idx = torch.tensor(running)
                picked = logits if len(running) == len(batch) else logits[run_idx.to(dev)]
                new, logprobs = sample_next(picked, params.temperature, params.top_p, uniforms.to(dev))
                still = [running[j] for j in self._record(rows, [batch[b] for b in running], new, logprobs)]
                if not still or step == params.max_new_tokens - 1:
                    break
                tokens[run_idx] = new.cpu()
                if len(batch) - len(still) >= max(1, len(batch) // 8):  # compact: drop finished rows
                    sel = torch.tensor(still)
                    dec.keep(sel.to(dev))
                    tokens, next_pos = tokens[sel], next_pos[sel]
                    batch = [batch[b] for b in still]
                    still = list(range(len(still)))
                running = still
                logits = dec.step(tokens.to(dev), next_pos.to(dev))
                next_pos = next_pos + 1

    def _record(self, rows: list[_Row], owners: list[int], tokens: Any, logprobs: Any) -> list[int]:
        """Append the j-th sampled token (and its log-prob) to row ``owners[j]``; returns the j whose
        row goes on (the others sampled a stop token)."""
        going = []
        for j, (r, tok, lp) in enumerate(zip(owners, tokens.tolist(), logprobs.tolist())):
            row = rows[r]
            row.token_ids.append(tok)
            row.logprobs.append(lp)
            if tok in self.stop_ids:
                row.finish_reason = "stop"
            else:
                going.append(j)
        return going

    def _packed(self, net: Any) -> "static_llama.PackedWeights | None":
        """``net``'s prepacked bf16 weights, repacked when any weight changed since (None where
        ``PackedWeights.eligible`` says no: fp32, hooks, biases)."""
        if not static_llama.PackedWeights.eligible(net):
            return None
        # only the sampling copy can qualify (greedy runs on it or on the fp32 live module), and
        # ``fresh`` compares storage addresses too, so one slot serves
        if self._pack is None or not self._pack.fresh(net):
            self._pack = static_llama.PackedWeights(net, self.batch_size)
        return self._pack

    def _completions(self, prompts: list[list[int]], rows: list[_Row]) -> list[list[Completion]]:
        out: list[list[Completion]] = [[] for _ in prompts]
        for row in rows:
            out[row.prompt].append(self._completion(row, prompts[row.prompt]))
        return out

    def _completion(self, row: _Row, prompt: list[int]) -> Completion:
        body = row.token_ids[:-1] if row.finish_reason == "stop" else row.token_ids
        return Completion(
            text=self.tokenizer.decode(body, skip_special_tokens=True),
            token_ids=row.token_ids,
            logprobs=row.logprobs,
            finish_reason=row.finish_reason,
            prompt_ids=list(prompt),
        )
