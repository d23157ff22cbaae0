"""Which head helps on my data? Train the same backbone on the same data and budget once per
head (or head variant) and seed, and tabulate validation perplexity (BLEU/chrF for seq2seq)
as mean ± std over seeds, the learning curves, and perplexity against training seconds.

    python -m studies.compare_heads --config studies/configs/compare_stdlib_lm.yaml \\
        --heads tied,drill,mos --seeds 1,2,3 --jobs 2 --output_dir outputs/compare

`--heads` lists run names. A name is a head type, or a key of the config's
`head_options_by_head` whose options hold `head_type` (a variant, e.g.
`mos-paper: {head_type: mos, latent_init: uniform}`). Every (name, seed) run is a separate
`accelerate launch -m hf_outheads.training.train` in `<output_dir>/<name>/seed<seed>/`; a run whose
results exist is reused, so a killed comparison resumes where it stopped. With `--jobs N`,
N runs train at once, each with `cores / N` torch threads. Written: `results.md`,
`results.json`, `curves.png` (perplexity per evaluation, mean and range over seeds) and
`walltime.png` (the same against cumulated training seconds). Each run of results.json names what
trained it (`produced_by`: the code's commit and the packages' versions, `studies/provenance.py`),
and results.json the command.

`--add_to <folder>` adds runs to a written comparison (its `results.json`, e.g. a regime's in
studies/results) without training its other runs again: only `--heads` train (with the comparison's
own config and flags), at its seeds, and replace the runs of the same names; the tables are written
from all of them into that folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from hf_outheads.training.launching import run_precision
from hf_outheads.training.options import CONFIG_FILE, parse_options, saved_options
from hf_outheads.training.tracking import RESULTS_FILE, read_metrics
from studies.comparison_tables import METRICS, curve_table, generation_table, main_metric, markdown_table, summarise
from studies.provenance import produced_by

PRODUCED_BY = "produced_by.json"  # a run's `provenance.produced_by`, written when it was trained

def add_flags(parser):
    parser.add_argument("--heads", required=True, help="Comma-separated run names: head types or variants (see above).")
    parser.add_argument("--seeds", default=None, help="Comma-separated seeds (default: the config's seed).")
    parser.add_argument("--jobs", type=int, default=1, help="Runs trained at once (each gets cores / jobs threads).")
    parser.add_argument("--launch_args", default="--num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no",
                        help="Arguments for `accelerate launch` before the script (quote them as one string).")
    parser.add_argument("--no_plot", action="store_true", help="Skip the plots even if matplotlib is installed.")
    parser.add_argument("--add_to", type=Path, default=None,
                        help="A comparison's folder (with results.json): train only --heads at its seeds, keep its other "
                             "runs, and write the merged tables there (give the comparison's own config and flags).")


def run_specs(options, names: list[str]) -> dict[str, tuple[str, dict]]:
    """name -> (head type, every option spelt out): each name's head as train.py builds it
    (`ModelOptions.head_spec`); a head type or option train.py would refuse fails here, before
    anything trains. Spelt out (the head's current defaults under the given options), so that a
    run trained under other defaults is not reused."""
    specs, unknown, errors = {}, [], []
    for name in names:
        try:
            spec = options.model.head_spec(name)
            specs[name] = (spec.head_type, spec.spelt_out())
        except ValueError as error:
            unknown.append(name)
            errors.append(str(error))
    if unknown:
        raise SystemExit(f"Run(s) {sorted(set(unknown))} cannot be trained: {errors[0]}")
    return specs


def launch_precision(options, launch_args: str) -> str:
    """The mixed precision the run trains with and saves in its train_config.yaml (`launching.run_precision`), the
    launch's being `--mixed_precision` of `launch_args`."""
    launch = argparse.ArgumentParser(add_help=False)
    launch.add_argument("--mixed_precision", default=None)
    given = launch.parse_known_args(shlex.split(launch_args))[0].mixed_precision
    return run_precision(options.training.mixed_precision, given)


def run_one(options, name: str, spec: tuple[str, dict], seed: int, launch_args: str, threads: int) -> dict:
    """Train one (name, seed) in a subprocess, or reuse its finished results."""
    run_dir = Path(options.training.output_dir) / name / f"seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    config = {**saved_options(options), "head_type": spec[0], "head_options": spec[1], "head_options_by_head": {},
              "seed": seed, "output_dir": str(run_dir), "resume": "never", "push_to_hub": False,
              "mixed_precision": launch_precision(options, launch_args)}
    text = yaml.safe_dump(config, sort_keys=False)  # train.py saves the same file when it finishes
    config_path, results_path, produced = run_dir / CONFIG_FILE, run_dir / RESULTS_FILE, run_dir / PRODUCED_BY
    # the same options in another order (a refactor of an options class) are the same run
    if results_path.exists() and config_path.exists() and yaml.safe_load(config_path.read_text()) == yaml.safe_load(text):
        print(f"=== {name} seed {seed}: reusing {results_path}", flush=True)
    else:
        results_path.unlink(missing_ok=True)
        produced.unlink(missing_ok=True)
        config_path.write_text(text)
        command = [sys.executable, "-m", "accelerate.commands.launch", *shlex.split(launch_args), "-m", "hf_outheads.training.train",
                   "--config", str(config_path), "--overwrite_output_dir", "true"]
        print(f"=== {name} seed {seed}: {' '.join(command)}", flush=True)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads)}
        with (run_dir / "train.log").open("w") as log:
            done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        if done.returncode != 0:
            tail = (run_dir / "train.log").read_text().strip().splitlines()[-5:]
            print(f"=== {name} seed {seed} failed:\n" + "\n".join(tail), flush=True)
            return {"name": name, "seed": seed, "error": tail[-1] if tail else f"exit code {done.returncode}"}
        produced.write_text(json.dumps(produced_by(), indent=1) + "\n")
    curve = [{k: r[k] for k in ("step", "train_seconds", "train_flops", *dict(METRICS)) if k in r}
             for r in read_metrics(run_dir) if any(m in r for m in dict(METRICS))]
    run = {"name": name, "head": spec[0], "head_options": spec[1], "seed": seed,
           **json.loads(results_path.read_text()), "curve": curve}
    if produced.exists():  # (a run trained before runs recorded it has none)
        run["produced_by"] = json.loads(produced.read_text())
    return fill_flops(run, run_dir, options)


