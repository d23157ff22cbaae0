"""Tables of a head comparison (`compare_heads.py`): every head against the best plain head,
at equal steps and at equal training FLOPs, and by word-frequency band.

- The baseline is the better of the plain heads (`tied`, `linear`) by its mean over seeds.
  Seeds are paired (same backbone init and data order per seed), so each row also says at
  how many seeds it beat that baseline's run of the same seed.
- Equal FLOPs: every run's curve is interpolated (log metric, linear in FLOPs between two
  evaluations) at the smallest training-FLOP budget any row reached, so a head that costs
  more per step is compared where the cheapest run stopped.
- Bands: perplexity of the validation tokens whose word occurs rarely / moderately / often in
  the training set (`hf_outheads.training.frequency_bands`, the DRILL paper's analysis).
"""

from __future__ import annotations

import math
import statistics

METRICS = [("eval_perplexity", "val. perplexity"), ("eval_sacrebleu", "BLEU"), ("eval_chrf", "chrF")]
HIGHER_IS_BETTER = {"eval_sacrebleu", "eval_chrf"}
PLAIN_HEADS = ("tied", "linear")
BANDS = ("rare", "medium", "frequent")


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def better(metric: str, a: float, b: float) -> bool:
    return a > b if metric in HIGHER_IS_BETTER else a < b


def at_flops(run: dict, metric: str, budget: float, key: str = "train_flops") -> float | None:
    """`metric` of `run` at `budget` training FLOPs (or another curve `key`: "train_seconds"),
    interpolated between evaluations (log of the metric for perplexity); None when the run's
    curve does not reach the budget."""
    points = sorted((p[key], p[metric]) for p in run.get("curve", []) if key in p and metric in p)
    log = metric == "eval_perplexity"
    for (f0, v0), (f1, v1) in zip(points, points[1:]):
        if f0 <= budget <= f1:
            t = (budget - f0) / (f1 - f0) if f1 > f0 else 1.0
            if log:
                return math.exp((1 - t) * math.log(v0) + t * math.log(v1))
            return (1 - t) * v0 + t * v1
    if points and math.isclose(points[-1][0], budget):
        return points[-1][1]
    return None


def summarise(runs: list[dict]) -> tuple[list[dict], str | None]:
    """One row per name (means over seeds), and the name of the best plain row."""
    rows = []
    for name in dict.fromkeys(r["name"] for r in runs):
        done = [r for r in runs if r["name"] == name and "error" not in r]
        row = {"name": name, "seeds": [r["seed"] for r in done],
               "errors": [r["error"] for r in runs if r["name"] == name and "error" in r]}
        if done:
            row.update(head=done[0]["head"], head_options=done[0]["head_options"],
                       parameters=done[0]["parameters"], head_parameters=done[0]["head_parameters"],
                       train_step_time_s=mean_std([r["train_step_time_s"] for r in done])[0],
                       per_seed={key: {r["seed"]: r[key] for r in done if key in r} for key, _ in METRICS})
            for key, _ in METRICS:
                if all(key in r for r in done):
                    row[key] = mean_std([r[key] for r in done])
            if all("train_flops" in r for r in done):
                row["train_flops"] = statistics.fmean(r["train_flops"] for r in done)
            if all("eval_bands" in r for r in done):
                row["bands"] = {band: statistics.fmean(r["eval_bands"][band]["perplexity"] for r in done)
                                for band in BANDS if all(r["eval_bands"][band]["perplexity"] for r in done)}
        rows.append(row)
    metric = main_metric(rows)
    plain = [row for row in rows if row.get("head") in PLAIN_HEADS and metric in row]
    best = None
    for row in plain:
        if best is None or better(metric, row[metric][0], best[metric][0]):
            best = row
    if best is not None:
        budget = min((row["train_flops"] for row in rows if "train_flops" in row), default=None)
        for row in rows:
            compare(row, best, metric, runs, budget)
    return rows, (best["name"] if best else None)


def main_metric(rows: list[dict]) -> str:
    return "eval_perplexity" if any("eval_perplexity" in r for r in rows) else METRICS[1][0]


