"""Plots of a run's metrics (written next to ``metrics.jsonl``)."""

from __future__ import annotations

from pathlib import Path


def plot_metrics(run_dir: Path) -> Path | None:
    """``rewards.png``: batch reward and pass rate per environment, validation reward, and (with a
    curriculum) the target vs the batch pass rate with the re-profiling steps, by step."""
    from posttrain.train.metrics import read_metrics

    rows = read_metrics(run_dir)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("reward", "batch reward"), ("pass_rate", "batch pass rate"), ("val_reward", "validation (greedy)")]
    curriculum = any("curriculum_target" in r for r in rows)
    fig, axes = plt.subplots(1, 3 + curriculum, figsize=(14 + 4.5 * curriculum, 3.8))
    if curriculum:  # what the sampler aimed at vs what the batches got, and the re-profiles
        ax = axes[3]
        for k, label in (("curriculum_target", "target pass rate"), ("pass_rate", "batch pass rate"),
                         ("pass_rate_gain", "gain over profile")):
            pts = [(r["step"], r[k]) for r in rows if k in r]
            if pts:
                ax.plot(*zip(*pts), label=label, lw=1.5)
        for r in rows:
            if r.get("reprofiled"):
                ax.axvline(r["step"], color="grey", ls="--", lw=1)
        ax.axhline(0, color="black", lw=0.5)
        ax.set_title("curriculum (dashed: re-profiled)")
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    for ax, (prefix, title) in zip(axes, panels):
        keys = sorted({k for r in rows for k in r if k == prefix or k.startswith(prefix + "/")})
        for k in keys:
            pts = [(r["step"], r[k]) for r in rows if k in r]
            ax.plot(*zip(*pts), marker="o" if len(pts) < 30 else None, ms=3, label=k,
                    lw=2 if k == prefix else 1)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylim(-0.02, 1.02)
        if keys:
            ax.legend(fontsize=7)
    fig.tight_layout()
    path = run_dir / "rewards.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
