"""Which head helps on my data? Train the same backbone on the same data, with the same
budget and seeds, once per head, and tabulate validation perplexity (and BLEU/chrF for
seq2seq), parameter counts and step time.

    python training/compare_heads.py --config training/configs/compare_stdlib_lm.yaml \\
        --heads tied,linear,bilinear --output_dir outputs/compare [--key value ...]

Each head is a separate `accelerate launch training/train.py` run (its options from the
config's `head_options_by_head`), in `<output_dir>/<head>/` with its resolved config, log
and model card. The comparison is written to `<output_dir>/results.md`, `results.json`
and `comparison.png` (with matplotlib).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `training` importable when run as a script

import yaml

from training.options import parse_options
from training.tracking import RESULTS_FILE, read_metrics

TRAIN_SCRIPT = Path(__file__).resolve().parent / "train.py"
COLUMNS = [  # (result key, column title, format)
    ("eval_perplexity", "val. perplexity", "{:.2f}"),
    ("eval_sacrebleu", "BLEU", "{:.2f}"),
    ("eval_chrf", "chrF", "{:.2f}"),
    ("parameters", "parameters", "{:,}"),
    ("head_parameters", "head parameters", "{:,}"),
    ("train_step_time_s", "step time (s)", "{:.3f}"),
]


def add_flags(parser):
    parser.add_argument("--heads", required=True, help="Comma-separated head types to compare, e.g. tied,linear,bilinear.")
    parser.add_argument("--launch_args", default="--num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no",
                        help="Arguments for `accelerate launch` before the script (quote them as one string).")
    parser.add_argument("--no_plot", action="store_true", help="Skip comparison.png even if matplotlib is installed.")


def check_heads(heads: list[str]) -> None:
    from hf_outheads import HEAD_CLASSES

    unknown = [head for head in heads if head not in HEAD_CLASSES]
    if unknown:
        raise SystemExit(f"Head(s) {unknown} are not registered in hf_outheads.HEAD_CLASSES. "
                         f"Registered heads: {sorted(HEAD_CLASSES)}.")


def run_head(options, head: str, launch_args: str) -> dict:
    """Train one head in a subprocess; its eval_results.json plus wall time, or the error."""
    run_dir = Path(options.output_dir) / head
    run_dir.mkdir(parents=True, exist_ok=True)
    config = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
    config.update(head_type=head, output_dir=str(run_dir), resume="never", push_to_hub=False)
    (run_dir / "train_config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    command = [sys.executable, "-m", "accelerate.commands.launch", *shlex.split(launch_args), str(TRAIN_SCRIPT),
               "--config", str(run_dir / "train_config.yaml")]
    print(f"=== {head}: {' '.join(command)}", flush=True)
    started = time.perf_counter()
    with (run_dir / "train.log").open("w") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        tail = (run_dir / "train.log").read_text().strip().splitlines()[-5:]
        print(f"=== {head} failed:\n" + "\n".join(tail), flush=True)
        return {"head": head, "error": tail[-1] if tail else f"exit code {done.returncode}"}
    results = json.loads((run_dir / RESULTS_FILE).read_text())
    return {"head": head, "wall_time_s": time.perf_counter() - started, **results}


def markdown_table(rows: list[dict], baseline: str | None) -> str:
    columns = [c for c in COLUMNS if any(c[0] in row for row in rows)]
    base = next((r for r in rows if r["head"] == baseline and "train_step_time_s" in r), None)
    header = ["head", *[title for _, title, _ in columns]] + (["step time vs " + baseline] if base else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['head']} | failed: {row['error']} |")
            continue
        cells = [row["head"], *[fmt.format(row[key]) if key in row else "" for key, _, fmt in columns]]
        if base:
            cells.append(f"{row['train_step_time_s'] / base['train_step_time_s']:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], output_dir: Path) -> Path | None:
    """Validation perplexity against steps, one line per head."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axis = plt.subplots(figsize=(7, 4))
    for row in rows:
        points = [(r["step"], r["eval_perplexity"]) for r in read_metrics(output_dir / row["head"]) if "eval_perplexity" in r]
        if points:
            axis.plot(*zip(*points), "o-", label=row["head"])
    axis.set(xlabel="optimizer step", ylabel="validation perplexity", yscale="log", title="Heads compared")
    axis.legend(loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    fig.savefig(output_dir / "comparison.png", dpi=100)
    plt.close(fig)
    return output_dir / "comparison.png"


def main(argv=None):
    options = parse_options(argv, description=__doc__, extra=add_flags)
    heads = [h.strip() for h in options.extra["heads"].split(",") if h.strip()]
    check_heads(heads)
    output_dir = Path(options.output_dir)
    rows = [run_head(options, head, options.extra["launch_args"]) for head in heads]
    baseline = "tied" if "tied" in heads else heads[0]
    command = "python " + " ".join(shlex.quote(a) for a in (sys.argv if argv is None else [__file__, *argv]))
    table = markdown_table(rows, baseline)
    (output_dir / "results.md").write_text(f"Command: `{command}`\n\n{table}")
    (output_dir / "results.json").write_text(json.dumps({"command": command, "rows": rows}, indent=2) + "\n")
    if not options.extra["no_plot"]:
        plot([r for r in rows if "error" not in r], output_dir)
    print(table)
    print(f"Written: {output_dir / 'results.md'}, {output_dir / 'results.json'}")
    return rows


if __name__ == "__main__":
    main()
