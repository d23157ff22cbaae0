"""Plots of a head comparison (`compare_heads.py`): a metric per evaluation against optimizer
steps, cumulated training seconds and training FLOPs, mean over seeds with the seeds' range shaded."""

from __future__ import annotations

import statistics
from pathlib import Path


def _series(runs: list[dict], name: str, metric: str, x_key: str) -> tuple[list, list, list, list]:
    """Mean x, mean / min / max metric over the seeds, at the evaluation steps every seed has."""
    curves = [[p for p in r["curve"] if metric in p and x_key in p] for r in runs if r["name"] == name and "curve" in r]
    steps = sorted(set.intersection(*[{p["step"] for p in c} for c in curves])) if curves else []
    xs, mean, low, high = [], [], [], []
    for step in steps:
        at = [next(p for p in c if p["step"] == step) for c in curves]
        values = [p[metric] for p in at]
        xs.append(statistics.fmean(p[x_key] for p in at))
        mean.append(statistics.fmean(values))
        low.append(min(values))
        high.append(max(values))
    return xs, mean, low, high


def plot_curves(runs: list[dict], output_dir: Path, metric: str = "eval_perplexity") -> list[Path]:
    """`curves.png` (against steps), `walltime.png` (against training seconds) and `flops.png`
    (against training FLOPs, when the runs logged them); [] without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    names = list(dict.fromkeys(r["name"] for r in runs if "curve" in r))
    written = []
    for x_key, label, file in (("step", "optimizer step", "curves.png"),
                               ("train_seconds", "training seconds (evaluation excluded)", "walltime.png"),
                               ("train_flops", "training FLOPs (analytic: backbone and head, forward and backward)",
                                "flops.png")):
        if not any(x_key in p for r in runs for p in r.get("curve", [])):
            continue
        fig, axis = plt.subplots(figsize=(8, 4.5))
        for name in names:
            xs, mean, low, high = _series(runs, name, metric, x_key)
            if xs:
                line, = axis.plot(xs, mean, "o-", markersize=3, label=name)
                axis.fill_between(xs, low, high, color=line.get_color(), alpha=0.15)
        log_scale = metric == "eval_perplexity"
        axis.set(xlabel=label, ylabel=metric.replace("eval_", "validation "), yscale="log" if log_scale else "linear",
                 title="Heads compared: mean over seeds, range shaded")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8)
        fig.tight_layout()
        fig.savefig(output_dir / file, dpi=100)
        plt.close(fig)
        written.append(output_dir / file)
    return written
