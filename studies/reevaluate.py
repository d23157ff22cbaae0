"""Evaluate finished runs again with other evaluation options (e.g. beam search), without
training: each run's saved model, tokenizer and `train_config.yaml` (its options, which train.py
saves with the model and `compare_heads.py` launches it with), with the given `train.py` options on top.

    python -m studies.reevaluate outputs/compare_finetune_restore_stdlib/*/seed* --generation_num_beams 4

Each run's results go to `<run>/eval_results_<options>.json` (reused when present, so a killed
re-evaluation resumes); printed: mean ± std over the runs of each name (the run folder's
parent), as `compare_heads.py` tabulates them, against `tied` when it is among them.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import yaml

from hf_outheads.training import run as training_run, train
from hf_outheads.training.tracking import RESULTS_FILE
from studies.comparison_tables import generation_table, markdown_table, summarise

EVALUATED = ("eval_loss", "eval_perplexity", "eval_sacrebleu", "eval_chrf", "eval_generated")


def reevaluate(run_dir: Path, overrides: list[str], config: Path | None = None) -> dict:
    """The run's final evaluation redone with `overrides` (train.py flags): a dict as
    `eval_results.json`'s, its metrics replaced."""
    tag = "_".join(a.lstrip("-") for a in overrides) or "again"
    saved = run_dir / f"eval_results_{tag}.json"
    if not saved.exists():
        with tempfile.TemporaryDirectory() as scratch:
            # the saved model as it is (no preset, no conversion), its own tokenizer, the run's data options
            as_saved = ["--pretrained", str(run_dir), "--model_preset", "null", "--head_type", "null",
                        "--head_options", "{}", "--tokenizer", str(run_dir)]
            options = train.parse_args(["--config", str(config or run_dir / "train_config.yaml"), *as_saved,
                                        "--output_dir", scratch, "--resume", "never", *overrides])
            run = training_run.prepare_run(options)
            results = training_run.evaluate_all(run.accelerator, run.model, run.eval_dl, run.gen_dl, run.tokenizer, options)
        saved.write_text(json.dumps({k: results[k] for k in EVALUATED if k in results}, indent=1) + "\n")
    return {**json.loads((run_dir / RESULTS_FILE).read_text()), **json.loads(saved.read_text())}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    split = next((i for i, a in enumerate(argv) if a.startswith("--")), len(argv))
    run_dirs, overrides = [Path(a) for a in argv[:split]], argv[split:]
    if not run_dirs:
        raise SystemExit(__doc__)
    runs = []
    for run_dir in run_dirs:
        config = yaml.safe_load((run_dir / "train_config.yaml").read_text())
        results = reevaluate(run_dir, overrides)
        runs.append({"name": run_dir.parent.name, "head": config["head_type"], "head_options": config["head_options"],
                     "seed": config["seed"], **results})
        print(json.dumps({"run": str(run_dir), **{k: results[k] for k in EVALUATED if k in results}}), flush=True)
    rows, best = summarise(runs)
    print(f"\n{' '.join(overrides)}; differences against the best plain head (`{best}`) are of the means.\n")
    print(markdown_table(rows, best))
    if generation := generation_table(rows, runs):  # BLEU and chrF, where the runs generate
        print(generation)


if __name__ == "__main__":
    main()
