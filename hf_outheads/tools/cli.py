"""`hf-outheads`, the installed command (pyproject.toml `[project.scripts]`):

    hf-outheads quickstart [--task lm|seq2seq|both] [--output_root outputs]   # the main job, offline
    hf-outheads train --config training/configs/quickstart_lm.yaml [--key value ...]
    hf-outheads export <trained_dir> <out_dir> [--approximate --text-file FILE] [--overwrite]
    hf-outheads mtp-distill <run_dir> --output_dir <out_dir> [--prompts 512 --max_steps 300]
    hf-outheads serve [MODEL] [transformers serve options]                    # transformers' own server

Each calls the `main(argv)` of its module, in this process: `quickstart`, `train`, `export` and
`mtp_distill` of `hf_outheads.training` (the repository's `training/` folder, installed under the
package), which need the training stack, and `hf_outheads.tools.serve`, which needs the server's
packages.
With no command, or an unknown one, it prints the usage on stderr and exits with status 2, as an
argparse command does when a required sub-command is missing, and as `transformers` and `hf` (the
Hugging Face CLIs) do (`accelerate` exits 1, `trl` 0); `hf-outheads --help` prints it on stdout with
status 0.
`train` is one process; several go through accelerate: `accelerate launch -m hf_outheads.training.train
...` (or, in a checkout, `accelerate launch training/train.py ...`). `hf-outheads <command> --help`
lists a command's options.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

TRAINING = "hf_outheads.training"
COMMANDS = {  # command -> (module it runs, what it does)
    "quickstart": (f"{TRAINING}.quickstart", "the offline quickstart: train, evaluate and publish two tiny models"),
    "train": (f"{TRAINING}.train", "train, evaluate and publish a model (one process)"),
    "export": (f"{TRAINING}.export", "write a trained model as its backbone's own transformers class"),
    "mtp-distill": (f"{TRAINING}.mtp_distill", "self-distil an mtp model's future-token predictors on its greedy output"),
    "serve": ("hf_outheads.tools.serve", "serve a model with transformers' OpenAI-compatible server (transformers serve)"),
}
TRAIN_STACK = ("yaml", "accelerate", "datasets", "tokenizers", "evaluate", "sacrebleu")  # imported by every training command


def usage() -> str:
    rows = "\n".join(f"  {name:<12} {what}" for name, (_, what) in COMMANDS.items())
    return f"usage: hf-outheads <command> [options]\n\ncommands:\n{rows}\n\n`hf-outheads <command> --help` lists its options."


def usage_error(message: str) -> SystemExit:
    """A usage error: the usage and `message` on stderr, exit status 2 (argparse's)."""
    print(f"{usage()}\n\nhf-outheads: error: {message}", file=sys.stderr)
    return SystemExit(2)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(usage())
        return
    if not argv:
        raise usage_error("a command is required.")
    if argv[0] not in COMMANDS:
        print(f"hf-outheads: error: unknown command {argv[0]!r}; choose one of {', '.join(COMMANDS)}.", file=sys.stderr)
        raise SystemExit(2)
    module = COMMANDS[argv[0]][0]
    missing = [name for name in TRAIN_STACK if module.startswith(TRAINING) and importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(f"hf-outheads {argv[0]}: error: the training stack is not installed ({', '.join(missing)}): "
                         "pip install 'hf_outheads[train]'.")
    sys.argv = [f"hf-outheads {argv[0]}", *argv[1:]]  # argparse's prog, in usage and errors
    importlib.import_module(module).main(argv[1:])


if __name__ == "__main__":
    main()
