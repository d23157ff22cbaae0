"""The offline quickstart: train, evaluate and write a model card on the Python standard
library's docstrings, with no download, in a few minutes on 2 CPU cores.

    hf-outheads quickstart            # language modelling, then seq2seq
    hf-outheads quickstart --task lm  # only one of them

Each task is a normal `hf-outheads train` run, trained in this process (`run.train_in_process`), so
what it prints (perplexity, BLEU, a generated sample, where the card is) is what the command printed
before it runs gives (`by_hand_command`; training/README.md shows it). An earlier quickstart's models
are kept unless `--overwrite_output_dir true` is given. Every task's options are checked
(`train.parse_args`) before the first one trains, so a wrong option is one line and exit status 2
with nothing trained.
With no other option the quickstart checks its figures against the stated ones (`EXPECTED`,
`check_figures`) and ends with status 1 when one is off.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hf_outheads.head_options import DeclaredOptions, choice, flag, text
from hf_outheads.training import train
from hf_outheads.tools.command_line import CommandParser, refuse
from hf_outheads.training.declared_flags import add_declared, declared_values
from hf_outheads.training.safeguards import earlier_work

HERE = Path(__file__).resolve().parent  # training/ in a checkout, hf_outheads/training installed
TASKS = {"lm": HERE / "configs" / "quickstart_lm.yaml", "seq2seq": HERE / "configs" / "quickstart_seq2seq.yaml"}

# The figures the quickstart states (training/README.md, "What the quickstart shows") and checks, with a
# tolerance that holds across machines: the same Python (the corpus is its standard library) and torch give
# other figures on other processors (their floating-point kernels), most of all BLEU through beam search
# (1,200 steps of seq2seq gave BLEU 62.41 and 59.36, chrF 83.78 and 82.15 on two x86-64 machines).
# task -> metric -> (stated value, largest difference allowed)
EXPECTED = {
    "lm": {"eval_perplexity": (106.22, 3.0)},
    "seq2seq": {"eval_sacrebleu": (70.26, 4.0), "eval_chrf": (88.05, 2.0)},
}
EXPECTED_PYTHON = (3, 11)
# seq2seq: the model must also beat copying its source unchanged on every metric it prints
BEATS_COPY = {"seq2seq": ("eval_sacrebleu", "eval_chrf")}


@dataclass(frozen=True)
class QuickstartOptions(DeclaredOptions):
    """Which quickstart runs, and where."""

    task: str = choice("both", (*TASKS, "both"), help="Which quickstart to run.")
    output_root: str = text("outputs", help="Folder that receives quickstart_lm/ and quickstart_seq2seq/.")
    overwrite_output_dir: bool = flag(False, help=(
        "true: replace an earlier quickstart's models in output_root (false: keep them and stop)."))


def parse_args(argv=None):
    """The `QuickstartOptions` (as the namespace's attributes) and, in `overrides`, the other
    `--key value` options, which go to train.py."""
    parser = CommandParser(description=__doc__, epilog=(
        "Any other --key value options are passed to train.py (e.g. --head_type drill); the figures are checked only "
        "without them."))
    add_declared(parser, QuickstartOptions)
    args, overrides = parser.parse_known_args(argv)  # argparse.REMAINDER would refuse a leading --key
    try:
        options = QuickstartOptions(**declared_values(QuickstartOptions, vars(args)))
    except ValueError as error:
        parser.error(str(error))
    return argparse.Namespace(**dataclasses.asdict(options), overrides=overrides)


def by_hand_command(task: str, output_dir: Path, overrides: list[str]) -> list[str]:
    """The command that trains quickstart `task` as the quickstart does (one process, in full
    precision, from any folder: the config is found among the package's when not in the folder)."""
    return ["hf-outheads", "train", "--config", f"hf_outheads/training/configs/{TASKS[task].name}", "--output_dir", str(output_dir),
            "--resume", "never", *overrides]


FIGURE_NAMES = {"eval_perplexity": "perplexity", "eval_sacrebleu": "BLEU", "eval_chrf": "chrF"}


def stated_figures(task: str, results: dict):
    """(key, what is stated, what is wrong when off, off) for each figure the quickstart states:
    `EXPECTED`'s values within their tolerances, and `BEATS_COPY`'s above the copied source."""
    for key, (stated, tolerance) in EXPECTED[task].items():
        yield (key, f"stated {stated} +- {tolerance}", f"is not within {tolerance} of the stated {stated}",
               abs(results[key] - stated) > tolerance)
    for key in BEATS_COPY.get(task, ()):
        copied = results[key.replace("eval_", "eval_copy_")]
        yield (key, f"stated: above the copied source's {copied:.2f}", f"does not beat the copied source's {copied:.2f}",
               results[key] <= copied)


def check_figures(task: str, results: dict) -> list[str]:
    """What is off in a quickstart's results against the stated figures (empty: as stated)."""
    return [f"{key} {results[key]:.2f} {wrong}" for key, _, wrong, off in stated_figures(task, results) if off]


def figure_lines(task: str, results: dict, not_checked: str | None = None) -> list[str]:
    """One line per stated figure: the run's value beside the stated one, then `as stated`, `OFF`, or
    `not checked (<not_checked>)`."""
    def verdict(off: bool) -> str:
        return f"not checked ({not_checked})" if not_checked else "OFF" if off else "as stated"

    return [f"{FIGURE_NAMES[key]} {results[key]:.2f} ({stated}): {verdict(off)}"
            for key, stated, _, off in stated_figures(task, results)]


def task_options(output_dirs: dict, overrides: list[str]) -> dict:
    """Each task's train.py options, parsed and checked as train.py checks them (`train.parse_args`:
    one line and exit status 2 for a wrong one) before any task trains."""
    return {task: train.parse_args(["--config", str(TASKS[task]), "--output_dir", str(output_dir), "--resume", "never",
                                 *overrides]) for task, output_dir in output_dirs.items()}


def main(argv=None):
    args = parse_args(argv)
    tasks = list(TASKS) if args.task == "both" else [args.task]
    output_dirs = {task: Path(args.output_root) / TASKS[task].stem for task in tasks}
    for task, output_dir in output_dirs.items():  # before anything is trained: keep an earlier quickstart's models
        work = earlier_work(output_dir)
        if work and not args.overwrite_output_dir:
            raise refuse(f"=== quickstart: {work}. Keep it with --output_root <another folder>, or replace it "
                         "with --overwrite_output_dir true.")
        if work:
            print(f"=== quickstart {task}: replacing the earlier run in {output_dir} (--overwrite_output_dir true)")
    overrides = [*args.overrides, *(["--overwrite_output_dir", "true"] if args.overwrite_output_dir else [])]
    options = task_options(output_dirs, overrides)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # as the command would: no fork warnings
    off = []
    for task, output_dir in output_dirs.items():
        print(f"\n=== quickstart {task}: {TASKS[task].name} -> {output_dir}\n=== by hand: "
              f"{shlex.join(by_hand_command(task, output_dir, overrides))}", flush=True)
        started = time.perf_counter()
        train.main(options=options[task], in_process=True)
        print(f"=== {task} done in {time.perf_counter() - started:.0f} s", flush=True)
        saved = output_dir / "eval_results.json"
        if not saved.is_file():  # a run told to stop early (stop_after_steps) has evaluated nothing
            print(f"=== {task}: figures not checked: the run wrote no {saved.name}", flush=True)
            continue
        results, not_checked = json.loads(saved.read_text()), None
        if args.overrides:
            not_checked = f"options given: {shlex.join(args.overrides)}"
        elif sys.version_info[:2] != EXPECTED_PYTHON:
            not_checked = (f"stated for Python {'.'.join(map(str, EXPECTED_PYTHON))}, whose standard library is the "
                           "corpus")
        else:
            off += [f"{task}: {problem}" for problem in check_figures(task, results)]
        print(f"=== {task}: figures (training/README.md, \"What the quickstart shows\"):", flush=True)
        for line in figure_lines(task, results, not_checked):
            print(f"===   {line}", flush=True)
    if off:
        raise SystemExit(f"=== quickstart: figures off the stated ones: {'; '.join(off)}")


if __name__ == "__main__":
    main()