def fill_flops(run: dict, run_dir: Path, options) -> dict:
    """A run trained before FLOPs were logged: its per-step FLOPs from its saved model config
    (built on the meta device), and `train_flops` at every evaluation of its curve."""
    if "error" in run or "train_flops_per_step" in run or not (run_dir / "config.json").exists():
        return run
    import torch
    from transformers import AutoConfig

    from hf_outheads.training.modeling import model_class, step_flops

    with torch.device("meta"):
        model = model_class(options.model.task)(AutoConfig.from_pretrained(run_dir))
    per_step = step_flops(model, options, 1)
    run["train_flops_per_step"], run["train_flops"] = per_step, per_step * run["curve"][-1]["step"]
    for point in run["curve"]:
        point["train_flops"] = per_step * point["step"]
    return run


def main(argv=None):
    options = parse_options(argv, description=__doc__, extra=add_flags)
    extra = options.extra
    names = [h.strip() for h in extra["heads"].split(",") if h.strip()]
    seeds = [int(s) for s in extra["seeds"].split(",")] if extra["seeds"] else [options.training.seed]
    saved = json.loads((extra["add_to"] / "results.json").read_text()) if extra["add_to"] else None
    if saved is not None and extra["seeds"] is None:
        seeds = saved["seeds"]
    elif saved is not None and seeds != saved["seeds"]:
        raise SystemExit(f"--add_to {extra['add_to']}: its runs are at seeds {saved['seeds']}, not {seeds}: the added "
                         "runs must pair with them (drop --seeds).")
    specs = run_specs(options, names)
    jobs = max(1, extra["jobs"])
    threads = max(1, (os.cpu_count() or 1) // jobs)
    output_dir = Path(options.training.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(jobs) as pool:
        runs = list(pool.map(lambda job: run_one(options, job[0], specs[job[0]], job[1], extra["launch_args"], threads),
                             [(name, seed) for name in names for seed in seeds]))
    command = "python -m studies.compare_heads " + shlex.join(sys.argv[1:] if argv is None else argv)
    if saved is not None:  # the comparison's other runs as they were, then the added ones
        if failed := [f"{run['name']} seed {run['seed']}" for run in runs if "error" in run]:
            raise SystemExit(f"--add_to {extra['add_to']}: left as it was, since {', '.join(failed)} failed "
                             f"(see train.log under {output_dir}).")
        runs = [run for run in saved["runs"] if run["name"] not in names] + runs
        command, output_dir = f"{saved['command']}; then {command}", extra["add_to"]
    return write_results(output_dir, command, seeds, runs, plot=not extra["no_plot"])


def write_results(output_dir: Path, command: str, seeds: list[int], runs: list[dict], plot: bool = True) -> list[dict]:
    """`results.md`, `results.json` and the plots of a comparison's runs (also `regimes.py --retabulate`)."""
    rows, best = summarise(runs)
    metric = main_metric(rows)
    text = (f"Command: `{command}`\n\nSeeds: {seeds}. Differences against the best plain head (`{best}`, the better "
            f"of `tied` and `linear`) are of the means; \"better at seeds\" pairs each seed with its run.\n\n"
            f"{markdown_table(rows, best)}\nMean {metric} at every evaluation:\n\n{curve_table(runs, metric)}")
    if generation := generation_table(rows, runs):
        text += f"\nBLEU and chrF of generate():\n\n{generation}\nMean BLEU at every evaluation:\n\n{curve_table(runs, 'eval_sacrebleu')}"
    (output_dir / "results.md").write_text(text)
    (output_dir / "results.json").write_text(json.dumps({"command": command, "seeds": seeds, "best_plain": best,
                                                          "rows": rows, "runs": runs}, indent=1) + "\n")
    if plot:
        from studies.study_plots import plot_curves

        plot_curves(runs, output_dir, metric)
    print(text)
    print(f"Written: {output_dir / 'results.md'}, {output_dir / 'results.json'}")
    return rows


if __name__ == "__main__":
    main()