def compare(row: dict, best: dict, metric: str, runs: list[dict], budget: float | None) -> None:
    """Fills the row's comparisons with the best plain row `best` (in place)."""
    for key, _ in METRICS:
        if key in row and key in best:
            row[f"{key}_vs_best_plain"] = row[key][0] / best[key][0] - 1.0
    paired = [s for s in row.get("seeds", []) if s in best["per_seed"][metric] and s in row["per_seed"][metric]]
    row["seeds_better"] = [sum(better(metric, row["per_seed"][metric][s], best["per_seed"][metric][s]) for s in paired),
                           len(paired)]
    if budget is not None:
        values = [at_flops(r, metric, budget) for r in runs if r["name"] == row["name"] and "error" not in r]
        base = [at_flops(r, metric, budget) for r in runs if r["name"] == best["name"] and "error" not in r]
        if values and None not in values and base and None not in base:
            row["equal_flops"] = {"budget": budget, "value": statistics.fmean(values),
                                  "vs_best_plain": statistics.fmean(values) / statistics.fmean(base) - 1.0}
    if "bands" in row and "bands" in best:
        row["bands_vs_best_plain"] = {b: row["bands"][b] / best["bands"][b] - 1.0 for b in row["bands"] if b in best["bands"]}


def markdown_table(rows: list[dict], best: str | None) -> str:
    metric = main_metric(rows)
    title = dict(METRICS)[metric]
    header = ["run", "head", "seeds", f"{title} (mean ± std)", f"vs best plain ({best})", "better at seeds",
              f"{title} at equal FLOPs", "vs best plain at equal FLOPs", *[f"{b} words" for b in BANDS],
              "train TFLOP", "parameters", "head parameters", "step time (s)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        if "parameters" not in row:
            lines.append(f"| {row['name']} | failed: {'; '.join(row['errors'])} |")
            continue
        pct = lambda v: "" if v is None else f"{100 * v:+.1f}%"
        equal = row.get("equal_flops")
        bands = [f"{row['bands'][b]:.1f} ({pct(row.get('bands_vs_best_plain', {}).get(b))})" if b in row.get("bands", {})
                 else "" for b in BANDS]
        cells = [row["name"], row["head"], str(len(row["seeds"])),
                 f"{row[metric][0]:.2f} ± {row[metric][1]:.2f}" if metric in row else "",
                 pct(row.get(f"{metric}_vs_best_plain")),
                 "{}/{}".format(*row["seeds_better"]) if "seeds_better" in row else "",
                 f"{equal['value']:.2f}" if equal else "", pct(equal["vs_best_plain"]) if equal else "", *bands,
                 f"{row['train_flops'] / 1e12:.2f}" if "train_flops" in row else "",
                 f"{row['parameters']:,}", f"{row['head_parameters']:,}", f"{row['train_step_time_s']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    budget = next((r["equal_flops"]["budget"] for r in rows if "equal_flops" in r), None)
    note = (f"\nEqual FLOPs: each run's curve interpolated at {budget / 1e12:.2f} TFLOP, the smallest training budget "
            "of any row.\n") if budget else ""
    return "\n".join(lines) + "\n" + note


def curve_table(runs: list[dict], key: str = "eval_perplexity") -> str:
    """Mean over seeds of `key` at every evaluation step, one column per run name."""
    names = list(dict.fromkeys(r["name"] for r in runs if "curve" in r))
    points: dict[int, dict[str, list[float]]] = {}
    for run in (r for r in runs if "curve" in r):
        for point in run["curve"]:
            if key in point:
                points.setdefault(point["step"], {}).setdefault(run["name"], []).append(point[key])
    lines = ["| step | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
    for step in sorted(points):
        cells = [f"{statistics.fmean(points[step][n]):.2f}" if n in points[step] else "" for n in names]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


GENERATION_METRICS = [("eval_sacrebleu", "BLEU"), ("eval_chrf", "chrF")]
COPY = "copy source"  # the row of the sources taken as their own translations


def copy_baseline(runs: list[dict]) -> dict[str, tuple[float, float]]:
    """Mean ± std over the finished runs of the scores of the copied source (`eval_copy_<metric>`,
    hf_outheads/training/evaluation.py `copy_scores`); runs of one comparison share the pairs, so the std is 0
    unless runs generated on different pairs."""
    done = [r for r in runs if "error" not in r]
    return {key: mean_std([r[f"eval_copy_{key.removeprefix('eval_')}"] for r in done]) for key, _ in GENERATION_METRICS
            if done and all(f"eval_copy_{key.removeprefix('eval_')}" in r for r in done)}


def generation_table(rows: list[dict], runs: list[dict], margin: float = 1.0) -> str:
    """BLEU and chrF of every row against the best plain head by BLEU, in points: the difference
    of the means, the seeds at which the row is better and at which it is better by at least
    `margin` BLEU (paired by seed), BLEU at equal training FLOPs; a `copy source` row first.
    Empty when no run has BLEU."""
    rows = [row for row in rows if "eval_sacrebleu" in row]
    if not rows:
        return ""
    plain = [row for row in rows if row["head"] in PLAIN_HEADS]
    best = max(plain, key=lambda row: row["eval_sacrebleu"][0]) if plain else None
    budget = min((row["train_flops"] for row in rows if "train_flops" in row), default=None)
    flops_bleu = {row["name"]: _mean_at_flops(runs, row["name"], budget) for row in rows}
    name = best["name"] if best else "none"
    header = ["run", "seeds", "BLEU (mean ± std)", f"BLEU vs {name}", "better at seeds", f">= +{margin:g} BLEU at seeds",
              "BLEU at equal FLOPs", f"vs {name} at equal FLOPs", "chrF (mean ± std)", f"chrF vs {name}", "val. perplexity"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    points = lambda a, b: "" if a is None or b is None else f"{a - b:+.2f}"
    score = lambda v: "" if v is None else f"{v[0]:.2f} ± {v[1]:.2f}"
    best_bleu = best["eval_sacrebleu"][0] if best else None
    best_chrf = best["eval_chrf"][0] if best and "eval_chrf" in best else None
    copy = copy_baseline(runs)
    if copy:
        bleu, chrf = copy["eval_sacrebleu"], copy.get("eval_chrf")
        cells = [COPY, "", score(bleu), points(bleu[0], best_bleu), "", "", "", "", score(chrf),
                 points(chrf and chrf[0], best_chrf), ""]
        lines.append("| " + " | ".join(cells) + " |")
    for row in rows:
        bleu = row["per_seed"]["eval_sacrebleu"]
        paired = [s for s in bleu if best and s in best["per_seed"]["eval_sacrebleu"]]
        diffs = [bleu[s] - best["per_seed"]["eval_sacrebleu"][s] for s in paired]
        chrf = row.get("eval_chrf")
        cells = [row["name"], str(len(row["seeds"])), score(row["eval_sacrebleu"]), points(row["eval_sacrebleu"][0], best_bleu),
                 f"{sum(d > 0 for d in diffs)}/{len(diffs)}" if best else "",
                 f"{sum(d >= margin for d in diffs)}/{len(diffs)}" if best else "",
                 "" if flops_bleu[row["name"]] is None else f"{flops_bleu[row['name']]:.2f}",
                 points(flops_bleu[row["name"]], best and flops_bleu[best["name"]]),
                 score(chrf), points(chrf and chrf[0], best_chrf),
                 f"{row['eval_perplexity'][0]:.2f}" if "eval_perplexity" in row else ""]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"Against the best plain head by BLEU (`{name}`, the better of `tied` and `linear`); differences in "
             "points, of the means; seeds paired."]
    if copy and best:
        gap = best_bleu - copy["eval_sacrebleu"][0]
        notes.append(f"The copied source scores BLEU {copy['eval_sacrebleu'][0]:.2f}: `{name}` is "
                     f"{abs(gap):.2f} BLEU {'above' if gap >= 0 else 'below'} it.")
    if budget is not None and any(v is not None for v in flops_bleu.values()):
        notes.append(f"Equal FLOPs: BLEU interpolated linearly between evaluations at {budget / 1e12:.2f} TFLOP.")
    return "\n".join(lines) + "\n\n" + " ".join(notes) + "\n"


def _mean_at_flops(runs: list[dict], name: str, budget: float | None) -> float | None:
    values = [at_flops(r, "eval_sacrebleu", budget) for r in runs if r["name"] == name and "error" not in r]
    return statistics.fmean(values) if budget is not None and values and None not in values else None
