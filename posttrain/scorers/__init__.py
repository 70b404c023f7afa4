"""Scorers: what turns sampled rollouts into training signal, as a list of plug-ins.

Two phases, so the RL loop runs any list of them without knowing what they compute:

* ``reward`` scorers run on the raw rollouts and set each one's ``reward`` (and ``reason``):
  :class:`~posttrain.scorers.verifier.VerifierReward` (the environment's verifier); a generative
  reward model is the next one.
* ``signal`` scorers run on the filtered :class:`~posttrain.algos.advantages.ScoredBatch` and add
  per-token tensors to it: :class:`~posttrain.scorers.teachers.ScoringTeacherPool` (teacher
  log-probs for distillation, and optionally their top-k for the ``topk_kl`` loss term).

Each returns a dict of metrics for the step's log line.
"""
