"""Policy × environment: one-turn collection and the multi-turn tool loop, over any engine.

``multiturn.run_episodes`` plays tasks of one environment with a ``Generator`` and returns
trajectories (exact token ids, loss mask, sampler log-probs); ``collect`` turns them into the
``Rollout`` records the trainer and the scorers read, each carrying how it was sampled.
"""
