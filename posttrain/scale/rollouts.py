"""Rollouts from Ray workers for the RL stage, synchronous or ahead of the trainer.

:class:`RayRollouts` is the RL stage's rollout source (``train/rl.py: RLStage(source=...)``) when
``scale.backend: ray``. A step's batch is one request per rollout worker (a contiguous share of the
step's prompts, with their group ids), each chained to a verification worker: Ray hands the
rollout worker's result straight to the verifier, so scoring starts the moment sampling ends,
without a round trip through the trainer. The merged batch is put back in the order the in-process
stage produces (environment, then prompt, then sample), so everything downstream is unchanged.

Synchronous (``scale.ahead: 0``, the default): the request for step s is made at step s, after
step s-1's weights were published; every rollout has policy version s, as in the in-process loop.

Asynchronous (``ahead: k``): after taking step s's batch the trainer makes the requests of steps
s+1 … s+k, which the workers sample while it updates. A worker loads the newest published weights
when it *starts* a batch, so a batch's policy version is the trainer's version at that moment and
its staleness (the trainer's version when it trains on it, minus that) depends on timing. A batch
more than ``max_staleness`` versions old is dropped — counted in ``stale_batches_dropped`` and
``stale_tokens_dropped`` — and its step is sampled again from the current weights. The masked
importance-sampling correction in the ``pg`` loss weighs each kept token by π_trainer / π_sampler,
which is now the off-policy gap too; its ``is_masked_frac`` and ``is_ratio_mean`` show how much.

Metrics per step: ``policy_staleness`` (max over the batch's rollouts), ``stale_batches_dropped``,
``stale_tokens_dropped``, ``time_wait_s`` (the trainer blocked on rollouts), and the workers'
``time_generate_s`` / ``time_verify_s`` summed over workers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from posttrain.engines.base import TokenEngine
from posttrain.scale.weight_sync import make_sync


def staleness(versions: list[int], current: int) -> int:
    """How many updates behind the trainer a batch is: its oldest rollout's version counts."""
    return current - min(versions) if versions else 0


