"""The offline quickstart: train, evaluate and write a model card on the Python standard
library's docstrings, with no download, in a few minutes on 2 CPU cores.

    python -m training.quickstart            # language modelling, then seq2seq
    python -m training.quickstart --task lm  # only one of them

Each task is a normal `accelerate launch -m training.train` run (`by_hand_command`, printed
before it runs; training/README.md shows it), so what it prints (perplexity, BLEU, a generated
sample, where the card is) is what that command gives.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository: `training` importable from it
CONFIGS = ROOT / "training" / "configs"
TASKS = {"lm": CONFIGS / "quickstart_lm.yaml", "seq2seq": CONFIGS / "quickstart_seq2seq.yaml"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=[*TASKS, "both"], default="both", help="Which quickstart to run.")
    parser.add_argument("--output_root", default="outputs", help="Folder that receives quickstart_lm/ and quickstart_seq2seq/.")
    parser.epilog = "Any other --key value options are passed to train.py (e.g. --head_type drill)."
    args, args.overrides = parser.parse_known_args(argv)  # argparse.REMAINDER would refuse a leading --key
    return args


# one process, full precision, whatever `accelerate config` set up: the run the READMEs' numbers are of
LAUNCH_ARGS = ["--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]


def by_hand_command(task: str, output_dir: Path, overrides: list[str]) -> list[str]:
    """The command, from the repository root, that runs quickstart `task` as the quickstart does."""
    return ["accelerate", "launch", *LAUNCH_ARGS, "-m", "training.train", "--config", f"training/configs/{TASKS[task].name}",
            "--output_dir", str(output_dir), "--resume", "never", *overrides]


def launch_command(task: str, output_dir: Path, overrides: list[str]) -> list[str]:
    """`by_hand_command` with this interpreter's accelerate and absolute paths (any working directory:
    `main` puts the repository on the run's PYTHONPATH)."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--quiet", *LAUNCH_ARGS, "-m", "training.train",
            "--config", str(TASKS[task]), "--output_dir", str(output_dir), "--resume", "never", *overrides]


def main(argv=None):
    args = parse_args(argv)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for task in (TASKS if args.task == "both" else [args.task]):
        output_dir = Path(args.output_root) / TASKS[task].stem
        print(f"\n=== quickstart {task}: {TASKS[task].name} -> {output_dir}\n=== by hand: "
              f"{shlex.join(by_hand_command(task, output_dir, args.overrides))}", flush=True)
        started = time.perf_counter()
        done = subprocess.run(launch_command(task, output_dir, args.overrides), env=env)
        if done.returncode:  # train.py has printed why
            raise SystemExit(f"=== quickstart {task} failed (exit status {done.returncode})")
        print(f"=== {task} done in {time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
