"""Compression by pruning and distillation (Minitron / MiniPuzzle), see docs/prune.md.

``importance``: per-channel, per-head, per-expert and per-layer scores from activations on a
calibration set. ``slicing``: the smaller architecture's config and its weights cut from the big
one (a plain HF checkpoint). ``prune``: the ``posttrain prune`` entry point. ``distill_logits``: the
off-policy forward-KL stage on the one training loop (``posttrain distill-logits``).
"""
