"""Warmup-Stable-Decay learning-rate schedule (docs/recipe.md §6).

Linear warm-up from 0 to the peak over ``warmup_steps``, constant at the peak, then a linear decay
to ``min_lr_ratio × peak`` over the last ``decay_frac`` of the run. Unlike cosine, the long stable
phase lets a run be extended or branched (decay from any stable checkpoint) without retuning.
"""

from __future__ import annotations


def wsd_lr_factor(step: int, total_steps: int, warmup_steps: int, decay_frac: float, min_lr_ratio: float = 0.0) -> float:
    """Multiplier of the peak LR at optimizer step ``step`` (0-based)."""
    if total_steps <= 0:
        return 1.0
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = int(round(decay_frac * total_steps))
    decay_start = total_steps - decay_steps
    if decay_steps <= 0 or step < decay_start:
        return 1.0
    progress = (step - decay_start + 1) / decay_steps
    return 1.0 - (1.0 - min_lr_ratio) * min(1.0, progress)