def split_picks(n: int, workers: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each worker's contiguous share of n prompts (the first ones get one more)."""
    q, r = divmod(n, workers)
    bounds, start = [], 0
    for w in range(workers):
        end = start + q + (1 if w < r else 0)
        if end > start:
            bounds.append((start, end))
        start = end
    return bounds


def in_process_order(rollouts: list[Any], env_order: list[str]) -> list[Any]:
    """Rollouts as ``collect_rollouts`` returns them for the whole batch: by environment (config
    order), then group; a stable sort keeps each group's samples in order."""
    rank = {name: i for i, name in enumerate(env_order)}
    return sorted(rollouts, key=lambda r: (rank[r.env], r.group))


class WorkerEngine(TokenEngine):
    """The rollout workers as one engine, for validation and re-profiling on the trainer's side:
    prompts (token ids, each with its own seed) are split between the workers, which sample from
    the newest published weights. ``tokenizer`` and ``model`` (read for its config only) are the
    trainer's."""

    def __init__(self, workers: list[Any], model: Any, tokenizer: Any, batch_size: int) -> None:
        self.workers, self.model, self.tokenizer, self.batch_size = workers, model, tokenizer, batch_size

    def generate_ids(self, prompt_ids: Any, params: Any, seeds: Any = None) -> list[list[Any]]:
        import ray

        from posttrain.engines.hf import row_seed

        if seeds is None:  # as the engines do: a base seed, one stream per prompt position
            import secrets

            base = params.seed if params.seed is not None else secrets.randbits(62)
            seeds = [row_seed(base, i) for i in range(len(prompt_ids))]
        parts = split_picks(len(prompt_ids), len(self.workers))
        refs = [self.workers[w].generate_ids.remote(list(prompt_ids[a:b]), params, list(seeds[a:b]))
                for w, (a, b) in enumerate(parts)]
        return [c for part in ray.get(refs) for c in part]


@dataclass
class Pending:
    step: int
    refs: list[Any]  # one per worker share: (rollouts, metrics) once verified
    submitted: float


class RayRollouts:
    def __init__(self, cfg: Any, roles: Any, t: Any, plan: Callable[[int], tuple[list[Any], int]]) -> None:
        self.cfg, self.roles, self.t, self.plan = cfg, roles, t, plan
        self.sync = make_sync(cfg.scale.weight_sync, cfg.run_dir, roles.rollout)
        self.env_order = [e.name for e in cfg.envs]
        self.inflight: dict[int, Pending] = {}
        self.version = t.start - 1
        self.publish(t.model)  # version = t.start: the weights the first batch samples from

    def engine(self) -> WorkerEngine:
        return WorkerEngine(self.roles.rollout, self.t.model, self.t.tokenizer, self.cfg.rollout.batch_size)

    def publish(self, model: Any) -> None:
        import ray

        from posttrain.train import sharding

        self.version += 1
        if sharding.current() is not None:  # a sharded trainer: every rank takes part in the gather
            sharding.send(("publish", self.version))
        payload = self.sync.publish(model, self.version)
        ray.get(self.roles.store.set.remote(self.version, payload))  # before any later request starts

    def _submit(self, step: int, picks: list[Any], seed: int, group_offset: int = 0) -> Pending:
        rollout, verifier = self.roles.rollout, self.roles.verifier
        refs = []
        for w, (a, b) in enumerate(split_picks(len(picks), len(rollout))):
            sampled = rollout[w].sample.remote(picks[a:b], seed, step, group_offset + a)
            refs.append(verifier[w % len(verifier)].score.remote(sampled))
        return Pending(step, refs, time.perf_counter())

    def _gather(self, pending: Pending) -> tuple[list[Any], dict[str, float]]:
        import ray

        rollouts: list[Any] = []
        m: dict[str, float] = {}
        for part, pm in ray.get(pending.refs):
            rollouts += part
            for k, v in pm.items():
                m[k] = m.get(k, 0.0) + v
        return in_process_order(rollouts, self.env_order), m

    def sample(self, picks: list[Any], seed: int, step: int, group_offset: int = 0
               ) -> tuple[list[Any], dict[str, float]]:
        """Sampled now, from the current weights (refill rounds, a dropped stale batch)."""
        return self._gather(self._submit(step, picks, seed, group_offset))

    def batch(self, step: int, picks: list[Any], seed: int) -> tuple[list[Any], dict[str, float]]:
        """Step ``step``'s rewarded rollouts: the one sampled ahead if any (unless too stale), else now."""
        t0 = time.perf_counter()
        pending = self.inflight.pop(step, None)
        rollouts, m = self._gather(pending) if pending is not None else self.sample(picks, seed, step)
        dropped, dropped_tokens = 0, 0.0
        while staleness([r.sampling.policy_version for r in rollouts], self.version) > self.cfg.scale.max_staleness:
            dropped += 1
            dropped_tokens += sum(r.response_tokens for r in rollouts)
            rollouts, m = self.sample(picks, seed, step)
        last = self.cfg.train.steps - 1
        for s in range(step + 1, min(step + self.cfg.scale.ahead, last) + 1):
            if s not in self.inflight:
                self.inflight[s] = self._submit(s, *self.plan(s))
        m.update(policy_staleness=float(staleness([r.sampling.policy_version for r in rollouts], self.version)),
                 stale_batches_dropped=float(dropped), stale_tokens_dropped=dropped_tokens,
                 time_wait_s=time.perf_counter() - t0)
        return rollouts, m

    def close(self) -> None:
        import ray

        for p in self.inflight.values():  # requests of steps this run will not reach (stop_after, errors)
            for ref in p.refs:
                try:
                    ray.cancel(ref)
                except Exception:  # already finished, or its actor is gone: nothing left to stop
                    pass
        self.inflight.clear()
